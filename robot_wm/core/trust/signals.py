"""The trust monitor's per-period signals, from what the world model predicted and what happened.

Each control period the world model predicted the state measured now (mean, epistemic and
aleatoric std, one period earlier, for the command actually sent); the monitor turns the pair
into dimensionless signals, each about 1 or below in normal operation:

* ``prediction_error``: the RMS z-score ``sqrt(mean(((x − μ) / σ)²))`` over the state (q, q̇),
  σ² = epistemic² + aleatoric² (a diagonal Mahalanobis distance per dimension: 1 when the model's
  uncertainty is calibrated, larger when reality leaves it — a payload, friction, latency);
* ``disagreement``: the RMS over the velocities of epistemic / aleatoric std: how much more the
  ensemble members disagree than the noise they expect (large where the model has not seen such
  states, whatever happened);
* ``intervention``: 1 for a period in which the safety filter changed the command, else 0;
* ``effort_error``: the RMS z-score of the measured joint efforts against a model of normal
  operation (``effort.py``): what a payload or a push changes while the motion hardly does;
* ``response_lag``: the share of the velocity change the model predicted that the arm did not
  make, ``−Σ e·Δv̂ / Σ Δv̂²`` over the joints (e = measured − predicted q̇, Δv̂ = predicted q̇ −
  the q̇ it was predicted from), each sum an EWMA over ``lag_tau_s`` (``ResponseLag``): 0 when
  the arm answers as the model expects, towards 1 when it answers a period late or not at all.
  A command latency hides in the RMS error, which the transients of normal operation dominate,
  but shows here as soon as the commands change (library mode, nominal arm, +30 ms, with the
  floor at 1e-4: 0.28 at most in two minutes of normal operation, a median of 0.57 after the
  onset; ``MIN_RESPONSE_POWER`` below for the floor).

``Ewma`` smooths each of them (an exponentially weighted mean with a time constant in seconds):
chosen over CUSUM because it needs no assumed size of the shift, answers within a few time
constants to any persistent change, and its steady-state spread is known, which is what the
conformal calibration (``calibration.py``) quantiles. numpy only.
"""
from __future__ import annotations

import math
from enum import Enum

import numpy as np

#: Floor on a predicted std (a model that claims zero noise would make every error infinite).
MIN_STD = 1e-6


class Signal(str, Enum):
    """The monitor's signals (names used in config and calibration files)."""

    PREDICTION_ERROR = "prediction_error"
    DISAGREEMENT = "disagreement"
    INTERVENTION = "intervention"
    EFFORT = "effort_error"
    LAG = "response_lag"


SIGNALS = tuple(Signal)
#: the signals every calibration has; the effort signal needs an effort model (and efforts measured),
#: the response lag a calibration that made a threshold for it (older ones do not judge it)
BASE_SIGNALS = (Signal.PREDICTION_ERROR, Signal.DISAGREEMENT, Signal.INTERVENTION)
#: the predicted velocity change, (rad/s)² summed over the joints, below which the response lag is
#: hardly judged (0.017 rad/s in a period): added to the denominator, so a resting arm reads ~0, and
#: a steady change of this size reads half its slope. 1e-4 before (0.01 rad/s): small
#: predicted changes, whose slopes are mostly noise, then set the signal's normal tail, and its
#: threshold (library mode, nominal: 0.547 against 0.350, `docs/trust.md`)
MIN_RESPONSE_POWER = 3e-4


def prediction_error(predicted: np.ndarray, epistemic_std: np.ndarray, aleatoric_std: np.ndarray,
                     measured: np.ndarray) -> float:
    """RMS z-score of ``measured`` under the predicted Gaussian (all arrays the same shape)."""
    var = epistemic_std * epistemic_std + aleatoric_std * aleatoric_std
    np.maximum(var, MIN_STD * MIN_STD, out=var)  # std floored at MIN_STD
    d = np.asarray(measured, dtype=float) - predicted
    return math.sqrt(float(d @ (d / var)) / d.size)


def disagreement(epistemic_std: np.ndarray, aleatoric_std: np.ndarray) -> float:
    """RMS of epistemic / aleatoric std (dimensionless)."""
    ratio = np.asarray(epistemic_std, dtype=float) / np.maximum(aleatoric_std, MIN_STD)
    return math.sqrt(float(ratio @ ratio) / ratio.size)


