"""Calibrated thresholds for the trust monitor: conformal quantiles of normal operation.

``calibrate`` takes the smoothed signals of a run of normal operation (a recorded bag or a
library-mode run on a chosen profile) and returns, per signal, the split-conformal quantile at
level ``1 − exceedance``: the ⌈(n + 1)(1 − α)⌉-th smallest of the n calibration values. On data
exchangeable with the calibration run, a period's smoothed signal exceeds it with probability at
most α (with autocorrelated, smoothed streams the bound holds for the stationary marginal, which is
what the false-alarm benchmark checks on held-out data). A signal that is rarely non-zero in
normal operation (the filter's interventions) gets the threshold's floor instead.

An anomaly needs two signals over their thresholds at once for ``min_duration_s``: for independent
signals the false-alarm rate is then about the product of the two exceedances, which is why each
can be calibrated at a moderate α from minutes of data. One signal over its threshold is a level
drop (CAUTIOUS), though, and at α = 1e-4 per period those come several times an hour. With
``alarms_per_hour`` each threshold is also raised to the level the signal stays over for
``min_duration_s`` in at most its share of that many episodes per hour: a peaks-over-threshold
fit of the calibration's excursions, extrapolated (``robot_wm.core.trust.tail``).

The result is a ``Calibration``: thresholds, the model version it is valid for, where the data
came from, and when; saved as JSON with an atomic write (``save``), refused on load when it does
not match the running model (``load``). numpy (and scipy for the tail fit).
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from robot_wm.core.atomic import write_json
from robot_wm.core.trust.signals import BASE_SIGNALS, Signal
from robot_wm.core.trust.tail import EPISODE_GAP_S, TailError, rate_threshold

CALIBRATION_FORMAT = "robot_wm-trust-calibration/2"
#: a rate threshold is at most this multiple of the per-period quantile: a signal whose minutes of
#: normal operation show excursions that far out (a live graph's hiccups) cannot be bought off its
#: false alarms without going blind, and an extra CAUTIOUS is the cheaper error (the fit records
#: ``capped_at``). On the library loop's signals the fits come to 1.1-1.6 times the quantile.
RATE_MAX_RATIO = 2.0


class CalibrationError(ValueError):
    """A calibration cannot be made or used; the message names the file, field or signal."""


@dataclass(frozen=True)
class Calibration:
    """Thresholds per signal (smoothed, dimensionless) and their provenance.

    Attributes:
        thresholds: signal name -> threshold on its smoothed value.
        exceedance: the per-signal exceedance α the quantiles were taken at.
        model_version: the world model version the prediction error was measured with.
        source: what the normal data was (a bag path, "library:<profile>", ...).
        periods: calibration periods per signal.
        created_unix_s: when it was made.
        effort_model: ``EffortModel.to_dict()`` of the same normal operation, or None (then the
            effort signal is off: no threshold for it).
        alarms_per_hour: the level drops per hour the thresholds were raised for (None: per-period
            exceedance alone).
        tail: signal name -> ``TailFit.to_dict()`` of its rate threshold, or the reason there is none.
    """

    thresholds: dict[str, float]
    exceedance: float
    model_version: str
    source: str
    periods: int
    created_unix_s: float = field(default_factory=time.time)
    effort_model: dict | None = None
    alarms_per_hour: float | None = None
    tail: dict | None = None

    def threshold(self, signal: Signal) -> float:
        """The signal's threshold; ``math.inf`` for a signal this calibration does not judge."""
        return self.thresholds.get(Signal(signal).value, math.inf)

    def judges(self, signal: Signal) -> bool:
        """Whether the calibration has a threshold for ``signal``."""
        return Signal(signal).value in self.thresholds


def conformal_quantile(values: np.ndarray, exceedance: float) -> float:
    """The split-conformal (1 − α) quantile of ``values``: the ⌈(n + 1)(1 − α)⌉-th smallest.

    Raises:
        CalibrationError: α outside (0, 1), non-finite values, or too few values for α (n + 1 < 1/α).
    """
    if not (0.0 < exceedance < 1.0):
        raise CalibrationError(f"exceedance {exceedance!r}: expected a probability in (0, 1)")
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise CalibrationError(f"{v.size} calibration values, some not finite: expected finite values")
    k = math.ceil((v.size + 1) * (1.0 - exceedance))
    if k > v.size:
        raise CalibrationError(f"{v.size} calibration periods are too few for exceedance {exceedance:g}: "
                               f"need at least {math.ceil(1.0 / exceedance) - 1}")
    return float(np.partition(v, k - 1)[k - 1])


