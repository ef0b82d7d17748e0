"""The trust monitor beyond its state machine: the effort model, the tracker's pairing, calibration
files with an effort model, config/trust.yaml, the library-mode loop (a payload is seen, normal
operation is quiet) and the trust_monitor node in the whole ROS graph."""
from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import wait_for
from robot_wm.core.safety.limits import TrustLevel
from robot_wm.core.trust import Calibration, CalibrationError, EffortModel, EffortModelError, TrustConfig, TrustMonitor
from robot_wm.core.trust import calibration as calib_io
from robot_wm.core.trust.effort import FEATURES, EffortSignal, features
from robot_wm.core.trust.settings import config_from_params, load_trust_config
from robot_wm.core.trust.tracker import TrustTracker

DT = 0.01
EFFORT_OVER = re.compile(r"effort_error [0-9.e+-]+ > ")


def _kin():
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics

    urdf = description.expand()
    return Kinematics(urdf, description.joint_limits(urdf).names)


# ------------------------------------------------------------------------------- effort model
def test_effort_fit_recovers_the_coefficients_and_scores_a_load_as_a_bias():
    rng = np.random.default_rng(0)
    t, n = 5000, 6
    g, m, v, a = rng.normal(0, 20, (t, n)), rng.normal(0, 5, (t, n)), rng.normal(0, 0.5, (t, n)), rng.normal(0, 2, (t, n))
    feats = features(g, m, v, a)
    true = rng.normal(0, 1, (n, len(FEATURES)))
    tau = np.einsum("tjf,jf->tj", feats, true) + rng.normal(0, 0.3, (t, n))
    model = EffortModel.fit(feats, tau, tau_s=0.05, clip_z=4.0)
    assert np.allclose(model.coefficients, true, atol=0.05)
    assert np.allclose(model.residual_std_nm, 0.3, rtol=0.1)
    # each joint's scale: its smoothed bias's normal quantile (z-scores of std 1: EWMA spread ~0.3)
    model = model.calibrated(feats[:1000], tau[:1000], DT, 1e-3)
    assert np.all((model.joint_scale > 0.5) & (model.joint_scale < 2.0))
    signal = EffortSignal(model)
    quiet = [signal.update(feats[i], tau[i], DT) for i in range(1000, 1400)]
    # a load on ONE joint (the largest scaled bias over the joints: not averaged away over six)
    loaded = [signal.update(feats[i], tau[i] + np.array([0, 0, 1.5, 0, 0, 0]), DT) for i in range(1400, 1460)]
    assert max(quiet) < 1.5 < 2.5 < min(loaded[20:])
    # a single wild sample moves the smoothed signal by at most alpha * clip / scale
    signal.reset()
    spike = signal.update(feats[0], tau[0] + 1e3, DT)
    assert spike <= (1 - math.exp(-DT / 0.05)) * 4.0 / model.joint_scale.min() + 1e-9


def test_the_coupled_inertial_torques_are_pinocchios_rnea():
    import pinocchio as pin

    kin = _kin()
    rng = np.random.default_rng(1)
    for _ in range(20):
        q, v, a = rng.uniform(-2, 2, 6), rng.normal(0, 1, 6), rng.normal(0, 3, 6)
        g, inertial = kin.inverse_dynamics_nm(q, v, a)
        np.testing.assert_allclose(g, kin.gravity_torque_nm(q), atol=1e-9)
        # M(q) a + C(q, v) v, with M from pinocchio's CRBA: the two routes agree
        pq = kin._q(q)
        mass = pin.crba(kin.model, kin.data, pq)
        mass = np.triu(mass) + np.triu(mass, 1).T
        pv, pa = np.empty(6), np.empty(6)
        pv[kin._perm], pa[kin._perm] = v, a
        coriolis = pin.rnea(kin.model, kin.data, pq, pv, np.zeros(6)) - pin.computeGeneralizedGravity(kin.model, kin.data, pq)
        np.testing.assert_allclose(inertial, (mass @ pa + coriolis)[kin._perm], atol=1e-8)


def test_the_inverse_dynamics_follow_the_joint_order_asked_for():
    """In the URDF's order pinocchio reads the arrays as they are (the trust monitor's fast path);
    in any other order the torques come back in that order."""
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics

    urdf = description.expand()
    names = description.joint_limits(urdf).names
    kin, rev = Kinematics(urdf, names), Kinematics(urdf, names[::-1])
    assert kin._in_order and not rev._in_order
    rng = np.random.default_rng(2)
    for _ in range(10):
        q, v, a = rng.uniform(-2, 2, 6), rng.normal(0, 1, 6), rng.normal(0, 3, 6)
        g, inertial = kin.inverse_dynamics_nm(q, v, a)
        g_rev, inertial_rev = rev.inverse_dynamics_nm(q[::-1], v[::-1], a[::-1])  # strided views, too
        np.testing.assert_allclose(g_rev, g[::-1], atol=1e-9)
        np.testing.assert_allclose(inertial_rev, inertial[::-1], atol=1e-9)
        np.testing.assert_allclose(kin.tool_position_m(q[::-1][::-1]), rev.tool_position_m(q[::-1]), atol=1e-12)


