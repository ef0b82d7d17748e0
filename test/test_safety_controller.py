"""SafetyController: the whole control period of the safety filter, fail-safe against every input,
parameter change, exception and restart. Each test names the way around the filter it closes
(issue #7, items 1-11); each failed on the code before SafetyController existed.

Everything runs on plain inputs with stamps, as the node feeds them; commands are checked for what
they are (zero, a ramp from the previous command, inside the acceleration box), not for how the
controller computed them.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from robot_wm.core.safety import (
    ControllerConfig,
    FaultKind,
    FilterState,
    JointSample,
    Latch,
    NominalSample,
    Phase,
    SafetyController,
    SafetyLimitsError,
    TrustLevel,
    TrustSample,
    WrenchSample,
)
from robot_wm.core.safety.qp import FORCE_RETREAT_MPS
from robot_wm.core.safety.wrench import GRAVITY_MPS2, ForceTare, estimate_tare

DT = 0.01
HOME = np.array([0.0, -1.5708, 1.5708, -1.5708, -1.5708, 0.0])
FT = "ft_sensor_link"


def config(**kw) -> ControllerConfig:
    """A config for tests: no world model, full trust in SIM, no F/T sensor unless asked."""
    base = dict(dt_s=DT, require_model=False, default_trust_level=TrustLevel.FULL, default_phase=Phase.SIM,
                force_sensor=False)
    base.update(kw)
    return ControllerConfig(**base)


class Rig:
    """A controller and a clock: ``step`` feeds fresh samples (or the ones given) one period later."""

    def __init__(self, ctrl: SafetyController, q=HOME, qd=None) -> None:
        self.ctrl = ctrl
        self.t = 0.0
        self.q = np.array(q, dtype=float)
        self.qd = np.zeros(6) if qd is None else np.array(qd, dtype=float)
        self.nominal = np.zeros(6)
        self.wrench: np.ndarray | None = None
        self.trust: tuple[int, int] | None = None
        self.integrate = True  # move q, qd as a perfect drive would (qd = command)

    def step(self, **override):
        self.t += DT
        t = self.t
        kw = dict(joint=JointSample(self.q, self.qd, t), nominal=NominalSample(self.nominal, t))
        if self.wrench is not None:
            kw["wrench"] = WrenchSample(self.wrench, t, FT)
        if self.trust is not None:
            kw["trust"] = TrustSample(*self.trust, t)
        kw.update(override)
        out = self.ctrl.step(t, **kw)
        if self.integrate:
            self.qd = out.u_safe_radps.copy()
            self.q = self.q + self.qd * DT
        return out

    def run(self, periods: int, **override):
        return [self.step(**override) for _ in range(periods)]

    def enable(self):
        """Step until an operator reset is accepted (inputs healthy), then one more period."""
        for _ in range(100):
            self.step()
            ok, msg = self.ctrl.reset()
            if ok:
                return msg
        raise AssertionError(f"reset never accepted: {msg}")


def moving(rig: Rig, nominal, periods=30) -> Rig:
    rig.nominal = np.array(nominal, dtype=float)
    rig.run(periods)
    assert np.any(np.abs(rig.qd) > 0.1), rig.ctrl.last_output
    return rig


def is_ramp_from(u, u_prev, limits, elapsed=DT) -> bool:
    """u is one step of the controlled stop from u_prev."""
    expected = np.sign(u_prev) * np.maximum(np.abs(u_prev) - limits.stop_decel_radps2 * elapsed, 0.0)
    return np.allclose(u, expected, atol=1e-12)


# ---------------------------------------------------------------------- 9: start latched
def test_a_new_controller_starts_latched_until_an_operator_enables_it(kin, limits):
    """Item 9: a (re)started filter — crash, respawn, manual restart, cleanup -> configure — must not
    resume motion on the first nominal command: it starts latched, commanding exactly zero."""
    rig = Rig(SafetyController(limits, kin, config()))
    rig.nominal = np.array([0.5, 0, 0, 0, 0, 0])
    for out in rig.run(50):
        assert out.state == FilterState.ESTOP and np.array_equal(out.u_safe_radps, np.zeros(6))
        assert out.latches == ("start",) and "waiting for operator enable" in out.reason
    ok, msg = rig.ctrl.reset()
    assert ok and "start" in msg
    assert rig.step().state in (FilterState.OK, FilterState.FILTERING)
    moving(rig, [0.5, 0, 0, 0, 0, 0])


def test_auto_enable_releases_only_the_start_latch_and_only_once(kin, limits):
    rig = Rig(SafetyController(limits, kin, config(auto_enable=True)))
    assert rig.step().latches == ("start",)
    moving(rig, [0.3, 0, 0, 0, 0, 0])
    rig.ctrl.request_estop("test")
    rig.run(5)
    assert rig.ctrl.supervisor.latched  # an e-stop is never released by auto_enable
    rig.ctrl.reset()
    rig.ctrl.hold("deactivated (lifecycle)")
    assert all(o.state == FilterState.ESTOP for o in rig.run(20))  # nor a later start latch


def test_latches_carried_into_a_new_controller_survive_it(kin, limits):
    """Lifecycle cleanup -> configure builds a new controller: the latches of the old one come along."""
    old = SafetyController(limits, kin, config())
    old.request_estop("operator e-stop")
    new = SafetyController(limits, kin, config(), latches=old.supervisor.latches)
    assert set(new.supervisor.latches) == {Latch.START, Latch.ESTOP}
    assert "operator e-stop" in Rig(new).step().reason


# ---------------------------------------------------------------------- 1: parameters in place
@pytest.mark.parametrize("change", ["same_value", "tightened"])
def test_a_parameter_change_never_releases_a_latched_fault(kin, limits, change):
    """Item 1: a NaN nominal latches a FAULT; setting a safety limit (to its current value, or
    tighter) is applied in place and changes nothing about the latch: the arm stays stopped."""
    rig = Rig(SafetyController(limits, kin, config()))
    rig.enable()
    moving(rig, [0.4, 0, 0, 0, 0, 0])
    out = rig.step(nominal=NominalSample([np.nan] * 6, rig.t + DT))
    assert out.state == FilterState.FAULT and out.fault_kind == FaultKind.NOMINAL and "fault" in out.latches
    new = limits if change == "same_value" else dataclasses.replace(limits, tool_speed_max_mps=0.45)
    assert rig.ctrl.set_limits(new) == (change == "tightened")
    assert rig.ctrl.limits == new
    outs = rig.run(40)  # healthy nominal again
    assert all(o.is_stop and "fault" in o.latches for o in outs)
    assert np.array_equal(outs[-1].u_safe_radps, np.zeros(6)) and outs[-1].state == FilterState.STOPPED
    assert rig.ctrl.reset()[0]
    assert rig.step().state in (FilterState.OK, FilterState.FILTERING)


def test_an_e_stop_survives_a_parameter_change(kin, limits):
    rig = Rig(SafetyController(limits, kin, config()))
    rig.enable()
    rig.ctrl.request_estop("operator")
    rig.ctrl.set_limits(dataclasses.replace(limits, tool_speed_max_mps=0.3))
    assert all(o.state == FilterState.ESTOP and not np.any(o.u_safe_radps) for o in rig.run(10))


def test_limits_the_arm_cannot_use_are_refused_and_nothing_changes(kin, limits):
    ctrl = SafetyController(limits, kin, config())
    looser_than_urdf = dataclasses.replace(limits, velocity_max_radps=(9.0,) * 6)
    with pytest.raises(SafetyLimitsError, match="exceeds the URDF"):
        ctrl.set_limits(looser_than_urdf)
    assert ctrl.limits == limits
    ctrl.parameter_fault("safety.tool_speed_max_mps=-1.0: expected a finite value in (0.0, 3.0] m/s")
    assert Latch.FAULT in ctrl.supervisor.latches and "bad parameter" in ctrl.supervisor.latches[Latch.FAULT]


# ---------------------------------------------------------------------- 2, inputs: malformed -> latched FAULT
@pytest.mark.parametrize("bad", [
    dict(trust=TrustSample(99, 0, 0.0)),
    dict(trust=TrustSample(0, 7, 0.0)),
    dict(trust=TrustSample("full", 0, 0.0)),
    dict(nominal=NominalSample([0.1] * 5, 0.0)),
    dict(nominal=NominalSample([0.1, np.inf, 0, 0, 0, 0], 0.0)),
    dict(joint=JointSample(None, None, 0.0, error="joint_states: unknown joints ['gripper_joint']")),
    dict(joint=JointSample([0.0] * 6, [np.nan] * 6, 0.0)),
], ids=["trust_level_99", "trust_phase_7", "trust_level_text", "nominal_5_values", "nominal_inf",
        "joint_unknown_name", "joint_nan"])
def test_every_malformed_input_is_a_latched_fault_naming_it_never_an_exception(kin, limits, bad):
    """Item 2 (and its kin): one malformed message stops the arm by a controlled stop from the last
    command, latches a FAULT whose reason names the input, and no exception leaves the controller."""
    rig = Rig(SafetyController(limits, kin, config()))
    rig.trust = (TrustLevel.FULL, Phase.SIM)
    rig.enable()
    moving(rig, [0.0, 0.0, 0.6, 0.0, 0.0, 0.0])
    last = rig.qd.copy()
    t = rig.t + DT
    sample = {k: dataclasses.replace(v, stamp_s=t) for k, v in bad.items()}
    out = rig.step(**sample)
    kind = out.fault_kind
    assert out.state == FilterState.FAULT and "fault" in out.latches
    assert kind in (FaultKind.TRUST, FaultKind.NOMINAL, FaultKind.JOINT_STATE) and kind.text in out.reason
    assert is_ramp_from(out.u_safe_radps, last, limits)
    outs = rig.run(40)  # healthy again: the latch holds, the stop completes
    assert all(o.is_stop for o in outs) and np.array_equal(outs[-1].u_safe_radps, np.zeros(6))
    assert rig.ctrl.reset()[0]


def test_reset_is_refused_while_the_malformed_input_persists(kin, limits):
    rig = Rig(SafetyController(limits, kin, config()))
    rig.enable()
    rig.nominal = np.array([np.nan] * 6)
    rig.run(3)
    ok, msg = rig.ctrl.reset()
    assert not ok and "fault persists" in msg and "nominal" in msg
    rig.nominal = np.zeros(6)
    rig.step()
    assert rig.ctrl.reset()[0]


# ---------------------------------------------------------------------- 3: exceptions
def test_an_exception_inside_a_period_is_a_controlled_stop_and_a_latched_fault(kin, limits, monkeypatch):
    """Item 3: whatever raises inside the period (here the QP itself) gives a controlled stop from
    the last command and a latched FAULT; the traceback comes out once, not every period."""
    rig = Rig(SafetyController(limits, kin, config()))
    rig.enable()
    moving(rig, [0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    last = rig.qd.copy()

    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(rig.ctrl.filter, "filter", broken)
    monkeypatch.setattr(rig.ctrl.filter, "filter_checked", broken)  # what the controller calls
    first = rig.step()
    assert first.state == FilterState.FAULT and first.fault_kind == FaultKind.INTERNAL and "fault" in first.latches
    assert "ZeroDivisionError: boom" in first.reason and "Traceback" in first.traceback
    assert is_ramp_from(first.u_safe_radps, last, limits)
    later = rig.run(30)
    assert all(o.traceback == "" for o in later) and np.array_equal(later[-1].u_safe_radps, np.zeros(6))
    monkeypatch.undo()
    assert all(o.is_stop for o in rig.run(5))  # latched: the QP works again, the arm stays stopped
    assert rig.ctrl.reset()[0]


def test_a_world_model_that_raises_is_a_latched_model_fault(kin, limits):
    """A world model that raises is a latched MODEL fault, and it is checked while latched too: an
    operator's reset is refused for as long as the model is broken, naming it."""

    class Broken:
        broken = False

        def linearize_with_std(self, q, qd, u):
            if self.broken:
                raise RuntimeError("onnxruntime: invalid input")
            return _lagged().linearize_with_std(q, qd, u)

        def commit(self, u):
            pass

    model = Broken()
    rig = Rig(SafetyController(limits, kin, config(require_model=True), model=model))
    rig.enable()
    moving(rig, [0.3, 0, 0, 0, 0, 0])
    model.broken = True
    out = rig.step()
    assert out.state == FilterState.FAULT and out.fault_kind == FaultKind.MODEL and "linearization failed" in out.reason
    assert Latch.FAULT in rig.ctrl.supervisor.latches
    rig.run(30)
    ok, msg = rig.ctrl.reset()
    assert not ok and "linearization failed" in msg
    model.broken = False
    rig.step()
    assert rig.ctrl.reset()[0]


