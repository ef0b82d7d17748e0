"""SafetySupervisor: e-stop latch, fault latch, reset rules, STOPPING -> STOPPED, counts."""
from __future__ import annotations

import numpy as np
import pytest

from robot_wm import description
from robot_wm.core.kinematics import Kinematics
from robot_wm.core.safety import (
    FilterInput,
    FilterState,
    LinearizedModel,
    SafetyFilter,
    SafetySupervisor,
    load_safety_limits,
)

DT = 0.01
HOME = np.array([0.0, -1.5708, 1.5708, -1.5708, -1.5708, 0.0])
NAN = np.full(6, np.nan)


@pytest.fixture(scope="module")
def kin() -> Kinematics:
    urdf = description.expand()
    return Kinematics(urdf, description.joint_limits(urdf).names)


@pytest.fixture(scope="module")
def limits():
    return load_safety_limits()


@pytest.fixture
def sup(limits, kin) -> SafetySupervisor:
    return SafetySupervisor(SafetyFilter(limits, kin, DT))


class Arm:
    """A kinematic arm: the next measured velocity is the command sent (enough for state logic)."""

    def __init__(self) -> None:
        self.q, self.qd = HOME.copy(), np.zeros(6)

    def step(self, sup: SafetySupervisor, nominal, **kwargs):
        out = sup.step(FilterInput(self.q, self.qd, nominal, **kwargs))
        self.qd = out.u_safe_radps.copy()
        self.q = self.q + self.qd * DT
        return out


def _move(arm: Arm, sup: SafetySupervisor, periods: int = 20) -> None:
    for _ in range(periods):
        arm.step(sup, np.array([0.0, 0.0, 0.8, 0.0, 0.0, 1.0]))
    assert np.any(arm.qd != 0)


def test_estop_zero_on_the_first_step_and_latched_under_adversarial_inputs(sup, limits):
    arm = Arm()
    _move(arm, sup)
    ok, msg = sup.request_estop("operator pressed the button")
    assert ok and "latched" in msg and "operator pressed the button" in msg
    rng = np.random.default_rng(0)
    adversarial = [np.full(6, 1e6), -np.full(6, 3.0), NAN, np.full(6, np.inf), rng.uniform(-3, 3, 6)]
    for i in range(200):
        nominal = adversarial[i % len(adversarial)]
        out = sup.step(FilterInput(arm.q, arm.qd, nominal, trust_scale=1.0))
        assert np.array_equal(out.u_safe_radps, np.zeros(6)), i  # exactly zero from the very first step
        assert out.state == FilterState.ESTOP and "operator pressed the button" in out.fault_reason
        arm.qd = np.zeros(6)  # the hardware brakes; whatever it does, the command stays zero
    assert sup.estopped and sup.state == FilterState.ESTOP
    again, msg = sup.request_estop("second press")
    assert again and "already latched" in msg and "operator pressed the button" in msg


def test_reset_refused_while_a_fault_persists_and_accepted_after(sup):
    arm = Arm()
    _move(arm, sup)
    sup.request_estop("test")
    out = sup.step(FilterInput(arm.q, arm.qd, NAN))  # latest period: non-finite nominal
    assert out.state == FilterState.ESTOP and "input fault" in out.reason
    ok, msg = sup.reset()
    assert not ok and "fault persists" in msg and "u_nominal_radps" in msg
    assert sup.estopped
    # a healthy period clears the persisting fault; reset releases the latch
    sup.step(FilterInput(arm.q, np.zeros(6), np.zeros(6)))
    ok, msg = sup.reset()
    assert ok and "e-stop" in msg and sup.state == FilterState.OK and not sup.estopped
    arm.qd = np.zeros(6)
    out = arm.step(sup, np.array([0.0, 0.0, 0.05, 0.0, 0.0, 0.0]))
    assert out.state == FilterState.OK and out.u_safe_radps[2] == 0.05


def test_reset_with_nothing_latched_is_refused_with_a_clear_message(sup):
    ok, msg = sup.reset()
    assert not ok and "nothing to reset" in msg


