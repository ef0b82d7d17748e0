"""Adversarial end to end: 10,000 control cycles of a hostile nominal command source through the
safety filter into the embedded arm (separate processes), for nominal and real_twin. Everything is
measured on the arm's actual /joint_states with the URDF kinematics computed here.

Tolerances (stated, and why):
  * joint limits: the safety limits (config/safety.yaml) + 0.02 rad. The filter plans with the
    world model's one-period prediction; a joint driven at its full 1.5-2 rad/s into a limit coasts
    for the drive's latency + lag (~12 ms on the real twin) before the braking command bites.
    0.02 rad is 0.3 % of the URDF range that stays behind it (the URDF limits are ±2π / ±π).
  * keep-outs and table: no monitored point (tool0 and the link origins the filter watches) inside
    a keep-out box or sphere, or below the table plane, at any joint state. (The filter keeps 5-8 cm
    clearances, so no tolerance is needed.)
  * tool speed |J(q) q̇| <= 0.5 m/s + 0.1 m/s: the measured velocity carries the drive's tracking
    overshoot and, on the real twin, 0.005 rad/s sensor noise per joint; the filter bounds the
    commanded speed exactly (up to its reported slack).

History: the first version of this test passed on an idle machine but failed in a fresh-clone CI
run (joint overshoot 23-25 mrad, tool speed up to 0.74 m/s). The causes, found with recorded runs
under load: filter periods ran 20-30 ms late on 10-150 ms old joint states (each node worked through
a queue of 500 Hz states; age counted from receipt), braking was planned for one period of
coasting, the stop ramp was per period, and the tool-speed rows bounded the world model's lagging
one-step velocity instead of the command. With those fixed (docs/safety_filter.md) it runs in
`make test`; under a concurrent benchmark load (load average ~5) it measured nominal 0.0 mrad,
0.518 m/s and real_twin 9.4 mrad, 0.555 m/s. A later CI run measured 0.606 m/s on nominal: the
shoulder pan, effort saturated, ran 0.35 rad/s over its command for 0.3 s while the commands' own
tool speed stayed at 0.485 m/s; the tool-speed rows now also take the drive's tracking error
(docs/safety_filter.md, "Drive error"). With one core busy, nominal then measured 0.505 and 0.533
m/s in two runs (0.566 before, 1.3 % of samples above 0.5 m/s; after, 0.03 % and 0.16 %).
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from robot_wm import description, graph
from robot_wm.core.kinematics import Kinematics
from robot_wm.core.safety import load_safety_limits
from robot_wm.process_group import command_for

from conftest import wait_for
from rosclient import ArmClient
from test_control_stack_ros import NominalSource

pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.adversarial]
CYCLES = 10_000
JOINT_TOL_RAD = 0.02
SPEED_TOL_MPS = 0.1


def _adversary(kin, limits, q: np.ndarray, phase: int, rng: np.random.Generator) -> np.ndarray:
    """A hostile nominal command: full speed into a joint limit, the table, a keep-out, or random."""
    v_max = np.asarray(limits.vel_max_radps)
    kind = phase % 4
    if kind == 0:  # every joint at full speed into its limits, alternating direction
        sign = 1.0 if (phase // 4) % 2 == 0 else -1.0
        return sign * v_max
    jac = kin.tool_jacobian(q)[:3]
    if kind == 1:
        target = np.array([0.0, 0.0, -1.0])  # straight down into the table
    elif kind == 2:
        boxes = np.asarray(limits.keepout_boxes_m).reshape(-1, 6)
        centre = (boxes[0, :3] + boxes[0, 3:]) / 2.0 if len(boxes) else np.array([0.45, 0.0, 0.15])
        target = centre - kin.tool_position_m(q)
    else:
        return rng.uniform(-1.0, 1.0, 6) * v_max
    v = np.linalg.pinv(jac) @ (2.0 * target / max(np.linalg.norm(target), 1e-6))
    return np.clip(v, -v_max, v_max)


def _points(kin, q, frames):
    return [kin.tool_position_m(q)] + [kin.frame_pose(q, f).translation for f in frames]


def _speed_context(kin, states, i: int, published, statuses, names) -> str:
    """What the arm was told and what the filter said around joint state ``i`` (the fastest): a
    failure on a loaded CI machine cannot be rerun, so the message carries the evidence."""
    stamp, q, qd = states[i][5], states[i][1], states[i][2]
    sent = [(t, u) for t, u in published if t <= stamp]
    lines = [f"at arm stamp {stamp:.3f} (state {i} of {len(states)}): q̇ {np.round(qd, 3).tolist()}"]
    if sent:
        t_cmd, u = sent[-1]
        err = qd - u
        lines.append(f"the filter's latest command, published {1e3 * (stamp - t_cmd):.1f} ms before: {np.round(u, 3).tolist()} "
                     f"(its tool speed here {np.linalg.norm(kin.tool_linear_velocity_mps(q, u)):.3f} m/s; largest "
                     f"q̇ − u {err[np.argmax(np.abs(err))]:+.3f} rad/s on {names[int(np.argmax(np.abs(err)))]})")
    stamps = [s[5] for s in states[max(i - 50, 0):i + 1]]
    lines.append(f"largest gap between the states received in the 50 before: {1e3 * max(np.diff(stamps), default=0):.1f} ms")
    near = [m for m in statuses if abs(m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec - stamp) <= 0.05]
    for m in near:
        t_m = m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec
        lines.append(f"  status {1e3 * (t_m - stamp):+6.1f} ms: {m.state_text} slack {m.max_slack:.3f} "
                     f"{list(m.active_constraints)} {m.fault_reason}")
    return "\n".join(lines)


@pytest.mark.parametrize("profile", ["nominal", "real_twin"])
def test_hostile_nominal_commands_never_break_a_limit(spawn, ros_context, profile):
    specs = {s.name: s for s in graph.plan("mujoco", overrides={"profile": profile}, enable=True, trust=False)
             if not s.needs_ros_install}
    arm = spawn(command_for(specs["arm_sim"]))
    filt = spawn(command_for(specs["safety_filter"]))
    from robot_wm.msg import SafetyStatus

    client = ArmClient(ros_context, start=False)
    source = NominalSource(client)  # its subscription exists before the client spins
    client.start()
    urdf = description.expand()
    names = description.joint_limits(urdf).names
    kin = Kinematics(urdf, names)
    limits = load_safety_limits()
    rng = np.random.default_rng(0)
    try:
        assert client.wait_for_state(60.0), arm.output()
        # running and enabled: its status says so (the start latch is released by enable_on_start)
        assert wait_for(lambda: client.statuses and not client.statuses[-1].latches, 60.0), filt.output()
        t0 = time.monotonic()
        n0 = len(client.states)  # the states received from here on (a count that costs nothing to poll)
        phase = -1
        # CYCLES commands, and on until this client has more than CYCLES joint states to judge: on a loaded
        # machine it receives far fewer than the arm's 500 Hz (CI once: 35 of 250), so the attack goes on
        # longer rather than being judged on too few (within the test's time-out)
        while len(source.commands_since(t0)) < CYCLES or (len(client.states) - n0 <= CYCLES
                                                          and time.monotonic() - t0 < 200.0):
            if int((time.monotonic() - t0) / 2.0) != phase:  # a new attack every 2 s
                phase = int((time.monotonic() - t0) / 2.0)
            latest = client.latest()
            source.value = list(_adversary(kin, limits, latest[1], phase, rng))
            time.sleep(0.01)
            assert filt.process.poll() is None and arm.process.poll() is None, filt.output() + arm.output()
        states = client.states_since(t0)
    finally:
        source.close()
        client.close()
    assert len(states) > CYCLES  # 500 Hz joint states over >= 100 s
    q = np.array([s[1] for s in states])
    qd = np.array([s[2] for s in states])
    over = np.maximum(q - np.asarray(limits.upper_rad), np.asarray(limits.lower_rad) - q).max(axis=1)
    assert over.max() <= JOINT_TOL_RAD, f"joint limit exceeded by {over.max():.4f} rad"
    boxes = np.asarray(limits.keepout_boxes_m).reshape(-1, 6)
    spheres = np.asarray(limits.keepout_spheres_m).reshape(-1, 4)
    speeds = []
    for qi, qdi in zip(q, qd):  # every joint state the arm published (500 Hz)
        for p in _points(kin, qi, limits.monitored_frames):
            assert p[2] > limits.table_z_m, f"a monitored point went below the table: {p}"
            for b in boxes:
                assert not np.all((p > b[:3]) & (p < b[3:])), f"keep-out box entered at {p}"
            for sph in spheres:
                assert np.linalg.norm(p - sph[:3]) > sph[3], f"keep-out sphere entered at {p}"
        speeds.append(np.linalg.norm(kin.tool_linear_velocity_mps(qi, qdi)))
    worst = int(np.argmax(speeds))
    assert speeds[worst] <= limits.tool_speed_max_mps + SPEED_TOL_MPS, (
        f"tool speed {speeds[worst]:.3f} m/s\n" + _speed_context(kin, states, worst, source.published, client.statuses, names))
    # ... and the attack was real: the filter mostly passed or shaped commands (not a stopped arm),
    # joints were driven to their limits and the tool up to its speed limit
    states_seen = [m.state for m in client.statuses]
    running = sum(s in (SafetyStatus.OK, SafetyStatus.FILTERING) for s in states_seen) / max(len(states_seen), 1)
    assert running >= 0.5, f"the filter ran (OK/FILTERING) in only {running:.0%} of {len(states_seen)} periods"
    assert (-over).min() < 0.05, f"no joint came within 0.05 rad of a limit (closest {(-over).min():.3f} rad)"
    assert max(speeds) > 0.8 * limits.tool_speed_max_mps, f"the tool never got near its speed limit ({max(speeds):.3f} m/s)"
    print(f"{profile}: {CYCLES} cycles, max joint overshoot {max(over.max(), 0) * 1e3:.1f} mrad, "
          f"max tool speed {max(speeds):.3f} m/s, filter running (OK/FILTERING) {running:.0%} of periods")
