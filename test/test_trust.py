"""The trust monitor's core (robot_wm.core.trust): conformal thresholds reach their exceedance on
held-out data, the two-signal persistence ignores single spikes, the level state machine never
gains autonomy without the stated evidence."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robot_wm.core.safety.limits import TrustLevel
from robot_wm.core.trust import (
    SIGNALS,
    Calibration,
    CalibrationError,
    Ewma,
    Signal,
    TrustConfig,
    TrustMonitor,
    calibrate,
    conformal_quantile,
    disagreement,
    prediction_error,
)
from robot_wm.core.trust import calibration as calib_io
from robot_wm.core.trust.signals import ResponseLag, period_signals

DT = 0.01
THRESHOLDS = {"prediction_error": 2.0, "disagreement": 1.0, "intervention": 0.2}
CAL = Calibration(THRESHOLDS, 1e-3, "wm-test", "test", 10_000)


def _run(monitor, samples, t0=0.0):
    """Feed (e, d, intervened) triples one period apart; return the outputs."""
    return [monitor.step(t0 + k * DT, prediction_error=e, disagreement=d, intervened=i)
            for k, (e, d, i) in enumerate(samples)]


# ------------------------------------------------------------------------------- calibration
def test_conformal_thresholds_reach_their_exceedance_on_held_out_data():
    """The split-conformal guarantee is on average over calibration sets: over 100 sets of 20/α
    values each, the held-out exceedance is at most α within the sampling noise (2 % of α here), and
    not far below it (no waste)."""
    rng = np.random.default_rng(0)
    for alpha in (0.1, 0.01, 0.002):
        n = int(20 / alpha)
        rates = [np.mean(rng.gamma(2.0, 1.0, 5 * n) > conformal_quantile(rng.gamma(2.0, 1.0, n), alpha))
                 for _ in range(100)]
        assert 0.85 * alpha <= np.mean(rates) <= 1.1 * alpha, (alpha, np.mean(rates))


def test_too_little_data_for_the_exceedance_is_refused_naming_the_signal():
    with pytest.raises(CalibrationError, match="too few for exceedance 0.001: need at least 999"):
        conformal_quantile(np.ones(500), 1e-3)
    streams = {s.value: np.ones(5000) for s in SIGNALS}
    del streams["disagreement"]
    with pytest.raises(CalibrationError, match="'disagreement'"):
        calibrate(streams, 1e-3, {}, model_version="v", source="s")


def test_a_signal_that_is_never_nonzero_gets_its_floor():
    streams = {"prediction_error": np.linspace(0.5, 1.5, 5000), "disagreement": np.full(5000, 0.3),
               "intervention": np.zeros(5000)}
    cal = calibrate(streams, 1e-2, {"intervention": 0.05}, model_version="wm-1", source="library:nominal")
    assert cal.thresholds["intervention"] == 0.05 and 1.4 < cal.thresholds["prediction_error"] <= 1.5


def test_a_calibration_round_trips_and_is_refused_for_another_model(tmp_path):
    path = calib_io.save(CAL, tmp_path / "trust" / "calibration.json")
    assert calib_io.load(path, "wm-test") == CAL
    with pytest.raises(CalibrationError, match="calibrated for world model 'wm-test'.*'wm-other'"):
        calib_io.load(path, "wm-other")
    doc = json.loads(path.read_text())
    doc["thresholds"]["disagreement"] = -1
    path.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="thresholds.disagreement=-1"):
        calib_io.load(path)
    with pytest.raises(CalibrationError, match="cannot read"):
        calib_io.load(tmp_path / "missing.json")
    assert not list((tmp_path / "trust").glob("*.tmp"))  # the atomic write leaves nothing behind


def test_the_response_lag_is_judged_only_by_a_calibration_that_has_its_threshold(tmp_path):
    """A file made before the signal loads and never judges it; one made with it judges it, and a
    bad value is refused by name."""
    old = calib_io.load(calib_io.save(CAL, tmp_path / "old.json"))
    new = Calibration({**THRESHOLDS, "response_lag": 0.4}, 1e-3, "wm-test", "test", 10_000)
    assert not old.judges(Signal.LAG) and calib_io.load(calib_io.save(new, tmp_path / "new.json")).judges(Signal.LAG)
    for cal, judged in ((old, False), (new, True)):
        monitor = TrustMonitor(TrustConfig(), cal)
        for k in range(300):
            out = monitor.step(k * DT, prediction_error=0.5, disagreement=0.3, intervened=False, response_lag=0.9)
        assert (out.evidence > TrustLevel.FULL) == judged, out.reason
        assert ("response_lag 0.9" in out.reason) == judged, out.reason
    doc = json.loads((tmp_path / "new.json").read_text())
    doc["thresholds"]["response_lag"] = "high"
    (tmp_path / "new.json").write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="thresholds.response_lag='high'"):
        calib_io.load(tmp_path / "new.json")


# ------------------------------------------------------------------------------- signals
def test_the_signals_are_one_when_the_model_is_calibrated():
    rng = np.random.default_rng(1)
    std_e, std_a = np.full(12, 0.003), np.full(12, 0.004)
    errs = [prediction_error(np.zeros(12), std_e, std_a, rng.normal(0, 0.005, 12)) for _ in range(4000)]
    assert 0.95 < float(np.sqrt(np.mean(np.square(errs)))) < 1.05
    assert disagreement(std_e, std_a) == pytest.approx(0.75)
    assert prediction_error(np.zeros(2), np.zeros(2), np.zeros(2), np.ones(2)) == pytest.approx(1e6)  # std floored


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 1e-9, 1e-3, 1.0]))
def test_the_per_period_signals_are_the_reference_formulas(n, seed, std_scale):
    """``period_signals`` (one pass over Python floats, the tracker's path) gives what the numpy
    definitions give, tiny or zero stds included (the floor)."""
    rng = np.random.default_rng(seed)
    mean, q, qd = rng.normal(0, 1, 2 * n), rng.normal(0, 1, n), rng.normal(0, 1, n)
    epi, ale = rng.uniform(0, 1, 2 * n) * std_scale, rng.uniform(0, 1, 2 * n) * std_scale
    qd_from = rng.normal(0, 1, n)
    pe, dis, vel, cross, power = period_signals(mean.tolist(), epi.tolist(), ale.tolist(), q.tolist(), qd.tolist(),
                                                qd_from.tolist())
    assert pe == pytest.approx(prediction_error(mean, epi, ale, np.concatenate([q, qd])), rel=1e-9)
    assert dis == pytest.approx(disagreement(epi[n:], ale[n:]), rel=1e-9)
    assert vel == pytest.approx(float(np.sqrt(np.mean((mean[n:] - qd) ** 2))), rel=1e-9)
    assert cross == pytest.approx(float((qd - mean[n:]) @ (mean[n:] - qd_from)), rel=1e-9, abs=1e-12)
    assert power == pytest.approx(float((mean[n:] - qd_from) @ (mean[n:] - qd_from)), rel=1e-9)
    assert period_signals(mean.tolist(), epi.tolist(), ale.tolist(), q.tolist(), qd.tolist())[3:] == (0.0, 0.0)


def _lag_run(delay_periods: int, seconds: float = 6.0, seed: int = 0, moving: bool = True) -> np.ndarray:
    """The response lag of a stiff velocity-controlled joint pair the model predicts answers its
    command within a period (q̇' = u), on an arm whose commands arrive ``delay_periods`` late."""
    rng = np.random.default_rng(seed)
    n = int(seconds / DT)
    u = np.cumsum(rng.normal(0, 0.03, (n, 2)), axis=0) if moving else np.full((n, 2), 0.2)
    lag, out, qd = ResponseLag(0.1), [], np.zeros(2)
    for k in range(1, n):
        predicted = u[k - 1]  # the model: the command sent at k-1 is the velocity at k
        measured = u[max(k - 1 - delay_periods, 0)] + rng.normal(0, 0.002, 2)
        *_, cross, power = period_signals([0.0, 0.0, *predicted], [1e-3] * 4, [1e-2] * 4, [0.0, 0.0],
                                          measured.tolist(), qd.tolist())
        out.append(lag.update(cross, power, DT))
        qd = measured
    return np.asarray(out[50:])


def test_the_response_lag_reads_zero_when_the_arm_answers_as_predicted_and_rises_with_a_delay():
    on_time, late, later, resting = _lag_run(0), _lag_run(1), _lag_run(3), _lag_run(3, moving=False)
    assert np.percentile(np.abs(on_time), 99) < 0.15
    # random-walk commands: a delay of d periods leaves d of the d + 1 increments the model expects
    # to show undone, a slope of d / (d + 1)
    assert np.median(late) == pytest.approx(0.5, abs=0.1) and np.median(later) == pytest.approx(0.75, abs=0.1)
    assert np.abs(resting).max() < 0.05  # nothing predicted to change: nothing to judge (the floor)


def test_the_response_lags_floor_discounts_small_predicted_changes_and_only_those():
    """MIN_RESPONSE_POWER in the denominator: a steady predicted change whose power equals the floor
    reads half the slope the arm shows, one a hundred times larger nearly all of it (the same relative
    miss); a floor that is not a positive number is refused."""
    from robot_wm.core.trust.signals import MIN_RESPONSE_POWER

    def steady(power: float, miss: float) -> float:
        lag = ResponseLag(0.1)
        for _ in range(200):
            out = lag.update(-miss * power, power, DT)
        return out

    assert steady(MIN_RESPONSE_POWER, 0.8) == pytest.approx(0.4, rel=1e-6)
    assert steady(100 * MIN_RESPONSE_POWER, 0.8) == pytest.approx(0.8 * 100 / 101, rel=1e-6)
    assert ResponseLag(0.1, min_power=1e-4).update(-0.8e-4, 1e-4, 1.0) == pytest.approx(0.4, rel=1e-3)  # its own floor
    for bad in (0.0, -1e-4, float("nan")):
        with pytest.raises(ValueError, match="min_power"):
            ResponseLag(0.1, min_power=bad)


def test_the_ewma_weighs_a_sample_by_the_time_it_covers():
    f = Ewma(0.05)
    f.update(0.0, DT)
    f.update(1.0, DT)
    one = f.value
    g = Ewma(0.05)
    g.update(0.0, DT)
    g.update(1.0, 3 * DT)  # a late period counts for three
    assert g.value > one > 0.0
    with pytest.raises(ValueError, match="tau_s"):
        Ewma(0.0)


def _trusted(config: TrustConfig | None = None) -> tuple[TrustMonitor, float]:
    """A monitor stepped up from its start-up STOP to FULL on quiet evidence; (monitor, next t)."""
    m = TrustMonitor(config or TrustConfig(), CAL)
    steps = int(round((3 * m.config.clean_hold_s + 0.1) / DT))
    outs = _run(m, [(1.0, 0.5, False)] * steps)
    assert outs[0].level == TrustLevel.STOP and outs[-1].level == TrustLevel.FULL
    return m, steps * DT


# ------------------------------------------------------------------------------- levels
def test_the_monitor_starts_at_stop_and_earns_full():
    m = TrustMonitor(TrustConfig(clean_hold_s=0.5), CAL)
    levels = [o.level for o in _run(m, [(1.0, 0.5, False)] * 200)]
    assert levels[0] == TrustLevel.STOP and levels[-1] == TrustLevel.FULL
    assert [lv for a, lv in zip(levels, levels[1:]) if a != lv] == [TrustLevel.SLOW, TrustLevel.CAUTIOUS, TrustLevel.FULL]


def test_single_spikes_never_stop_the_arm():
    """One wild sample in both signals at once, every half second: never STOP, never below CAUTIOUS
    for long; a persistent error in one signal slows the arm, in two it stops it."""
    m, t0 = _trusted()
    quiet = [(1.0, 0.5, False)] * 49
    outs = _run(m, ([(50.0, 20.0, True)] + quiet) * 10, t0=t0)
    assert all(o.level <= TrustLevel.CAUTIOUS for o in outs) and m.anomalies == 0
    m, t0 = _trusted()
    outs = _run(m, [(1.0, 0.5, False)] * 20 + [(6.0, 0.5, False)] * 30, t0=t0)  # prediction error only, 3x
    assert outs[-1].level == TrustLevel.SLOW and "prediction_error" in outs[-1].reason
    outs = _run(m, [(6.0, 3.0, False)] * 30, t0=t0 + 0.5)  # and the ensemble disagrees: an anomaly
    assert outs[-1].level == TrustLevel.STOP and m.anomalies == 1


def test_a_signal_that_joins_a_lasting_one_must_last_itself_before_it_stops_the_arm():
    """A changed arm (a payload the effort sees) keeps one signal over for good, at SLOW. A brief
    excursion of a second signal beside it is one odd sample, not two signals agreeing on one event:
    no STOP. The same second signal lasting anomaly_window_s is an anomaly."""
    m, t0 = _trusted(TrustConfig(clean_hold_s=0.5, anomaly_window_s=1.0))
    outs = _run(m, [(6.0, 0.5, False)] * 300, t0=t0)  # the prediction error over for 3 s: SLOW
    assert outs[-1].level == TrustLevel.SLOW and m.anomalies == 0
    outs = _run(m, [(6.0, 3.0, False)] * 30 + [(6.0, 0.5, False)] * 100, t0=t0 + 3.0)  # disagreement for 0.3 s
    assert "disagreement" in outs[20].reason and " > " in outs[20].reason.split("disagreement")[1][:12]
    assert all(o.level == TrustLevel.SLOW for o in outs) and m.anomalies == 0
    assert "the 1 s an anomaly needs" in outs[20].reason, outs[20].reason
    assert "anomaly needs" not in outs[-1].reason  # the excursion over, the reason says so no more
    outs = _run(m, [(6.0, 3.0, False)] * 150, t0=t0 + 4.3)  # ... and for 1.5 s: STOP once it has lasted 1 s
    stopped = next(k for k, o in enumerate(outs) if o.level == TrustLevel.STOP)
    assert 100 <= stopped <= 110 and m.anomalies == 1, stopped


@settings(max_examples=60, deadline=None)
@given(gap_s=st.floats(0.0, 3.0), lasts_s=st.floats(0.05, 2.5), window_s=st.sampled_from([0.5, 1.0]))
def test_two_signals_stop_the_arm_exactly_when_they_went_over_together_or_both_lasted_the_window(gap_s, lasts_s, window_s):
    """The prediction error goes over and stays; ``gap_s`` later the disagreement goes over for ``lasts_s``.
    STOP (an anomaly) when the two went over within the window of each other, or when the second
    lasted the window; never otherwise (a few periods of the smoothing's rise either side)."""
    m, t0 = _trusted(TrustConfig(anomaly_window_s=window_s))
    first = int(round(gap_s / DT))
    second = int(round(lasts_s / DT))
    outs = _run(m, [(6.0, 0.5, False)] * first + [(6.0, 3.0, False)] * second + [(6.0, 0.5, False)] * 20, t0=t0)
    margin = 0.06
    together = gap_s + margin < window_s and lasts_s > margin
    lasting = lasts_s > window_s + margin
    apart = gap_s > window_s + margin and lasts_s < window_s - margin
    stopped = any(o.level >= TrustLevel.STOP for o in outs)
    if together or lasting:
        assert stopped and m.anomalies == 1
    elif apart:
        assert not stopped and m.anomalies == 0


def test_levels_step_up_one_at_a_time_after_the_clean_hold_and_human_needs_an_operator():
    cfg = TrustConfig(clean_hold_s=0.5, human_after_s=1.0)
    m = TrustMonitor(cfg, CAL)
    _run(m, [(6.0, 3.0, True)] * 20)
    assert m.level == TrustLevel.STOP
    outs = _run(m, [(1.0, 0.5, False)] * 200, t0=0.2)
    levels = [o.level for o in outs]
    changes = [(a, b) for a, b in zip(levels, levels[1:]) if a != b]
    assert changes == [(TrustLevel.STOP, TrustLevel.SLOW), (TrustLevel.SLOW, TrustLevel.CAUTIOUS),
                       (TrustLevel.CAUTIOUS, TrustLevel.FULL)]
    # a STOP that lasts past human_after_s calls a human, who is refused while the evidence is bad
    outs = _run(m, [(6.0, 3.0, True)] * 150, t0=2.5)
    assert outs[-1].level == TrustLevel.HUMAN and "acknowledge" in outs[-1].reason
    assert m.acknowledge()[0] is False
    _run(m, [(1.0, 0.5, False)] * 300, t0=4.0)
    assert m.level == TrustLevel.HUMAN  # clean evidence alone never leaves HUMAN
    ok, message = m.acknowledge()
    assert ok and m.level == TrustLevel.STOP, message


def test_no_prediction_slows_then_stops():
    m = TrustMonitor(TrustConfig(stale_s=0.1, stop_stale_s=0.5), CAL)
    out = m.step(0.0, prediction_error=None, disagreement=None, intervened=False)
    assert out.level == TrustLevel.STOP and "no world-model prediction" in out.reason
    m, t0 = _trusted(TrustConfig(stale_s=0.1, stop_stale_s=0.5))
    outs = _run(m, [(None, None, False)] * 60, t0=t0)
    evidence = [o.evidence for o in outs]
    assert evidence[5] == TrustLevel.FULL and evidence[15] == TrustLevel.SLOW and outs[15].level == TrustLevel.SLOW
    assert evidence[-1] == TrustLevel.STOP and "no world-model prediction for" in outs[-1].reason


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.tuples(st.floats(0.0, 20.0), st.floats(0.0, 5.0), st.booleans()), min_size=1, max_size=400),
       human_on_anomaly=st.booleans())
def test_no_path_gains_autonomy_without_a_clean_hold(events, human_on_anomaly):
    """Over random event sequences: the level never rises by more than one at a time, and only
    after clean_hold_s of evidence better than the level; HUMAN is never left without an operator."""
    cfg = TrustConfig(clean_hold_s=0.2, human_after_s=0.5, human_on_anomaly=human_on_anomaly)
    m = TrustMonitor(cfg, CAL)
    better_since = None
    prev = m.level
    for k, (e, d, i) in enumerate(events):
        t = k * DT
        out = m.step(t, prediction_error=e, disagreement=d, intervened=i)
        if out.level < prev:
            assert prev != TrustLevel.HUMAN
            assert int(prev) - int(out.level) == 1
            assert better_since is not None and t - better_since >= cfg.clean_hold_s - 1e-9
        better_since = (better_since if better_since is not None else t) if out.evidence < out.level else None
        if out.level != prev:
            better_since = t if out.evidence < out.level else None
        prev = out.level


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="tau_s"):
        TrustConfig(tau_s=(0.1, 0.1))
    with pytest.raises(ValueError, match="slow_ratio"):
        TrustConfig(slow_ratio=0.5)