def test_missing_model_is_a_fault_that_blocks_reset_until_it_returns(limits, kin):
    sup = SafetySupervisor(SafetyFilter(limits, kin, DT, require_model=True))
    q, qd = HOME.copy(), np.zeros(6)
    model = LinearizedModel(np.concatenate([q, qd]), np.vstack([DT * np.eye(6), np.eye(6)]), np.zeros(12))
    out = sup.step(FilterInput(q, qd, np.zeros(6), model=model))
    assert out.state == FilterState.OK
    out = sup.step(FilterInput(q, qd, np.zeros(6)))  # no model this period
    assert out.state == FilterState.FAULT and "world model missing" in out.fault_reason
    assert sup.latched_fault and "world model missing" in sup.latched_fault
    for _ in range(3):
        out = sup.step(FilterInput(q, qd, np.full(6, 0.5)))
        assert out.state == FilterState.FAULT and np.array_equal(out.u_safe_radps, np.zeros(6))
    ok, msg = sup.reset()
    assert not ok and "world model missing" in msg
    out = sup.step(FilterInput(q, qd, np.full(6, 0.5), model=model))
    assert out.state == FilterState.STOPPED and "reset to resume" in out.reason  # still latched, at rest
    assert np.array_equal(out.u_safe_radps, np.zeros(6))
    ok, msg = sup.reset()
    assert ok and "fault" in msg and sup.state == FilterState.OK


def test_latched_fault_brakes_to_standstill_and_never_passes_the_nominal(sup, limits):
    arm = Arm()
    _move(arm, sup)
    moving = arm.qd.copy()
    out = arm.step(sup, NAN)
    assert out.state == FilterState.FAULT and "u_nominal_radps" in out.fault_reason
    ramp = np.sign(moving) * np.maximum(np.abs(moving) - limits.stop_decel_radps2 * DT, 0.0)
    np.testing.assert_allclose(out.u_safe_radps, ramp, atol=1e-12)
    states = []
    for _ in range(30):  # healthy inputs again, but the fault is latched: keep braking
        out = arm.step(sup, np.full(6, 2.0))
        states.append(out.state)
        assert np.all(np.abs(out.u_safe_radps) <= np.abs(moving) + 1e-12)
    assert FilterState.STOPPING in states and states[-1] == FilterState.STOPPED
    assert np.array_equal(arm.qd, np.zeros(6))
    ok, _ = sup.reset()
    assert ok and arm.step(sup, np.zeros(6)).state == FilterState.OK


def test_unlatched_faults_resume_by_themselves(limits, kin):
    sup = SafetySupervisor(SafetyFilter(limits, kin, DT), latch_faults=False)
    arm = Arm()
    _move(arm, sup)
    assert arm.step(sup, NAN).state == FilterState.FAULT
    assert arm.step(sup, np.zeros(6)).state in (FilterState.OK, FilterState.FILTERING)
    assert sup.latched_fault is None


def test_trust_stop_goes_stopping_then_stopped_and_resumes(sup):
    arm = Arm()
    _move(arm, sup)
    seen = [arm.step(sup, np.full(6, 0.5), trust_scale=0.0).state for _ in range(20)]
    assert seen[0] == FilterState.STOPPING and seen[-1] == FilterState.STOPPED
    assert "trust scale 0" in sup.last_output.reason and sup.last_output.fault_reason == ""
    out = arm.step(sup, np.array([0.0, 0.0, 0.05, 0.0, 0.0, 0.0]), trust_scale=1.0)
    assert out.state == FilterState.OK  # a trust stop is not latched


def test_intervention_counts_and_diagnostics_summary(sup, limits):
    arm = Arm()
    for _ in range(150):  # drive the elbow into its upper limit at full speed
        arm.step(sup, np.array([0.0, 0.0, 3.0, 0.0, 0.0, 0.0]))
    assert arm.q[2] <= limits.upper_rad[2]
    counts = sup.constraint_counts
    assert counts["joint_limit:elbow"] > 0 and counts["tool_speed"] > 0 and counts["acceleration_limit:elbow"] > 0
    summary = sup.summary()
    assert summary["state"] in ("FILTERING", "OK") and int(summary["periods"]) == 150
    assert int(summary["active_periods:joint_limit:elbow"]) == counts["joint_limit:elbow"]
    assert "solve_time_us" in summary and "state_periods:FILTERING" in summary
    sup.request_estop("diag")
    sup.step(FilterInput(arm.q, arm.qd, np.zeros(6)))
    assert sup.summary()["estop"] == "diag" and sup.summary()["state"] == "ESTOP"
    assert sup.stop_events >= 1