def test_the_per_period_effort_path_gives_the_feature_matrix_numbers():
    """``update_state`` (Python floats, no feature matrix) and ``update`` (the regressors of
    ``features``) are the same signal: period after period, with clipping and joint scales."""
    rng = np.random.default_rng(3)
    model = EffortModel(rng.normal(0, 1, (6, len(FEATURES))), rng.uniform(0.05, 1.0, 6), tau_s=0.03, clip_z=4.0,
                        joint_scale=rng.uniform(0.5, 3.0, 6))
    fast, ref = EffortSignal(model), EffortSignal(model)
    for k in range(300):
        g, m, v, a = rng.normal(0, 5, 6), rng.normal(0, 2, 6), rng.normal(0, 0.5, 6), rng.normal(0, 3, 6)
        tau = rng.normal(0, 10 if k % 7 else 100, 6)  # now and then far past the clip
        dt = DT if k % 11 else 2 * DT
        assert fast.update_state(g, m, v, a, tau, dt) == pytest.approx(ref.update(features(g, m, v, a), tau, dt), rel=1e-9)
    np.testing.assert_allclose(fast.update(features(g, m, v, a), tau, DT, per_joint=True),
                               ref.update(features(g, m, v, a), tau, DT, per_joint=True), rtol=1e-9)


@pytest.mark.parametrize("mutate,words", [
    (lambda d: d.update(features=["gravity", "acceleration", "velocity", "coulomb", "bias"]),
     "made with features ['gravity', 'acceleration', 'velocity', 'coulomb', 'bias'], this code uses"),
    (lambda d: d.update(coulomb_velocity_radps=0.5), "coulomb_velocity_radps"),
    (lambda d: d.update(coefficients=[[1.0] * 6] * 5), "residual_std_nm (6,)"),
    (lambda d: d.update(residual_std_nm=[0.0] * 6), "non-positive residual std"),
    (lambda d: d.pop("coefficients"), "unreadable"),
    (lambda d: d.pop("joint_scale"), "unreadable"),
    (lambda d: d.update(joint_scale=[1.0, 1.0, 0.0, 1.0, 1.0, 1.0]), "joint_scale [1.0, 1.0, 0.0"),
    (lambda d: d.update(tau_s=-1.0), "tau_s=-1.0"),
])
def test_a_bad_effort_model_is_refused_naming_the_field(mutate, words):
    doc = EffortModel(np.ones((6, len(FEATURES))), np.ones(6)).to_dict()
    mutate(doc)
    with pytest.raises(EffortModelError, match=re.escape(words)):
        EffortModel.from_dict(doc, 6)


def test_too_little_normal_operation_for_an_effort_fit_is_refused():
    with pytest.raises(EffortModelError, match="need at least 50"):
        EffortModel.fit(np.ones((10, 6, len(FEATURES))), np.ones((10, 6)))


# ------------------------------------------------------------------------------- tracker
def _cal(effort=None, **thresholds):
    base = {"prediction_error": 2.0, "disagreement": 1.0, "intervention": 0.25}
    if effort is not None:
        base["effort_error"] = 2.0
    base.update(thresholds)
    return Calibration(base, 1e-3, "wm-test", "test", 10_000, effort_model=effort)


def test_the_tracker_pairs_a_prediction_with_the_state_one_period_later():
    kin = _kin()
    tracker = TrustTracker(TrustMonitor(TrustConfig(), _cal()), kin, DT)
    q, qd = np.zeros(6), np.zeros(6)
    std = np.full(12, 0.1)
    mean = np.concatenate([q, qd + 0.2])  # predicts 0.2 rad/s on every joint
    tracker.prediction(1.00, mean, std, std)
    tracker.measurement(1.012, q, qd, None, False)  # 2 ms after the predicted stamp: paired
    assert tracker.raw["prediction_error"] is not None
    tracker.prediction(2.00, mean, std, std)
    tracker.measurement(2.02, q, qd, None, False)  # two periods later: no pairing
    assert tracker.raw["prediction_error"] is None
    tracker.prediction(3.00, mean, std, std)
    tracker.measurement(3.01, q, qd, None, False)
    z = np.sqrt(np.mean(np.r_[np.zeros(6), np.full(6, 0.2 / math.hypot(0.1, 0.1))] ** 2))
    assert tracker.raw["prediction_error"] == pytest.approx(z)
    # a malformed prediction is no prediction
    tracker.prediction(4.00, mean[:6], std, std)
    tracker.prediction(5.00, np.full(12, np.nan), std, std)
    assert tracker.next_target_s() is None


def test_interventions_count_only_at_full():
    """Below FULL the filter is meant to cut the nominal to the scaled limits: not evidence."""
    tracker = TrustTracker(TrustMonitor(TrustConfig(), _cal()), _kin(), DT)
    assert tracker.monitor.level == TrustLevel.STOP
    tracker.measurement(0.0, np.zeros(6), np.zeros(6), None, True)
    assert tracker.raw["intervention"] == 0.0