# ---------------------------------------------------------------------- 4: force
def _lagged(beta=0.3):
    class Lagged:
        """A world model of a lagging drive (what made the old force row bound the wrong thing)."""

        def linearize_with_std(self, q, qd, u):
            q, qd, u = (np.asarray(x, dtype=float) for x in (q, qd, u))
            qd_next = qd + beta * (u - qd)
            f0 = np.concatenate([q + DT * 0.5 * (qd + qd_next), qd_next])
            return f0, np.vstack([0.5 * DT * beta * np.eye(6), beta * np.eye(6)]), np.full(12, 1e-4)

        def commit(self, u):
            pass

    return Lagged()


def _at_rest_with_sensor(kin, limits, **kw) -> Rig:
    rig = Rig(SafetyController(limits, kin, config(force_sensor=True, **kw), model=kw.pop("model", None)))
    rig.integrate = False
    rig.wrench = np.zeros(3)
    return rig


def test_with_the_world_model_the_force_row_bounds_the_command(kin, limits):
    """Item 4a: F = 17 N pushing the tool up (a table), a lagging world model, a nominal straight
    down into the contact: the COMMANDED tool velocity must not point into the contact (the old
    row bounded the model's predicted next velocity, which lags the command)."""
    ctrl = SafetyController(limits, kin, config(force_sensor=True, require_model=True), model=_lagged())
    rig = Rig(ctrl)
    rig.wrench = np.zeros(3)
    rig.enable()
    jv = kin.tool_jacobian(rig.q)[:3]
    rot = kin.frame_pose(rig.q, FT).rotation
    rig.wrench = rot.T @ np.array([0.0, 0.0, 17.0])  # the sensor reads the table pushing up on the tool
    rig.nominal = np.linalg.pinv(jv) @ np.array([0.0, 0.0, -0.3])
    for out in rig.run(20):
        assert out.state in (FilterState.OK, FilterState.FILTERING), out.reason
        v = kin.tool_jacobian(rig.q - rig.qd * DT)[:3] @ out.u_safe_radps
        assert v[2] >= -1e-6, f"commanded {v[2]:.4f} m/s into the contact"
    assert "contact_force" in out.active_constraints


