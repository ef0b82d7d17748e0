"""The trust monitor's per-period signals, from what the world model predicted and what happened.

Each control period the world model predicted the state measured now (mean, epistemic and
aleatoric std, one period earlier, for the command actually sent); the monitor turns the pair
into three dimensionless signals, each about 1 or below in normal operation:

* ``prediction_error``: the RMS z-score ``sqrt(mean(((x − μ) / σ)²))`` over the state (q, q̇),
  σ² = epistemic² + aleatoric² (a diagonal Mahalanobis distance per dimension: 1 when the model's
  uncertainty is calibrated, larger when reality leaves it — a payload, friction, latency);
* ``disagreement``: the RMS over the velocities of epistemic / aleatoric std: how much more the
  ensemble members disagree than the noise they expect (large where the model has not seen such
  states, whatever happened);
* ``intervention``: 1 for a period in which the safety filter changed the command, else 0;
* ``effort_error``: the RMS z-score of the measured joint efforts against a model of normal
  operation (``effort.py``): what a payload or a push changes while the motion hardly does.

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


SIGNALS = tuple(Signal)
#: the signals every calibration has; the effort signal needs an effort model (and efforts measured)
BASE_SIGNALS = (Signal.PREDICTION_ERROR, Signal.DISAGREEMENT, Signal.INTERVENTION)


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
                   q: list[float], qdot: list[float]) -> tuple[float, float, float]:
    """This period's ``(prediction_error, disagreement, velocity RMS error)`` for a predicted state
    (q, q̇) against the measured ``q``, ``qdot``: the numbers ``prediction_error(predicted, epi, ale,
    q + qdot)``, ``disagreement`` over the velocities and the RMS of the velocity error (rad/s)
    give, in one pass over Python floats (the monitor's per-period path: a dozen numbers are too
    few for numpy's per-call overhead, 7.6 µs with arrays against 2.5 µs)."""
    nq, floor = len(q), MIN_STD * MIN_STD
    z2 = dis2 = v2 = 0.0
    for i, (mu, e, a, x) in enumerate(zip(predicted, epistemic_std, aleatoric_std, q + qdot)):
        var = e * e + a * a
        d = x - mu
        z2 += d * d / (var if var > floor else floor)
        if i >= nq:
            r = e / (a if a > MIN_STD else MIN_STD)
            dis2 += r * r
            v2 += d * d
    nv = len(qdot)
    return math.sqrt(z2 / (nq + nv)), math.sqrt(dis2 / nv), math.sqrt(v2 / nv)


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


__all__ = ["MIN_STD", "SIGNALS", "Ewma", "Signal", "disagreement", "period_signals", "prediction_error"]