def _drive(tracker, t0, t1, predicted_qd, measured_qd, commands_every_s=None, silent=()):
    """Periods from t0 to t1: each a prediction made one period before and its measurement; commands
    every ``commands_every_s`` (None: none reported) except inside the ``silent`` (start, end) spans.
    Returns the levels the monitor gave."""
    std = np.full(12, 0.1)
    levels = []
    for k in range(int(round((t1 - t0) / DT))):
        t = t0 + k * DT
        if commands_every_s is not None and not any(a < t <= b for a, b in silent):
            tracker.command(t)
        tracker.prediction(t - DT, np.r_[np.zeros(6), np.full(6, predicted_qd(t))], std, std)
        levels.append(tracker.measurement(t, np.zeros(6), np.full(6, measured_qd(t)), None, False).level)
    return levels


def test_a_silent_command_stream_is_the_drivers_to_stop_not_an_anomaly_and_a_real_mismatch_still_is():
    """The CI failure of stop 37: the filter's process stalled, the driver's command timeout brought the
    arm to rest, the world model went on predicting the last command's motion, and two signals agreed on
    an anomaly (a latched STOP) that was a stall of the command stream, which the filter and the driver
    handle. With the hardware's timeout and the commands' arrivals, those periods are not judged; a
    mismatch while commands flow is."""
    def moving(t):
        return 1.0

    def stopped_after_1_05(t):  # the driver's ramp to rest, 50 ms after the last command at 1.0
        return 1.0 if t <= 1.05 else max(0.0, 1.0 - 20.0 * (t - 1.05))

    judged = TrustTracker(TrustMonitor(TrustConfig(), _cal()), _kin(), DT, command_timeout_s=0.05)
    blind = TrustTracker(TrustMonitor(TrustConfig(), _cal()), _kin(), DT)  # no timeout: every period judged
    for tracker in (judged, blind):
        assert max(_drive(tracker, -10.0, 1.0, moving, moving, DT)[-100:]) == TrustLevel.FULL
    # the stream is silent from 1.0 to 1.2: the arm ramps to rest while the model predicts motion
    during = _drive(judged, 1.0, 1.2, moving, stopped_after_1_05, DT, silent=[(1.0, 1.2)])
    assert max(during) == TrustLevel.FULL and judged.unjudged >= 14, (during, judged.unjudged)
    assert judged.monitor.anomalies == 0
    assert max(_drive(blind, 1.0, 1.2, moving, stopped_after_1_05, DT, silent=[(1.0, 1.2)])) >= TrustLevel.SLOW
    # the stream resumes; two periods later the model answers again: the arm still at rest while it
    # predicts motion, with commands arriving, is the model's (or the arm's) fault
    after = _drive(judged, 1.2, 1.5, moving, lambda t: 0.0, DT)
    assert judged.raw["prediction_error"] is not None and max(after) >= TrustLevel.SLOW, after
    assert judged.unjudged <= 20 + TrustTracker.SETTLE_PERIODS + 1
    # a stream that stays silent is not judged either, and so the monitor cannot vouch for the model:
    # SLOW after stale_s, STOP after stop_stale_s, as for missing predictions (fail-safe, not blind)
    config = TrustConfig()
    silent = _drive(judged, 1.5, 1.5 + config.stop_stale_s + 0.1, moving, lambda t: 0.0, DT, silent=[(1.5, 9.0)])
    stale_k = int(config.stale_s / DT) + 1
    assert max(silent[stale_k:]) >= TrustLevel.SLOW and silent[-1] == TrustLevel.STOP, silent


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.001, 0.2), min_size=1, max_size=60), st.floats(0.0, 3.0), st.randoms())
def test_the_hardware_is_on_its_own_exactly_when_no_command_came_within_its_timeout(gaps, t, rnd):
    """Property: after the first command, a stamp with no arrival within the timeout before it is the
    driver's; one with an arrival within it, and no silence ending in the settle before it, is judged;
    the order the arrivals are reported in does not matter."""
    timeout = 0.05
    arrivals = list(np.cumsum(gaps))
    tracker = TrustTracker(TrustMonitor(TrustConfig(), _cal()), None, DT, command_timeout_s=timeout)
    shuffled = arrivals[:]
    rnd.shuffle(shuffled)
    for a in shuffled:
        tracker.command(a)
    before = [a for a in arrivals if a <= t]
    on_its_own = tracker.hardware_on_its_own(t)
    if not before:
        assert not on_its_own
    elif t - before[-1] > timeout:
        assert on_its_own
    else:
        settle = TrustTracker.SETTLE_PERIODS * DT
        ended = any(i > 0 and a >= t - settle and a - arrivals[i - 1] > timeout for i, a in enumerate(arrivals) if a <= t)
        assert on_its_own == ended
    with pytest.raises(ValueError, match="command_timeout_s"):
        TrustTracker(TrustMonitor(TrustConfig(), _cal()), None, DT, command_timeout_s=float("nan"))