def test_above_the_force_limit_the_tool_retreats(kin, limits):
    rig = _at_rest_with_sensor(kin, limits)
    rig.integrate = True
    rig.enable()
    rot = kin.frame_pose(rig.q, FT).rotation
    rig.wrench = rot.T @ np.array([0.0, 0.0, 1.5 * limits.force_limit_n])
    rig.nominal = np.zeros(6)  # the policy would stay pressed in
    outs = rig.run(10)
    v = kin.tool_jacobian(rig.q)[:3] @ outs[-1].u_safe_radps
    assert "contact_force" in outs[-1].active_constraints and v[2] >= FORCE_RETREAT_MPS - 1e-6


def test_a_force_sensor_that_never_spoke_is_a_fault_and_refuses_the_enable(kin, limits):
    """Item 4b: with force_sensor the contact-force limit is not silently off for lack of a wrench."""
    rig = Rig(SafetyController(limits, kin, config(force_sensor=True)))
    out = rig.run(40)[-1]
    assert out.state == FilterState.ESTOP and out.fault_kind == FaultKind.MISSING and "no wrench" in out.reason
    ok, msg = rig.ctrl.reset()
    assert not ok and "no wrench" in msg


def test_a_stale_wrench_stops_the_arm_like_any_stale_input(kin, limits):
    """Item 4c: the wrench's age counts like the other inputs'."""
    rig = _at_rest_with_sensor(kin, limits)
    rig.integrate = True
    rig.enable()
    moving(rig, [0.3, 0, 0, 0, 0, 0])
    t_last = rig.t
    outs = rig.run(20, wrench=WrenchSample(np.zeros(3), t_last, FT))
    assert any(o.fault_kind == FaultKind.STALE and "wrench" in o.reason for o in outs)
    assert np.array_equal(outs[-1].u_safe_radps, np.zeros(6))


def test_the_tare_is_taken_at_rest_out_of_contact_and_refused_in_contact(kin, limits):
    """Item 4d: no tare while something presses on the tool at start-up (the old filter tared during
    its first 0.3 s whatever the contact), and no tare while the arm moves."""
    rig = _at_rest_with_sensor(kin, limits)
    rot = kin.frame_pose(rig.q, FT).rotation
    rig.wrench = rot.T @ np.array([0.0, 0.0, 15.0])  # resting on something that pushes up 15 N
    out = rig.run(60)[-1]
    assert not rig.ctrl.tare.ready and "payload of -1.53 kg" in rig.ctrl.tare.last_refusal
    assert not rig.ctrl.reset()[0] and "not tared" in out.reason
    rig.wrench = rot.T @ np.array([12.0, 0.0, 0.0])  # a sideways contact
    rig.run(60)
    assert not rig.ctrl.tare.ready and "bias" in rig.ctrl.tare.last_refusal
    rig.wrench = rot.T @ np.array([0.3, -0.2, -0.8 * GRAVITY_MPS2])  # free: a 0.8 kg payload and a little bias
    rig.run(40)
    assert rig.ctrl.tare.ready and rig.ctrl.tare.tare.payload_kg == pytest.approx(0.8, abs=0.05)
    taken = rig.ctrl.tare.tares_taken
    rig.integrate = True
    rig.enable()
    moving(rig, [0.3, 0, 0, 0, 0, 0], periods=60)
    assert rig.ctrl.tare.tares_taken == taken  # never while moving under the policy


