"""ArmSim: the embedded MuJoCo arm behaving like a velocity-controlled arm behind a ros2_control driver.

The caller (a ROS node, a test, a data collector) calls :meth:`ArmSim.set_command` with joint
velocities, :meth:`ArmSim.step` to advance 1 ms physics steps, and reads :meth:`ArmSim.joint_state`
/ :meth:`ArmSim.wrench` (measured: noise, encoder offset, sensor faults) or
:meth:`ArmSim.true_joint_state` / :meth:`ArmSim.tool_pose` (ground truth).

What the driver does, in sim time:

* a command is clamped to the URDF velocity limits and acts ``command_latency_s`` after it was set
  (plus any injected latency spike; commands are delivered in order);
* the drive is a PI velocity loop with gravity feed-forward, clamped to the URDF effort, whose
  reference lags by ``actuator_lag_s`` (see :mod:`robot_wm.sim.model`); its integral state is
  clamped at the end of every :meth:`step` call and at every internal event (anti-windup);
* watchdog: if no command arrives for ``command_timeout_s`` the reference ramps to zero at the
  profile's ``stop_deceleration_radps2`` (``timed_out`` is True until the next command);
* a rejected command (wrong length, NaN, inf) raises :class:`CommandRejected` and the arm stops the
  same way instead of keeping its last command.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from robot_wm import description
from robot_wm.sim.faults import FaultInjector
from robot_wm.sim.model import PAYLOAD_RADIUS_M, TIMESTEP_S, ArmModel, build_model
from robot_wm.sim.profiles import DynamicsProfile, load_profile


#: The drive reports its torque averaged over this many 1 ms physics steps: the embedded arm's
#: joint-state rate (500 Hz), so that samples at that rate tile time and their mean over a control
#: period is the torque that period's motion took. A stiff velocity loop (nominal shoulder: kv =
#: 2000 N·m·s/rad) acts in a one-step impulse at each command change and rings back within three:
#: instantaneous samples every 2 ms read that as tens of N·m of the wrong sign (a real drive
#: reports its current filtered over its own cycle).
EFFORT_WINDOW_STEPS = 2


def applied_torque(qfrc_actuator: np.ndarray, velocity_force: np.ndarray, dqvel: np.ndarray, kv: np.ndarray,
                   velocity_force_max: np.ndarray, joint_force_max: np.ndarray) -> np.ndarray:
    """The drive torque that acted during a physics step (ArmSim and VecArmSim: any leading shape).

    MuJoCo's ``qfrc_actuator`` is the drive's torque at the step's *starting* velocity; the
    implicit integrator applies the velocity loop's damping at the *new* velocity, i.e. ``kv``
    times the step's velocity change ``dqvel`` less, wherever neither the velocity actuator's force
    range nor the joint's clamps the torque (there its derivative is zero)."""
    free = (np.abs(velocity_force) < velocity_force_max) & (np.abs(qfrc_actuator) < joint_force_max)
    return qfrc_actuator - np.where(free, kv * dqvel, 0.0)


class CommandRejected(ValueError):
    """A velocity command was malformed; the arm stops instead of executing it."""


@dataclass(frozen=True)
class JointState:
    """One joint-state sample, arrays in joint order (read-only)."""

    stamp_s: float
    position_rad: np.ndarray
    velocity_radps: np.ndarray
    effort_nm: np.ndarray


def _frozen(array: np.ndarray) -> np.ndarray:
    out = np.array(array, dtype=float)
    out.flags.writeable = False
    return out


def _index(indices: np.ndarray) -> slice | np.ndarray:
    """A slice when the indices are contiguous (much cheaper to index with), else the array."""
    idx = np.asarray(indices)
    if idx.size and np.array_equal(idx, np.arange(idx[0], idx[0] + idx.size)):
        return slice(int(idx[0]), int(idx[0]) + idx.size)
    return idx


def _steps(duration_s: float, dt_s: float) -> int:
    """Number of physics steps in a duration (durations are quantized to the step)."""
    return int(round(duration_s / dt_s))