# ------------------------------------------------------------------------------- calibration files
def test_a_calibration_with_an_effort_model_round_trips_and_is_checked(tmp_path):
    effort = EffortModel(np.ones((6, len(FEATURES))), np.ones(6)).to_dict()
    cal = _cal(effort)
    path = calib_io.save(cal, tmp_path / "trust" / "nominal.json")
    back = calib_io.load(path, "wm-test")
    assert back.thresholds == cal.thresholds and back.effort_model == effort
    tracker = TrustTracker(TrustMonitor(TrustConfig(), back), _kin(), DT)
    assert tracker.effort is not None
    doc = json.loads(path.read_text())
    del doc["thresholds"]["effort_error"]
    path.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="thresholds.effort_error=None"):
        calib_io.load(path)
    calib_io.save(cal, path)
    with pytest.raises(CalibrationError, match="run `robot-wm trust calibrate` again"):
        calib_io.load(path, "wm-other")


def test_trust_yaml_loads_and_a_bad_value_names_the_parameter(tmp_path):
    config, settings = load_trust_config()
    assert config.stale_s < config.stop_stale_s and 0 < settings.exceedance < 1
    assert set(settings.floor_map()) == {"prediction_error", "disagreement", "intervention", "effort_error",
                                         "response_lag"}
    with pytest.raises(ValueError, match=r"tau_s=\(0.1,\): expected 5 positive time constants"):
        config_from_params({"tau_s": [0.1]})
    with pytest.raises(ValueError, match="trust_monitor.calibration_exceedance=2.0"):
        config_from_params({"calibration_exceedance": 2.0})
    bad = tmp_path / "trust.yaml"
    bad.write_text("trust_monitor:\n  ros__parameters:\n    clean_hold_s: fast\n")
    with pytest.raises(ValueError, match=r"trust.yaml: trust_monitor.clean_hold_s='fast'"):
        load_trust_config(bad)


# ------------------------------------------------------------------------------- library mode
@pytest.mark.slow
def test_library_mode_calibration_is_quiet_on_normal_operation_and_sees_a_payload_and_a_latency():
    """40 s of normal operation (shipped policy through the filter) calibrate the monitor at a
    coarse exceedance (1e-3 per signal and period: a few short excursions per minute are expected);
    held-out normal operation then stays at FULL nearly all the time, a 2.5 kg payload drops the
    level within half a second, by the effort signal, and +30 ms of command latency by the
    response lag, once the commands change."""
    from robot_wm.learning import trust_eval as te
    from robot_wm.learning.stack_eval import build_stack

    stack = build_stack(DT)
    config = TrustConfig()
    normal = te.operate("nominal", 40.0, 1, config=config, stack=stack)
    cal = te.calibrate_run(normal, 1e-3, load_trust_config()[1].floor_map(), config, model_version="wm", source="test")
    assert set(cal.thresholds) == {"prediction_error", "disagreement", "intervention", "effort_error", "response_lag"}
    quiet = te.operate("nominal", 16.0, 2, calibration=cal, config=config, stack=stack)
    full = np.flatnonzero(quiet.level == TrustLevel.FULL)
    assert full.size and quiet.t_s[full[0]] <= 7.0, quiet.events  # the start-up climb: 3 clean holds of 2 s
    assert np.mean(quiet.level[full[0]:] == TrustLevel.FULL) >= 0.9, quiet.events
    loaded = te.operate("nominal", 12.0, 3, calibration=cal, config=config, stack=stack, fault=("payload", 9.0))
    latency = te.detection_latency_periods(loaded)
    assert latency is not None and latency <= 50, loaded.events  # the 100 ms target is bench_trust.py's
    first = next(e for e in loaded.events if e[0] >= 9.0)
    assert EFFORT_OVER.search(first[2]), first
    late = te.operate("nominal", 13.0, 4, calibration=cal, config=config, stack=stack, fault=("latency", 9.0))
    latency, excited = te.detection_latency_periods(late), te.excitation_delay_periods(late)
    assert latency is not None and excited is not None and latency - excited <= 50, late.events
    first = next(e for e in late.events if e[0] >= 9.0)
    assert re.search(r"response_lag [0-9.e+-]+ > ", first[2]), first