def test_the_tare_is_taken_on_a_resting_arm_with_noisy_velocity_and_never_on_a_creeping_one(kin, limits):
    """A resting arm whose encoders report 0.01 rad/s of velocity noise per sample (the worn_heavy
    profile) is at rest: the tare is taken and the enable accepted. Judged per sample, 0.75**30 of
    the windows would qualify and the stack never came up. An arm creeping at 0.03 rad/s under the
    same noise is not at rest: no tare."""
    rng = np.random.default_rng(0)
    rot = kin.frame_pose(HOME, FT).rotation
    for creep, expect in ((0.0, True), (0.03, False)):
        rig = _at_rest_with_sensor(kin, limits)
        rig.wrench = rot.T @ np.array([0.0, 0.0, -0.8 * GRAVITY_MPS2])
        for _ in range(100):
            rig.qd = np.array([creep, 0, 0, 0, 0, 0]) + rng.normal(0.0, 0.01, 6)
            rig.step()
        assert rig.ctrl.tare.ready is expect, (creep, rig.ctrl.last_output.reason)
        assert rig.ctrl.reset()[0] is expect


def test_the_tare_keeps_bias_in_the_sensor_frame_and_weight_in_the_base_frame(kin):
    """Item 4e: tared at one pose, the contact force at a very different wrist orientation is the
    true contact force, to within the part of the bias that lay along gravity at the tare pose."""
    bias = np.array([0.5, -0.3, 1.2])
    mass = 0.8
    q0, q1 = HOME.copy(), HOME + np.array([0.0, 0.0, 0.0, 0.9, 1.2, 0.7])
    reading = lambda q, contact: (kin.frame_pose(q, FT).rotation.T  # noqa: E731
                                  @ (np.array([0.0, 0.0, -mass * GRAVITY_MPS2]) + contact) + bias)
    tare = ForceTare(window_periods=1)
    tare.observe(reading(q0, np.zeros(3)), kin.frame_pose(q0, FT).rotation, at_rest=True)
    contact = np.array([0.0, 5.0, 3.0])
    got = tare.tare.contact_force_base(reading(q1, contact), kin.frame_pose(q1, FT).rotation)
    c0 = -(kin.frame_pose(q0, FT).rotation.T @ np.array([0.0, 0.0, 1.0]))
    assert np.linalg.norm(got - contact) <= 2 * abs(bias @ c0) + 1e-9
    # a base-frame tare (the old filter's) is off by the bias rotated with the wrist
    base_tare = kin.frame_pose(q0, FT).rotation @ reading(q0, np.zeros(3))
    old = kin.frame_pose(q1, FT).rotation @ reading(q1, contact) - base_tare
    assert np.linalg.norm(got - contact) < np.linalg.norm(old - contact)
    single = estimate_tare(reading(q0, np.zeros(3)), kin.frame_pose(q0, FT).rotation)
    assert single.payload_kg == pytest.approx(mass + (bias @ c0) / GRAVITY_MPS2)


def test_the_payload_acceleration_follows_the_sensor_frames_true_acceleration(kin):
    """Item 4f: from noisy measured velocities at 100 Hz the estimate of the F/T frame's acceleration
    follows the true one (pinocchio's J q̈ + J̇ q̇ on the exact trajectory) within a fraction of its
    size; a gap in the samples or a stamp going back starts the estimate again from zero, a repeated
    stamp changes nothing, a velocity jump no drive makes is held back once as a glitch (taken the
    second time: a hit), and the estimate never exceeds its clamp."""
    from robot_wm.core.safety.wrench import PayloadAcceleration

    rng = np.random.default_rng(4)
    w, amp = np.array([3.0, 2.5, 4.0, 3.5, 2.0, 3.0]), 0.4
    q = lambda t: HOME + amp * np.sin(w * t)  # noqa: E731
    qd = lambda t: amp * w * np.cos(w * t)  # noqa: E731
    qdd = lambda t: -amp * w * w * np.sin(w * t)  # noqa: E731
    est = PayloadAcceleration(kin, FT, tau_s=0.02, max_gap_s=0.03, qdd_max_radps2=20.0)
    errors, sizes = [], []
    for k in range(300):
        t = k * DT
        got = est.update(t, q(t), qd(t) + rng.normal(0.0, 0.01, 6))
        if t > 0.2:
            true = kin.frame_linear_acceleration(q(t), qd(t), qdd(t), FT)
            errors.append(np.linalg.norm(got - true))
            sizes.append(np.linalg.norm(true))
    assert np.sqrt(np.mean(np.square(errors))) < 0.25 * np.sqrt(np.mean(np.square(sizes))), (np.mean(errors), np.mean(sizes))
    assert np.linalg.norm(est.qdd) > 1.0
    still = est.update(300 * DT + 0.5, q(0), np.zeros(6))  # after a gap: no difference across it
    assert np.array_equal(est.qdd, np.zeros(6)) and np.allclose(still, 0.0, atol=1e-9)
    t = 300 * DT + 0.5
    est.update(t + DT, q(0), np.full(6, 0.1))  # 10 rad/s² for one period: taken
    first = est.qdd.copy()
    assert np.all(first > 0.0)
    est.update(t + DT, q(0), np.full(6, 9.0))  # the same stamp again: the same sample, nothing changes
    assert np.array_equal(est.qdd, first)
    est.update(t + 2 * DT, q(0), np.full(6, 1.6))  # a jump of 1.5 rad/s in a period: a glitch, held back
    assert np.array_equal(est.qdd, first) and est.glitches == 1
    est.update(t + 3 * DT, q(0), np.full(6, 0.1))  # back: differenced against the last good sample
    assert np.all(np.abs(est.qdd) < np.abs(first))
    est.update(t + 4 * DT, q(0), np.full(6, 1.6))  # a real change of speed (a hit): held once ...
    est.update(t + 5 * DT, q(0), np.full(6, 1.6))  # ... then taken, and never past the clamp
    assert est.glitches == 2 and np.all(est.qdd > 0.0) and np.all(np.abs(est.qdd) <= 20.0)
    est.update(300 * DT + 0.40, q(0), np.zeros(6))  # a stamp going back
    assert np.array_equal(est.qdd, np.zeros(6))
    with pytest.raises(ValueError, match="payload_accel_tau_s"):
        config(payload_accel_tau_s=-0.1)


