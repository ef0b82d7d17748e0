"""Refreshing an inherited calibration on the live arm after a world-model swap.

The online learner registers each accepted candidate with its parent's trust calibration
re-issued for it (``source`` "inherited from ..."): the candidate passed the gate with calibrated
intervals, so the parent's thresholds are a sound start. They are the parent's, though: a better
model leaves the monitor blunter than it needs to be, and one whose ensemble spreads differently
can graze a threshold that was never its own. ``CalibrationRefresh`` measures the new model's own:

- it collects the smoothed **world-model signals** (prediction error, ensemble disagreement, and
  the response lag where the calibration judges it) of the running model in periods with a fresh prediction that the **model-free signals** call
  normal: the drives' effort under its threshold, and the filter's interventions, smoothed here
  from the filter's own status (the monitor stops counting them once its level is below FULL),
  under theirs; no operator in control, no HUMAN latch; for at least five of the world-model
  signals' smoothing time constants in a row (from the swap, and after each abnormal period: their
  smoothing still carries what came before). The judges of "normal" do not depend on the model
  being judged, so a model cannot vouch for itself;
- after ``seconds`` of such periods (at least the ⌈1/α⌉ − 1 that the conformal quantile at the
  calibration's exceedance α needs) each world-model threshold becomes the split-conformal quantile
  of what was collected (raised to its rate threshold when the calibration was made for a number
  of level drops per hour, ``calibration.signal_threshold``; where the collected periods hold too
  few excursions to fit, not below the inherited threshold), kept between its floor and
  ``max_factor`` times the inherited threshold: a refresh may tighten freely (the new model is
  better) and loosen only that much (a model worse than its parent is the rollback's business,
  ``swap.SwapWatch``). Without an effort model (an arm without torque sensing) the interventions
  alone are a weak judge: the refresh only tightens;
- the model-free thresholds and the effort model are kept as they are (the arm did not change
  with the model).

The refreshed calibration is the monitor's from then on; a restart loads the inherited file again
and refreshes again. numpy only.
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from robot_wm.core.trust.calibration import Calibration, alarms_share, judged_signals, signal_threshold
from robot_wm.core.trust.monitor import TrustMonitor
from robot_wm.core.safety.limits import TrustLevel
from robot_wm.core.trust.signals import SIGNALS, Ewma, Signal

#: the signals a world model's swap changes (refreshed, those the calibration judges); the others
#: judge whether a period is normal
MODEL_SIGNALS = (Signal.PREDICTION_ERROR, Signal.DISAGREEMENT, Signal.LAG)
MODEL_FREE_SIGNALS = (Signal.EFFORT, Signal.INTERVENTION)  # the judges of a normal period
#: ``Calibration.source`` of a calibration re-issued for a child model (robot_wm.learning.online)
INHERITED_PREFIX = "inherited from"
_SETTLE_TAUS = 5.0  # a smoothed signal forgets what came before in this many time constants (e^-5)


def is_inherited(calibration: Calibration) -> bool:
    """Whether ``calibration`` was re-issued from a parent model's (and so is worth refreshing)."""
    return calibration.source.startswith(INHERITED_PREFIX)