def period_signals(predicted: list[float], epistemic_std: list[float], aleatoric_std: list[float],
                   q: list[float], qdot: list[float], qdot_from: list[float] | None = None) -> tuple[float, ...]:
    """This period's ``(prediction_error, disagreement, velocity RMS error, Σ e·Δv̂, Σ Δv̂²)`` for a
    predicted state (q, q̇) against the measured ``q``, ``qdot``: the numbers
    ``prediction_error(predicted, epi, ale, q + qdot)``, ``disagreement`` over the velocities and
    the RMS of the velocity error (rad/s) give, and ``ResponseLag``'s two sums (e = measured −
    predicted q̇, Δv̂ = predicted q̇ − ``qdot_from``, the q̇ the prediction started from; both 0
    without it), in one pass over Python floats (the monitor's per-period path: a dozen numbers are
    too few for numpy's per-call overhead, 7.6 µs with arrays against 2.5 µs)."""
    nq, floor = len(q), MIN_STD * MIN_STD
    z2 = dis2 = v2 = cross = power = 0.0
    for i, (mu, e, a, x) in enumerate(zip(predicted, epistemic_std, aleatoric_std, q + qdot)):
        var = e * e + a * a
        d = x - mu
        z2 += d * d / (var if var > floor else floor)
        if i >= nq:
            r = e / (a if a > MIN_STD else MIN_STD)
            dis2 += r * r
            v2 += d * d
            if qdot_from is not None:
                dv = mu - qdot_from[i - nq]
                cross += d * dv
                power += dv * dv
    nv = len(qdot)
    return math.sqrt(z2 / (nq + nv)), math.sqrt(dis2 / nv), math.sqrt(v2 / nv), cross, power


class EwmaWeight:
    """The weight ``1 − exp(−dt / τ)`` of a sample covering ``dt`` seconds in an EWMA of time
    constant ``tau_s``, kept for the last ``dt`` (the per-period signals see the same period
    period after period, and ``exp`` is most of their arithmetic)."""

    def __init__(self, tau_s: float) -> None:
        self.tau_s = float(tau_s)
        self._dt, self._weight = -1.0, 0.0

    def __call__(self, dt_s: float) -> float:
        dt = max(float(dt_s), 0.0)
        if dt != self._dt:
            self._dt, self._weight = dt, 1.0 - math.exp(-dt / self.tau_s)
        return self._weight


class ResponseLag:
    """``response_lag``: ``−EWMA(Σ e·Δv̂) / (EWMA(Σ Δv̂²) + min_power)`` (see the module
    docstring), the two sums of ``period_signals``, each EWMA over ``tau_s`` and weighed by the
    time a period covers: a least-squares slope of the velocity error on the predicted velocity
    change over the last ``tau_s``, negated (positive: the arm answers less, or later, than the
    model predicts).

    Each period's ``Σ e·Δv̂`` enters clipped to ±``Σ Δv̂²``: a period counts at most as the whole
    predicted change missed (or made twice), so the signal stays within (−1, 1). Unclipped, an arm
    still answering an older command (moving against the change the model predicts from the
    newest one) made single periods of several times the change, and the ROS path's own command
    delay, which jitters, gave the signal a tail no threshold could bound (live, nominal arm: a
    threshold of 2.25 from a heavy-tailed fit)."""

    def __init__(self, tau_s: float, min_power: float = MIN_RESPONSE_POWER) -> None:
        if not (math.isfinite(tau_s) and tau_s > 0):
            raise ValueError(f"response lag tau_s={tau_s!r}: expected a positive time constant (s)")
        if not (math.isfinite(min_power) and min_power > 0):
            raise ValueError(f"response lag min_power={min_power!r}: expected a positive (rad/s)²")
        self.tau_s, self.min_power = float(tau_s), float(min_power)
        self._cross = self._power = 0.0
        self._weight = EwmaWeight(self.tau_s)

    def update(self, cross: float, power: float, dt_s: float) -> float:
        """Add one period's sums (``dt_s`` since the previous); return the signal."""
        alpha = self._weight(dt_s)
        cross = -power if cross < -power else (power if cross > power else cross)
        self._cross += alpha * (cross - self._cross)
        self._power += alpha * (power - self._power)
        return -self._cross / (self._power + self.min_power)


class Ewma:
    """Exponentially weighted moving average with a time constant ``tau_s`` (s).

    ``update(x, dt_s)`` weighs the new sample by ``1 − exp(−dt / τ)``, so a late period counts for
    the time it covers. Without an ``initial`` value the first sample initialises the mean; the
    monitor starts its signals at 0 (quiet), so that a wild first sample is smoothed like any other.
    """

    def __init__(self, tau_s: float, initial: float | None = None) -> None:
        if not (math.isfinite(tau_s) and tau_s > 0):
            raise ValueError(f"tau_s={tau_s!r}: expected a positive time constant (s)")
        self.tau_s = float(tau_s)
        self.initial = initial
        self.value: float | None = initial

    def update(self, x: float, dt_s: float) -> float:
        """Add a sample covering ``dt_s`` seconds; return the new mean."""
        if self.value is None:
            self.value = float(x)
        else:
            alpha = 1.0 - math.exp(-max(float(dt_s), 0.0) / self.tau_s)
            self.value += alpha * (float(x) - self.value)
        return self.value

    def reset(self) -> None:
        self.value = self.initial


__all__ = ["MIN_RESPONSE_POWER", "MIN_STD", "SIGNALS", "Ewma", "EwmaWeight", "ResponseLag", "Signal", "disagreement",
           "period_signals", "prediction_error"]