def test_a_heavy_payloads_own_inertia_is_not_read_as_contact_and_a_velocity_glitch_makes_none(kin, limits):
    """Item 4g, through the controller: a 2.5 kg payload tared at rest, then the arm moving on a smooth
    path whose sensor reads the payload's weight and inertia only (no contact). The contact force the
    filter uses stays near zero, where without the compensation it is the inertia itself; one
    glitching velocity sample of 1.5 rad/s adds no phantom force."""
    mass = 2.5
    w, amp = np.array([6.0, 5.0, 7.0, 6.0, 4.0, 5.0]), 0.15
    q = lambda t: HOME + amp * np.sin(w * t)  # noqa: E731
    qd = lambda t: amp * w * np.cos(w * t)  # noqa: E731
    qdd = lambda t: -amp * w * w * np.sin(w * t)  # noqa: E731

    def reading(t, qd_t=None):
        a = kin.frame_linear_acceleration(q(t), qd(t), qdd(t), FT)
        return kin.frame_pose(q(t), FT).rotation.T @ (np.array([0.0, 0.0, -mass * GRAVITY_MPS2]) - mass * a)

    def run(tau):
        rig = Rig(SafetyController(limits, kin, config(force_sensor=True, payload_accel_tau_s=tau)), q=q(0.0), qd=qd(0.0) * 0)
        rig.integrate = False
        rig.wrench = kin.frame_pose(q(0.0), FT).rotation.T @ np.array([0.0, 0.0, -mass * GRAVITY_MPS2])
        rig.enable()
        assert rig.ctrl.tare.tare.payload_kg == pytest.approx(mass, abs=0.01)
        t0, forces = rig.t, []
        for k in range(1, 200):
            t = rig.t + DT
            glitch = np.array([1.5, 0, 0, 0, 0, 0]) if k == 120 else 0.0
            out = rig.step(joint=JointSample(q(t - t0), qd(t - t0) + glitch, t), nominal=NominalSample(qd(t - t0), t),
                           wrench=WrenchSample(reading(t - t0), t, FT))
            if k > 20:
                forces.append(np.linalg.norm(out.force_base_n))
        return np.array(forces)

    with_, without = run(0.02), run(0.0)
    assert without.max() > 10.0  # the inertia, read as contact without the compensation
    # what is left is the estimate's lag (about tau + a period) on a path this quick: a quarter at most
    assert with_.max() < 0.25 * without.max() and np.median(with_) < 0.25 * np.median(without), (with_.max(), np.median(with_))
    assert np.max(np.abs(np.diff(with_[95:105]))) < 0.5  # the glitch (period 120) made no phantom force


# ---------------------------------------------------------------------- 5: trust fails safe
def test_no_trust_state_means_the_configured_default_and_stop_by_default(kin, limits):
    """Item 5a: the code default before the first TrustState is STOP (a graph with a trust monitor
    must not move before it speaks); a graph without one configures its level explicitly."""
    assert ControllerConfig(dt_s=DT).default_trust_level == TrustLevel.STOP
    rig = Rig(SafetyController(limits, kin, config(default_trust_level=TrustLevel.STOP)))
    rig.nominal = np.array([0.3, 0, 0, 0, 0, 0])
    out = rig.run(5)[-1]
    assert set(out.latches) == {"start", "trust"} and "STOP" in out.reason
    ok, msg = rig.ctrl.reset()
    assert not ok and "trust level is STOP" in msg
    rig.trust = (TrustLevel.FULL, Phase.SIM)
    rig.step()
    assert rig.ctrl.reset()[0]
    moving(rig, [0.3, 0, 0, 0, 0, 0])


def test_a_stale_trust_state_stops_the_arm(kin, limits):
    """Item 5b: a TrustState older than trust_timeout_s does not fall back to FULL: it stops."""
    rig = Rig(SafetyController(limits, kin, config(trust_timeout_s=0.2)))
    rig.trust = (TrustLevel.FULL, Phase.SIM)
    rig.enable()
    moving(rig, [0.3, 0, 0, 0, 0, 0])
    t_last = rig.t
    outs = rig.run(60, trust=TrustSample(TrustLevel.FULL, Phase.SIM, t_last))
    stale = [o for o in outs if o.fault_kind == FaultKind.STALE]
    assert stale and "trust state" in stale[-1].reason and np.array_equal(outs[-1].u_safe_radps, np.zeros(6))


def test_trust_stop_and_human_are_latched_until_a_moving_level_and_a_reset(kin, limits):
    """Item 5c: STOP/HUMAN hold the arm even after the monitor says FULL again; an operator resets."""
    for level in (TrustLevel.STOP, TrustLevel.HUMAN):
        rig = Rig(SafetyController(limits, kin, config()))
        rig.trust = (TrustLevel.FULL, Phase.SIM)
        rig.enable()
        moving(rig, [0.3, 0, 0, 0, 0, 0])
        rig.trust = (level, Phase.SIM)
        rig.run(3)
        assert not rig.ctrl.reset()[0]
        rig.trust = (TrustLevel.FULL, Phase.SIM)
        outs = rig.run(40)
        assert all(o.is_stop and "trust" in o.latches for o in outs)
        assert outs[-1].state == FilterState.STOPPED and "reset to resume" in outs[-1].reason
        assert rig.ctrl.reset()[0]
        moving(rig, [0.3, 0, 0, 0, 0, 0])


