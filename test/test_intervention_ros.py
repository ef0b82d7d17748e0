"""Trust phases and human intervention in the whole ROS graph on the embedded arm, through the
operator's CLI: a promotion refused with its unmet criteria and then granted on evidence, the
MIXED phase's reduced limits on the measured arm, a take-over, teleoperation that cannot break
the filter's limits, the deadman, a release refused while moving and granted at rest, the policy
resuming without a jump, `robot-wm teleop` (scripted keys), and the intervention in the log and on /robot_wm/intervention/state.

Time is judged by the joint states' own stamps; waits are on conditions."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import wait_for
from rosclient import ArmClient

CLI = [sys.executable, "-m", "robot_wm.cli"]
# promotion criteria small enough for a test: seconds, not minutes. No anomaly-free time: how often
# the monitor sees an anomaly depends on the machine's load (a starved host delays commands, and the
# arm then rightly departs from the model: a CI run saw one every few seconds for 90 s), and this
# test is about the operator's path through the phases; the criterion is test_trust_phase's.
CRITERIA = {"phase_to_mixed_min_minutes": 0.3, "phase_to_mixed_min_episodes": 4,
            "phase_to_mixed_min_success_rate": 0.5, "phase_to_mixed_min_mean_score": 0.3,
            "phase_to_mixed_anomaly_free_minutes": 0.0}
_TELLING = ("anomaly", "controlled stop", "timed out", "latched", "HUMAN", "skipped")


def _cli(*args, timeout=90):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=timeout)


def _stamp(msg) -> float:
    return msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec


def _bring_up(spawn, ros_context, overrides: dict, subscriptions=()):
    """The graph on the embedded arm (self-enabling) with ``overrides``, and a test client that also
    records ``subscriptions`` ((type, topic, list, qos)). Returns (processes, client, logs())."""
    from robot_wm import graph
    from robot_wm.process_group import command_for

    specs = [s for s in graph.plan("mujoco", overrides={"profile": "nominal", **overrides}, enable=True)
             if not s.needs_ros_install]
    procs = {s.name: spawn(command_for(s)) for s in specs}
    arm = ArmClient(ros_context, start=False)
    for msg_type, topic, into, qos in subscriptions:
        arm.node.create_subscription(msg_type, topic, into.append, qos)

    def logs():
        """Each process's last output, then (last: what a truncated report still shows) a count of
        the lines that tell what went wrong, and the newest of them."""
        outputs = {n: p.output() for n, p in procs.items()}
        summary = []
        for n, text in outputs.items():
            telling = [line for line in text.splitlines() if any(k in line for k in _TELLING)]
            if telling:
                summary.append(f"{n}: {len(telling)} telling lines, newest: {telling[-1][-300:]}")
        return "\n".join([f"--- {n}\n{text[-2500:]}" for n, text in outputs.items()]
                         + ["=== summary", *summary])

    return procs, arm, logs


@pytest.mark.ros
@pytest.mark.slow
def test_promotion_intervention_teleop_deadman_and_release_through_the_filter(spawn, ros_context, tmp_path):
    from geometry_msgs.msg import TwistStamped
    from rclpy.qos import DurabilityPolicy, QoSProfile
    from std_msgs.msg import Float64MultiArray

    from robot_wm.core.safety import load_safety_limits
    from robot_wm.core.safety.limits import Phase, TrustLevel
    from robot_wm.msg import InterventionState, TrustState

    phase_file, log = tmp_path / "phase.json", tmp_path / "interventions.jsonl"
    trust: list = []
    who: list = []
    procs, arm, logs = _bring_up(
        spawn, ros_context, {"phase_file": str(phase_file), "intervention_log": str(log), **CRITERIA},
        [(TrustState, "/robot_wm/trust", trust, 50),
         (InterventionState, "/robot_wm/intervention/state", who,
          QoSProfile(depth=5, durability=DurabilityPolicy.TRANSIENT_LOCAL))])
    jog = arm.node.create_publisher(Float64MultiArray, "/robot_wm/teleop/joint_velocity", 10)
    twist = arm.node.create_publisher(TwistStamped, "/robot_wm/teleop/twist", 10)
    arm.start()
    limits = load_safety_limits()
    vmax = np.asarray(limits.velocity_max_radps)

    def since(t0, pred):
        return [s for s in list(trust) if _stamp(s) >= t0 and pred(s)]

    try:
        assert wait_for(lambda: since(0, lambda s: s.level == TrustLevel.FULL), 120.0), logs()
        assert trust[-1].phase == Phase.SIM
        assert json.loads(phase_file.read_text())["phase"] == "SIM"

        # --- a promotion without the evidence is refused, naming what is missing
        refused = _cli("trust", "promote", "--reason", "too early", "--timeout", "20")
        assert refused.returncode == 1 and "REFUSED" in refused.stdout, refused
        assert "unmet: operated" in refused.stdout and "(phase now SIM)" in refused.stdout, refused.stdout
        # --- the evidence comes in (18 s operated, 4 goals): granted
        answers = []
        deadline = time.monotonic() + 90.0
        while time.monotonic() < deadline:
            answers.append(_cli("trust", "promote", "--reason", "sim evidence", "--timeout", "20"))
            if answers[-1].returncode == 0:
                break
            time.sleep(2.0)
        granted = answers[-1]
        assert granted.returncode == 0 and "promoted SIM -> MIXED" in granted.stdout, \
            "\n".join(f"answer: {a.stdout}{a.stderr}" for a in answers) + "\n" + logs()
        t_mixed = time.time()
        assert wait_for(lambda: since(t_mixed, lambda s: s.phase == Phase.MIXED), 5.0)
        history = json.loads(phase_file.read_text())["history"]
        assert history[-1]["to"] == "MIXED" and history[-1]["by"] == "operator"
        # MIXED's reduced limits on the measured arm (the filter applies the phase of the TrustState)
        time.sleep(3.0)
        mixed_cap = vmax * limits.phase_speed_scale[Phase.MIXED]
        moving = [s for s in arm.states if s[5] >= t_mixed + 0.5]
        assert moving and max(np.max(np.abs(s[2]) / mixed_cap) for s in moving) <= 1.05, logs()

        # --- the operator takes over: the monitor answers SLOW, the policy's nominal is replaced
        taken = _cli("intervene", "take", "--reason", "test take-over", "--timeout", "20")
        assert taken.returncode == 0 and "operator in control" in taken.stdout, (taken, logs())
        t_take = time.time()
        assert wait_for(lambda: who and who[-1].active and who[-1].reason.startswith("operator took over"), 5.0)
        assert wait_for(lambda: since(t_take, lambda s: s.level == TrustLevel.SLOW
                                      and "operator in control" in s.reason), 5.0), logs()
        assert wait_for(lambda: arm.rest_after(t_take, 0.01) is not None, 10.0), "the arm did not come to rest"

        # --- teleop cannot break a limit: an absurd jog is held to SLOW x MIXED speed
        slow_cap = vmax * limits.level_speed_scale[TrustLevel.SLOW] * limits.phase_speed_scale[Phase.MIXED]
        t_jog = time.time()
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            jog.publish(Float64MultiArray(data=[5.0, -5.0, 5.0, 0.0, 0.0, 0.0]))
            time.sleep(0.02)
        t_last = time.time()
        # the states the arm stamped during the jog, the window complete (a loaded machine hands them over late)
        jogged = arm.stamped_between(t_jog, t_last)
        peak = max((np.max(np.abs(s[2]) / slow_cap) for s in jogged), default=0.0)
        assert 0.5 < peak <= 1.05, (peak, len(jogged))  # it moved, and no faster than the limits in force
        # --- the deadman: no teleop message -> the arm stops by itself (stamps of the arm's states; + the arm's
        # own stalls: while its process is not scheduled its simulation does not run, see ArmClient.stalls)
        assert wait_for(lambda: arm.rest_after(t_last, 0.01) is not None, 5.0)
        stop_s = arm.rest_after(t_last, 0.01)
        decel = np.min(np.asarray(limits.accel_max_radps2)[:3] * limits.level_accel_scale[TrustLevel.SLOW]
                       * limits.phase_accel_scale[Phase.MIXED])
        stall = arm.stalls(t_last, t_last + stop_s)
        assert stop_s <= 0.2 + float(np.max(slow_cap[:3])) / decel + 0.5 + stall, (stop_s, stall)
        # --- a tool twist in the base frame moves the tool that way
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics

        urdf = description.expand()
        kin = Kinematics(urdf, description.joint_limits(urdf).names)
        before = kin.tool_position_m(arm.latest()[1])
        # 1 s, and on (up to 10 s) until the tool rose 1 cm: a loaded machine that delays the twists past the
        # deadman gets a longer push, not a short one (what is judged is the direction)
        start = time.monotonic()
        while time.monotonic() - start < 1.0 or (kin.tool_position_m(arm.latest()[1])[2] - before[2] <= 0.01
                                                 and time.monotonic() - start < 10.0):
            msg = TwistStamped()
            msg.header.frame_id = "base_link"
            msg.twist.linear.z = 0.03
            twist.publish(msg)
            time.sleep(0.02)
        assert wait_for(lambda: arm.rest_after(time.time() - 0.05, 0.01) is not None, 5.0)
        moved = kin.tool_position_m(arm.latest()[1]) - before
        assert moved[2] > 0.01 and abs(moved[2]) > 2 * max(abs(moved[0]), abs(moved[1])), moved
        # --- the operator's keyboard teleop (scripted keys, the same loop): q jogs shoulder_pan +
        pan = arm.latest()[1][0]
        keys = _cli("teleop", "--script", "0:q,0.2:q,0.2:q,0.2:q,0.2:q", "--timeout", "20")
        assert keys.returncode == 0 and "command: OPERATOR" in keys.stdout, keys
        assert "filter OK" in keys.stdout or "filter FILTERING" in keys.stdout, keys.stdout
        assert wait_for(lambda: arm.rest_after(time.time() - 0.05, 0.01) is not None, 5.0)
        assert arm.latest()[1][0] - pan > 0.05, (arm.latest()[1][0], pan)
        released = _cli("intervene", "release", "--reason", "cleared", "--timeout", "20")
        assert released.returncode == 0 and "handed back" in released.stdout, released
        # --- a release is refused while the arm moves (driven without the CLI's start-up time)
        from robot_wm.srv import Intervention as InterventionSrv

        assert arm.call(InterventionSrv, "/robot_wm/intervention/take", InterventionSrv.Request(reason="again")).success
        # the jog goes on while the release is asked for: on a loaded machine the call can take longer
        # than the deadman, and an arm that stopped by it would rightly be released
        import threading

        jogging = threading.Event()
        jogging.set()

        def keep_jogging() -> None:
            while jogging.is_set():
                jog.publish(Float64MultiArray(data=[0.0, 0.0, 0.0, 0.0, 0.0, 0.3]))
                time.sleep(0.02)

        jogger = threading.Thread(target=keep_jogging, daemon=True)
        jogger.start()
        try:
            assert wait_for(lambda: abs(arm.latest()[2][5]) > 0.1, 10.0), arm.latest()[2]  # moving, by its state
            answer = arm.call(InterventionSrv, "/robot_wm/intervention/release", InterventionSrv.Request(reason="moving"))
        finally:
            jogging.clear()
            jogger.join(2.0)
        assert not answer.success and "moving" in answer.message, answer.message
        assert wait_for(lambda: arm.rest_after(time.time() - 0.05, 0.01) is not None, 5.0)
        t_release = time.time()
        answer = arm.call(InterventionSrv, "/robot_wm/intervention/release", InterventionSrv.Request(reason="at rest"))
        assert answer.success, answer.message
        assert wait_for(lambda: who and not who[-1].active, 5.0)
        # --- the policy resumes from rest, no jump: every step within the filter's acceleration box
        def after_release() -> str:  # what held the arm: the monitor's verdicts, the operator state, the arm
            levels = [(round(_stamp(s) - t_release, 2), TrustLevel(s.level).name, Phase(s.phase).name, s.reason)
                      for s in list(trust) if _stamp(s) >= t_release]
            changes = [x for i, x in enumerate(levels) if i == 0 or x[1:] != levels[i - 1][1:]]
            return f"trust since the release: {changes}\nintervention: {who[-1:]}\narm: {arm.latest()}\n{logs()}"

        assert wait_for(lambda: any(np.max(np.abs(s[2])) > 0.05 for s in arm.states if s[5] >= t_release), 30.0), \
            after_release()
        # the first 0.8 s of motion by the arm's stamps, the window complete (a moving state can be seen
        # a few milliseconds after the release: too few states yet for a 20 ms window, as CI once found)
        t_moving = next(s[5] for s in list(arm.states) if s[5] >= t_release and np.max(np.abs(s[2])) > 0.05)
        after = arm.stamped_between(max(t_release, t_moving - 0.2), t_moving + 0.8)
        box = np.asarray(limits.accel_max_radps2) * limits.phase_accel_scale[Phase.MIXED]
        # (over 20 ms windows: the command changes once per 10 ms period, the 500 Hz states see that as steps)
        steps = []
        for i, a in enumerate(after):
            b = next((b for b in after[i + 1:] if b[5] - a[5] >= 0.02), None)
            if b is not None:
                steps.append(np.max(np.abs(b[2] - a[2]) / (box * (b[5] - a[5]))))
        assert steps and max(steps) <= 1.5, (max(steps, default=None), len(after))
        # --- logged, with reasons and times; the monitor counted the take-overs
        records = [json.loads(line) for line in log.read_text().splitlines()]
        assert [(r["reason"], r["release_reason"]) for r in records] == [("test take-over", "cleared"),
                                                                          ("again", "at rest")], records
        assert all(r["released_s"] > r["taken_s"] for r in records)
        assert json.loads(phase_file.read_text())["evidence"]["interventions"] == 2
        for name in ("trust_monitor", "policy", "safety_filter"):
            assert "Traceback" not in procs[name].output(), procs[name].output()[-3000:]
    finally:
        arm.close()


@pytest.mark.ros
@pytest.mark.slow
def test_an_anomaly_demotes_real_to_mixed_and_in_mixed_calls_a_human(spawn, ros_context, tmp_path):
    """A deployment in REAL (a phase file as a promotion leaves it); a fault that two signals see
    (a 10 kg payload and heavy sensor noise at once, from the injector): automatic demotion to MIXED with a request on
    /robot_wm/intervention/requests; the fault again in MIXED: HUMAN, a critical request, the arm
    held; the history says who did what."""
    from robot_wm.core.safety.limits import Phase, TrustLevel
    from robot_wm.core.trust.phase import PhaseState, PhaseStore
    from robot_wm.msg import InterventionRequest, TrustState
    from robot_wm.srv import InjectFault

    phase_file = tmp_path / "phase.json"
    PhaseStore(phase_file).save(PhaseState(phase=Phase.REAL))
    trust: list = []
    requests: list = []
    procs, arm, logs = _bring_up(
        spawn, ros_context, {"phase_file": str(phase_file), "intervention_log": str(tmp_path / "i.jsonl")},
        [(TrustState, "/robot_wm/trust", trust, 50),
         (InterventionRequest, "/robot_wm/intervention/requests", requests, 10)])
    arm.start()

    def noise():  # two faults at once, each seen by its own signal: effort (payload), prediction error (noise)
        loaded = arm.call(InjectFault, "/arm_sim/inject_fault",
                          InjectFault.Request(kind="payload", payload_kg=10.0, duration_s=1.5))
        noisy = arm.call(InjectFault, "/arm_sim/inject_fault",
                         InjectFault.Request(kind="sensor_noise", noise_std=0.05, duration_s=1.5))
        return type("Both", (), {"success": loaded.success and noisy.success})

    try:
        assert wait_for(lambda: trust and trust[-1].level == TrustLevel.FULL and trust[-1].phase == Phase.REAL,
                        120.0), logs()
        time.sleep(2.0)
        assert noise().success
        assert wait_for(lambda: trust[-1].phase == Phase.MIXED, 10.0), logs()
        assert wait_for(lambda: any("automatic demotion REAL -> MIXED" in r.reason for r in requests), 5.0)
        history = json.loads(phase_file.read_text())["history"]
        assert history[-1]["from"] == "REAL" and history[-1]["to"] == "MIXED" and history[-1]["by"] == "monitor"
        # one anomaly, one step: the event that demoted does not also call a human
        assert not any(s.level == TrustLevel.HUMAN for s in list(trust)), [s.reason for s in trust[-3:]]
        # the level recovers (the filter's trust latch is the operator's to reset; here: the monitor's level)
        assert wait_for(lambda: trust[-1].level <= TrustLevel.SLOW, 30.0), logs()
        from std_srvs.srv import Trigger

        assert wait_for(lambda: arm.call(Trigger, "/robot_wm/reset_estop", Trigger.Request()).success
                        or trust[-1].level == TrustLevel.FULL, 30.0)
        assert wait_for(lambda: trust[-1].level == TrustLevel.FULL, 30.0), logs()
        t_second = time.time()
        assert noise().success
        assert wait_for(lambda: trust[-1].level == TrustLevel.HUMAN, 10.0), logs()
        assert trust[-1].phase == Phase.MIXED  # the phase is kept: the operator decides
        assert wait_for(lambda: any(r.severity == InterventionRequest.SEVERITY_CRITICAL
                                    and _stamp(r) >= t_second for r in requests), 5.0), [r.reason for r in requests]
        time.sleep(2.0)  # the noise is gone: HUMAN holds until an operator
        assert trust[-1].level == TrustLevel.HUMAN
        assert wait_for(lambda: arm.rest_after(time.time() - 0.1, 0.01) is not None, 5.0)
    finally:
        arm.close()
