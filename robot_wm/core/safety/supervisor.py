"""SafetySupervisor: the latches that hold the arm and the rules that release them.

A latch holds the arm stopped until an operator's reset (``/robot_wm/reset_estop``); nothing
else releases one — no input, parameter change, exception, lifecycle transition or restart.

| latch | set by | command while latched |
|---|---|---|
| START | construction (every process start, every configure), lifecycle deactivate | zero |
| ESTOP | an operator's e-stop | zero |
| FAULT | a latching fault (``FaultKind.latches``: malformed input or parameter, broken model, exception, slack) | controlled stop, then zero |
| TRUST | trust level STOP or HUMAN | controlled stop, then zero |

``reset`` releases every latch at once and is refused, with the reason, while the latest
period's inputs are not usable (``fault_now``: a latching fault, a missing input, a stale input
that has been stale for more than ``STALE_RESET_GRACE_PERIODS`` periods) or while the trust
level is still STOP/HUMAN.

State machine of the reported state::

    (start) ESTOP "waiting for operator enable" ──reset──► OK/FILTERING ──request_estop──► ESTOP ──reset──► OK
    OK/FILTERING ──latching fault──► FAULT ──input healthy──► STOPPING ──standstill──► STOPPED ──reset──► OK
    OK/FILTERING ──transient fault (stale, solver)──► FAULT ──healthy again──► OK/FILTERING
    OK/FILTERING ──trust STOP/HUMAN──► STOPPING ──► STOPPED ──fresh moving level + reset──► OK
"""
from __future__ import annotations

from collections import Counter

from robot_wm.core.safety.types import RUNNING_STATES, FaultKind, FilterState, Latch
from robot_wm.core.safety.validate import Problem

#: A stale input refuses a reset once it has been stale for more than this many periods in a row.
STALE_RESET_GRACE_PERIODS = 50

#: Text of the start latch.
START_REASON = "waiting for operator enable (call /robot_wm/reset_estop)"


class SafetySupervisor:
    """The latches, the latest period's input health, and the reset rules.

    Args:
        latch_stale: True = stale inputs latch like malformed ones; False (default) = a stale
            input stops the arm only while it is stale (as moveit_servo halts on an incoming-command
            timeout), unless it lasts beyond the reset grace.
        latches: latches carried over from an earlier instance (a lifecycle cleanup/configure);
            START is always added.
    """

    def __init__(self, *, latch_stale: bool = False, latches: dict[Latch, str] | None = None) -> None:
        self.latch_stale = bool(latch_stale)
        self.latches: dict[Latch, str] = dict(latches or {})
        self.latches.setdefault(Latch.START, START_REASON)
        self.fault_now: Problem | None = None  # the latest period's input problem (None = healthy)
        self.stale_periods = 0  # consecutive periods with a stale or missing input
        self.trust_blocks_reset = ""  # why the current trust level does not allow a reset ("" = it does)
        self.evaluated = False  # a period has checked the inputs since the start (or the last hold)
        self.periods = 0
        self.stop_events = 0
        self.constraint_counts: Counter[str] = Counter()
        self.state_counts: Counter[str] = Counter()
        self._last_state = FilterState.ESTOP

    # ------------------------------------------------------------------ status
    @property
    def latched(self) -> bool:
        """True while any latch holds the arm."""
        return bool(self.latches)

    @property
    def holds_zero(self) -> bool:
        """True while a latch demands exactly zero (e-stop, start) rather than a controlled stop."""
        return Latch.ESTOP in self.latches or Latch.START in self.latches

    def latch_names(self) -> tuple[str, ...]:
        """Names of the active latches, in a fixed order."""
        return tuple(k.value for k in Latch if k in self.latches)

    def latch_text(self) -> str:
        """One line naming every active latch and its reason."""
        return "; ".join(f"{k.value}: {self.latches[k]}" for k in Latch if k in self.latches)

    # ------------------------------------------------------------------ latches
    def latch(self, kind: Latch, reason: str) -> None:
        """Set a latch (the first reason of each kind is kept)."""
        self.latches.setdefault(kind, reason)

    def record_problem(self, problem: Problem | None) -> None:
        """Note this period's input problem; a latching one sets the FAULT latch."""
        self.fault_now = problem
        self.evaluated = True
        stale = problem is not None and problem.kind == FaultKind.STALE
        self.stale_periods = self.stale_periods + 1 if stale else 0
        if problem is not None and (problem.kind.latches or (stale and self.latch_stale)):
            self.latch(Latch.FAULT, problem.reason)

    def reset(self) -> tuple[bool, str]:
        """Release every latch if the inputs allow it.

        Returns:
            (success, message). Refused when nothing is latched, while this period's input has a
            latching fault or a stale/missing input beyond the grace, and while trust is STOP/HUMAN.
        """
        if not self.latches:
            return False, f"reset refused: nothing to reset (no latch; state {self._last_state.name})"
        if not self.evaluated:
            return False, "reset refused: no control period has checked the inputs yet since the start (try again)"
        problem = self.fault_now
        if problem is not None:
            momentary = (problem.kind == FaultKind.STALE and not self.latch_stale
                         and self.stale_periods <= STALE_RESET_GRACE_PERIODS)
            if not momentary:
                lasting = f" for {self.stale_periods} periods" if problem.kind == FaultKind.STALE else ""
                return False, f"reset refused: fault persists{lasting}: {problem.reason}"
        if self.trust_blocks_reset:
            return False, f"reset refused: {self.trust_blocks_reset}"
        released = self.latch_text()
        self.latches.clear()
        tail = (f"; inputs are stale right now ({problem.reason}): the arm moves once they are fresh"
                if problem is not None else "")
        return True, f"reset: released {released}{tail}"

    # ------------------------------------------------------------------ bookkeeping
    def count(self, state: FilterState, active_constraints: tuple[str, ...]) -> None:
        """Count one period's state and active constraints; count a stop event on leaving RUNNING."""
        self.periods += 1
        if state not in RUNNING_STATES and self._last_state in RUNNING_STATES:
            self.stop_events += 1
        self._last_state = state
        self.state_counts[state.name] += 1
        self.constraint_counts.update(active_constraints)