# ---------------------------------------------------------------------- 6, 7: the previous command, never a stale or glitchy measurement
def test_after_a_reset_with_a_stale_input_the_stop_ramps_from_the_last_command(kin, limits):
    """Item 6: e-stop (command zero), the joint state goes stale while reporting 0.85 rad/s, reset
    accepted (momentarily stale): the commands stay exactly zero — never a ramp down from the
    stale measured 0.85, 0.70, 0.55 rad/s."""
    rig = Rig(SafetyController(limits, kin, config()))
    rig.enable()
    moving(rig, [0.85, 0, 0, 0, 0, 0])
    rig.ctrl.request_estop("operator")
    rig.integrate = False
    stale_joint = JointSample(rig.q, np.array([0.85, 0, 0, 0, 0, 0]), rig.t)
    rig.run(8, joint=stale_joint)
    ok, msg = rig.ctrl.reset()
    assert ok and "stale" in msg
    outs = rig.run(10, joint=stale_joint)
    assert all(np.array_equal(o.u_safe_radps, np.zeros(6)) for o in outs), [o.u_safe_radps[0] for o in outs]


def test_a_glitchy_velocity_sample_does_not_open_the_acceleration_box(kin, limits):
    """Item 7: after a zero command, one sample claiming 1.5 rad/s must not let 1.6 rad/s through:
    the box and the trust speed cap are built around the previous command, not the measurement."""
    rig = Rig(SafetyController(limits, kin, config()))
    rig.enable()
    rig.run(5)  # at rest, commanding zero
    glitch = JointSample(rig.q, np.array([1.5, 0, 0, 0, 0, 0]), rig.t + DT)
    out = rig.step(joint=glitch, nominal=NominalSample([1.6, 0, 0, 0, 0, 0], rig.t + DT))
    assert abs(out.u_safe_radps[0]) <= limits.accel_max_radps2[0] * DT + 1e-9
    assert out.state == FilterState.FILTERING and "acceleration_limit:shoulder_pan" in out.active_constraints


# ---------------------------------------------------------------------- 8: implausible model
def test_an_implausible_world_model_slope_is_a_fault_with_require_model(kin, limits):
    """Item 8: docs say FAULT; the old filter quietly used the kinematic model instead. The fault is
    transient (the arm stops while the slope is implausible: a controlled stop from the last command)."""

    class BackwardsForTheElbow:
        def linearize_with_std(self, q, qd, u):
            f0, b, sig = _lagged().linearize_with_std(q, qd, u)
            if abs(u[2]) > 0:  # commanding the elbow: the model says faster means slower
                b = b.copy()
                b[6 + 2, 2] = -0.2
            return f0, b, sig

        def commit(self, u):
            pass

    rig = Rig(SafetyController(limits, kin, config(require_model=True), model=BackwardsForTheElbow()))
    rig.enable()
    moving(rig, [0.3, 0, 0, 0, 0, 0])
    last = rig.qd.copy()
    rig.nominal = np.array([0.3, 0.0, 0.3, 0.0, 0.0, 0.0])
    out = rig.step()
    assert out.state == FilterState.FAULT and out.fault_kind == FaultKind.MODEL_IMPLAUSIBLE and not out.latches
    assert is_ramp_from(out.u_safe_radps, last, limits)
    rig.nominal = np.array([0.3, 0, 0, 0, 0, 0])
    assert rig.run(30)[-1].state in (FilterState.OK, FilterState.FILTERING)  # plausible again: it resumes


# ---------------------------------------------------------------------- 11: soft-row slack
def test_soft_constraint_slack_beyond_tolerance_for_too_long_latches_a_fault(kin, limits):
    """Item 11: the slack of the soft rows is reported AND acted on. A trust drop while the tool
    moves at the speed limit leaves the tool faster than the new limit for a few periods (braking
    at a_max); with a zero tolerance and 20 ms that latches a FAULT naming the family."""
    rig = Rig(SafetyController(limits, kin, config(slack_tolerance=(0.0, 0.0, 0.0), slack_time_s=0.02)))
    rig.trust = (TrustLevel.FULL, Phase.SIM)
    rig.enable()
    moving(rig, [1.5, 0, 0, 0, 0, 0], periods=60)  # the pan at the tool-speed limit (0.5 m/s)
    rig.trust = (TrustLevel.SLOW, Phase.SIM)
    outs = rig.run(20)
    first = next((i for i, o in enumerate(outs) if o.fault_kind == FaultKind.SLACK), None)
    assert first is not None and "tool_speed_mps" in outs[first].reason and "fault" in outs[first].latches
    assert all(o.is_stop for o in outs[first:])


def test_the_default_slack_tolerance_never_trips_on_a_trust_drop(kin, limits):
    rig = Rig(SafetyController(limits, kin, config()))
    rig.trust = (TrustLevel.FULL, Phase.SIM)
    rig.enable()
    moving(rig, [1.5, 0, 0, 0, 0, 0], periods=60)
    assert rig.ctrl.last_output.active_constraints == ("tool_speed",)
    rig.trust = (TrustLevel.SLOW, Phase.SIM)
    assert not any(o.is_stop for o in rig.run(40))