def check_q0(q0_rad: object, arm: ArmModel, what: str = "q0_rad") -> np.ndarray:
    """Validate a start configuration (6 finite values within the joint limits); return it as floats."""
    try:
        q0 = np.asarray(q0_rad, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} = {q0_rad!r}: expected {len(arm.joint_names)} joint positions in rad") from exc
    if q0.shape != (len(arm.joint_names),):
        raise ValueError(f"{what} has shape {q0.shape}: expected ({len(arm.joint_names)},) joint positions in rad")
    if not np.all(np.isfinite(q0)):
        raise ValueError(f"{what} = {q0.tolist()}: expected finite values")
    outside = [
        f"{n}={q:.4g} not in [{lo:.4g}, {hi:.4g}]"
        for n, q, lo, hi in zip(arm.joint_names, q0, arm.lower_rad, arm.upper_rad)
        if not lo <= q <= hi
    ]
    if outside:
        raise ValueError(f"{what} outside the joint limits: {', '.join(outside)}")
    return q0


class ArmSim:
    """A 6-DOF arm in MuJoCo with a ros2_control-like velocity interface, sensor models and faults.

    Attributes:
        joint_names: joint order of every array.
        faults: the fault injector (push, payload, sensor_freeze, sensor_noise, latency, clear).
        profile: the dynamics profile in use.
    """

    def __init__(
        self,
        profile: str | Path | DynamicsProfile = "nominal",
        seed: int = 0,
        command_timeout_s: float = 0.05,
        q0_rad: np.ndarray | None = None,
    ) -> None:
        """Build the simulator and reset it to ``q0_rad``.

        Args:
            profile: "nominal", "real_twin", a YAML path or a DynamicsProfile.
            seed: seed of the sensor-noise generator (the only randomness).
            command_timeout_s: watchdog period, s (> 0): no command for this long → controlled stop.
            q0_rad: start configuration; default config/initial_positions.yaml.
        """
        self.profile = load_profile(profile)
        timeout = float(command_timeout_s)
        if not np.isfinite(timeout) or timeout <= 0.0:
            raise ValueError(f"command_timeout_s = {command_timeout_s!r}: expected a finite time > 0 s")
        self._arm = build_model(self.profile)
        self.model = self._arm.model
        self.data = mujoco.MjData(self.model)
        self._scratch = mujoco.MjData(self.model)  # for mj_setConst, which overwrites its data
        self.joint_names = self._arm.joint_names
        self.dt_s = float(self.model.opt.timestep)
        self.command_timeout_s = timeout
        self._timeout_steps = max(1, _steps(timeout, self.dt_s))
        self._rng = np.random.default_rng(seed)
        self._default_q0 = check_q0(
            description.initial_positions(self.joint_names) if q0_rad is None else q0_rad, self._arm
        )
        a = self._arm
        self._qpos_i, self._dof_i = _index(a.qpos_adr), _index(a.dof_adr)
        self._vel_i, self._int_i, self._act_i = _index(a.vel_actuators), _index(a.int_actuators), _index(a.int_act_adr)
        p = self.profile
        self._offset = np.asarray(p.encoder_offset_rad)
        self._stop_step_radps = np.asarray(p.stop_deceleration_radps2) * self.dt_s
        self._force_bias = np.asarray(p.force_bias_n)
        self._torque_bias = np.asarray(p.torque_bias_nm)
        self._base_payload_kg = p.payload_kg
        # what the velocity loop's torque is judged against when reported (see _applied_effort)
        self._kv = np.asarray(p.velocity_gain_nms, dtype=float)
        self._vel_force_max = self.model.actuator_forcerange[self._vel_i, 1].copy()
        self._joint_force_max = self.model.jnt_actfrcrange[[self.model.joint(n).id for n in self.joint_names], 1].copy()
        self.faults = FaultInjector(self)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self, q0_rad: np.ndarray | None = None) -> None:
        """Reset time, state, commands and faults; the arm starts at rest at ``q0_rad``.

        Args:
            q0_rad: start configuration (rad); default the one given at construction.
        """
        q0 = self._default_q0 if q0_rad is None else check_q0(q0_rad, self._arm)
        self.faults.clear()
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        d.qpos[self._qpos_i] = q0
        d.act[self._act_i] = q0  # the integral term starts with zero error
        self._step = 0
        self._ctrl = np.zeros(len(self.joint_names))
        self._pending: deque[tuple[int, np.ndarray]] = deque()
        self._last_arrival_step = 0
        self._stopping = False
        self._rejected = False
        self._kin_step = -1
        self._effort_window = np.zeros((EFFORT_WINDOW_STEPS, len(self.joint_names)))  # applied torque, last steps
        self._effort_steps = 0  # physics steps since the reset (the window fills up)
        mujoco.mj_forward(m, d)

    @property
    def time_s(self) -> float:
        """Simulated time since the last reset, s."""
        return self._step * self.dt_s

    @property
    def arm_model(self) -> ArmModel:
        """The compiled model with its indices and URDF limits."""
        return self._arm

    @property
    def timed_out(self) -> bool:
        """True while the watchdog has expired: no command arrived for ``command_timeout_s``."""
        return self._step - self._last_arrival_step >= self._timeout_steps

    @property
    def command_rejected(self) -> bool:
        """True from a rejected command until the next valid one arrives."""
        return self._rejected

    @property
    def commanded_velocity_radps(self) -> np.ndarray:
        """Velocity reference at the driver input, rad/s (clamped; the stop ramp when stopping)."""
        return _frozen(self._ctrl)

    # --------------------------------------------------------------- commands
    def set_command(self, v_radps: object) -> None:
        """Command joint velocities (ros2_control forward velocity controller semantics).

        Args:
            v_radps: one velocity per joint, rad/s, in ``joint_names`` order; clamped to the
                URDF velocity limits.
        Raises:
            CommandRejected: wrong length or non-finite values; the arm then decelerates to rest.
        """
        n = len(self.joint_names)
        try:
            v = np.array(v_radps, dtype=float)
        except (TypeError, ValueError):
            self._reject()
            raise CommandRejected(f"velocity command {v_radps!r}: expected {n} numbers (rad/s); stopping") from None
        if v.shape != (n,):
            self._reject()
            raise CommandRejected(
                f"velocity command has shape {v.shape}: expected ({n},) for joints {list(self.joint_names)}; stopping"
            )
        bad = [f"{name}={x}" for name, x in zip(self.joint_names, v) if not np.isfinite(x)]
        if bad:
            self._reject()
            raise CommandRejected(f"velocity command has non-finite values ({', '.join(bad)}); stopping")
        vmax = self._arm.velocity_limit_radps
        np.clip(v, -vmax, vmax, out=v)
        extra = self.faults.extra_latency_steps()
        if extra == 0 and not self._pending:
            self._deliver(v)
        else:
            due = self._step + extra
            if self._pending:
                due = max(due, self._pending[-1][0])
            self._pending.append((due, v))

    def _deliver(self, v: np.ndarray) -> None:
        """A command arrives at the driver: it becomes the reference and feeds the watchdog."""
        self._ctrl = v
        self._write_ctrl()
        self._last_arrival_step = self._step
        self._stopping = False
        self._rejected = False

    def stop(self) -> None:
        """Decelerate to rest (the profile's stop deceleration) until the next command arrives, as
        after a rejected command (robot_wm.driver.ArmDriver.bring_to_rest of the embedded arm)."""
        self._reject()

    def _reject(self) -> None:
        self._pending.clear()
        self._rejected = True
        self._stopping = True

    def _write_ctrl(self) -> None:
        ctrl = self.data.ctrl
        ctrl[self._vel_i] = self._ctrl
        ctrl[self._int_i] = self._ctrl

    # ---------------------------------------------------------------- stepping
    def step(self, n_steps: int = 1) -> None:
        """Advance the simulation by ``n_steps`` physics steps of ``dt_s`` (1 ms).

        Args:
            n_steps: number of steps (>= 0).
        """
        if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 0:
            raise ValueError(f"n_steps = {n_steps!r}: expected an integer >= 0")
        m, d = self.model, self.data
        target = self._step + int(n_steps)
        while self._step < target:
            self._process_events()
            if self._stopping and self._ctrl.any():
                # controlled stop: ramp the reference down, one step at a time
                mag = np.maximum(np.abs(self._ctrl) - self._stop_step_radps, 0.0)
                self._ctrl = np.copysign(mag, self._ctrl)
                self._write_ctrl()
                k = 1
            else:
                k = min(target, self._next_event_step()) - self._step
            if k > EFFORT_WINDOW_STEPS:
                mujoco.mj_step(m, d, nstep=k - EFFORT_WINDOW_STEPS)
            for _ in range(min(k, EFFORT_WINDOW_STEPS)):  # the steps the reported effort averages over
                v0 = d.qvel[self._dof_i].copy()
                mujoco.mj_step(m, d)
                self._effort_window[self._effort_steps % EFFORT_WINDOW_STEPS] = self._applied_effort(v0)
                self._effort_steps += 1
            self._step += k
        self._process_events()
        self._anti_windup()

    def _next_event_step(self) -> int:
        nxt = self.faults.next_event_step(self._step)
        if self._pending:
            nxt = min(nxt, self._pending[0][0])
        if not self._stopping:
            nxt = min(nxt, self._last_arrival_step + self._timeout_steps)
        return max(nxt, self._step + 1)

    def _process_events(self) -> None:
        if self.faults.expire(self._step):
            self._anti_windup()
        while self._pending and self._pending[0][0] <= self._step:
            self._deliver(self._pending.popleft()[1])
        if not self._stopping and self.timed_out:
            self._stopping = True
            self._anti_windup()

    def _anti_windup(self) -> None:
        """Clamp the integral state to where its output saturates (|ki * error| <= integral limit)."""
        d, window = self.data, self._arm.integral_window_rad
        q = d.qpos[self._qpos_i]
        d.act[self._act_i] = np.minimum(np.maximum(d.act[self._act_i], q - window), q + window)

    # ---------------------------------------------------------------- sensing
    def true_joint_state(self) -> JointState:
        """Return the true joint state (no noise, offset or sensor faults).

        Returns:
            JointState; ``effort_nm`` is the drive torque applied during the last physics step
            (gravity feed-forward included).
        """
        d = self.data
        return JointState(
            stamp_s=self.time_s,
            position_rad=_frozen(d.qpos[self._qpos_i]),
            velocity_radps=_frozen(d.qvel[self._dof_i]),
            effort_nm=_frozen(self._reported_effort()),
        )

    def _applied_effort(self, qvel_before: np.ndarray) -> np.ndarray:
        """The drive torque that acted during the physics step just taken (``applied_torque``)."""
        d = self.data
        return applied_torque(d.qfrc_actuator[self._dof_i], d.actuator_force[self._vel_i],
                              d.qvel[self._dof_i] - qvel_before, self._kv, self._vel_force_max, self._joint_force_max)

    def _reported_effort(self) -> np.ndarray:
        """What the drive reports: its applied torque averaged over the last EFFORT_WINDOW_STEPS
        physics steps (the drive's torque before the first step after a reset)."""
        if self._effort_steps == 0:
            return self.data.qfrc_actuator[self._dof_i].copy()
        return self._effort_window[: min(self._effort_steps, EFFORT_WINDOW_STEPS)].mean(axis=0)

    def _measure_joints(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        d, p = self.data, self.profile
        extra = self.faults.extra_noise_std()
        noise = self._rng.standard_normal((3, len(self.joint_names)))
        pos_std = math.hypot(p.position_noise_std_rad, extra)
        vel_std = math.hypot(p.velocity_noise_std_radps, extra)
        q = d.qpos[self._qpos_i] + self._offset + pos_std * noise[0]
        qd = d.qvel[self._dof_i] + vel_std * noise[1]
        tau = self._reported_effort() + p.effort_noise_std_nm * noise[2]
        return q, qd, tau

    def _measure_wrench(self) -> tuple[np.ndarray, np.ndarray]:
        a, d, p = self._arm, self.data, self.profile
        noise = self._rng.standard_normal((2, 3))
        # MuJoCo reports what the arm exerts on the tool side; a F/T sensor reports the reverse
        force = -d.sensordata[a.force_adr : a.force_adr + 3] + self._force_bias + p.force_noise_std_n * noise[0]
        torque = -d.sensordata[a.torque_adr : a.torque_adr + 3] + self._torque_bias + p.torque_noise_std_nm * noise[1]
        return force, torque

    def _measurement_snapshot(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, np.ndarray]]:
        """Take one measurement of everything (used by the sensor-freeze fault)."""
        return self._measure_joints(), self._measure_wrench()

    def joint_state(self) -> JointState:
        """Return the measured joint state: sensor noise, encoder offset and sensor faults applied.

        Returns:
            JointState stamped with the current sim time; while a sensor freeze is active the
            values are those of the moment the freeze began.
        """
        frozen = self.faults.frozen_measurement()
        if frozen is not None:
            q, qd, tau = frozen[0]
        else:
            q, qd, tau = self._measure_joints()
        return JointState(self.time_s, _frozen(q), _frozen(qd), _frozen(tau))

    def wrench(self) -> tuple[np.ndarray, np.ndarray]:
        """Return the measured F/T wrench at ft_sensor_link (noise, bias and sensor faults applied).

        Returns:
            ``(force_n, torque_nm)``: what the tool side (payload, pushes, contacts) exerts on the
            flange, in the ft_sensor_link frame, torque about its origin; at the last physics step.
        """
        frozen = self.faults.frozen_measurement()
        force, torque = frozen[1] if frozen is not None else self._measure_wrench()
        return _frozen(force), _frozen(torque)

    def _kinematics(self) -> None:
        if self._kin_step != self._step:
            mujoco.mj_kinematics(self.model, self.data)
            self._kin_step = self._step

    def tool_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """Return the true tool0 pose in the base_link frame.

        Returns:
            ``(p_base_tool_m, R_base_tool)``: position (3,) in m and rotation matrix (3, 3).
        """
        self._kinematics()
        a, d = self._arm, self.data
        r_base = d.xmat[a.base_body].reshape(3, 3)
        p = r_base.T @ (d.site_xpos[a.tool_site] - d.xpos[a.base_body])
        r = r_base.T @ d.site_xmat[a.tool_site].reshape(3, 3)
        return _frozen(p), _frozen(r)

    def tool_position_m(self) -> np.ndarray:
        """Return the true tool0 position in the base_link frame, m."""
        return self.tool_pose()[0]

    # ------------------------------------------------------- fault plumbing
    def _base_rotation(self) -> np.ndarray:
        self._kinematics()
        return self.data.xmat[self._arm.base_body].reshape(3, 3).copy()

    def _set_push_force(self, force_base_n: np.ndarray) -> None:
        """Apply a force at the tool0 origin (base frame), or remove it with zeros."""
        self.data.xfrc_applied[self._arm.load_body, :3] = self._base_rotation() @ np.asarray(force_base_n)
        self.data.xfrc_applied[self._arm.load_body, 3:] = 0.0

    def _set_extra_payload(self, extra_kg: float) -> None:
        """Set the payload to the profile's plus ``extra_kg`` (takes effect at the next step)."""
        mass = self._base_payload_kg + extra_kg
        body = self._arm.payload_body
        self.model.body_mass[body] = mass
        self.model.body_inertia[body] = 0.4 * mass * PAYLOAD_RADIUS_M**2
        mujoco.mj_setConst(self.model, self._scratch)

    def _now_step(self) -> int:
        return self._step


__all__ = ["ArmSim", "CommandRejected", "JointState", "TIMESTEP_S", "check_q0"]
