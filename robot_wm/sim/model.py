"""The MuJoCo model of the arm, compiled from the same URDF as every other consumer.

``build_model(profile)`` loads ``description.expand(ros2_control=False)`` with an injected
``<mujoco><compiler/></mujoco>`` block, then edits it with ``mujoco.MjSpec``:

* a table plane at z = 0; arm geoms collide with the table only (the URDF's primitive collision
  cylinders overlap at the joints, so self-collision would be spurious);
* sites ``tool`` (on tool0) and ``ft_sensor`` (on ft_sensor_link) with force + torque sensors;
  a ``tool_load`` body under ft_sensor_link at the tool0 pose carries the payload and takes pushes,
  so the F/T sensor measures whatever acts on the tool;
* per joint: armature, Coulomb friction (``frictionloss``), viscous damping, URDF range, and a
  drive built from two ``general`` actuators fed the same velocity reference (see below);
* 1 ms timestep, implicitfast integration (the velocity loop's damping is integrated implicitly).

The drive (per joint) is a PI velocity loop with gravity feed-forward, clamped to the URDF effort:

    tau = kv (v_f - qdot) + ki (∫v_d dt - q) + g_nominal(q),    |tau| <= effort

``v_f`` is the velocity command after the command latency (actuator ``delay``) and the actuator
lag (first-order filter); ``v_d`` is the command delayed by latency + lag + the loop's own time
constant, so that the integral term works on the error against what the loop can follow (a
first-order lag and a dead time of the same length have the same integral after a step): it
removes steady-state errors without making velocity steps overshoot. All of it runs in C:

* actuator ``<joint>_vel``: dyntype filterexact (time constant = lag), gain ``kv``, bias ``-kv*qdot``;
* actuator ``<joint>_int``: dyntype integrator (act = ∫ v_d dt, clamped to the joint range), gain
  ``ki``, bias ``-ki*q``, force limited to ``integral_limit_nm``. The simulator clamps its state to
  that limit's window at the end of each ``step`` call (anti-windup); the output clamp holds in
  between.

The gravity feed-forward is MuJoCo's gravcomp routed through the actuators (``actuatorgravcomp``),
with each link's gravcomp = 1/mass_scale: the drive compensates the *nominal* link masses; heavier
links and the payload are left to the integral term, as on a real arm whose gravity model is not
perfect. Joint-level ``actuatorfrcrange`` (the URDF effort) bounds the total, gravity feed-forward
included. Both actuators of a joint take the same control (the velocity command, rad/s); the
control history of every actuator holds MAX_COMMAND_LATENCY_S + MAX_ACTUATOR_LAG_S, so every
profile compiles to the same MjData layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import numpy as np

from robot_wm import description
from robot_wm.contracts import JOINT_NAMES
from robot_wm.sim.profiles import (
    LINK_NAMES,
    MAX_ACTUATOR_LAG_S,
    MAX_COMMAND_LATENCY_S,
    DynamicsProfile,
)

TIMESTEP_S = 0.001
#: Lag modeled when a profile asks for none: with exact discretization a 1 µs filter is the identity
#: at 1 ms steps, and keeping the filter keeps the MjData layout the same for every profile.
_MIN_LAG_S = 1e-6
#: Radius of the solid sphere that stands for the payload's inertia (m).
PAYLOAD_RADIUS_M = 0.04
#: Time constant of the velocity loop at the default tuning (kv = 500 M): the integral term's
#: reference is delayed by it (and by the lag and latency) so velocity steps do not overshoot.
_LOOP_TIME_CONSTANT_S = 0.002

_COMPILER_BLOCK = (
    '<mujoco><compiler discardvisual="false" fusestatic="false" balanceinertia="true" '
    'angle="radian"/></mujoco>'
)
# Collision bits: arm geoms (contype 2) collide with the table (conaffinity 2) but not each other.
_ARM_CONTYPE, _ARM_CONAFFINITY = 2, 0
_TABLE_CONTYPE, _TABLE_CONAFFINITY = 0, 2


class ModelError(RuntimeError):
    """The URDF does not produce the MuJoCo model robot_wm.sim expects."""


@dataclass(frozen=True)
class ArmModel:
    """A compiled MuJoCo arm and the indices/limits the simulator needs (arrays in joint order)."""

    model: mujoco.MjModel
    profile: DynamicsProfile
    joint_names: tuple[str, ...]
    qpos_adr: np.ndarray
    dof_adr: np.ndarray
    vel_actuators: np.ndarray
    int_actuators: np.ndarray
    int_act_adr: np.ndarray
    lower_rad: np.ndarray
    upper_rad: np.ndarray
    velocity_limit_radps: np.ndarray
    effort_limit_nm: np.ndarray
    integral_window_rad: np.ndarray
    base_body: int
    tool_site: int
    ft_site: int
    load_body: int
    payload_body: int
    force_adr: int
    torque_adr: int


def urdf_for_mujoco(urdf_xml: str | None = None) -> str:
    """Return the arm URDF with the ``<mujoco><compiler/></mujoco>`` block MuJoCo needs injected.

    Args:
        urdf_xml: URDF text; default ``description.expand(ros2_control=False)``.
    Returns:
        The URDF text MuJoCo loads.
    """
    urdf = description.expand(ros2_control=False) if urdf_xml is None else urdf_xml
    start = urdf.find("<robot")
    if start < 0:
        raise ModelError("URDF text has no <robot> element")
    end = urdf.index(">", start) + 1
    return urdf[:end] + _COMPILER_BLOCK + urdf[end:]


def _quat_to_mat(quat_wxyz: np.ndarray) -> np.ndarray:
    mat = np.zeros(9)
    mujoco.mju_quat2Mat(mat, np.asarray(quat_wxyz, dtype=float))
    return mat.reshape(3, 3)


def _relative_pose(spec: mujoco.MjSpec, frame: str, target: str) -> tuple[np.ndarray, np.ndarray]:
    """Return the pose (pos, quat) of body ``target`` in body ``frame``; both children of one body."""
    a, b = spec.body(frame), spec.body(target)
    if a.parent.name != b.parent.name:
        raise ModelError(f"{frame!r} and {target!r} are expected to share a parent link")
    ra, rb = _quat_to_mat(a.quat), _quat_to_mat(b.quat)
    pos = ra.T @ (np.asarray(b.pos) - np.asarray(a.pos))
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, (ra.T @ rb).ravel())
    return pos, quat


def build_spec(profile: DynamicsProfile, urdf_xml: str | None = None) -> mujoco.MjSpec:
    """Return the edited MjSpec of the arm for a profile (compile it with ``.compile()``).

    Args:
        profile: the dynamics profile (friction, masses, payload, drive tuning, lag, latency).
        urdf_xml: URDF text without ``<ros2_control>``; default: the package description.
    Returns:
        The spec.
    """
    urdf = description.expand(ros2_control=False) if urdf_xml is None else urdf_xml
    limits = description.joint_limits(urdf)
    if tuple(limits.names) != JOINT_NAMES:
        raise ModelError(f"URDF joints {limits.names} differ from the simulator's joint order {JOINT_NAMES}")
    spec = mujoco.MjSpec.from_string(urdf_for_mujoco(urdf))
    spec.option.timestep = TIMESTEP_S
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST

    for joint_name, link_name in zip(JOINT_NAMES, LINK_NAMES):
        body = spec.body(link_name)
        if body is None or body.first_joint() is None or body.first_joint().name != joint_name:
            raise ModelError(f"URDF link {link_name!r} is not the child of joint {joint_name!r}")

    for geom in spec.geoms:
        if geom.contype or geom.conaffinity:  # collision geoms; visual ones are already 0/0
            geom.contype, geom.conaffinity = _ARM_CONTYPE, _ARM_CONAFFINITY
    spec.worldbody.add_geom(
        name="table",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[2.0, 2.0, 0.05],
        contype=_TABLE_CONTYPE,
        conaffinity=_TABLE_CONAFFINITY,
        rgba=[0.45, 0.42, 0.38, 1.0],
    )

    # Link masses: scale mass and inertia together; the drive's gravity model stays nominal.
    for link_name, scale in zip(LINK_NAMES, profile.link_mass_scale):
        body = spec.body(link_name)
        body.mass = body.mass * scale
        body.inertia = np.asarray(body.inertia) * scale
        body.gravcomp = 1.0 / scale

    # Tool side of the F/T sensor: a load body at the tool0 pose, carrying the payload.
    tool_pos, tool_quat = _relative_pose(spec, "ft_sensor_link", "tool0")
    ft_body = spec.body("ft_sensor_link")
    ft_body.add_site(name="ft_sensor", size=[0.01, 0.01, 0.01])
    spec.body("tool0").add_site(name="tool", size=[0.01, 0.01, 0.01])
    load = ft_body.add_body(name="tool_load", pos=tool_pos, quat=tool_quat)
    payload = load.add_body(name="payload", pos=list(profile.payload_com_m))
    set_payload_inertial(payload, profile.payload_kg)
    spec.add_sensor(
        name="ft_force", type=mujoco.mjtSensor.mjSENS_FORCE, objtype=mujoco.mjtObj.mjOBJ_SITE, objname="ft_sensor"
    )
    spec.add_sensor(
        name="ft_torque", type=mujoco.mjtSensor.mjSENS_TORQUE, objtype=mujoco.mjtObj.mjOBJ_SITE, objname="ft_sensor"
    )

    lag_s = max(profile.actuator_lag_s, _MIN_LAG_S)
    nsample = int(math.ceil((MAX_COMMAND_LATENCY_S + MAX_ACTUATOR_LAG_S + _LOOP_TIME_CONSTANT_S) / TIMESTEP_S)) + 1
    for k, name in enumerate(JOINT_NAMES):
        joint = spec.joint(name)
        joint.armature = profile.armature_kgm2[k]
        joint.frictionloss = profile.coulomb_friction_nm[k]
        joint.damping = [profile.viscous_damping_nms[k], 0.0, 0.0]  # linear term only
        joint.limited = mujoco.mjtLimited.mjLIMITED_TRUE
        joint.range = [limits.lower_rad[k], limits.upper_rad[k]]
        joint.actfrclimited = mujoco.mjtLimited.mjLIMITED_TRUE
        joint.actfrcrange = [-limits.effort_nm[k], limits.effort_nm[k]]
        joint.actgravcomp = True

    # All "_vel" actuators, then all "_int" ones: ctrl and act are two contiguous blocks of 6.
    for suffix in ("vel", "int"):
        for k, name in enumerate(JOINT_NAMES):
            kv, ki = profile.velocity_gain_nms[k], profile.integral_gain_nm_per_rad[k]
            act = spec.add_actuator(name=f"{name}_{suffix}", target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
            act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
            act.ctrlrange = [-limits.velocity_radps[k], limits.velocity_radps[k]]
            act.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
            act.gaintype = mujoco.mjtGain.mjGAIN_FIXED
            act.biastype = mujoco.mjtBias.mjBIAS_AFFINE
            act.nsample = nsample
            if suffix == "vel":  # kv (v_f - qdot), v_f = lagged, delayed command
                act.delay = profile.command_latency_s
                act.actearly = True  # the filtered reference acts in the same step
                act.dyntype = mujoco.mjtDyn.mjDYN_FILTEREXACT
                act.dynprm[0] = lag_s
                act.gainprm[0] = kv
                act.biasprm[:3] = [0.0, 0.0, -kv]
                act.forcerange = [-limits.effort_nm[k], limits.effort_nm[k]]
            else:  # ki (∫ v dt - q), v delayed by latency + lag + loop time constant
                act.delay = profile.command_latency_s + profile.actuator_lag_s + _LOOP_TIME_CONSTANT_S
                act.dyntype = mujoco.mjtDyn.mjDYN_INTEGRATOR
                act.gainprm[0] = ki
                act.biasprm[:3] = [0.0, -ki, 0.0]
                act.forcerange = [-profile.integral_limit_nm[k], profile.integral_limit_nm[k]]
                act.actlimited = mujoco.mjtLimited.mjLIMITED_TRUE
                act.actrange = [limits.lower_rad[k], limits.upper_rad[k]]
    return spec


def set_payload_inertial(body: mujoco.MjsBody, mass_kg: float) -> None:
    """Give a spec body the inertia of a solid sphere of ``mass_kg`` (radius PAYLOAD_RADIUS_M)."""
    body.explicitinertial = True
    body.mass = mass_kg
    body.inertia = [0.4 * mass_kg * PAYLOAD_RADIUS_M**2] * 3
    body.gravcomp = 0.0  # the payload is unknown to the drive's gravity model


def build_model(profile: DynamicsProfile, urdf_xml: str | None = None) -> ArmModel:
    """Compile the arm for a profile and collect the indices the simulator uses.

    Args:
        profile: the dynamics profile.
        urdf_xml: URDF text without ``<ros2_control>``; default: the package description.
    Returns:
        The compiled model with its joint/actuator/site/sensor indices and URDF limits.
    """
    urdf = description.expand(ros2_control=False) if urdf_xml is None else urdf_xml
    limits = description.joint_limits(urdf)
    model = build_spec(profile, urdf).compile()

    joint_ids = [model.joint(n).id for n in JOINT_NAMES]
    lower, upper = model.jnt_range[joint_ids, 0].copy(), model.jnt_range[joint_ids, 1].copy()
    if not (np.allclose(lower, limits.lower_rad) and np.allclose(upper, limits.upper_rad)):
        raise ModelError(
            f"MuJoCo joint ranges {lower}/{upper} differ from the URDF's {limits.lower_rad}/{limits.upper_rad}"
        )
    vel_acts = np.array([model.actuator(f"{n}_vel").id for n in JOINT_NAMES])
    int_acts = np.array([model.actuator(f"{n}_int").id for n in JOINT_NAMES])
    ki = np.asarray(profile.integral_gain_nm_per_rad)
    window = np.divide(np.asarray(profile.integral_limit_nm), ki, out=np.zeros(len(ki)), where=ki > 0)
    force_sensor, torque_sensor = model.sensor("ft_force"), model.sensor("ft_torque")
    return ArmModel(
        model=model,
        profile=profile,
        joint_names=JOINT_NAMES,
        qpos_adr=model.jnt_qposadr[joint_ids].copy(),
        dof_adr=model.jnt_dofadr[joint_ids].copy(),
        vel_actuators=vel_acts,
        int_actuators=int_acts,
        int_act_adr=model.actuator_actadr[int_acts].copy(),
        lower_rad=lower,
        upper_rad=upper,
        velocity_limit_radps=np.asarray(limits.velocity_radps, dtype=float).copy(),
        effort_limit_nm=np.asarray(limits.effort_nm, dtype=float).copy(),
        integral_window_rad=window,
        base_body=model.body("base_link").id,
        tool_site=model.site("tool").id,
        ft_site=model.site("ft_sensor").id,
        load_body=model.body("tool_load").id,
        payload_body=model.body("payload").id,
        force_adr=int(model.sensor_adr[force_sensor.id]),
        torque_adr=int(model.sensor_adr[torque_sensor.id]),
    )