def test_a_recorded_run_judged_again_gives_its_own_levels_back_and_a_stricter_config_later_ones():
    """rejudge (bench_trust_variants.py): a run's recorded signals through a fresh TrustMonitor. With
    the recording's own config and calibration every level comes back (the effort signal recomputed
    from its regressors, the response lag re-smoothed from its sums, interventions counted only at
    FULL); a longer persistence sees the payload later by the difference."""
    import dataclasses

    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.learning import trust_eval as te
    from robot_wm.paths import data_path

    config = load_trust_config()[0]
    cal = calib_io.load(data_path("models", "trust", "nominal.json"))
    run = te.operate("nominal", 12.0, 3, calibration=cal, config=config, fault=("payload", 8.0))
    again = te.rejudge(run, cal, config)
    assert np.array_equal(again.level, run.level), (again.events, run.events)
    assert again.events == run.events
    assert np.allclose(te.with_lag_tau(run, config.lag_tau_s).raw["response_lag"], run.raw["response_lag"], equal_nan=True)
    # a run whose monitor only watches (the filter's levels depend on no verdict) judged two ways
    watching = Calibration({s: math.inf for s in cal.thresholds}, 0.5, cal.model_version, "never acts", 0)
    watched = te.operate("nominal", 12.0, 3, calibration=watching, config=config, fault=("payload", 8.0))
    seen = te.detection_latency_periods(te.rejudge(watched, cal, config))
    later = te.detection_latency_periods(te.rejudge(watched, cal, dataclasses.replace(config, min_duration_s=0.08)))
    # 50 ms more persistence: 5 periods later, give or take one for the stamps' rounding
    assert seen is not None and later is not None and later >= seen + 4, (seen, later)
    with pytest.raises(ValueError, match="no response-lag sums"):
        te.with_lag_tau(dataclasses.replace(run, lag_sums=None), 0.1)


def test_a_trust_variant_is_parsed_over_the_configs_fields_and_a_bad_one_is_named():
    """bench_trust_variants.py's ``--variant name=value[,name=value]``."""
    import dataclasses

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    try:
        from bench_trust_variants import parse_variant
    finally:
        sys.path.pop(0)
    from robot_wm.core.trust.signals import MIN_RESPONSE_POWER

    base = TrustConfig()
    assert parse_variant("base", base) == (base, MIN_RESPONSE_POWER) and parse_variant("base", base)[0] is base
    v, min_power = parse_variant("lag_tau_s=0.05, min_duration_s=0.02,tau_s=0.04/0.05/0.5/0.01/0.01", base)
    assert (v.lag_tau_s, v.min_duration_s, v.tau_s[0], v.clean_hold_s) == (0.05, 0.02, 0.04, base.clean_hold_s)
    assert min_power == MIN_RESPONSE_POWER
    assert parse_variant("lag_min_power=1e-4,min_duration_s=0.02", base) == (
        dataclasses.replace(base, min_duration_s=0.02), 1e-4)  # the response lag's floor, not a TrustConfig field
    with pytest.raises(ValueError, match="lag_min_power='-1'"):
        parse_variant("lag_min_power=-1", base)
    with pytest.raises(ValueError, match="'lag_tau=0.1' is not name=value"):
        parse_variant("lag_tau=0.1", base)
    with pytest.raises(ValueError, match="min_duration_s='fast'"):
        parse_variant("min_duration_s=fast", base)
    with pytest.raises(ValueError, match="lag_tau_s=-1.0"):  # TrustConfig's own check
        parse_variant("lag_tau_s=-1", base)
    with pytest.raises(ValueError, match="clean_hold_s shapes the start-up or the recovery"):
        parse_variant("clean_hold_s=3", base)


def test_a_variants_false_alarms_are_counted_after_its_start_up_with_the_anomalies_among_them():
    """bench_trust_variants.py ``--normal-minutes``: a held-out normal run judged by a variant."""
    import types

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    try:
        from bench_trust_variants import false_alarms
    finally:
        sys.path.pop(0)
    t = np.arange(0, 3601.5, 0.5)  # an hour after a second of start-up
    level = np.zeros(t.size, dtype=int)
    level[t < 1.0] = 3  # the start-up's STOP: not a false alarm
    level[(t >= 600) & (t < 602)] = 1  # one signal: CAUTIOUS
    level[(t >= 1800) & (t < 1805)] = 3  # two signals: STOP
    events = [(0.0, "STOP", "no world-model prediction"),
              (600.0, "CAUTIOUS", "prediction_error 3.5 > 3.09 for 0.03 s; disagreement 0.1 <= 0.6"),
              (1800.0, "STOP", "prediction_error 3.5 > 3.09 for 0.03 s; response_lag 0.7 > 0.5 for 0.03 s")]
    out = false_alarms(types.SimpleNamespace(t_s=t, level=level, events=events))
    assert out["false_alarms"] == 2 and out["false_anomalies"] == 1
    assert out["normal_hours"] == pytest.approx(1.0) and out["false_alarms_per_hour"] == pytest.approx(2.0)
    assert out["reasons"][0].startswith("prediction_error 3.5 > 3.09")


