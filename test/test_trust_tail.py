"""Rate thresholds for the trust monitor (robot_wm.core.trust.tail): a threshold calibrated for a
number of level drops per hour on minutes of normal operation must hold that rate on hours of it.

The streams are what the monitor judges: noise smoothed by an EWMA (10 ms periods), so excursions
last several periods and come in clusters, as the real signals' do.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.signal import lfilter

from robot_wm.core.trust import calibrate, conformal_quantile
from robot_wm.core.trust import calibration as calib_io
from robot_wm.core.trust.calibration import RATE_MAX_RATIO, signal_threshold
from robot_wm.core.trust.tail import EPISODE_GAP_S, XI_MAX, TailError, episode_peaks, fit_gpd, persisted, rate_threshold

DT = 0.01
MIN_DURATION = 0.03
PERIODS_PER_HOUR = int(3600 / DT)


def smoothed_noise(rng: np.random.Generator, n: int, tau_s: float = 0.05, heavy: bool = False) -> np.ndarray:
    """|EWMA| of white noise (Student-t with 5 degrees of freedom when ``heavy``)."""
    x = rng.standard_t(5, n) if heavy else rng.standard_normal(n)
    a = 1.0 - math.exp(-DT / tau_s)
    return np.abs(lfilter([a], [1.0, a - 1.0], x))


def drops(values: np.ndarray, threshold: float) -> int:
    """Level drops the monitor would make: the signal over ``threshold`` for MIN_DURATION, episodes
    separated by its 2 s clean hold."""
    return int(episode_peaks(persisted(values, int(round(MIN_DURATION / DT)) + 1), threshold, int(2.0 / DT)).size)


def test_persisted_is_the_running_minimum_and_episodes_merge_within_the_gap():
    v = np.array([0.0, 5.0, 6.0, 7.0, 1.0, 9.0, 9.0, 9.0, 0.0])
    np.testing.assert_array_equal(persisted(v, 3), [0.0, 0.0, 0.0, 5.0, 1.0, 1.0, 1.0, 9.0, 0.0])
    m = np.array([0.0, 3.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0])
    np.testing.assert_array_equal(episode_peaks(m, 1.0, 3), [4.0, 2.0])  # 3 and 4 are one episode
    np.testing.assert_array_equal(episode_peaks(m, 1.0, 2), [3.0, 4.0, 2.0])
    assert episode_peaks(m, 10.0, 3).size == 0


@pytest.mark.parametrize("heavy", [False, True])
def test_a_rate_threshold_from_five_minutes_holds_its_rate_over_ten_hours(heavy):
    rng = np.random.default_rng(7 if heavy else 3)
    target = 3.0  # per hour: enough drops in 10 h to count, far below what 5 min can show
    cal = smoothed_noise(rng, 5 * 60 * 100, heavy=heavy)
    fit = rate_threshold(cal, DT, MIN_DURATION, target, EPISODE_GAP_S)
    assert fit.method == "gpd" and fit.episodes >= 20 and fit.xi >= 0.0
    held = smoothed_noise(rng, 10 * PERIODS_PER_HOUR, heavy=heavy)
    rate = drops(held, fit.threshold) / 10.0
    assert rate <= 2.0 * target, (rate, fit)
    # and a lower rate asks for a higher level
    assert rate_threshold(cal, DT, MIN_DURATION, target / 10.0, EPISODE_GAP_S).threshold > fit.threshold


def test_a_calibration_long_enough_reads_the_level_off_the_data():
    rng = np.random.default_rng(11)
    values = smoothed_noise(rng, 2 * PERIODS_PER_HOUR)
    fit = rate_threshold(values, DT, MIN_DURATION, 30.0, EPISODE_GAP_S)  # 60 episodes expected in 2 h
    assert fit.method == "empirical"
    over = episode_peaks(persisted(values, 4), fit.threshold, int(EPISODE_GAP_S / DT)).size
    assert over <= 60


def test_too_little_or_bad_data_is_refused_by_name():
    with pytest.raises(TailError, match="calibrate longer"):
        rate_threshold(np.zeros(30_000), DT, MIN_DURATION, 1.0, EPISODE_GAP_S)
    with pytest.raises(TailError, match="not finite"):
        rate_threshold(np.array([1.0, math.nan]), DT, MIN_DURATION, 1.0, EPISODE_GAP_S)
    with pytest.raises(TailError, match="positive rate"):
        rate_threshold(np.ones(10), DT, MIN_DURATION, 0.0, EPISODE_GAP_S)


def test_calibrate_with_a_false_alarm_rate_raises_thresholds_and_keeps_the_fit(tmp_path):
    rng = np.random.default_rng(5)
    n = 5 * 60 * 100
    streams = {"prediction_error": smoothed_noise(rng, n), "disagreement": smoothed_noise(rng, n, tau_s=0.2),
               "intervention": np.zeros(n)}
    plain = calibrate(streams, 1e-4, {"intervention": 0.5}, model_version="wm", source="s")
    rated = calibrate(streams, 1e-4, {"intervention": 0.5}, model_version="wm", source="s", alarms_per_hour=0.5)
    for name in ("prediction_error", "disagreement"):
        assert rated.thresholds[name] > plain.thresholds[name]
        assert rated.tail[name]["rate_per_hour"] == pytest.approx(0.5 / 3)
    assert rated.thresholds["intervention"] == 0.5  # never non-zero: its floor, and the reason in the file
    assert rated.tail["intervention"].startswith("no rate threshold")
    back = calib_io.load(calib_io.save(rated, tmp_path / "c.json"), "wm")
    assert back.alarms_per_hour == 0.5 and back.tail == rated.tail and back.thresholds == rated.thresholds
    assert plain.alarms_per_hour is None and plain.tail is None


def test_the_shape_fit_is_bounded_and_recovers_a_plain_tail():
    from scipy.stats import genpareto

    rng = np.random.default_rng(2)
    for true_xi in (0.0, 0.3):
        xi, sigma = fit_gpd(genpareto.rvs(true_xi, scale=1.0, size=400, random_state=rng))
        assert abs(xi - true_xi) < 0.15 and 0.8 < sigma < 1.25, (true_xi, xi, sigma)
    # a mass of tiny excesses and a few large ones: scipy's unconstrained fit says shape 5-7
    xi, sigma = fit_gpd(np.r_[1e-5 * rng.random(60), 0.5, 1.0, 2.0])
    assert 0.0 <= xi <= XI_MAX and sigma > 0


def test_outliers_in_a_calibration_neither_blind_a_signal_nor_hide_under_the_fit():
    """A signal whose five minutes hold a few big excursions: its rate threshold is at least the
    largest of them (each seen once, so more often than the target), and at most RATE_MAX_RATIO
    times the per-period quantile (the signal must still fire)."""
    rng = np.random.default_rng(9)
    values = smoothed_noise(rng, 30_000)
    for start in (5_000, 15_000, 25_000):  # three hiccups of 0.2 s at 6x the usual level
        values[start:start + 20] += 6.0
    fit = rate_threshold(values, DT, MIN_DURATION, 0.1, EPISODE_GAP_S)
    assert fit.threshold >= episode_peaks(persisted(values, 4), fit.u, int(EPISODE_GAP_S / DT)).max()
    q = conformal_quantile(values, 1e-4)
    threshold, info = signal_threshold(values, 1e-4, 0.1, DT, MIN_DURATION)
    assert threshold == pytest.approx(min(max(q, fit.threshold), RATE_MAX_RATIO * q))
    assert info["capped_at"] == pytest.approx(RATE_MAX_RATIO * q)
