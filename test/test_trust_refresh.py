"""Refreshing an inherited trust calibration after a world-model swap (robot_wm.core.trust.refresh):
the new model's world-model thresholds from its own normal periods (judged by the model-free
signals), tightened freely, loosened at most by the factor, the rest kept; the settings refused
with their names."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robot_wm.core.safety.limits import TrustLevel
from robot_wm.core.trust import Calibration, TrustConfig, TrustMonitor, conformal_quantile
from robot_wm.core.trust.refresh import CalibrationRefresh, is_inherited
from robot_wm.core.trust.settings import config_from_params
from robot_wm.core.trust.signals import Signal

DT = 0.01
ALPHA = 0.01  # the quantile needs >= 99 periods
EFFORT_MODEL = {"note": "kept as it is"}
INHERITED = Calibration({"prediction_error": 2.0, "disagreement": 1.0, "intervention": 0.5, "effort_error": 2.0},
                        ALPHA, "wm-child", "inherited from wm-parent (library:nominal) by online adaptation", 60_000,
                        effort_model=EFFORT_MODEL)
FLOORS = {"prediction_error": 0.3, "disagreement": 0.15, "intervention": 0.5, "effort_error": 1.0}


def _feed(refresh, monitor, errors, spreads, efforts=None, interventions=None, t0=0.0):
    """One monitor step per sample, then the refresh; returns (the refreshed calibration or None,
    the smoothed (error, disagreement) of every period the refresh could have taken)."""
    seen, out = [], None
    for k, (e, d) in enumerate(zip(errors, spreads)):
        effort = None if efforts is None else efforts[k]
        effort = 0.5 if effort is None and monitor.calibration.judges(Signal.EFFORT) else effort
        intervened = False if interventions is None else bool(interventions[k])
        # what the tracker does: the monitor stops counting interventions below FULL
        monitor.step(t0 + k * DT, prediction_error=e, disagreement=d, effort_error=effort,
                     intervened=intervened and monitor.level == TrustLevel.FULL)
        seen.append((monitor.smoothed(Signal.PREDICTION_ERROR), monitor.smoothed(Signal.DISAGREEMENT),
                     monitor.ratio(Signal.EFFORT) <= 1.0))
        got = refresh.update(monitor, fresh_prediction=True, intervened=intervened)
        out = got if got is not None else out
    return out, seen


def test_a_better_model_gets_tighter_thresholds_from_its_own_normal_periods():
    rng = np.random.default_rng(0)
    monitor = TrustMonitor(TrustConfig(), INHERITED)
    refresh = CalibrationRefresh(INHERITED, FLOORS, DT, seconds=3.0, max_factor=1.5)
    n = 25 + refresh.periods  # the first 5 x 50 ms settle the smoothing
    errors, spreads = rng.uniform(0.4, 0.8, n), rng.uniform(0.2, 0.4, n)
    cal, seen = _feed(refresh, monitor, errors, spreads)
    assert cal is not None and refresh.collected == refresh.periods == 300 and refresh.skipped == 0
    taken = np.array([s[:2] for s in seen[25:]])
    assert cal.thresholds["prediction_error"] == pytest.approx(conformal_quantile(taken[:, 0], ALPHA))
    assert cal.thresholds["disagreement"] == pytest.approx(conformal_quantile(taken[:, 1], ALPHA))
    assert cal.thresholds["prediction_error"] < 0.85 and cal.thresholds["disagreement"] < 0.45  # tighter
    # the model-free signals' thresholds, the effort model and the model version are kept
    assert cal.thresholds["intervention"] == 0.5 and cal.thresholds["effort_error"] == 2.0
    assert cal.effort_model is EFFORT_MODEL and cal.model_version == "wm-child" and cal.exceedance == ALPHA
    assert cal.source.startswith("refreshed on 300 live periods") and "inherited from wm-parent" in cal.source
    assert not is_inherited(cal) and is_inherited(INHERITED)
    assert refresh.update(monitor, fresh_prediction=True, intervened=False) is None  # once


def test_periods_the_model_free_signals_call_abnormal_are_not_taken():
    """A payload raises the effort signal and the world model's error together: those periods say
    nothing about the model's normal error and must not loosen its thresholds."""
    monitor = TrustMonitor(TrustConfig(), INHERITED)
    refresh = CalibrationRefresh(INHERITED, FLOORS, DT, seconds=1.0, max_factor=1.5)
    n = 400
    loaded = (np.arange(n) >= 100) & (np.arange(n) < 250)
    errors = np.where(loaded, 2.8, 0.5)
    efforts = np.where(loaded, 6.0, 0.5)  # three times its threshold: over it while loaded
    cal, seen = _feed(refresh, monitor, errors, np.full(n, 0.3), efforts)
    assert cal is not None and refresh.skipped > 100
    taken = [s[0] for s in seen[25:] if s[2]]
    # what entered is the unloaded model's error (the smoothing's tail into the loaded periods aside)
    assert cal.thresholds["prediction_error"] <= max(taken[:refresh.periods]) + 1e-12
    assert cal.thresholds["prediction_error"] < 1.5