def test_the_excitation_clock_starts_at_the_first_command_change_after_the_onset():
    """A command-path fault (latency) cannot show while the arm holds a goal: bench_trust also
    counts its detection from the first command that changed after the onset."""
    from robot_wm.learning import trust_eval as te

    n = 100
    commands = [np.zeros(6) for _ in range(n)]
    for k in (10, 11):  # a change before the onset does not count
        commands[k] = np.full(6, 0.1 * k)
    for k in range(60, n):  # the goal changes 40 periods after the onset
        commands[k] = np.full(6, 0.002 * (k - 59))
    run = te.Run("nominal", np.arange(n) * DT, {}, np.zeros((n, 6, 6)), np.zeros((n, 6)), np.zeros(n, int), fault_t_s=0.2)
    run.commands = commands
    assert te.excitation_delay_periods(run) is None  # steps of 0.002 rad/s: under the 0.01 that counts
    assert te.excitation_delay_periods(run, min_change_radps=0.001) == 40.0
    run.commands = commands[:55]
    assert te.excitation_delay_periods(run, min_change_radps=0.001) is None


# ------------------------------------------------------------------------------- the node
def _trust_client(context):
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node

    from robot_wm.msg import TrustState
    from robot_wm.nodes.runner import SpinThread

    node = Node("test_trust_client", context=context)
    states: list = []
    node.create_subscription(TrustState, "/robot_wm/trust", states.append, 50)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = SpinThread(executor)

    def close():
        spinner.stop()
        executor.remove_node(node)
        node.destroy_node()

    return node, executor, states, close


def _call(node, executor, srv_type, name, request, timeout_s=10.0):
    import time

    client = node.create_client(srv_type, name)
    deadline = time.monotonic() + timeout_s
    while not client.service_is_ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    future = client.call_async(request)
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert future.done(), f"no answer from {name}"
    return future.result()