def test_stale_inputs_stop_only_while_stale_unless_configured_to_latch(limits, kin):
    """Staleness (a slow or restarted publisher) halts the arm and resumes on fresh input, as
    moveit_servo does on its incoming-command timeout; with latch_stale it needs a reset."""
    for latch_stale in (False, True):
        sup = SafetySupervisor(SafetyFilter(limits, kin, DT), latch_stale=latch_stale)
        arm = Arm()
        _move(arm, sup)
        moving = np.abs(arm.qd).max()
        for _ in range(5):
            out = arm.step(sup, np.full(6, 2.0), input_age_periods=limits.stale_limit_periods + 1)
            assert out.state == FilterState.FAULT and "stale input" in out.fault_reason
        assert np.abs(arm.qd).max() < moving  # braking, never the nominal
        out = arm.step(sup, np.array([0.0, 0.0, 0.05, 0.0, 0.0, 0.0]))
        if latch_stale:
            assert out.is_stop and "reset to resume" in out.reason
        else:
            assert out.state in (FilterState.OK, FilterState.FILTERING) and sup.latched_fault is None


def test_a_momentarily_stale_input_does_not_refuse_a_reset_but_keeps_the_arm_stopped(limits, kin):
    """Staleness latches nothing (a stalled publisher stops the arm only while it is stale), so it
    does not refuse an operator's reset either; the arm moves again only once inputs are fresh.
    With latch_stale=True staleness is a latched fault and does refuse the reset."""
    for latch_stale in (False, True):
        sup = SafetySupervisor(SafetyFilter(limits, kin, DT), latch_stale=latch_stale)
        arm = Arm()
        sup.request_estop("test")
        stale = sup.step(FilterInput(arm.q, np.zeros(6), np.full(6, 0.05), input_age_periods=10))
        assert np.array_equal(stale.u_safe_radps, np.zeros(6))
        ok, msg = sup.reset()
        if latch_stale:
            assert not ok and "fault persists" in msg and "stale input" in msg
            continue
        assert ok and "stale right now" in msg and not sup.estopped
        still = sup.step(FilterInput(arm.q, np.zeros(6), np.full(6, 0.05), input_age_periods=10))
        assert still.state == FilterState.FAULT and np.array_equal(still.u_safe_radps, np.zeros(6))
        fresh = sup.step(FilterInput(arm.q, np.zeros(6), np.full(6, 0.05)))
        assert fresh.state == FilterState.OK and np.allclose(fresh.u_safe_radps, 0.05)



def test_a_long_dead_publisher_refuses_the_reset(limits, kin):
    """Stale for longer than STALE_RESET_GRACE_PERIODS in a row (a dead policy or driver): the reset
    is refused with the reason, so the arm cannot start on its own when the component returns."""
    from robot_wm.core.safety.supervisor import STALE_RESET_GRACE_PERIODS

    sup = SafetySupervisor(SafetyFilter(limits, kin, DT))
    arm = Arm()
    sup.request_estop("test")
    for _ in range(STALE_RESET_GRACE_PERIODS + 1):
        sup.step(FilterInput(arm.q, np.zeros(6), np.zeros(6), input_age_periods=10))
    ok, msg = sup.reset()
    assert not ok and f"for {STALE_RESET_GRACE_PERIODS + 1} periods" in msg and "stale input" in msg
    sup.step(FilterInput(arm.q, np.zeros(6), np.zeros(6)))  # fresh again
    ok, msg = sup.reset()
    assert ok, msg


def test_a_fault_before_the_arm_ever_moved_need_not_latch(limits, kin):
    sup = SafetySupervisor(SafetyFilter(limits, kin, DT))
    out = sup.fault("bad joint state: unknown joints ['x']", None, latch=False)
    assert out.state == FilterState.FAULT and np.array_equal(out.u_safe_radps, np.zeros(6))
    assert sup.latched_fault is None
    out = sup.fault("bad joint state: unknown joints ['x']", None)
    assert sup.latched_fault and "unknown joints" in sup.latched_fault
