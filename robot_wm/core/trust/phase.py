"""Deployment phases SIM → MIXED → REAL: evidence, gated promotion, automatic demotion, persistence.

    store = PhaseStore(path)                      # atomic JSON with the phase's history
    phases = PhaseMachine(PhaseConfig(), store)   # loads the persisted phase (SIM when there is none)
    phases.operate(dt_s, score)                   # each period the arm moves under the policy
    phases.episode(success)                       # each finished episode
    action = phases.anomaly(reason)               # REAL -> MIXED; in MIXED: "human" (the caller holds the arm)
    phases.intervention(reason)                   # an operator took over: REAL -> MIXED
    ok, message, unmet = phases.promote(reason, calibrated=True)   # refused with the unmet criteria

The phases (msg/TrustState.msg PHASE_*):
  SIM    the policy has run on the simulator only; on a real arm the monitor holds it (STOP).
  MIXED  on the real arm with reduced limits (config/safety.yaml phase scales), an operator standing
         by: an anomaly calls the human at once.
  REAL   full real limits; an anomaly or an operator's take-over demotes to MIXED at once.

Evidence is what the phase has earned since it was entered, kept in the file across restarts:
minutes operated (a moving trust level, under the policy), episodes and their success rate, the
mean trust score while operating, and operating minutes since the last anomaly. It belongs to one
world model (``model_version``): a swapped model starts its evidence afresh. Promotion needs the
criteria of the next phase (``PromotionCriteria``, config/trust.yaml ``phase_*``) AND an operator's
request; demotion needs no evidence. numpy-free, rclpy-free.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from robot_wm.core.atomic import write_json
from robot_wm.core.safety.limits import Phase, TrustLevel

FORMAT = "robot_wm.trust.phase/1"
HISTORY_MAX = 200  # transitions kept in the file (the oldest are dropped)


class PhaseFileError(ValueError):
    """The phase file exists but cannot be read as a phase state (names the file and what is wrong)."""


@dataclass(frozen=True)
class PromotionCriteria:
    """What the current phase must have shown before an operator may promote out of it.

    Attributes:
        min_minutes: minutes operated in the phase (a moving trust level, policy in command).
        min_episodes: finished episodes in the phase.
        min_success_rate: successful episodes / episodes, 0..1.
        min_mean_score: mean trust score while operating, 0..1.
        anomaly_free_minutes: operating minutes since the last anomaly in the phase.
        require_calibration: the trust calibration must be for the running world model.
    """

    min_minutes: float = 10.0
    min_episodes: int = 20
    min_success_rate: float = 0.8
    min_mean_score: float = 0.5
    anomaly_free_minutes: float = 5.0
    require_calibration: bool = True

    def __post_init__(self) -> None:
        for name in ("min_minutes", "anomaly_free_minutes"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"PromotionCriteria.{name}={v!r}: expected minutes >= 0")
        if not (isinstance(self.min_episodes, int) and self.min_episodes >= 0):
            raise ValueError(f"PromotionCriteria.min_episodes={self.min_episodes!r}: expected an integer >= 0")
        for name in ("min_success_rate", "min_mean_score"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ValueError(f"PromotionCriteria.{name}={v!r}: expected a fraction in [0, 1]")


@dataclass(frozen=True)
class PhaseConfig:
    """Promotion criteria per step: SIM -> MIXED (on simulator evidence) and MIXED -> REAL."""

    to_mixed: PromotionCriteria = PromotionCriteria()
    to_real: PromotionCriteria = PromotionCriteria(min_minutes=30.0, min_episodes=50, min_success_rate=0.9,
                                                   min_mean_score=0.6, anomaly_free_minutes=15.0)

    def criteria(self, phase: Phase) -> PromotionCriteria | None:
        """The criteria to leave ``phase`` upwards (None: REAL, the top)."""
        return {Phase.SIM: self.to_mixed, Phase.MIXED: self.to_real}.get(Phase(phase))


@dataclass
class Evidence:
    """What the phase has shown since it was entered (persisted)."""

    operating_s: float = 0.0
    episodes: int = 0
    successes: int = 0
    score_sum_s: float = 0.0  # ∫ score dt over operating time (mean score = score_sum_s / operating_s)
    anomalies: int = 0
    operating_s_at_last_anomaly: float | None = None
    interventions: int = 0

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def mean_score(self) -> float:
        return self.score_sum_s / self.operating_s if self.operating_s > 0 else 0.0

    @property
    def anomaly_free_s(self) -> float:
        last = self.operating_s_at_last_anomaly
        return self.operating_s if last is None else self.operating_s - last


@dataclass
class PhaseState:
    """The persisted phase: where it is, since when, its evidence, and how it got there."""

    phase: Phase = Phase.SIM
    since_unix: float = field(default_factory=time.time)
    model_version: str = ""
    evidence: Evidence = field(default_factory=Evidence)
    history: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"format": FORMAT, "phase": Phase(self.phase).name, "since_unix": self.since_unix,
                "model_version": self.model_version, "evidence": asdict(self.evidence), "history": self.history}

    @classmethod
    def from_json(cls, data, where: str) -> PhaseState:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise PhaseFileError(f"{where}: format {got!r}, expected {FORMAT!r}")
        try:
            phase = Phase[data["phase"]]
        except (KeyError, TypeError):
            raise PhaseFileError(f"{where}: phase {data.get('phase')!r}, expected one of "
                                 f"{[p.name for p in Phase]}") from None
        ev = data.get("evidence") or {}
        known = {f.name for f in fields(Evidence)}
        if not isinstance(ev, dict) or set(ev) - known:
            raise PhaseFileError(f"{where}: evidence {ev!r}: expected an object with keys among {sorted(known)}")
        try:
            evidence = Evidence(**ev)
            numbers = [evidence.operating_s, evidence.score_sum_s, float(data.get("since_unix", 0.0))]
            if not all(math.isfinite(float(x)) for x in numbers) or evidence.operating_s < 0:
                raise ValueError("non-finite or negative numbers")
        except (TypeError, ValueError) as exc:
            raise PhaseFileError(f"{where}: evidence {ev!r}: {exc}") from None
        history = data.get("history") or []
        if not isinstance(history, list):
            raise PhaseFileError(f"{where}: history must be a list")
        return cls(phase, float(data.get("since_unix", time.time())), str(data.get("model_version", "")),
                   evidence, history)


class PhaseStore:
    """The phase file: JSON, written atomically (temp file, fsync, rename), so a crash or a power cut
    leaves either the old or the new state, never half of one.

    Args:
        path: the file (its directory is created on the first save).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def load(self) -> PhaseState | None:
        """The persisted state; None when there is no file yet.

        Raises:
            PhaseFileError: the file exists but is not a phase state (the caller must not guess).
        """
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise PhaseFileError(f"phase file {self.path}: cannot read it: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PhaseFileError(f"phase file {self.path}: not JSON ({exc})") from None
        return PhaseState.from_json(data, f"phase file {self.path}")

    def save(self, state: PhaseState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, state.to_json(), indent=1)


class PhaseMachine:
    """The phase, its evidence and its transitions; every transition is saved at once.

    Args:
        config: the promotion criteria.
        store: where the state lives (None: in memory only, e.g. a benchmark).
        model_version: the running world model; evidence gathered with another one is discarded.
        clock: seconds since the epoch (the history's times).
    Raises:
        PhaseFileError: the store's file is unreadable.
    """

    def __init__(self, config: PhaseConfig, store: PhaseStore | None = None, model_version: str = "",
                 clock=time.time) -> None:
        self.config, self.store, self.clock = config, store, clock
        loaded = store.load() if store is not None else None
        self.state = loaded or PhaseState(since_unix=clock())
        self._dirty = loaded is None
        if model_version:
            self.set_model(model_version)
        self.save()

    @property
    def phase(self) -> Phase:
        return Phase(self.state.phase)

    # ------------------------------------------------------------------ evidence
    def set_model(self, model_version: str) -> None:
        """The running world model; a different one than the evidence's starts the evidence afresh."""
        if model_version and model_version != self.state.model_version:
            if self.state.model_version:
                self._record(self.phase, f"world model {self.state.model_version} -> {model_version}: "
                                         "evidence starts afresh", "monitor")
            self.state.model_version = model_version
            self.state.evidence = Evidence()
            self._dirty = True

    def operate(self, dt_s: float, score: float) -> None:
        """``dt_s`` of operation under the policy at trust ``score`` (the caller decides what counts)."""
        if dt_s > 0 and math.isfinite(dt_s) and math.isfinite(score):
            ev = self.state.evidence
            ev.operating_s += dt_s
            ev.score_sum_s += dt_s * min(max(score, 0.0), 1.0)
            self._dirty = True

    def episode(self, success: bool) -> None:
        ev = self.state.evidence
        ev.episodes += 1
        ev.successes += int(bool(success))
        self._dirty = True

    def anomaly(self, reason: str) -> str | None:
        """An anomaly (two independent signals). Returns what the caller must do: "demoted" (REAL ->
        MIXED, done here), "human" (in MIXED: hold the arm and call the operator) or None (SIM)."""
        ev = self.state.evidence
        ev.anomalies += 1
        ev.operating_s_at_last_anomaly = ev.operating_s
        self._dirty = True
        if self.phase == Phase.REAL:
            self._to(Phase.MIXED, f"automatic demotion on anomaly: {reason}", "monitor")
            return "demoted"
        if self.phase == Phase.MIXED:
            self.save()
            return "human"
        self.save()
        return None

    def intervention(self, reason: str) -> bool:
        """An operator took over from the policy. REAL -> MIXED (True); otherwise only counted."""
        self.state.evidence.interventions += 1
        self._dirty = True
        if self.phase == Phase.REAL:
            self._to(Phase.MIXED, f"automatic demotion on an intervention: {reason}", "monitor")
            return True
        self.save()
        return False

    # ------------------------------------------------------------------ operator
    def unmet(self, calibrated: bool) -> list[str]:
        """The criteria for leaving the current phase upwards that are not met ([] when all are)."""
        crit = self.config.criteria(self.phase)
        if crit is None:
            return ["already REAL: there is no higher phase"]
        ev, out = self.state.evidence, []
        if ev.operating_s / 60.0 < crit.min_minutes:
            out.append(f"operated {ev.operating_s / 60.0:.1f} of {crit.min_minutes:g} min in {self.phase.name}")
        if ev.episodes < crit.min_episodes:
            out.append(f"{ev.episodes} of {crit.min_episodes} episodes in {self.phase.name}")
        if ev.episodes == 0 or ev.success_rate < crit.min_success_rate:
            out.append(f"success rate {ev.success_rate:.0%} ({ev.successes}/{ev.episodes}) < "
                       f"{crit.min_success_rate:.0%}")
        if ev.mean_score < crit.min_mean_score:
            out.append(f"mean trust score {ev.mean_score:.2f} < {crit.min_mean_score:.2f}")
        if ev.anomaly_free_s / 60.0 < crit.anomaly_free_minutes:
            since = "since the last anomaly" if ev.operating_s_at_last_anomaly is not None else "so far"
            out.append(f"{ev.anomaly_free_s / 60.0:.1f} of {crit.anomaly_free_minutes:g} anomaly-free min ({since})")
        if crit.require_calibration and not calibrated:
            out.append("no trust calibration for the running world model (`robot-wm trust calibrate`)")
        return out

    def promote(self, reason: str, *, calibrated: bool) -> tuple[bool, str, list[str]]:
        """An operator asks for the next phase: granted only when ``unmet`` is empty."""
        unmet = self.unmet(calibrated)
        if unmet:
            return False, f"promotion out of {self.phase.name} refused: " + "; ".join(unmet), unmet
        to = Phase(int(self.phase) + 1)
        frm = self.phase
        self._to(to, f"promoted by the operator: {reason or 'no reason given'}", "operator")
        return True, f"promoted {frm.name} -> {to.name}", []

    def demote(self, reason: str) -> tuple[bool, str]:
        """An operator asks for the previous phase (always granted, but out of SIM there is none)."""
        if self.phase == Phase.SIM:
            return False, "already SIM: there is no lower phase"
        frm = self.phase
        to = Phase(int(frm) - 1)
        self._to(to, f"demoted by the operator: {reason or 'no reason given'}", "operator")
        return True, f"demoted {frm.name} -> {to.name}"

    # ------------------------------------------------------------------ persistence
    def save(self, force: bool = False) -> None:
        """Write the state when it changed (``force``: anyway). Errors propagate (OSError)."""
        if self.store is not None and (self._dirty or force):
            self.store.save(self.state)
        self._dirty = False

    def _to(self, phase: Phase, reason: str, by: str) -> None:
        self._record(phase, reason, by)
        self.state.phase = Phase(phase)
        self.state.since_unix = self.clock()
        self.state.evidence = Evidence()
        self._dirty = True
        self.save()

    def _record(self, to: Phase, reason: str, by: str) -> None:
        ev = self.state.evidence
        self.state.history.append({
            "unix": self.clock(), "from": self.phase.name, "to": Phase(to).name, "by": by, "reason": reason,
            "evidence": {"minutes": round(ev.operating_s / 60.0, 3), "episodes": ev.episodes,
                         "success_rate": round(ev.success_rate, 4), "mean_score": round(ev.mean_score, 4),
                         "anomalies": ev.anomalies, "interventions": ev.interventions}})
        del self.state.history[:-HISTORY_MAX]


def criteria_from_mapping(data: dict, where: str = "config/trust.yaml") -> PhaseConfig:
    """PhaseConfig from ``{"to_mixed": {...}, "to_real": {...}}`` (fields of PromotionCriteria)."""
    known = {f.name for f in fields(PromotionCriteria)}
    out = {}
    for step in ("to_mixed", "to_real"):
        given = data.get(step) or {}
        if not isinstance(given, dict) or set(given) - known:
            bad = sorted(set(given) - known) if isinstance(given, dict) else given
            raise ValueError(f"{where}: phase criteria {step}: unknown {bad!r}; expected keys among {sorted(known)}")
        base = getattr(PhaseConfig(), step)
        out[step] = PromotionCriteria(**{**asdict(base), **given})
    return PhaseConfig(**out)


class DemotionEvent:
    """One anomaly, one step: in MIXED an anomaly calls a human, except the event that has just
    demoted REAL -> MIXED. That event lasts until the trust level is FULL again: its two-signal
    evidence can flicker (a signal grazing its threshold) and start another anomaly onset, which is
    still the same event. A fault that never clears keeps the arm at STOP, and STOP for longer than
    ``human_after_s`` calls a human by itself."""

    def __init__(self) -> None:
        self.open = False

    def demoted(self) -> None:
        """An anomaly just demoted REAL -> MIXED."""
        self.open = True

    def human_on_anomaly(self, phase: Phase, level: TrustLevel) -> bool:
        """Whether an anomaly now calls a human (the monitor's level before this period's step)."""
        if self.open and level == TrustLevel.FULL:
            self.open = False  # recovered: the next anomaly is a new event
        return phase == Phase.MIXED and not self.open


__all__ = ["DemotionEvent", "Evidence", "FORMAT", "PhaseConfig", "PhaseFileError", "PhaseMachine", "PhaseState", "PhaseStore",
           "PromotionCriteria", "criteria_from_mapping"]
