"""TrustMonitor: one control period of the trust monitor, from the period's signals to a TrustState.

    monitor = TrustMonitor(TrustConfig(), calibration)
    out = monitor.step(t_s, prediction_error=e, disagreement=d, intervened=filter_changed_command)
    publish(out.level, out.score, out.normalized_error, out.threshold, out.reason)

Levels (``TrustLevel``) and how they move::

    evidence (persistent = over its threshold for min_duration_s without a break):
      no signal persistent              -> FULL
      one signal persistent             -> CAUTIOUS, or SLOW when it is over by slow_ratio or more
      two or more signals persistent    -> STOP (an anomaly: two independent signals agree), when
                                           two of them went over within anomaly_window_s of each other
                                           or have both been over that long; else SLOW (a signal that
                                           joins a lasting one must last itself: one odd sample beside
                                           a changed arm, a payload the effort sees, does not stop it)
      no prediction yet, or for stop_stale_s -> STOP ("no prediction")
      no prediction for stale_s         -> SLOW (it cannot judge: slower, until predictions return)

    FULL ─┬─ evidence worse: at once ──► CAUTIOUS / SLOW / STOP
          ▲
          └── evidence better for clean_hold_s: one level up (STOP -> SLOW -> CAUTIOUS -> FULL)

    STOP for longer than human_after_s (once a moving level has been in force: the start-up's STOP
    does not count), or any anomaly while ``human_on_anomaly`` -> HUMAN:
    held until ``acknowledge()`` (an operator), and even then only once the evidence is clean.

    An operator in control (``set_operator(True)``: a take-over, teleoperation through the filter)
    -> SLOW whatever the evidence, HUMAN released (the human is there); handing back -> SLOW, then
    the rules above (down at once on evidence, up after clean holds): no jump.

Levels step down at once and up only after a clean hold, one at a time, so a single odd sample
never stops the arm and a recovery is never a jump. numpy only (no rclpy).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from robot_wm.core.safety.limits import TrustLevel
from robot_wm.core.trust.calibration import Calibration
from robot_wm.core.trust.signals import SIGNALS, Signal

_INDEX = {sig: i for i, sig in enumerate(SIGNALS)}
_NAMES = tuple(sig.value for sig in SIGNALS)


@dataclass(frozen=True)
class TrustConfig:
    """How the monitor smooths and judges its signals (config/trust.yaml).

    Attributes:
        tau_s: EWMA time constant of (prediction_error, disagreement, intervention, effort_error,
            response_lag), s (the effort signal arrives smoothed per joint, ``effort_tau_s``, and the
            response lag over ``lag_tau_s``: short ones here).
        lag_tau_s: the time constant of the response lag's two sums (``ResponseLag``), s: the
            window of the slope it estimates (a calibration is made with the value in force).
        effort_tau_s: the per-joint smoothing of the signed effort z-scores (``EffortSignal``), s: what a
            calibration makes its effort model with (a model keeps the values it was calibrated with).
        effort_clip_z: the clip on each joint's effort z-score before that smoothing (likewise).
        min_duration_s: a signal must stay over its threshold this long to count.
        slow_ratio: one persistent signal at this multiple of its threshold or more -> SLOW.
        clean_hold_s: better evidence must last this long before the level steps up by one.
        human_after_s: STOP lasting longer than this -> HUMAN.
        stale_s: no prediction for this long -> SLOW (a loaded machine delays one now and then).
        stop_stale_s: no prediction for this long -> STOP.
        human_on_anomaly: an anomaly calls a human at once (the MIXED phase: operator standing by).
        anomaly_window_s: two persistent signals are an anomaly when they went over within this long
            of each other (one event, seen twice) or once both have been over this long; a signal that
            joins one over for longer must itself last this long (until then: SLOW).
        clip_ratio: a sample enters its EWMA clipped to this multiple of its threshold, so one wild
            sample moves the smoothed signal by at most (1 − e^(−dt/τ)) · clip_ratio · threshold
            (a spike must not outlast min_duration_s by its own decay), while a persistent shift
            still drives it past the threshold.
    """

    tau_s: tuple[float, ...] = (0.03, 0.05, 0.5, 0.01, 0.01)
    lag_tau_s: float = 0.1
    effort_tau_s: float = 0.03
    effort_clip_z: float = 8.0
    min_duration_s: float = 0.03
    slow_ratio: float = 2.0
    clean_hold_s: float = 2.0
    human_after_s: float = 5.0
    stale_s: float = 0.25
    stop_stale_s: float = 1.0
    human_on_anomaly: bool = False
    clip_ratio: float = 3.0
    anomaly_window_s: float = 1.0

    def __post_init__(self) -> None:
        if len(self.tau_s) != len(SIGNALS) or not all(math.isfinite(t) and t > 0 for t in self.tau_s):
            raise ValueError(f"TrustConfig.tau_s={self.tau_s!r}: expected {len(SIGNALS)} positive time constants (s) "
                             f"for {[s.value for s in SIGNALS]}")
        if not (math.isfinite(self.lag_tau_s) and self.lag_tau_s > 0):
            raise ValueError(f"TrustConfig.lag_tau_s={self.lag_tau_s!r}: expected a positive time constant (s)")
        if not (math.isfinite(self.effort_tau_s) and self.effort_tau_s > 0):
            raise ValueError(f"TrustConfig.effort_tau_s={self.effort_tau_s!r}: expected a positive time constant (s)")
        for name in ("min_duration_s", "clean_hold_s", "human_after_s", "stale_s", "stop_stale_s", "anomaly_window_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"TrustConfig.{name}={v!r}: expected a duration >= 0 (s)")
        for name in ("slow_ratio", "clip_ratio"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 1.0):
                raise ValueError(f"TrustConfig.{name}={v!r}: expected a ratio >= 1")


class TrustOutput(NamedTuple):
    """One period's verdict (the fields of msg/TrustState.msg but the phase). A NamedTuple: made
    every period, and a frozen dataclass's ``__init__`` cost three times as much.

    Attributes:
        level: the level in force.
        evidence: what this period's signals alone would give (before hold times and latches).
        score: 1 / (1 + r²), r = the largest smoothed signal / threshold ratio (1 = all quiet).
        normalized_error: the smoothed prediction error (RMS z-score, ~1 when calibrated).
        threshold: its calibrated threshold.
        ratios: signal name -> smoothed value / threshold.
        reason: why the level is what it is, for a person.
    """

    level: TrustLevel
    evidence: TrustLevel
    score: float
    normalized_error: float
    threshold: float
    ratios: dict[str, float]
    reason: str


class TrustMonitor:
    """The trust level from smoothed, calibrated signals; see the module docstring for the rules.

    Args:
        config: smoothing and timing (``TrustConfig``).
        calibration: the thresholds (``robot_wm.core.trust.calibration``).
    """

    def __init__(self, config: TrustConfig, calibration: Calibration) -> None:
        self.config = config
        self.set_calibration(calibration)
        # per-signal state in SIGNALS order, as lists: the monitor runs every 10 ms, and the enum-keyed
        # dicts and Ewma objects this replaces were a third of its time (the same arithmetic as ``Ewma``)
        self._tau = tuple(float(t) for t in config.tau_s)
        self._alpha_dt, self._alpha = -1.0, [0.0] * len(SIGNALS)  # per-signal EWMA weights for a period of _alpha_dt
        self._value = [0.0] * len(SIGNALS)  # the smoothed signals (Ewma with initial 0: quiet)
        self._over_since: list[float | None] = [None] * len(SIGNALS)
        self._young = ""  # why two persistent signals are SLOW, not STOP (anomaly_window_s), for the reason
        self._last_t: float | None = None
        self._last_prediction_t: float | None = None
        self._better_since: float | None = None
        self._stop_since: float | None = None
        self.level = TrustLevel.STOP  # no evidence yet: step up after clean holds like any recovery
        self._has_moved = False  # a moving level (FULL, CAUTIOUS, SLOW) was in force after start-up
        self.human_reason = ""
        self.anomalies = 0  # anomaly onsets (evidence STOP after a period without)
        self._was_anomaly = False
        #: an anomaly calls a human at once (the node sets it for the MIXED phase)
        self.human_on_anomaly = config.human_on_anomaly
        self.operator = False  # an operator is in control (teleoperation): SLOW, no latching

    def set_operator(self, active: bool) -> None:
        """An operator took over (True) or handed back (False); see the module docstring."""
        active = bool(active)
        if active == self.operator:
            return
        self.operator = active
        self.human_reason = ""
        self.level = TrustLevel.SLOW
        self._better_since = self._stop_since = None
        self._has_moved = True

    # ------------------------------------------------------------------ operator
    def acknowledge(self) -> tuple[bool, str]:
        """An operator releases HUMAN; refused while the evidence is not clean (FULL)."""
        if self.level != TrustLevel.HUMAN:
            return False, f"trust level is {self.level.name}, not HUMAN: nothing to acknowledge"
        evidence = self._evidence(self._last_t or 0.0)[0]
        if evidence != TrustLevel.FULL:
            return False, f"evidence still {evidence.name}: {self._reason(self._last_t or 0.0)}"
        self.level, self.human_reason = TrustLevel.STOP, ""
        self._better_since = self._stop_since = self._last_t
        return True, "HUMAN acknowledged: STOP, stepping up after the clean hold"

    def set_calibration(self, calibration: Calibration) -> None:
        """New thresholds (after a model swap or a recalibration); the smoothing state is kept."""
        self.calibration = calibration
        # per-period lookups by index in SIGNALS order, without the enum round trips
        self._th = [calibration.threshold(sig) for sig in SIGNALS]
        self._th_text = [f"{th:.3g}" for th in self._th]
        self._judged_idx = tuple(i for i, sig in enumerate(SIGNALS) if calibration.judges(sig))
        self._clip = [self.config.clip_ratio * th if i in self._judged_idx else None for i, th in enumerate(self._th)]

    # ------------------------------------------------------------------ the period
    def step(self, t_s: float, *, prediction_error: float | None, disagreement: float | None,
             intervened: bool | None, effort_error: float | None = None,
             response_lag: float | None = None) -> TrustOutput:
        """One period: update the signals given (None: not available this period), return the verdict.

        A signal the calibration has no threshold for (the effort signal without an effort model,
        the response lag in a calibration made before it) is never over its threshold."""
        dt = 0.0 if self._last_t is None else max(t_s - self._last_t, 0.0)  # the first sample has no weight
        self._last_t = t_s
        if prediction_error is not None:
            self._last_prediction_t = t_s
        values, th, clip, over_since = self._value, self._th, self._clip, self._over_since
        if dt != self._alpha_dt:  # the EWMA weights of a period this long (the same dt period after period)
            self._alpha_dt, self._alpha = dt, [1.0 - math.exp(-dt / tau) for tau in self._tau]
        alphas = self._alpha
        for i, x in enumerate((prediction_error, disagreement, None if intervened is None else float(bool(intervened)),
                               effort_error, response_lag)):
            if x is not None and clip[i] is not None and math.isfinite(x):
                values[i] += alphas[i] * (min(float(x), clip[i]) - values[i])
            if not values[i] / th[i] > 1.0:
                over_since[i] = None
            elif over_since[i] is None:
                over_since[i] = t_s
        evidence, anomaly = self._evidence(t_s)
        if anomaly and not self._was_anomaly:
            self.anomalies += 1
        self._was_anomaly = anomaly
        self._move(t_s, evidence, anomaly)
        ratios = {_NAMES[i]: values[i] / th[i] for i in self._judged_idx}
        worst = max(ratios.values())
        return TrustOutput(self.level, evidence, 1.0 / (1.0 + worst * worst), values[0], th[0], ratios,
                           self._reason(t_s))

    def smoothed(self, sig: Signal) -> float:
        """The signal's smoothed value (0 before its first sample)."""
        return self._value[_INDEX[Signal(sig)]]

    def ratio(self, sig: Signal) -> float:
        """The smoothed signal over its threshold (0 for a signal the calibration does not judge)."""
        i = _INDEX[Signal(sig)]
        return self._value[i] / self._th[i]

    # ------------------------------------------------------------------ pieces
    def _evidence(self, t_s: float) -> tuple[TrustLevel, bool]:
        """(level the signals alone give, whether it is an anomaly)."""
        if self._last_prediction_t is None or t_s - self._last_prediction_t > self.config.stop_stale_s:
            return TrustLevel.STOP, False
        if t_s - self._last_prediction_t > self.config.stale_s:
            return TrustLevel.SLOW, False
        min_s = self.config.min_duration_s
        persistent = [i for i, since in enumerate(self._over_since) if since is not None and t_s - since >= min_s]
        if len(persistent) >= 2:
            onsets = sorted(self._over_since[i] for i in persistent)
            window = self.config.anomaly_window_s
            if t_s - onsets[1] >= window or any(b - a <= window for a, b in zip(onsets, onsets[1:])):
                self._young = ""
                return TrustLevel.STOP, True
            # a young signal beside a lasting one: it must last too
            self._young = (f" (two signals over, the later for {t_s - onsets[-1]:.2g} of the {window:g} s an anomaly "
                           "needs beside one over for longer)")
            return TrustLevel.SLOW, False
        self._young = ""
        if len(persistent) == 1:
            i = persistent[0]
            slow = self._value[i] / self._th[i] >= self.config.slow_ratio
            return (TrustLevel.SLOW if slow else TrustLevel.CAUTIOUS), False
        return TrustLevel.FULL, False

    def _move(self, t_s: float, evidence: TrustLevel, anomaly: bool) -> None:
        cfg = self.config
        if self.operator:
            self.level = TrustLevel.SLOW  # the operator teleoperates at SLOW limits; nothing latches
            return
        if self.level == TrustLevel.HUMAN:
            return  # only acknowledge() leaves it
        if anomaly and self.human_on_anomaly:
            self._to_human(f"anomaly: {self._reason(t_s)}")
            return
        if evidence > self.level:  # worse: at once
            self.level, self._better_since = evidence, None
        elif evidence < self.level:  # better: one level after the clean hold
            if self._better_since is None:
                self._better_since = t_s
            elif t_s - self._better_since >= cfg.clean_hold_s:
                self.level = TrustLevel(int(self.level) - 1)
                self._better_since = t_s if evidence < self.level else None
        else:
            self._better_since = None
        if self.level < TrustLevel.STOP:
            self._has_moved = True
        if self.level == TrustLevel.STOP:
            self._stop_since = t_s if self._stop_since is None else self._stop_since
            # the start-up's STOP (before the first moving level) is not a reason to call a human
            if self._has_moved and t_s - self._stop_since > cfg.human_after_s:
                self._to_human(f"STOP for more than {cfg.human_after_s:g} s: {self._reason(t_s)}")
        else:
            self._stop_since = None

    def _to_human(self, why: str) -> None:
        self.level, self.human_reason = TrustLevel.HUMAN, why
        self._better_since = None

    def _reason(self, t_s: float) -> str:
        if self.operator:
            return "operator in control (teleoperation at SLOW limits); evidence: " + self._signal_reason(t_s)
        return self._signal_reason(t_s)

    def _signal_reason(self, t_s: float) -> str:
        if self.level == TrustLevel.HUMAN and self.human_reason:
            return f"HUMAN (operator must acknowledge): {self.human_reason}"
        if self._last_prediction_t is None or t_s - self._last_prediction_t > self.config.stale_s:
            return "no world-model prediction" + ("" if self._last_prediction_t is None else
                                                  f" for {t_s - self._last_prediction_t:.3g} s")
        parts = []
        for i in self._judged_idx:
            since = self._over_since[i]
            parts.append(f"{_NAMES[i]} {self._value[i]:.3g} > {self._th_text[i]} for {t_s - since:.2g} s" if since is not None
                         else f"{_NAMES[i]} {self._value[i]:.3g} <= {self._th_text[i]}")
        return "; ".join(parts) + self._young if parts else "no signals yet"


__all__ = ["TrustConfig", "TrustMonitor", "TrustOutput"]
