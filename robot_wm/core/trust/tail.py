"""Thresholds for a false-alarm rate per hour: peaks over threshold, fitted and extrapolated.

The monitor drops a level when a smoothed signal stays over its threshold for ``min_duration_s``.
So what an operator feels as a false alarm is not one period's exceedance but an *excursion*: the
signal's minimum over a ``min_duration_s`` window (``persisted``) going over the threshold, and
the excursions within ``gap_s`` of each other being one episode (the level climbs back only after
a clean hold). The rate the issue asks for, under one alarm per hour, lies far beyond what minutes
of calibration can show: 300 s of held-out operation hold a few dozen excursions over a level
that a one-per-hour threshold is well above.

Extreme-value theory bridges that gap the standard way (peaks over threshold, Coles 2001, ch. 4
and 5.3): decluster the persisted stream into episodes over a high level ``u`` (the runs method),
fit a generalized Pareto distribution (``scipy.stats.genpareto``, maximum likelihood) to the
episode peaks' excess over ``u``, and solve for the level whose episode rate is the target:

    rate(x) = rate(u) · (1 + ξ (x − u) / σ) ^ (−1/ξ)     ->     x = u + σ/ξ · ((rate(u)/target)^ξ − 1)

with ξ kept in [0, 0.5] (``fit_gpd``): at the lightest an exponential tail, since a short
calibration cannot tell a bounded tail from an unlucky sample, and taking it for one would put the
threshold at the largest value seen; at the heaviest a tail with finite variance. The threshold is
never below the largest episode peak of the calibration (seen once in minutes: more often than
once in hours), whatever the fit says. What this cannot do is see a heavier tail than minutes
show: on smoothed Student-t noise (ξ ≈ 0.1) five minutes fit ξ ≤ 0, and a 0.3-per-hour threshold drops about once an hour; on the
arm's own signals (library mode, both profiles, 0.125 per hour and signal) an hour of held-out
operation had no drop at all, against 5-12 with the per-period quantiles. Where the calibration
is long enough to hold ``MIN_EMPIRICAL`` episodes at the target rate, the threshold is the
empirical level instead and nothing is extrapolated. numpy and scipy.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

#: episodes over the fitted level ``u``: fewer and the shape ξ is guesswork
MIN_EPISODES = 20
#: the episode count over ``u`` aimed for (the highest ``u`` that keeps about this many)
TARGET_EPISODES = 50
#: the largest shape ξ believed: beyond 0.5 the peaks' variance is infinite, and minutes of data that
#: say so show a few outliers, not a tail to extrapolate over thousands of times the rate
XI_MAX = 0.5
#: episodes that a calibration must hold at the target rate for the threshold to be read off it
MIN_EMPIRICAL = 10
#: excursions closer than this are one episode. Shorter than the monitor's clean hold (2 s, within
#: which a second excursion is no new drop from FULL), so episodes are counted at least as often
#: as the monitor would drop (the fit errs high), while a slow signal (the ensemble's
#: disagreement, over its median for seconds at a time) still shows enough episodes to fit
EPISODE_GAP_S = 0.5


class TailError(ValueError):
    """Too little data for a tail fit; the message says how much there was and how much is needed."""


@dataclass(frozen=True)
class TailFit:
    """How a rate threshold was made (kept in the calibration file, for a person to check).

    Attributes:
        threshold: the level whose episode rate is ``rate_per_hour``.
        rate_per_hour: the target episode rate.
        u: the level the peaks were taken over.
        rate_u_per_hour: the episode rate over ``u`` in the calibration.
        sigma, xi: the generalized Pareto scale and shape of the peaks' excess over ``u`` (ξ >= 0).
        episodes: the episodes over ``u``.
        hours: the calibration's length.
        method: "gpd" (extrapolated) or "empirical" (read off a long enough calibration).
    """

    threshold: float
    rate_per_hour: float
    u: float
    rate_u_per_hour: float
    sigma: float
    xi: float
    episodes: int
    hours: float
    method: str

    def to_dict(self) -> dict:
        """The fields, JSON-safe (σ and ξ of an empirical threshold are None)."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def persisted(values: np.ndarray, periods: int) -> np.ndarray:
    """The smallest of each ``periods`` consecutive values, ending at each period (the level the
    stream has stayed over for that long; the first ``periods − 1`` entries use what there is)."""
    v = np.asarray(values, dtype=float)
    out = v.copy()
    for lag in range(1, max(int(periods), 1)):
        out[lag:] = np.minimum(out[lag:], v[:-lag])
    return out


def episode_peaks(m: np.ndarray, u: float, gap: int) -> np.ndarray:
    """The peaks of the episodes of ``m`` over ``u``: runs over ``u`` less than ``gap`` periods apart
    are one episode (the runs declustering)."""
    above = np.flatnonzero(m > u)
    if above.size == 0:
        return np.empty(0)
    breaks = np.flatnonzero(np.diff(above) > gap) + 1
    return np.maximum.reduceat(m[above], np.r_[0, breaks])