@pytest.mark.ros
@pytest.mark.slow
def test_the_trust_monitor_in_the_graph_rides_out_a_stalled_filter_judges_a_payload_and_recovers(spawn, ros_context):
    """The whole graph on the embedded arm with the shipped calibration: the monitor earns FULL,
    the arm moves, the filter's process stalls six times (no anomaly), a 3.5 kg payload from the fault injector drops the level (effort), and once the
    payload is cleared the level steps back up to FULL. (3.5 kg, not the benchmark's 2.5: live, with
    the shipped calibration, 2.5 kg reads 1.58 against the effort threshold of 1.70 in some postures,
    and a CI run with one core busy ended there; what this test checks is the path, the bench the
    sensitivity.)"""
    import time

    from robot_wm import graph
    from robot_wm.process_group import command_for
    from robot_wm.srv import InjectFault

    specs = [s for s in graph.plan("mujoco", overrides={"profile": "nominal"}, enable=True) if not s.needs_ros_install]
    procs = {s.name: spawn(command_for(s)) for s in specs}
    node, executor, states, close = _trust_client(ros_context)
    try:
        def level_since(t0, pred):
            return any(s.header.stamp.sec + s.header.stamp.nanosec * 1e-9 >= t0 and pred(s) for s in list(states))

        assert wait_for(lambda: level_since(0, lambda s: s.level == 0), 90.0), \
            procs["trust_monitor"].output()[-3000:] + str([(s.level, s.reason) for s in states[-3:]])
        assert states[-1].phase == 0 and "prediction_error" in states[-1].reason
        # the operator's verbs: the state, and an acknowledge refused (nothing to acknowledge)
        import subprocess
        import sys

        shown = subprocess.run([sys.executable, "-m", "robot_wm.cli", "trust", "status", "--timeout", "20"],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "trust: " in shown.stdout and "phase SIM" in shown.stdout, shown
        assert "phase evidence: " in shown.stdout and "min operated" in shown.stdout, shown.stdout
        ack = subprocess.run([sys.executable, "-m", "robot_wm.cli", "trust", "acknowledge", "--timeout", "20"],
                             capture_output=True, text=True, timeout=60)
        assert ack.returncode == 1 and "REFUSED" in ack.stdout and "not HUMAN" in ack.stdout, ack
        time.sleep(3.0)  # the arm moves under FULL
        # --- the filter's process stalls (a loaded machine): the driver's command timeout brings the arm
        # to rest while the world model predicts the last command's motion. Not an anomaly (stop 37's CI
        # failure was one, and its latched STOP); the monitor says it did not judge those periods.
        import signal

        filter_pid = procs["safety_filter"].pid
        for stall_s in (0.08, 0.12, 0.2, 0.08, 0.12, 0.2):
            os.kill(filter_pid, signal.SIGSTOP)
            try:
                time.sleep(stall_s)
            finally:
                os.kill(filter_pid, signal.SIGCONT)
            time.sleep(1.5)
        t_stalled = time.time()
        monitor_log = procs["trust_monitor"].output()
        assert "anomaly" not in monitor_log, monitor_log[-3000:]
        assert "periods not judged" in monitor_log, monitor_log[-3000:]
        assert wait_for(lambda: level_since(t_stalled, lambda s: s.level == 0), 30.0), monitor_log[-3000:]
        t_fault = time.time()
        answer = _call(node, executor, InjectFault, "/arm_sim/inject_fault", InjectFault.Request(kind="payload", payload_kg=3.5))
        assert answer.success, answer.message
        # the arm applied the fault just before it answered: the monitor's latency is judged from the answer, in
        # the monitor's periods (a loaded CI run measured 1.07 s of wall time from before the call)
        t_applied = time.time()
        # a generous wait on this machine's clock: the bound is the one below, in the monitor's own periods (a starved
        # monitor runs fewer of them a second, and this client may get its verdicts late)
        assert wait_for(lambda: level_since(t_fault, lambda s: s.level >= 1 and EFFORT_OVER.search(s.reason)), 30.0), \
            procs["trust_monitor"].output()[-3000:]
        dropped = next(s for s in list(states) if s.header.stamp.sec + s.header.stamp.nanosec * 1e-9 >= t_fault
                       and s.level >= 1)
        t_drop = dropped.header.stamp.sec + dropped.header.stamp.nanosec * 1e-9
        # within 3 s of the monitor's own periods (its stamps: a stalled machine runs fewer of them). Not the
        # detection target: that is the benchmark's (bench/bench_trust.py, library mode, 6-8 periods p90). Live,
        # with the shipped calibration, 2.5 kg sits near the effort threshold in some postures (a run with one
        # core busy: effort_error 1.58 against 1.70 at 1.2 s, the level first dropped on the intervention rate;
        # the shipped threshold has ranged 1.15-1.96 over the live remakes, with the machine's timing jitter)
        periods = sum(1 for s in list(states) if t_applied <= s.header.stamp.sec + s.header.stamp.nanosec * 1e-9 < t_drop)
        assert periods < 300, (periods, t_drop - t_fault, t_drop - t_applied, dropped.reason)
        assert _call(node, executor, InjectFault, "/arm_sim/inject_fault", InjectFault.Request(kind="clear")).success
        t_clear = time.time()
        # (clean holds of 2 s each, and a loaded machine makes the monitor see an excursion now and then: generous)
        assert wait_for(lambda: level_since(t_clear, lambda s: s.level == 0), 60.0), \
            procs["trust_monitor"].output()[-3000:]
        assert "Traceback" not in procs["trust_monitor"].output()
    finally:
        close()


@pytest.mark.ros
def test_without_a_calibration_the_monitor_says_stop_naming_the_file(spawn, ros_context, tmp_path):
    from robot_wm import graph
    from robot_wm.process_group import command_for

    missing = tmp_path / "no_such_calibration.json"
    spec = next(s for s in graph.plan("mujoco", overrides={"calibration_file": str(missing)}) if s.name == "trust_monitor")
    proc = spawn(command_for(spec))
    node, executor, states, close = _trust_client(ros_context)
    try:
        assert wait_for(lambda: states and "no usable trust calibration" in states[-1].reason, 60.0), proc.output()
        assert states[-1].level == TrustLevel.STOP and str(missing) in states[-1].reason
        assert "robot-wm trust calibrate" in proc.output()
    finally:
        close()


@pytest.mark.ros
def test_an_unreadable_phase_file_is_a_stop_naming_the_file_never_a_reset(spawn, ros_context, tmp_path):
    from robot_wm import graph
    from robot_wm.process_group import command_for

    bad = tmp_path / "phase.json"
    bad.write_text('{"format": "robot_wm.trust.phase/1", "phase": "ORBIT"}')
    spec = next(s for s in graph.plan("mujoco", overrides={"phase_file": str(bad)}) if s.name == "trust_monitor")
    proc = spawn(command_for(spec))
    node, executor, states, close = _trust_client(ros_context)
    try:
        assert wait_for(lambda: states and str(bad) in states[-1].reason, 60.0), proc.output()
        assert states[-1].level == TrustLevel.STOP and "phase 'ORBIT'" in states[-1].reason
        assert "fix or remove it" in states[-1].reason
        from robot_wm.srv import PhaseChange

        answer = _call(node, executor, PhaseChange, "/robot_wm/phase/promote", PhaseChange.Request(reason="x"))
        assert not answer.success and str(bad) in answer.message
        assert bad.read_text() == '{"format": "robot_wm.trust.phase/1", "phase": "ORBIT"}'  # left for the operator
    finally:
        close()


@pytest.mark.ros
@pytest.mark.slow
def test_on_a_real_arm_a_policy_still_in_sim_is_held(spawn, ros_context, tmp_path):
    """The graph as on hardware (simulated_arm false) with no phase file yet: the phase is SIM, the
    monitor publishes STOP saying the policy has not been promoted, and the arm never moves."""
    import dataclasses

    from robot_wm import graph
    from robot_wm.process_group import command_for
    from rosclient import ArmClient

    specs = [s for s in graph.plan("mujoco", overrides={"phase_file": str(tmp_path / "phase.json")}, enable=True)
             if not s.needs_ros_install]
    specs = [dataclasses.replace(s, parameters={**s.parameters, "simulated_arm": False})
             if s.name == "trust_monitor" else s for s in specs]
    procs = {s.name: spawn(command_for(s)) for s in specs}
    arm = ArmClient(ros_context, name="test_real_arm_client")
    node, executor, states, close = _trust_client(ros_context)
    try:
        assert wait_for(lambda: states and "phase SIM on a real arm" in states[-1].reason, 90.0), \
            procs["trust_monitor"].output()[-3000:]
        assert states[-1].level == TrustLevel.STOP and states[-1].phase == 0
        import time

        time.sleep(3.0)  # predictions flow, the evidence is clean: still held
        assert all(s.level == TrustLevel.STOP for s in states[-50:])
        assert max(float(np.abs(s[2]).max()) for s in arm.states) < 0.01  # the arm never moved
        assert json.loads((tmp_path / "phase.json").read_text())["phase"] == "SIM"
    finally:
        close()
        arm.close()


def test_the_live_calibrations_fit_runs_beside_the_periods_and_a_failed_one_stops_the_arm(monkeypatch):
    """The end of `trust calibrate --live`: the fit runs on a thread of its own while every period
    still publishes ("fitting"), no period is added to the recording meanwhile, the first period that
    finds the fit done takes it; a fit that raises leaves the monitor at STOP saying why."""
    import logging
    import threading

    from robot_wm.core.trust import settings as trust_settings
    from robot_wm.nodes import trust_live_calibration as live

    release, fit_threads = threading.Event(), []

    def fit(recording, profile, settings, config, dt_s, model_version):  # what the node hands the fit's thread
        fit_threads.append(threading.current_thread())
        assert release.wait(10.0)
        if profile == "broken":
            raise RuntimeError("boom")
        return ("a calibration", recording.periods, profile, settings, dt_s, model_version)

    monkeypatch.setattr(live, "_fit_calibration", fit)
    monkeypatch.setattr(trust_settings, "config_from_params", lambda params: ("config", f"settings of {params}"))

    class Recording:
        def __init__(self):
            self.periods = 0

        def add(self, t_s, tracker, effort):
            self.periods += 1

        @property
        def elapsed_s(self):
            return 0.01 * self.periods

    class Node(live.LiveCalibration):
        simulated_arm, calibrate_s, dt_s, hardware_command_timeout_s = True, 0.5, 0.01, 0.05
        params, _config, _path = "p", "config", "unused"

        def __init__(self, profile):
            self._recording, self._model_version, self.tracker, self.problem = Recording(), "wm-x", None, None
            self.profile, self.published = profile, []

        def _publish(self, level, score, error, threshold, reason, ratios=None, remember=True):
            self.published.append((level, reason))

        def get_logger(self):
            return logging.getLogger("test_live_calibration")

    ok = Node("nominal")
    taken = []
    ok._take_calibration = taken.append
    for k in range(50):
        ok._record(0.01 * k, None)
    assert ok._fitting is not None and ok._recording.periods == 50
    for k in range(50, 80):  # the fit is running: the periods go on, and say so
        ok._record(0.01 * k, None)
    assert ok._recording.periods == 50 and not taken
    assert ok.published[-1][0] == 0 and "fitting the calibration" in ok.published[-1][1]
    release.set()
    assert ok._fitting.wait(10.0)
    assert len(fit_threads) == 1 and fit_threads[0] is not threading.current_thread()
    ok._record(0.8, None)
    assert len(taken) == 1 and taken[0].result == ("a calibration", 50, "nominal", "settings of p", 0.01, "wm-x")
    assert ok._recording is None and ok._fitting is None

    failed = Node("broken")  # (released already: it may finish within the period that started it)
    for k in range(50):
        failed._record(0.01 * k, None)
    if failed._fitting is not None:
        assert failed._fitting.wait(10.0)
        failed._record(0.5, None)
    assert failed.problem == "calibration failed: RuntimeError: boom" and failed._recording is None


@pytest.mark.ros
@pytest.mark.slow
def test_calibrate_s_records_normal_operation_writes_the_file_and_judges_with_it(spawn, ros_context, tmp_path):
    """The node's own calibration (what `trust calibrate --live` runs): the whole graph on the
    embedded arm, a short recording at a loose exceedance, the file written for the running world
    model, then the monitor judging with it."""
    from robot_wm import graph
    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.process_group import command_for

    out = tmp_path / "calibration.json"
    overrides = {"profile": "nominal", "calibrate_s": 12.0, "calibration_exceedance": 0.02, "calibration_file": str(out)}
    for spec in graph.plan("mujoco", overrides=overrides, enable=True):
        if not spec.needs_ros_install:
            spawn(command_for(spec))
    node, executor, states, close = _trust_client(ros_context)
    try:
        assert wait_for(lambda: states and "calibrating" in states[-1].reason, 60.0)
        assert wait_for(out.exists, 90.0), states[-1].reason if states else "no TrustState"
        cal = calib_io.load(out)
        assert cal.model_version.startswith("wm-") and cal.source.startswith("ros:nominal:")
        assert all(v > 0 for v in cal.thresholds.values()) and cal.periods > 100
        assert wait_for(lambda: states and "calibrating" not in states[-1].reason, 10.0)
    finally:
        close()