# ---------------------------------------------------------------------- config and e-stop
def test_e_stop_is_zero_at_once_and_latched_under_adversarial_inputs(kin, limits):
    rig = Rig(SafetyController(limits, kin, config()))
    rig.enable()
    moving(rig, [0.5, -0.4, 0.6, 0.0, 0.0, 1.0])
    ok, msg = rig.ctrl.request_estop("operator e-stop")
    assert ok and "latched" in msg and np.array_equal(rig.ctrl.last_command, np.zeros(6))
    rng = np.random.default_rng(0)
    for _ in range(50):
        rig.nominal = rng.uniform(-3, 3, 6)
        out = rig.step()
        assert out.state == FilterState.ESTOP and np.array_equal(out.u_safe_radps, np.zeros(6))
    assert rig.ctrl.request_estop("again")[1].startswith("e-stop already latched")
    assert rig.ctrl.reset()[0] and not rig.ctrl.reset()[0]  # then nothing to reset


@pytest.mark.parametrize("field,value,match", [
    ("dt_s", 0.0, "dt_s"), ("default_trust_level", 9, "default_trust_level"), ("default_phase", -1, "default_phase"),
    ("trust_timeout_s", float("nan"), "trust_timeout_s"), ("slack_tolerance", (0.1, 0.1), "slack_tolerance"),
])
def test_a_bad_controller_config_names_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        ControllerConfig(**{"dt_s": DT, field: value})


def test_diagnostics_summary_names_latches_tare_and_counts(kin, limits):
    rig = Rig(SafetyController(limits, kin, config()))
    rig.run(3)
    summary = rig.ctrl.summary()
    assert summary["state"] == "ESTOP" and "start" in summary["latches"] and summary["ft_tare"].startswith("off")
    rig.ctrl.reset()
    rig.nominal = np.array([3.0, 0, 0, 0, 0, 0])
    rig.run(5)
    summary = rig.ctrl.summary()
    assert summary["latches"] == "" and int(summary["active_periods:acceleration_limit:shoulder_pan"]) >= 4


# ---------------------------------------------------------------------- what the review found
def test_a_malformed_message_replaced_within_a_period_still_latches(kin, limits):
    """The period reads only the newest sample of each input; a malformed message followed by a good
    one before the next period is seen on arrival (note) and still latches, and a trust STOP/HUMAN
    followed by FULL within a period still latches the trust latch."""
    rig = Rig(SafetyController(limits, kin, config()))
    rig.trust = (TrustLevel.FULL, Phase.SIM)
    rig.enable()
    moving(rig, [0.3, 0, 0, 0, 0, 0])
    for bad in (NominalSample([np.nan] * 6, rig.t), JointSample(None, None, rig.t, error="joint_states: 5 names"),
                TrustSample(42, 0, rig.t)):
        rig.ctrl.note(bad)  # ... then the good message arrives before the period
        out = rig.step()
        assert out.state == FilterState.FAULT and "fault" in out.latches, (bad, out.reason)
        rig.run(40)
        assert rig.ctrl.reset()[0]
        moving(rig, [0.3, 0, 0, 0, 0, 0])
    rig.ctrl.note(TrustSample(TrustLevel.HUMAN, Phase.SIM, rig.t))
    out = rig.step()  # the monitor said FULL again in the meantime (rig.trust)
    assert "trust" in out.latches and out.is_stop


def test_auto_enable_takes_the_start_up_trust_latch_only_before_its_first_enable(kin, limits):
    """With a trust monitor in the graph the filter starts at STOP: the start-up's trust latch goes
    with the start latch once the monitor says a moving level, and only then; a trust STOP after
    that first enable stays latched until an operator resets."""
    rig = Rig(SafetyController(limits, kin, config(auto_enable=True, default_trust_level=TrustLevel.STOP)))
    assert set(rig.step().latches) == {"start", "trust"}
    rig.trust = (TrustLevel.STOP, Phase.SIM)
    assert all(set(o.latches) == {"start", "trust"} for o in rig.run(20))  # STOP: nothing released
    rig.trust = (TrustLevel.SLOW, Phase.SIM)
    rig.run(3)
    assert not rig.ctrl.supervisor.latched  # released by itself: the first enable
    assert rig.step().state in (FilterState.OK, FilterState.FILTERING, FilterState.STOPPED)
    rig.trust = (TrustLevel.STOP, Phase.SIM)
    rig.run(3)
    rig.trust = (TrustLevel.FULL, Phase.SIM)
    outs = rig.run(50)
    assert all("trust" in o.latches for o in outs)  # after the first enable: only an operator
    assert rig.ctrl.reset()[0] and not rig.ctrl.supervisor.latched


def test_auto_enable_never_releases_latches_carried_into_a_new_controller(kin, limits):
    """enable_on_start releases the start latch of a fresh start only: a cleanup -> configure (a new
    controller carrying the deactivate latch) waits for an operator."""
    first = SafetyController(limits, kin, config(auto_enable=True))
    Rig(first).run(3)
    assert not first.supervisor.latched  # enabled itself
    first.hold("deactivated (lifecycle)")
    again = Rig(SafetyController(limits, kin, config(auto_enable=True), latches=first.supervisor.latches))
    again.nominal = np.array([0.3, 0, 0, 0, 0, 0])
    assert all(o.state == FilterState.ESTOP and "start" in o.latches for o in again.run(50))


def test_no_reset_before_a_period_has_checked_the_inputs(kin, limits):
    ctrl = SafetyController(limits, kin, config())
    ok, msg = ctrl.reset()
    assert not ok and "no control period" in msg
    rig = Rig(ctrl)
    rig.step()
    assert ctrl.reset()[0]
    ctrl.hold("deactivated (lifecycle)")
    assert not ctrl.reset()[0]


