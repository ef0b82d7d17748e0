"""Human intervention in the core (robot_wm.core.teleop, the monitor's operator rule) and the keyboard
mapping of `robot-wm teleop` (robot_wm.teleop_keys). The whole path through the ROS graph and the
safety filter is in test_intervention_ros.py."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from robot_wm.core.safety.limits import TrustLevel
from robot_wm.core.teleop import Intervention, Teleop, TeleopInputError
from robot_wm.core.trust import Calibration, TrustConfig, TrustMonitor
from robot_wm.teleop_keys import KeyTeleop, parse_script

HOME = np.array([0.0, -1.5708, 1.5708, -1.5708, -1.5708, 0.0])
CAP = np.array([0.45, 0.45, 0.45, 0.6, 0.6, 0.6])


@pytest.fixture(scope="module")
def kin():
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics

    urdf = description.expand()
    return Kinematics(urdf, description.joint_limits(urdf).names)


def test_the_deadman_zeroes_the_command_without_a_message_for_its_time(kin):
    t = Teleop(kin, CAP, deadman_s=0.2)
    assert np.all(t.command(0.0, HOME) == 0) and t.deadman(0.0)  # nothing received yet
    t.joint_velocity(1.0, [0.1, 0, 0, 0, 0, 0])
    assert t.command(1.19, HOME)[0] == pytest.approx(0.1)
    assert np.all(t.command(1.21, HOME) == 0) and t.deadman(1.21)
    t.clear()
    assert np.all(t.command(1.0, HOME) == 0)  # a take-over starts from zero, not from an old jog


def test_a_joint_jog_is_clipped_per_joint_and_bad_messages_are_refused(kin):
    t = Teleop(kin, CAP)
    t.joint_velocity(0.0, [10, -10, 0.1, 0, 0, 0])
    assert np.allclose(t.command(0.0, HOME), [0.45, -0.45, 0.1, 0, 0, 0])
    for bad, says in (([1.0] * 5, "6 finite values"), ([np.nan] + [0.0] * 5, "6 finite values")):
        with pytest.raises(TeleopInputError, match=says):
            t.joint_velocity(0.1, bad)
    assert np.allclose(t.command(0.1, HOME), [0.45, -0.45, 0.1, 0, 0, 0])  # the last good command holds
    with pytest.raises(TeleopInputError, match="base frame"):
        t.twist(0.1, [0.1, 0, 0], [0, 0, 0], frame_id="tool0")
    with pytest.raises(TeleopInputError, match="finite"):
        t.twist(0.1, [np.inf, 0, 0], [0, 0, 0])


@settings(max_examples=60, deadline=None)
@given(dq=st.lists(st.floats(-0.4, 0.4), min_size=6, max_size=6),
       v=st.lists(st.floats(-0.05, 0.05), min_size=3, max_size=3))
@example(dq=[0.0, -0.390625, -0.375, 0.0, 0.0, 0.0], v=[0.0, 0.046875, 0.0])  # σ_min 0.13 (CI, 2026-12-06)
def test_a_tool_twist_moves_the_tool_in_the_base_frame_as_asked(kin, dq, v):
    """A twist is followed as damped least squares promises: J q̇ = J Jᵀ (J Jᵀ + λ² I)⁻¹ x misses
    the twist x by λ² (J Jᵀ + λ² I)⁻¹ x, at most λ² / (σ_min² + λ²) of it, at every posture. Away
    from singularities (σ_min ≥ 3 λ) that is within 10 %, and large twists keep their direction
    when scaled into the per-joint caps. (Hypothesis found σ_min = 0.13, where the old "10 % once
    σ_min ≥ 0.05" could not hold: at σ_min = λ the damping halves that component by design.)"""
    q = HOME + np.asarray(dq)
    jac = kin.tool_jacobian(q)
    sigma = np.linalg.svd(jac, compute_uv=False)[-1]
    t = Teleop(kin, CAP * 10)  # caps far above what these twists need: no clipping
    t.twist(0.0, v, [0, 0, 0])
    qd = t.command(0.0, q)
    miss = np.linalg.norm(jac @ qd - np.r_[v, 0.0, 0.0, 0.0])
    lam2 = t.damping ** 2
    assert miss <= lam2 / (sigma ** 2 + lam2) * np.linalg.norm(v) + 1e-9
    if sigma < 3 * t.damping:
        return  # near a singularity DLS trades accuracy for bounded speed, by design
    assert miss <= 0.1 * np.linalg.norm(v) + 1e-9
    big = Teleop(kin, CAP)
    big.twist(0.0, np.asarray(v) * 100, [0, 0, 0])
    qd_big = big.command(0.0, q)
    assert np.all(np.abs(qd_big) <= CAP + 1e-12)
    if np.linalg.norm(v) > 1e-3:
        lin = (jac @ qd_big)[:3]
        assert np.dot(lin, v) / (np.linalg.norm(lin) * np.linalg.norm(v)) > 0.98  # the direction is kept


def test_release_only_from_rest_and_only_when_taken():
    hand = Intervention(rest_radps=0.02)
    assert hand.release("x", 0.0, np.zeros(6)) == (False, "not taken over: the policy is in command")
    ok, _ = hand.take("tool caught", 1.0)
    assert ok and hand.active and not hand.take("again", 1.5)[0]
    ok, why = hand.release("done", 2.0, np.array([0, 0, 0.05, 0, 0, 0]))
    assert not ok and "moving" in why and hand.active
    ok, why = hand.release("done", 2.0, None)
    assert not ok and "no fresh joint state" in why
    ok, why = hand.release("cleared", 3.0, np.full(6, 0.01))
    assert ok and not hand.active
    rec = hand.records[-1].to_json()
    assert rec == {"reason": "tool caught", "taken_s": 1.0, "released_s": 3.0, "release_reason": "cleared",
                   "duration_s": 2.0}


CAL = Calibration({"prediction_error": 2.0, "disagreement": 1.0, "intervention": 0.25}, 1e-3, "wm-test", "test",
                  10_000)


def _steps(m, t0, n, e=1.0, d=0.5):
    return [m.step(t0 + k * 0.01, prediction_error=e, disagreement=d, intervened=False) for k in range(n)]


def test_an_operator_in_control_gets_slow_and_a_hand_back_steps_up_without_a_jump():
    m = TrustMonitor(TrustConfig(clean_hold_s=0.5, human_after_s=0.2, human_on_anomaly=True), CAL)
    _steps(m, 0.0, 200)
    assert m.level == TrustLevel.FULL
    _steps(m, 2.0, 20, e=8.0, d=4.0)  # an anomaly with an operator standing by: HUMAN
    assert m.level == TrustLevel.HUMAN
    m.set_operator(True)  # the operator takes over: SLOW, whatever the evidence
    outs = _steps(m, 2.2, 100, e=8.0, d=4.0)
    assert {o.level for o in outs} == {TrustLevel.SLOW} and "operator in control" in outs[-1].reason
    m.set_operator(False)  # handed back: SLOW, then the usual rules
    out = _steps(m, 3.2, 1)[0]
    assert out.level == TrustLevel.HUMAN  # the anomaly is still there: the human again, at once ...
    m.set_operator(True)
    m.set_operator(False)
    outs = _steps(m, 3.3, 200)  # ... and on clean evidence one level at a time after the clean hold
    levels = [o.level for o in outs]
    assert levels[0] == TrustLevel.SLOW and levels[-1] == TrustLevel.FULL
    assert [b for a, b in zip(levels, levels[1:]) if a != b] == [TrustLevel.CAUTIOUS, TrustLevel.FULL]


def test_the_keyboard_mapping_holds_a_key_for_its_hold_time_and_stops_on_space():
    k = KeyTeleop(hold_s=0.5, joint_speed_radps=0.2)
    assert k.command(0.0) is None
    k.press("w", 1.0)
    assert k.command(1.4) == ("joint", [0.0, 0.2, 0.0, 0.0, 0.0, 0.0])
    assert k.command(1.6) is None  # released: nothing goes out, the node's deadman stops the arm
    k.press("s", 2.0)
    k.press(" ", 2.1)
    assert k.command(2.2) is None
    k.press("m", 3.0)
    k.press("r", 3.0)
    assert k.command(3.1) == ("tool", [0.0, 0.0, 0.03, 0.0, 0.0, 0.0])
    k.press("+", 3.2)
    k.press("j", 3.2)
    assert k.command(3.3)[1][4] == pytest.approx(0.3)
    k.press("\x1b", 4.0)
    assert k.quit and k.command(4.0) is None
    assert parse_script("0.1:q, 0.2:space,0:plus") == [(0.1, "q"), (0.2, " "), (0.0, "+")]
    with pytest.raises(ValueError, match="DELAY_S:KEY"):
        parse_script("q")
