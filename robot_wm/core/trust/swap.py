"""After a world-model swap: is the new model worse on the live arm than the one it replaced?

The online learner's gate judged the candidate on recorded data; the live arm has the last word.
``SwapWatch`` takes, every period, the running model's version and its one-step prediction error
(RMS over the joints of predicted minus measured joint velocity, rad/s: a raw error, so a model that
merely widens its intervals cannot look better) and, while the world_model node runs the replaced
model in the shadow, that model's error on the same period. For ``watch_s`` after a swap, once
``window_s`` of errors exist, a rolling median above ``factor`` times the reference for ``hold_s`` in a
row asks for a rollback (``RollbackVerdict``). The reference is the replaced model's error on the same
periods when the shadow gives it (a change of the arm itself, a payload picked up right after a swap,
raises both and is not blamed on the new model), else the replaced model's median error of the last
``window_s`` before the swap. A swap back (a rollback) is watched like any other.

The safety filter has a say too (``refused``): each period in which it refuses the new model's
linearization (a MODEL_IMPLAUSIBLE fault: a slope of the wrong sign, a step the arm cannot make;
the filter stops the arm for that period) counts, and ``refusals`` of them within ``watch_s`` of the
swap ask for a rollback at once: the gate checks the filter's question on recorded states, the live
arm can still find one it missed.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

_CHECK_EVERY = 10  # periods between two evaluations of the rolling median


@dataclass(frozen=True)
class SwapWatchConfig:
    """Settings of the rollback rule (config/trust.yaml: rollback_*)."""

    factor: float = 1.5  # the new model's rolling median error above factor x the old one's ...
    hold_s: float = 5.0  # ... for this long in a row: roll back
    window_s: float = 5.0  # the medians are over this much of the most recent errors
    watch_s: float = 60.0  # watch this long after a swap
    refusals: int = 3  # periods in which the safety filter refuses the new model, within watch_s: roll back

    def __post_init__(self) -> None:
        for name in ("factor", "hold_s", "window_s", "watch_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"rollback {name}={value!r}: expected a positive number")
        if isinstance(self.refusals, bool) or not isinstance(self.refusals, int) or self.refusals < 1:
            raise ValueError(f"rollback refusals={self.refusals!r}: expected a positive whole number of periods")
        if self.factor <= 1.0:
            raise ValueError(f"rollback factor={self.factor!r}: expected > 1 (the new model worse by that factor)")


@dataclass(frozen=True)
class RollbackVerdict:
    """A rollback to ask for: the version to leave, and why (a person can read it)."""

    version: str
    previous_version: str
    reason: str


class SwapWatch:
    """Watches the live prediction error around world-model swaps (see the module docstring)."""

    def __init__(self, config: SwapWatchConfig, dt_s: float) -> None:
        self.config = config
        self.dt_s = float(dt_s)
        self._window = max(1, int(round(config.window_s / dt_s)))
        self._recent: deque[float] = deque(maxlen=self._window)  # the running model's errors
        self._paired: deque[tuple[float, float]] = deque(maxlen=self._window)  # (error, the shadow's on the same period)
        self.version: str | None = None
        self.previous_version: str | None = None
        self.baseline: float | None = None  # median error of the model before the swap
        self._swap_t: float | None = None
        self._over_since: float | None = None
        self._since_check = 0
        self._refused = 0  # periods the safety filter refused the new model in (since the swap)
        self.verdict: RollbackVerdict | None = None  # the last rollback asked for (kept until the next swap)

    @property
    def watching(self) -> bool:
        return self._swap_t is not None

    def update(self, t_s: float, version: str, error: float | None,
               shadow_error: float | None = None) -> RollbackVerdict | None:
        """One period: the running model's version and its error (None/NaN: no prediction this period),
        and the replaced model's error on the same period when the shadow gives one.

        Returns a verdict the first time the rule asks for a rollback, else None.
        """
        if version != self.version:
            if self.version is not None:  # a swap: watched (the baseline needs enough of the old model's error)
                self.baseline = _median(self._recent) if len(self._recent) >= self._window // 2 else None
                self.previous_version = self.version
                self._swap_t = t_s
            else:  # the first version seen
                self.baseline, self.previous_version, self._swap_t = None, None, None
            self.version = version
            self._recent.clear()
            self._paired.clear()
            self._over_since = None
            self._refused = 0
            self.verdict = None
        if error is None or not math.isfinite(error):
            return None
        self._recent.append(float(error))
        if shadow_error is not None and math.isfinite(shadow_error):
            self._paired.append((float(error), float(shadow_error)))
        if self._swap_t is None or (self.baseline is None and not self._paired) or self.verdict is not None:
            return None
        if t_s - self._swap_t > self.config.watch_s:
            self._swap_t = None  # watched long enough: the new model stays
            return None
        if len(self._recent) < self._window:
            return None
        self._since_check += 1
        if self._since_check < _CHECK_EVERY:  # the rolling median ten times a second is enough
            return None
        self._since_check = 0
        if len(self._paired) >= self._window // 2:  # the replaced model on the same periods
            current = _median([e for e, _ in self._paired])
            reference = _median([r for _, r in self._paired])
            against = f"{self.previous_version} on the same periods (shadow)"
        elif self.baseline is not None:
            current, reference = _median(self._recent), self.baseline
            against = f"{self.previous_version} before the swap"
        else:
            return None
        if current > self.config.factor * reference:
            self._over_since = t_s if self._over_since is None else self._over_since
            if t_s - self._over_since >= self.config.hold_s:
                self.verdict = RollbackVerdict(
                    self.version, self.previous_version or "",
                    f"world model {self.version}: live one-step velocity error {current:.4g} rad/s (median of "
                    f"{self.config.window_s:g} s) > {self.config.factor:g} x {reference:.4g} of {against}, "
                    f"for {self.config.hold_s:g} s")
                return self.verdict
        else:
            self._over_since = None
        return None

    def refused(self, t_s: float, version: str, why: str) -> RollbackVerdict | None:
        """The safety filter refused ``version``'s linearization this period (``why``: its reason).

        Returns a verdict the first time the refusals of a just swapped-in model reach ``refusals``
        within ``watch_s`` of its swap, else None (no swap watched, another version, already asked).
        """
        if (version != self.version or self._swap_t is None or self.verdict is not None
                or not self.previous_version or t_s - self._swap_t > self.config.watch_s):
            return None
        self._refused += 1
        if self._refused < self.config.refusals:
            return None
        self.verdict = RollbackVerdict(
            self.version, self.previous_version,
            f"world model {self.version}: the safety filter refused its linearization in {self._refused} periods "
            f"within {t_s - self._swap_t:.1f} s of the swap (last: {why})")
        return self.verdict


def _median(values) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