def test_a_re_tare_under_a_contact_from_above_is_refused_and_an_operator_can_re_tare(kin, limits):
    """Once tared, a later tare at rest is refused when the reading disagrees with the tare (here a
    25 N push from above after an e-stop, which would pass as a 2.5 kg heavier payload); an
    operator's re-tare (after a real payload change) takes the next rest window."""
    rig = _at_rest_with_sensor(kin, limits)
    rot = kin.frame_pose(rig.q, FT).rotation
    payload = rot.T @ np.array([0.0, 0.0, -0.8 * GRAVITY_MPS2])
    rig.wrench = payload
    rig.enable()
    assert rig.ctrl.tare.tare.payload_kg == pytest.approx(0.8, abs=0.01)
    rig.ctrl.request_estop("operator")
    rig.wrench = payload + rot.T @ np.array([0.0, 0.0, -25.0])  # stuck under something
    rig.run(60)
    assert rig.ctrl.tare.tare.payload_kg == pytest.approx(0.8, abs=0.01) and "differs" in rig.ctrl.tare.last_refusal
    assert rig.ctrl.reset()[0]
    out = rig.step()
    assert out.force_base_n is not None and np.linalg.norm(out.force_base_n) == pytest.approx(25.0, abs=0.1)
    assert not rig.ctrl.request_tare()[0]  # not while it runs
    rig.ctrl.request_estop("operator")
    assert rig.ctrl.request_tare()[0]
    rig.wrench = rot.T @ np.array([0.0, 0.0, -1.5 * GRAVITY_MPS2])  # the new payload, free
    rig.run(40)
    assert rig.ctrl.tare.tare.payload_kg == pytest.approx(1.5, abs=0.01)


@pytest.mark.parametrize("stamp", [float("nan"), float("inf"), 1e9], ids=["nan", "inf", "future"])
def test_a_stamp_that_is_not_a_time_of_this_clock_is_a_latched_timing_fault(kin, limits, stamp):
    """A NaN, infinite or far-future stamp would never go stale: it is a TIMING fault instead."""
    rig = Rig(SafetyController(limits, kin, config()))
    rig.enable()
    moving(rig, [0.3, 0, 0, 0, 0, 0])
    out = rig.step(nominal=NominalSample([0.3, 0, 0, 0, 0, 0], stamp))
    assert out.fault_kind == FaultKind.TIMING and "nominal command" in out.reason and "fault" in out.latches


@pytest.mark.parametrize("level", [2.9, True, 3.0000001, -1], ids=["2.9", "True", "nearly_3", "-1"])
def test_a_trust_level_that_is_not_exactly_a_level_is_malformed(kin, limits, level):
    rig = Rig(SafetyController(limits, kin, config()))
    rig.trust = (level, Phase.SIM)
    out = rig.run(2)[-1]
    assert out.fault_kind == FaultKind.TRUST and "fault" in out.latches


def test_a_trust_state_once_seen_is_not_forgotten(kin, limits):
    """A caller that stops passing the trust sample does not fall back to the default level: the
    last TrustState is kept, and goes stale."""
    rig = Rig(SafetyController(limits, kin, config(trust_timeout_s=0.1)))
    rig.trust = (TrustLevel.FULL, Phase.SIM)
    rig.enable()
    rig.trust = None
    outs = rig.run(20)
    assert outs[-1].fault_kind == FaultKind.STALE and "trust state" in outs[-1].reason


def test_a_trust_state_cannot_loosen_the_configured_phase(kin, limits):
    """On hardware the configured phase is REAL (speed x0.5): a TrustState claiming SIM does not
    double the speed limits; one claiming a tighter phase tightens them."""
    rig = Rig(SafetyController(limits, kin, config(default_phase=Phase.REAL)))
    rig.trust = (TrustLevel.FULL, Phase.SIM)
    rig.enable()
    rig.nominal = np.array([0, 0, 0, 0, 0, 2.0])  # wrist_3 alone: no tool speed
    rig.run(40)
    assert rig.qd[5] == pytest.approx(2.0 * limits.phase_speed_scale[Phase.REAL], abs=1e-6)


def test_an_exception_whose_text_fails_still_gives_a_controlled_stop(kin, limits, monkeypatch):
    class Nasty(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    rig = Rig(SafetyController(limits, kin, config()))
    rig.enable()

    def broken(*args, **kwargs):
        raise Nasty()

    monkeypatch.setattr(rig.ctrl.filter, "filter", broken)
    monkeypatch.setattr(rig.ctrl.filter, "filter_checked", broken)  # what the controller calls
    out = rig.step()
    assert out.state == FilterState.FAULT and out.fault_kind == FaultKind.INTERNAL and "Nasty" in out.reason


def test_a_force_sensor_frame_missing_from_the_urdf_fails_at_construction(kin, limits):
    with pytest.raises(ValueError, match="not a frame of the URDF"):
        SafetyController(limits, kin, config(force_sensor=True, ft_frame="no_such_frame"))


def test_the_model_is_checked_once_per_period_and_the_bare_filter_still_checks_it(kin, limits, monkeypatch):
    """SafetyController checks the linearization (check_model) and tells the QP so: one check per
    period, not two (35 µs of the hot path); a FilterInput that does not say so is checked by the
    filter itself, and a broken model there is still a FAULT."""
    import robot_wm.core.safety.controller as controller_mod
    import robot_wm.core.safety.qp as qp_mod
    from robot_wm.core.safety import FilterInput, LinearizedModel
    from robot_wm.core.safety.validate import check_model

    calls = []

    def counting(*args, **kw):
        calls.append(1)
        return check_model(*args, **kw)

    monkeypatch.setattr(controller_mod, "check_model", counting)
    monkeypatch.setattr(qp_mod, "check_model", counting)
    rig = Rig(SafetyController(limits, kin, config(require_model=True), model=_lagged()))
    rig.enable()
    moving(rig, [0.3, 0, 0, 0, 0, 0])
    calls.clear()
    rig.run(20)
    assert len(calls) == 20 and rig.ctrl.last_output.state in (FilterState.OK, FilterState.FILTERING)
    q = np.array(rig.q, dtype=float)
    f0, B, sigma = _lagged().linearize_with_std(q, np.zeros(6), np.zeros(6))
    broken = LinearizedModel(np.full_like(f0, np.nan), B, sigma)
    out = rig.ctrl.filter.filter(FilterInput(q_rad=q, qdot_radps=np.zeros(6), u_nominal_radps=np.zeros(6), model=broken))
    assert out.state == FilterState.FAULT and "NaN" in out.reason