def test_a_refresh_loosens_at_most_by_the_factor_and_never_below_the_floor():
    monitor = TrustMonitor(TrustConfig(), INHERITED)
    refresh = CalibrationRefresh(INHERITED, FLOORS, DT, seconds=1.0, max_factor=1.5)
    n = 25 + refresh.periods
    cal, _ = _feed(refresh, monitor, np.full(n, 5.0), np.full(n, 0.01))  # clipped at 3x 2.0 in the EWMA
    assert cal.thresholds["prediction_error"] == pytest.approx(3.0)  # 1.5 x 2.0
    assert cal.thresholds["disagreement"] == pytest.approx(0.15)  # the floor


def test_without_an_effort_model_a_model_cannot_loosen_its_own_thresholds():
    """An arm without torque sensing: only the filter's interventions judge a period. A model 2.5x
    worse than its threshold drops the level, below which the monitor stops counting interventions;
    the refresh counts them itself, and without an effort judge it only tightens."""
    inherited = Calibration({"prediction_error": 2.0, "disagreement": 1.0, "intervention": 0.5}, ALPHA, "wm-child",
                            "inherited from wm-parent", 1000)
    monitor = TrustMonitor(TrustConfig(), inherited)
    refresh = CalibrationRefresh(inherited, FLOORS, DT, seconds=1.0, max_factor=1.5)
    assert refresh.max_factor == 1.0
    n = 400
    cal, _ = _feed(refresh, monitor, np.full(n, 5.0), np.full(n, 0.3), interventions=np.ones(n))
    # the filter acting: never normal once its smoothed rate is over the threshold (0.35 s from a cold start)
    assert cal is None and refresh.collected < 15 and refresh.skipped > n - 40
    monitor = TrustMonitor(TrustConfig(), inherited)
    refresh = CalibrationRefresh(inherited, FLOORS, DT, seconds=1.0, max_factor=1.5)
    cal, _ = _feed(refresh, monitor, np.full(n, 5.0), np.full(n, 0.3))  # the filter quiet: collected, but capped
    assert cal is not None and cal.thresholds["prediction_error"] == pytest.approx(2.0)


def test_periods_without_a_fresh_prediction_are_not_taken():
    monitor = TrustMonitor(TrustConfig(), INHERITED)
    refresh = CalibrationRefresh(INHERITED, FLOORS, DT, seconds=1.0, max_factor=1.5)
    for k in range(300):
        monitor.step(k * DT, prediction_error=0.5, disagreement=0.3, intervened=False, effort_error=0.5)
        assert refresh.update(monitor, fresh_prediction=False, intervened=False) is None
    assert refresh.collected == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 10.0), st.floats(0.0, 8.0), st.booleans()),
                min_size=1, max_size=40),
       st.floats(1.0, 3.0), st.floats(0.3, 4.0), st.floats(0.15, 2.0))
def test_refreshed_thresholds_stay_between_the_floor_and_the_factor(pattern, factor, th_error, th_spread):
    inherited = Calibration({"prediction_error": th_error, "disagreement": th_spread, "intervention": 0.5,
                             "effort_error": 2.0}, ALPHA, "wm-child", "inherited from wm-parent", 1000, effort_model={})
    monitor = TrustMonitor(TrustConfig(), inherited)
    refresh = CalibrationRefresh(inherited, FLOORS, DT, seconds=1.0, max_factor=factor)
    samples = (pattern * (2000 // len(pattern) + 1))[:2000]
    cal, _ = _feed(refresh, monitor, [s[0] for s in samples], [s[1] for s in samples], [s[2] for s in samples],
                   [s[3] for s in samples])
    if cal is None:  # the model-free signals never allowed 100 normal periods: nothing changes
        assert refresh.collected < refresh.periods
        return
    for name, inherited_th in (("prediction_error", th_error), ("disagreement", th_spread)):
        assert FLOORS[name] - 1e-12 <= cal.thresholds[name] <= factor * inherited_th + 1e-12
        assert math.isfinite(cal.thresholds[name])


def test_too_short_a_refresh_and_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match=r"refresh_seconds=0.5: 50 periods .* needs at least 99"):
        CalibrationRefresh(INHERITED, FLOORS, DT, seconds=0.5, max_factor=1.5)
    with pytest.raises(ValueError, match="refresh_max_factor=0.9"):
        CalibrationRefresh(INHERITED, FLOORS, DT, seconds=2.0, max_factor=0.9)
    import dataclasses

    with pytest.raises(ValueError, match=r"exceedance 0.0: expected a probability in \(0, 1\)"):
        CalibrationRefresh(dataclasses.replace(INHERITED, exceedance=0.0), FLOORS, DT, seconds=2.0, max_factor=1.5)
    with pytest.raises(ValueError, match="refresh_seconds=-1"):
        config_from_params({"refresh_seconds": -1.0})
    with pytest.raises(ValueError, match="refresh_max_factor=0.5"):
        config_from_params({"refresh_max_factor": 0.5})
    assert config_from_params({})[1].refresh_seconds == 600.0


def test_the_online_learners_re_issued_calibration_is_recognized_as_inherited(tmp_path):
    """The source string the learner writes (robot_wm.learning.online.export_candidate_set) is what
    the monitor refreshes; the shipped calibrations are not."""
    import json

    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.learning.online import INHERITED_SOURCE
    from robot_wm.registry import shipped_path

    assert is_inherited(Calibration({}, ALPHA, "v", INHERITED_SOURCE.format(parent="p", source="s"), 1))
    shipped = calib_io.load(shipped_path("reach", "calibration", "nominal"))
    assert not is_inherited(shipped), json.dumps(shipped.source)
