"""A payload the operator declares by a tare: the trust monitor's effort model takes its torques off
the efforts it judges (robot_wm.core.trust.effort, "A declared payload"; robot_wm/nodes/trust_payload.py).

Judged by the physics (the point mass against pinocchio's own dynamics with the mass added), by the
tracker's bookkeeping, in library mode on the embedded arm (a 2.5 kg payload holds the level down
until the operator re-tares, then FULL comes back with the payload still on), and live: the filter
publishes its tares and the monitor in the graph takes them.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robot_wm.core.safety.limits import TrustLevel
from robot_wm.core.trust import Calibration, EffortModel, EffortModelError, TrustConfig, TrustMonitor
from robot_wm.core.trust.effort import FEATURES
from robot_wm.core.trust.tracker import TrustTracker

DT = 0.01
EFFORT_OVER = re.compile(r"effort_error [0-9.e+-]+ > ")


def _kin():
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics

    urdf = description.expand()
    return Kinematics(urdf, description.joint_limits(urdf).names)


KIN = _kin()


def _with_mass(kin, mass_kg: float, com_m):
    """The same arm with the mass added to the tool frame's body, in pinocchio's own model."""
    import pinocchio as pin

    from robot_wm.core.kinematics import Kinematics

    other = Kinematics.__new__(Kinematics)
    other.__dict__.update(kin.__dict__)
    other.model = pin.Model(kin.model)
    frame = other.model.frames[kin.tool_frame_id]
    other.model.inertias[frame.parentJoint] = other.model.inertias[frame.parentJoint] + frame.placement.act(
        pin.Inertia(mass_kg, np.asarray(com_m, dtype=float), np.zeros((3, 3))))
    other.data = other.model.createData()
    return other


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-3.0, 3.0), min_size=18, max_size=18), st.floats(0.0, 10.0),
       st.lists(st.floats(-0.2, 0.2), min_size=3, max_size=3))
def test_a_point_mass_at_the_tool_adds_what_pinocchio_adds_for_it(x, mass, com):
    q, v, a = np.array(x[:6]), np.array(x[6:12]), 3.0 * np.array(x[12:])
    heavy = _with_mass(KIN, mass, com)
    g0, i0 = KIN.inverse_dynamics_nm(q, v, a)
    g1, i1 = heavy.inverse_dynamics_nm(q, v, a)
    g_p, i_p = KIN.point_mass_torques_nm(q, v, a, mass, com_m=com)
    np.testing.assert_allclose(g_p, g1 - g0, atol=1e-9)
    np.testing.assert_allclose(i_p, i1 - i0, atol=1e-8)


def test_an_effort_models_payload_round_trips_and_a_bad_one_is_named():
    model = EffortModel(np.ones((6, len(FEATURES))), np.ones(6), payload_kg=0.8)
    assert EffortModel.from_dict(model.to_dict(), 6).payload_kg == 0.8
    old = model.to_dict()
    old.pop("payload_kg")  # a calibration made before payloads were recorded
    assert EffortModel.from_dict(old, 6).payload_kg is None
    for bad in ("heavy", float("nan"), 1e4, True):
        doc = dict(model.to_dict(), payload_kg=bad)
        with pytest.raises(EffortModelError, match=r"payload_kg=.*expected the tared payload in kg"):
            EffortModel.from_dict(doc, 6)



def test_a_tare_declares_a_payload_when_taken_fresh_not_when_a_resting_arm_refreshes_it():
    """ForceTare.declared, what the filter publishes on /robot_wm/payload: the first tare, and the
    first after ``forget`` (an operator's re-tare); the refreshes of a resting latched arm (within the
    change tolerance) keep it, and a reading that differs by more is refused, not declared."""
    from robot_wm.core.safety.wrench import GRAVITY_MPS2, ForceTare

    tare = ForceTare(3, change_tolerance_n=5.0)
    down, g = np.eye(3), GRAVITY_MPS2

    def rest(mass_kg, bias=(0.3, -0.2, 0.0)):
        for _ in range(3):
            tare.observe(np.asarray(bias) + np.array([0.0, 0.0, -mass_kg * g]), down, True)

    assert tare.declared is None
    rest(0.8)
    first = tare.declared
    assert first is not None and first.payload_kg == pytest.approx(0.8, abs=1e-9)
    rest(0.85)  # a refresh (0.5 N away): the tare follows, the declaration stays
    assert tare.tare is not first and tare.declared is first
    rest(3.3)  # 24.5 N more: a contact or a payload change, refused until an operator re-tares
    assert tare.declared is first and "re-tare" in tare.last_refusal
    tare.forget()
    rest(3.3)
    assert tare.declared is not first and tare.declared.payload_kg == pytest.approx(3.3, abs=1e-9)

def _tracker(payload_kg):
    effort = EffortModel(np.zeros((6, len(FEATURES))), np.ones(6), payload_kg=payload_kg).to_dict()
    cal = Calibration({"prediction_error": 2.0, "disagreement": 1.0, "intervention": 0.25, "effort_error": 2.0},
                      1e-3, "wm", "test", 10_000, effort_model=effort)
    return TrustTracker(TrustMonitor(TrustConfig(), cal), KIN, DT)


def test_the_tracker_takes_the_change_from_the_calibrations_payload_off_the_efforts():
    q, qd0, qd1 = np.array([0.0, -1.2, 1.4, -1.5, -1.5, 0.3]), np.zeros(6), np.array([0.1, -0.2, 0.3, 0.0, 0.1, -0.1])
    effort = np.array([0.0, 40.0, 12.0, 3.0, 1.0, 0.0])
    recorded = _tracker(0.8)
    assert recorded.set_payload(3.3, first_kg=1.5) == pytest.approx(2.5)  # the model's own record wins
    assert recorded.payload_reference_kg == 0.8
    recorded.payload_com_m = np.array([0.0, 0.0, 0.05])
    recorded.measurement(0.0, q, qd0, effort, False)
    recorded.measurement(DT, q, qd1, effort, False)
    g_p, i_p = KIN.point_mass_torques_nm(q, qd1, (qd1 - qd0) / DT, 2.5, com_m=[0.0, 0.0, 0.05])
    np.testing.assert_allclose(recorded.last_effort_nm, effort - g_p - i_p, atol=1e-12)
    unrecorded = _tracker(None)  # a calibration without a record: the first tare heard stands for its
    assert unrecorded.set_payload(3.3, first_kg=0.8) == pytest.approx(2.5)
    assert unrecorded.set_payload(0.8, first_kg=0.8) == 0.0
    assert _tracker(None).set_payload(3.3) == 0.0  # nothing to compare with: nothing taken off
    # within the deadband (a tare's mass carries the sensor bias along gravity at its pose): no change
    assert recorded.set_payload(0.8 + 0.9 * TrustTracker.PAYLOAD_DEADBAND_KG) == 0.0
    assert recorded.set_payload(0.8 - 1.1 * TrustTracker.PAYLOAD_DEADBAND_KG) < 0.0
    plain = _tracker(None)
    plain.measurement(0.0, q, qd0, effort, False)
    plain.measurement(DT, q, qd1, effort, False)
    np.testing.assert_array_equal(plain.last_effort_nm, effort)
    with pytest.raises(ValueError, match="payload_kg=nan"):
        plain.set_payload(float("nan"))



def test_the_monitors_payload_input_refuses_what_no_tare_is_and_gives_each_new_tracker_the_last(ros_context):
    """DeclaredPayload in a node of its own (no spinning: its callback is called as the executor would):
    a NaN, an absurd mass or a message without the F/T frame is refused, named, and the last tare kept;
    the latest tare goes to the tracker on the period thread once, and again to a new tracker (a live
    calibration's); the first tare heard is the reference of a calibration that records none."""
    from geometry_msgs.msg import InertiaStamped
    from rclpy.node import Node

    from robot_wm.nodes.trust_payload import DeclaredPayload

    node = Node("payload_test", context=ros_context)
    try:
        declared = DeclaredPayload(node)

        def tare(kg, frame="ft_sensor_link"):
            msg = InertiaStamped()
            msg.header.frame_id, msg.inertia.m = frame, kg
            declared._on_payload(msg)

        tracker = _tracker(None)
        declared.apply(tracker)  # nothing heard yet: nothing given
        assert tracker.payload_kg is None and declared.diagnostics(tracker)["payload"].startswith("no tare heard")
        tare(0.9)
        declared.apply(tracker)
        assert tracker.payload_kg == 0.9 and tracker.payload_delta_kg == 0.0 and declared.first_kg == 0.9
        for bad, frame in ((float("nan"), "ft_sensor_link"), (1e3, "ft_sensor_link"), (3.4, "")):
            tare(bad, frame)
            assert "refused" in declared.problem and declared.kg == 0.9, declared.problem
            assert "refused" in declared.diagnostics(tracker)["payload"]
        tare(3.4)
        assert declared.problem is None
        declared.apply(tracker)
        assert tracker.payload_delta_kg == pytest.approx(2.5)
        fresh = _tracker(None)  # a live calibration's tracker: the payload in force, against the first tare heard
        declared.apply(fresh)
        assert fresh.payload_delta_kg == pytest.approx(2.5) and fresh.payload_reference_kg == 0.9
        recorded = _tracker(3.4)  # a calibration made with the payload on
        declared.apply(recorded)
        assert recorded.payload_delta_kg == 0.0
        assert list(fresh.payload_com_m) == [0.0, 0.0, 0.0]  # the parameter's default
    finally:
        node.destroy_node()


@pytest.mark.slow
def test_in_library_mode_a_re_tare_at_another_pose_without_a_payload_change_declares_nothing():
    """real_twin's F/T sensor has a bias: a tare's mass moves with the pose it was taken in. An
    operator's re-tare with nothing changed, at the pose the arm stopped in, must not be taken for a
    payload change: the efforts judged stay the measured ones and the level stays at FULL."""
    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.core.trust.settings import load_trust_config
    from robot_wm.learning import trust_eval as te

    given = []
    original = TrustTracker.set_payload

    def spy(self, payload_kg, first_kg=None):
        given.append((payload_kg, first_kg, original(self, payload_kg, first_kg)))
        return given[-1][2]

    cal = calib_io.load(te.default_calibration_path("real_twin"))
    TrustTracker.set_payload = spy
    try:
        run = te.operate("real_twin", 20.0, 7, calibration=cal, config=load_trust_config()[0], retare_at_s=10.0)
    finally:
        TrustTracker.set_payload = original
    assert len(given) == 2, given  # the start-up tare and the operator's: the refreshes of a latched arm are not given
    (first, _, _), (again, ref, delta) = given
    assert ref == first and delta == 0.0 and again != first, given
    late = run.t_s >= 15.0
    assert np.mean(run.level[late] == TrustLevel.FULL) >= 0.8, run.events


@pytest.mark.slow
def test_in_library_mode_a_payload_holds_the_level_down_until_the_operator_re_tares():
    """The embedded arm under the whole stack with the shipped calibration: a 2.5 kg payload at 8 s
    drops the level on the effort signal and keeps it below FULL; the operator's re-tare at 12 s
    (e-stop, tare at rest, reset: ``operate``'s ``retare_at_s``) declares it, and the level is back
    at FULL with the payload still on. A calibration made on that run records the tare it stood for."""
    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.core.trust.settings import load_trust_config
    from robot_wm.learning import trust_eval as te
    from robot_wm.learning.stack_eval import build_stack

    stack, config = build_stack(DT), load_trust_config()[0]
    cal = calib_io.load(te.default_calibration_path("nominal"))
    runs = {retare: te.operate("nominal", 24.0, 5, calibration=cal, config=config, stack=stack, fault=("payload", 8.0),
                               retare_at_s=retare) for retare in (None, 12.0)}
    for run in runs.values():
        first = next(e for e in run.events if e[0] >= 8.0)
        assert first[1] != "FULL" and EFFORT_OVER.search(first[2]), run.events
    late = runs[None].t_s >= 18.0
    assert np.mean(runs[None].level[late] == TrustLevel.FULL) < 0.5, runs[None].events
    assert np.mean(runs[12.0].level[late] == TrustLevel.FULL) >= 0.9, runs[12.0].events
    effort = runs[12.0].raw["effort_error"]
    assert np.nanmedian(effort[late]) < 0.2 * cal.thresholds["effort_error"]
    assert runs[12.0].payload_kg == pytest.approx(0.0, abs=0.05)  # the start-up tare: the profile has no payload
    made = te.calibrate_run(runs[12.0], 1e-2, load_trust_config()[1].floor_map(), config, model_version="wm", source="t")
    assert made.effort_model["payload_kg"] == pytest.approx(0.0, abs=0.05)


@pytest.mark.ros
@pytest.mark.slow
def test_live_the_filter_publishes_its_tares_and_a_re_tared_payload_brings_full_back(spawn, ros_context):
    """The whole graph on the embedded arm: the filter's start-up tare is on /robot_wm/payload; a
    3.5 kg payload from the fault injector drops the monitor's level on the effort signal; the
    operator's verbs (`robot-wm estop`, `robot-wm tare`, `robot-wm reset`) re-tare with it on, the
    filter publishes the new tare, and the monitor comes back to FULL carrying the payload."""
    import subprocess
    import sys
    import time

    from geometry_msgs.msg import InertiaStamped
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node

    from conftest import wait_for
    from robot_wm import graph
    from robot_wm.msg import TrustState
    from robot_wm.nodes.runner import SpinThread
    from robot_wm.nodes.trust_payload import PAYLOAD_QOS, PAYLOAD_TOPIC
    from robot_wm.process_group import command_for
    from robot_wm.srv import InjectFault

    specs = [s for s in graph.plan("mujoco", overrides={"profile": "nominal"}, enable=True) if not s.needs_ros_install]
    procs = {s.name: spawn(command_for(s)) for s in specs}
    node = Node("test_payload_client", context=ros_context)
    states, payloads = [], []
    node.create_subscription(TrustState, "/robot_wm/trust", states.append, 50)
    node.create_subscription(InertiaStamped, PAYLOAD_TOPIC, payloads.append, PAYLOAD_QOS)
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(node)
    spinner = SpinThread(executor)

    def stamp(msg) -> float:
        return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9

    def level_since(t0, pred):
        return any(stamp(s) >= t0 and pred(s) for s in list(states))

    def verb(*args) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "robot_wm.cli", *args, "--timeout", "20"], capture_output=True,
                              text=True, timeout=60)

    try:
        assert wait_for(lambda: level_since(0, lambda s: s.level == 0), 90.0), procs["trust_monitor"].output()[-3000:]
        assert payloads and abs(payloads[-1].inertia.m) < 0.2 and payloads[-1].header.frame_id == "ft_sensor_link", payloads
        t_fault = time.time()
        client = node.create_client(InjectFault, "/arm_sim/inject_fault")
        assert client.wait_for_service(timeout_sec=10.0)
        future = client.call_async(InjectFault.Request(kind="payload", payload_kg=3.5))
        assert wait_for(future.done, 10.0) and future.result().success
        assert wait_for(lambda: level_since(t_fault, lambda s: s.level >= 1 and EFFORT_OVER.search(s.reason)), 30.0), \
            procs["trust_monitor"].output()[-3000:]
        # the operator: e-stop, re-tare at rest (nothing touching the tool), reset
        assert verb("estop").returncode == 0
        tare = verb("tare")
        assert tare.returncode == 0, tare.stdout + tare.stderr
        assert wait_for(lambda: payloads and payloads[-1].inertia.m > 3.0, 30.0), (payloads, procs["safety_filter"].output()[-2000:])
        assert abs(payloads[-1].inertia.m - 3.5) < 0.3, payloads[-1]
        assert wait_for(lambda: verb("reset").returncode == 0, 60.0, poll_s=1.0), procs["safety_filter"].output()[-2000:]
        t_reset = time.time()
        assert wait_for(lambda: level_since(t_reset, lambda s: s.level == 0), 60.0), \
            procs["trust_monitor"].output()[-3000:] + str([(s.level, s.reason) for s in states[-3:]])
        log = procs["trust_monitor"].output()
        assert "payload tared at 3." in log and "Traceback" not in log, log[-3000:]
        shown = verb("trust", "status")  # what the operator sees: the tare and what the effort model takes off
        assert shown.returncode == 0 and re.search(r"payload: 3\.[0-9]+ kg tared; \+3\.[0-9]+ kg taken off", shown.stdout), \
            shown.stdout + shown.stderr
    finally:
        spinner.stop()
        executor.remove_node(node)
        node.destroy_node()