class CalibrationRefresh:
    """Collects one model's world-model signals in normal periods; see the module docstring.

    Args:
        inherited: the calibration in force (the parent's thresholds, re-issued for this model).
        floors: signal name -> the smallest threshold allowed (config/trust.yaml's floors).
        dt_s: the monitor's period (s).
        seconds: how much normal operation to collect (s).
        max_factor: a refreshed threshold is at most this multiple of the inherited one (>= 1).
        min_duration_s: the monitor's persistence, for the rate thresholds of a calibration made with
            a false-alarm rate (``Calibration.alarms_per_hour``).
    Raises:
        ValueError: ``seconds`` gives fewer periods than the conformal quantile at the calibration's
            exceedance needs, or a setting out of range (the message names it).
    """

    def __init__(self, inherited: Calibration, floors: dict[str, float], dt_s: float, seconds: float,
                 max_factor: float, min_duration_s: float = 0.03) -> None:
        if not (math.isfinite(dt_s) and dt_s > 0):
            raise ValueError(f"refresh: dt_s={dt_s!r}: expected a positive period (s)")
        if not (math.isfinite(max_factor) and max_factor >= 1.0):
            raise ValueError(f"refresh_max_factor={max_factor!r}: expected >= 1")
        alpha = inherited.exceedance
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 1.0:
            raise ValueError(f"the inherited calibration's exceedance {alpha!r}: expected a probability in (0, 1)")
        need = math.ceil(1.0 / alpha) - 1
        self.periods = int(math.ceil(seconds / dt_s)) if math.isfinite(seconds) and seconds > 0 else 0
        if self.periods < need:
            raise ValueError(f"refresh_seconds={seconds!r}: {self.periods} periods of {dt_s:g} s, the conformal "
                             f"quantile at exceedance {inherited.exceedance:g} needs at least {need} "
                             f"({need * dt_s:g} s)")
        self.inherited, self.floors, self.max_factor = inherited, dict(floors), float(max_factor)
        self.dt_s = float(dt_s)
        self.min_duration_s = float(min_duration_s)  # the monitor's persistence (a rate threshold's level drop)
        self.model_signals = tuple(sig for sig in MODEL_SIGNALS if inherited.judges(sig))
        self._values = {sig: np.empty(self.periods) for sig in self.model_signals}
        self.collected = 0
        self.skipped = 0  # periods the model-free signals did not call normal, and those settling after them
        self._quiet = 0  # normal periods in a row
        if not inherited.judges(Signal.EFFORT):
            self.max_factor = 1.0  # the interventions alone cannot tell a worse model from a changed arm
        self._interventions: Ewma | None = None  # the filter's own, unmasked (built with the first update)

    def update(self, monitor: TrustMonitor, *, fresh_prediction: bool, intervened: bool | None) -> Calibration | None:
        """Take this period's smoothed signals from ``monitor`` (after its ``step``); return the
        refreshed calibration once enough normal periods are in, else None.

        Args:
            monitor: the monitor, stepped this period.
            fresh_prediction: this period was judged against a prediction (not a stale one's smoothing).
            intervened: whether the filter changed the command this period, as it said (None: unknown).
        """
        if self._interventions is None:  # from where the monitor's own smoothing stands
            taus = monitor.config.tau_s
            self._interventions = Ewma(taus[SIGNALS.index(Signal.INTERVENTION)],
                                       initial=monitor.smoothed(Signal.INTERVENTION) or 0.0)
            # (the response lag's sums have their own window, lag_tau_s, before the monitor's smoothing)
            longest = max(taus[SIGNALS.index(sig)] for sig in self.model_signals)
            if Signal.LAG in self.model_signals:
                longest = max(longest, monitor.config.lag_tau_s)
            self._settle = _SETTLE_TAUS * longest / self.dt_s
        smoothed_interventions = self._interventions.update(1.0 if intervened else 0.0, self.dt_s)
        if self.collected >= self.periods:
            return None
        values = [monitor.smoothed(sig) for sig in self.model_signals]
        if not fresh_prediction or any(v is None or not math.isfinite(v) for v in values):
            return None  # nothing new measured (the smoothing was not fed either)
        if (monitor.operator or monitor.level == TrustLevel.HUMAN or intervened is None
                or monitor.ratio(Signal.EFFORT) > 1.0
                or smoothed_interventions > self.inherited.threshold(Signal.INTERVENTION)):
            self._quiet = 0
            self.skipped += 1
            return None
        self._quiet += 1
        if self._quiet <= self._settle:
            if self.collected:  # after an abnormal stretch (the first settling after the swap is not counted)
                self.skipped += 1
            return None
        for sig, v in zip(self.model_signals, values):
            self._values[sig][self.collected] = v
        self.collected += 1
        return self.result() if self.collected == self.periods else None

    def result(self) -> Calibration:
        """The refreshed calibration from the periods collected (all of them: ``collected == periods``)."""
        if self.collected < self.periods:
            raise ValueError(f"refresh: {self.collected} of {self.periods} normal periods collected")
        cal = self.inherited
        thresholds = dict(cal.thresholds)
        share = alarms_share(cal.alarms_per_hour, len(judged_signals(cal.judges(Signal.EFFORT), cal.judges(Signal.LAG))))
        tails = dict(cal.tail or {})
        for sig in self.model_signals:
            # the collected periods as one stream (the settling after an abnormal stretch left out)
            q, tails[sig.value] = signal_threshold(self._values[sig], cal.exceedance, share, self.dt_s,
                                                   self.min_duration_s)
            if isinstance(tails[sig.value], str):  # no rate fit on this data: the inherited threshold's is kept
                q = max(q, cal.threshold(sig))
            old = cal.threshold(sig)
            thresholds[sig.value] = float(min(max(q, self.floors.get(sig.value, 0.0)), self.max_factor * old))
        source = (f"refreshed on {self.collected} live periods of normal operation ({self.skipped} skipped), "
                  f"from {cal.source}")
        return dataclasses.replace(cal, thresholds=thresholds, source=source, periods=self.collected,
                                   created_unix_s=time.time(), tail={k: v for k, v in tails.items() if v is not None} or None)


__all__ = ["INHERITED_PREFIX", "MODEL_FREE_SIGNALS", "MODEL_SIGNALS", "CalibrationRefresh", "is_inherited"]