def calibrate(streams: dict[str, np.ndarray], exceedance: float, floors: dict[str, float], *,
              model_version: str, source: str, effort_model: dict | None = None,
              alarms_per_hour: float | None = None, dt_s: float = 0.01, min_duration_s: float = 0.03) -> Calibration:
    """Thresholds from smoothed normal-operation streams (one array per signal).

    Args:
        streams: signal name -> smoothed values, one per period (the base signals required;
            ``effort_error`` with ``effort_model``; ``response_lag`` judged when given).
        exceedance: per-signal exceedance α.
        floors: signal name -> the smallest threshold allowed (config).
        model_version, source: provenance, kept in the result.
        effort_model: the effort model the ``effort_error`` stream was computed with.
        alarms_per_hour: target level drops per hour over all the signals (each gets an equal
            share); None or 0: the conformal quantiles alone.
        dt_s, min_duration_s: the monitor's period and persistence (what a level drop is).
    Raises:
        CalibrationError: a signal missing, or what ``conformal_quantile`` raises (naming the signal).
    """
    thresholds: dict[str, float] = {}
    tails: dict[str, object] = {}
    wanted = judged_signals(effort_model is not None, Signal.LAG.value in streams)
    share = alarms_share(alarms_per_hour, len(wanted))
    for sig in wanted:
        if sig.value not in streams:
            raise CalibrationError(f"calibration: no values for signal {sig.value!r}")
        try:
            q, tails[sig.value] = signal_threshold(streams[sig.value], exceedance, share, dt_s, min_duration_s)
        except CalibrationError as exc:
            raise CalibrationError(f"signal {sig.value!r}: {exc}") from exc
        thresholds[sig.value] = max(q, float(floors.get(sig.value, 0.0)))
    n = min(int(np.asarray(streams[s.value]).size) for s in wanted)
    return Calibration(thresholds, float(exceedance), str(model_version), str(source), n,
                       effort_model=effort_model, alarms_per_hour=float(alarms_per_hour) if share else None,
                       tail={k: v for k, v in tails.items() if v is not None} or None)


def judged_signals(with_effort: bool, with_lag: bool) -> tuple[Signal, ...]:
    """The signals a calibration judges: the base ones, the effort signal with an effort model,
    the response lag when it was calibrated (files made before it have none)."""
    return BASE_SIGNALS + ((Signal.EFFORT,) if with_effort else ()) + ((Signal.LAG,) if with_lag else ())


def alarms_share(alarms_per_hour: float | None, n_signals: int) -> float | None:
    """Each of ``n_signals`` judged signals' share of the level drops per hour (an equal one; None:
    no rate target)."""
    return alarms_per_hour / n_signals if alarms_per_hour else None


def signal_threshold(values: np.ndarray, exceedance: float, alarms_per_hour: float | None, dt_s: float,
                     min_duration_s: float) -> tuple[float, dict | str | None]:
    """One signal's threshold (before its floor): the conformal quantile at ``exceedance``, raised
    to its rate threshold for ``alarms_per_hour`` level drops per hour when given.

    The rate threshold is capped at RATE_MAX_RATIO times the quantile.

    Returns:
        (threshold, the tail fit's ``to_dict()`` (with ``capped_at`` when the cap applied), or why
        there is none, or None without a rate).
    Raises:
        CalibrationError: what ``conformal_quantile`` raises.
    """
    q = conformal_quantile(values, exceedance)
    if alarms_per_hour is None:
        return q, None
    try:
        fit = rate_threshold(values, dt_s, min_duration_s, alarms_per_hour, EPISODE_GAP_S)
    except TailError as exc:  # a signal that is rarely non-zero (interventions): its quantile and floor
        return q, f"no rate threshold: {exc}"
    info = fit.to_dict()
    if fit.threshold > RATE_MAX_RATIO * q:
        info["capped_at"] = RATE_MAX_RATIO * q
    return max(q, min(fit.threshold, RATE_MAX_RATIO * q)), info


def save(calibration: Calibration, path: Path) -> Path:
    """Write ``calibration`` as JSON atomically (a temporary file renamed over ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": CALIBRATION_FORMAT, **asdict(calibration)}
    # 0644: mkstemp's 0600 would make a shipped calibration unreadable to others
    return write_json(path, doc, mode=0o644)


def load(path: Path, model_version: str | None = None) -> Calibration:
    """Read a calibration; refuse one for another world model (``model_version`` given).

    Raises:
        CalibrationError: missing or malformed file, unknown format, a missing or non-positive
            threshold, or a model version mismatch (the message names the file and the field).
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CalibrationError(f"{path}: cannot read the trust calibration: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != CALIBRATION_FORMAT:
        raise CalibrationError(f"{path}: not a trust calibration (format {CALIBRATION_FORMAT!r})")
    thresholds = doc.get("thresholds")
    if not isinstance(thresholds, dict):
        raise CalibrationError(f"{path}: field 'thresholds' missing")
    effort = doc.get("effort_model")
    wanted = judged_signals(effort is not None, Signal.LAG.value in thresholds)
    for sig in wanted:
        t = thresholds.get(sig.value)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
            raise CalibrationError(f"{path}: thresholds.{sig.value}={t!r}: expected a positive number")
    if model_version is not None and doc.get("model_version") != model_version:
        raise CalibrationError(f"{path}: calibrated for world model {doc.get('model_version')!r}, the running one is "
                               f"{model_version!r}: run `robot-wm trust calibrate` again")
    try:
        alarms = doc.get("alarms_per_hour")
        return Calibration({k: float(thresholds[k]) for k in (s.value for s in wanted)}, float(doc["exceedance"]),
                           str(doc["model_version"]), str(doc["source"]), int(doc["periods"]),
                           float(doc.get("created_unix_s", 0.0)), effort, None if alarms is None else float(alarms),
                           doc.get("tail") if isinstance(doc.get("tail"), dict) else None)
    except (KeyError, TypeError, ValueError) as exc:
        raise CalibrationError(f"{path}: malformed trust calibration: {exc}") from exc


__all__ = ["CALIBRATION_FORMAT", "Calibration", "CalibrationError", "alarms_share", "calibrate", "conformal_quantile",
           "judged_signals", "load", "save", "signal_threshold"]


def with_floors(cal: Calibration, floors: dict[str, float]) -> Calibration:
    """The calibration with config/trust.yaml's floors applied (a floor raised in config takes
    effect without recalibrating)."""
    return dataclasses.replace(cal, thresholds={k: max(v, floors.get(k, 0.0)) for k, v in cal.thresholds.items()})