def fit_gpd(excess: np.ndarray) -> tuple[float, float]:
    """Maximum likelihood (ξ, σ) of a generalized Pareto distribution for ``excess`` (> 0), with ξ
    in [0, XI_MAX]: the profile likelihood over a grid of ξ, σ by a bounded search at each (the
    unconstrained fit of ``scipy.stats.genpareto`` runs off to ξ of 5-7 with σ ~ 1e-5 on a mass of
    tiny excesses and a few large ones, as a live ROS calibration gave)."""
    from scipy.optimize import minimize_scalar
    from scipy.stats import genpareto

    y = np.asarray(excess, dtype=float)
    y = y[y > 0]
    mean = float(np.mean(y)) if y.size else 1.0
    best = (-float(genpareto.logpdf(y, 0.0, scale=mean).sum()), 0.0, mean)  # ξ = 0: the exponential, scale = mean
    for xi in np.linspace(0.0, XI_MAX, 26)[1:]:
        res = minimize_scalar(lambda ls, c=xi: -float(genpareto.logpdf(y, c, scale=math.exp(ls)).sum()),
                              bounds=(math.log(mean) - 12.0, math.log(mean) + 3.0), method="bounded")
        if res.fun < best[0]:
            best = (float(res.fun), float(xi), math.exp(float(res.x)))
    return best[1], max(best[2], 1e-12)


def rate_threshold(values: np.ndarray, dt_s: float, min_duration_s: float, rate_per_hour: float,
                   gap_s: float) -> TailFit:
    """The level that a smoothed signal stays over for ``min_duration_s`` in ``rate_per_hour``
    separate episodes per hour (see the module docstring).

    Args:
        values: the smoothed signal, one value per period of normal operation.
        dt_s: the period (s).
        min_duration_s: how long the monitor wants a signal over its threshold.
        rate_per_hour: the target episode rate.
        gap_s: excursions closer than this are one episode (the monitor's clean hold).
    Raises:
        TailError: too few episodes for a fit, or non-finite values.
    """
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise TailError(f"{v.size} values, some not finite: expected finite values")
    if not (math.isfinite(rate_per_hour) and rate_per_hour > 0):
        raise TailError(f"rate {rate_per_hour!r} per hour: expected a positive rate")
    hours = v.size * dt_s / 3600.0
    m = persisted(v, int(round(min_duration_s / dt_s)) + 1)
    gap = max(int(round(gap_s / dt_s)), 1)
    # u: the highest candidate level with TARGET_EPISODES episodes over it, else the one with the most
    # (a slow signal, the ensemble's disagreement, has few long episodes at any level)
    best_u, best = None, np.empty(0)
    for level in np.unique(np.quantile(m, np.linspace(0.5, 0.9999, 80)))[::-1]:
        peaks = episode_peaks(m, float(level), gap)
        if peaks.size > best.size:
            best_u, best = float(level), peaks
        if peaks.size >= TARGET_EPISODES:
            break
    u, peaks = best_u, best
    if peaks.size < MIN_EPISODES:
        raise TailError(f"{peaks.size} episodes of the signal over any level in {hours * 60:.1f} min (episodes "
                        f"{gap_s:g} s apart): a tail fit needs at least {MIN_EPISODES}; calibrate longer")
    rate_u = peaks.size / hours
    # the level the data itself shows exceeded no more often than the target: with fewer than one
    # episode expected in the calibration, its largest peak (seen once, so more often than the target)
    k = int(math.floor(rate_per_hour * hours))
    top = np.sort(peaks)[::-1]
    seen = float(top[k]) if k < top.size else u
    if rate_per_hour * hours >= MIN_EMPIRICAL:  # long enough to read the level off the data
        return TailFit(seen, float(rate_per_hour), u, rate_u, math.nan, math.nan, int(peaks.size), hours, "empirical")
    xi, sigma = fit_gpd(peaks - u)
    ratio = rate_u / rate_per_hour
    x = u + (sigma * math.log(ratio) if xi < 1e-9 else sigma / xi * (ratio ** xi - 1.0))
    x = max(x, seen)  # a fit that does not reach the data's own peaks (a few outliers) is not believed
    return TailFit(float(x), float(rate_per_hour), u, rate_u, sigma, float(xi), int(peaks.size), hours, "gpd")


__all__ = ["EPISODE_GAP_S", "MIN_EMPIRICAL", "MIN_EPISODES", "TARGET_EPISODES", "XI_MAX", "TailError", "TailFit",
           "episode_peaks", "fit_gpd", "persisted", "rate_threshold"]
