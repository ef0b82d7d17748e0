"""SafetySupervisor: the e-stop latch and the fault state machine around the safety filter.

The node calls :meth:`SafetySupervisor.step` once per control period and sends exactly the
command it returns. On top of :class:`~robot_wm.core.safety.cbf_qp.SafetyFilter` it adds:

* **e-stop latch**: after :meth:`request_estop` the next ``step`` commands exactly zero and every
  later one too, whatever the inputs, until :meth:`reset` succeeds;
* **fault latch** (``latch_faults=True``): after a FAULT period (bad/stale input, missing model,
  solver failure, failed post-check) the arm is stopped (controlled stop, then zero) until reset;
* **reset** is refused while a fault persists, i.e. while the latest period's input is not usable;
* STOPPING → STOPPED once the command is zero and the measured speed is below ``standstill_radps``;
* per-constraint intervention counts and a diagnostics summary.

State machine (``state`` of the returned FilterOutput)::

    OK/FILTERING ──fault──► FAULT ──input healthy──► STOPPING ──standstill──► STOPPED ──reset──► OK
         │  ▲                                                                   (latched)
         │  └── trust scale > 0 / feasible again ◄── STOPPING ──standstill──► STOPPED  (not latched)
         └──request_estop──► ESTOP (zero command) ──reset (no fault)──► OK
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

import numpy as np

from robot_wm.core.safety.cbf_qp import STALE_PREFIX, FilterInput, FilterOutput, FilterState, SafetyFilter, _as_vector


#: A stale input refuses a reset once it has been stale for more than this many periods in a row.
STALE_RESET_GRACE_PERIODS = 50


class SafetySupervisor:
    """E-stop latch, fault latch and bookkeeping around one SafetyFilter.

    Args:
        safety_filter: the filter (its ``controlled_stop`` and ``check_input`` are used while latched).
        standstill_radps: a stop counts as STOPPED when every measured |qdot| is below this, rad/s.
        latch_faults: True = a FAULT caused by a broken input (malformed, non-finite, missing model)
            latches a stop that only ``reset`` releases; solver failures stop the arm for as long
            as they last (the next period solves again).
        latch_stale: False = stale inputs stop the arm only while they are stale (as moveit_servo
            halts on an incoming-command timeout and resumes on fresh commands); True = they latch
            like any other fault. Malformed or non-finite inputs and solver failures always follow
            ``latch_faults``.
    """

    def __init__(
        self, safety_filter: SafetyFilter, *, standstill_radps: float = 0.02, latch_faults: bool = True,
        latch_stale: bool = False,
    ) -> None:
        if not (np.isfinite(standstill_radps) and standstill_radps > 0):
            raise ValueError(f"standstill_radps={standstill_radps!r}: expected a speed > 0 rad/s")
        self.filter = safety_filter
        self.standstill_radps = float(standstill_radps)
        self.latch_faults = bool(latch_faults)
        self.latch_stale = bool(latch_stale)
        self._estop_reason: str | None = None
        self._latched_fault: str | None = None
        self._fault_now: str | None = None  # fault of the latest period's input (None = healthy)
        self._stale_periods = 0  # consecutive periods with a stale input
        self._last: FilterOutput | None = None
        self.periods = 0
        self.constraint_counts: Counter[str] = Counter()
        self.state_counts: Counter[str] = Counter()
        self.stop_events = 0

    # ------------------------------------------------------------------ status
    @property
    def state(self) -> FilterState:
        """State reported by the latest step (OK before the first)."""
        if self._estop_reason is not None:
            return FilterState.ESTOP
        return self._last.state if self._last is not None else FilterState.OK

    @property
    def estopped(self) -> bool:
        """True while the e-stop is latched."""
        return self._estop_reason is not None

    @property
    def latched_fault(self) -> str | None:
        """The reason of the latched fault, or None."""
        return self._latched_fault

    @property
    def last_output(self) -> FilterOutput | None:
        """The output of the latest step."""
        return self._last

    def summary(self) -> dict[str, str]:
        """Key/value status for diagnostics (DiagnosticStatus.values): state, reasons, counts, solver."""
        last = self._last
        out = {
            "state": self.state.name,
            "estop": self._estop_reason or "",
            "latched_fault": self._latched_fault or "",
            "fault_now": self._fault_now or "",
            "periods": str(self.periods),
            "stop_events": str(self.stop_events),
        }
        if last is not None:
            out.update({
                "reason": last.reason,
                "active_constraints": ",".join(last.active_constraints),
                "intervention_norm_radps": f"{last.intervention_norm:.4g}",
                "solver_status": last.solver_status_text,
                "solver_iterations": str(last.iterations),
                "solve_time_us": f"{last.solve_time_s * 1e6:.1f}",
                "max_slack": f"{last.max_slack:.3g}",
            })
        for name, count in sorted(self.constraint_counts.items()):
            out[f"active_periods:{name}"] = str(count)
        for name, count in sorted(self.state_counts.items()):
            out[f"state_periods:{name}"] = str(count)
        return out

    # ---------------------------------------------------------------- services
    def request_estop(self, reason: str = "") -> tuple[bool, str]:
        """Latch the e-stop: from the next ``step`` on the command is exactly zero.

        Returns:
            (True, message); a repeated request keeps the first reason.
        """
        text = str(reason).strip() or "e-stop requested (no reason given)"
        if self._estop_reason is not None:
            return True, f"e-stop already latched ({self._estop_reason}); still latched"
        self._estop_reason = text
        self.stop_events += 1
        return True, f"e-stop latched: {text}"

    def reset(self) -> tuple[bool, str]:
        """Release the e-stop and/or the latched fault.

        Returns:
            (success, message). Refused while the latest period's input has a fault, and when there
            is nothing to reset. A momentarily stale input (stale for at most
            ``STALE_RESET_GRACE_PERIODS`` periods in a row) does not refuse it (unless
            ``latch_stale``): staleness latches nothing and keeps the arm stopped until inputs are
            fresh, so a publisher's brief stall cannot make an operator's reset fail; a dead
            publisher (stale for longer) does.
        """
        if self._estop_reason is None and self._latched_fault is None:
            return False, f"reset refused: nothing to reset (no e-stop or fault latched; state {self.state.name})"
        stale_now = self._fault_now is not None and self._fault_now.startswith(STALE_PREFIX)
        momentary = stale_now and self._stale_periods <= STALE_RESET_GRACE_PERIODS
        if self._fault_now is not None and (self.latch_stale or not momentary):
            lasting = f" for {self._stale_periods} periods" if stale_now else ""
            return False, f"reset refused: fault persists{lasting}: {self._fault_now}"
        released = [x for x in (
            f"e-stop ({self._estop_reason})" if self._estop_reason else "",
            f"fault ({self._latched_fault})" if self._latched_fault else "") if x]
        self._estop_reason = None
        self._latched_fault = None
        self.filter.reset()
        self._last = None
        if stale_now:  # staleness latches nothing: the arm stays stopped by it until inputs are fresh
            return True, ("reset: released " + " and ".join(released)
                          + f"; inputs are stale right now ({self._fault_now}): the arm moves once they are fresh")
        return True, "reset: released " + " and ".join(released) + "; state OK"

    # -------------------------------------------------------------------- step
    def step(self, inp: FilterInput) -> FilterOutput:
        """Run one control period; the returned ``u_safe_radps`` is the command to send."""
        out = self._step(inp)
        stale = self._fault_now is not None and self._fault_now.startswith(STALE_PREFIX)
        self._stale_periods = self._stale_periods + 1 if stale else 0
        return out

    def _step(self, inp: FilterInput) -> FilterOutput:
        self.periods += 1
        prev_state = self.state
        if self._estop_reason is not None:
            self._fault_now = self.filter.check_input(inp)
            zero = np.zeros(self.filter.n)
            self.filter.record_sent(zero)
            reason = self._estop_reason + (f"; input fault: {self._fault_now}" if self._fault_now else "")
            out = FilterOutput(u_safe_radps=zero, state=FilterState.ESTOP, reason=reason,
                               intervention_norm=_norm(zero, inp))
        elif self._latched_fault is not None:
            self._fault_now = self.filter.check_input(inp)
            u = self.filter.controlled_stop(getattr(inp, "qdot_radps", None))
            self.filter.record_sent(u)
            if self._fault_now is not None:
                state, reason = FilterState.FAULT, f"{self._fault_now} (latched: {self._latched_fault})"
            else:
                state = self._stop_state(u, inp)
                reason = f"fault latched: {self._latched_fault}; input healthy again, reset to resume"
            out = FilterOutput(u_safe_radps=u, state=state, reason=reason, intervention_norm=_norm(u, inp))
        else:
            out = self.filter.filter(inp)
            self._fault_now = out.reason if out.state == FilterState.FAULT else None
            # latch what says a component is broken (malformed or non-finite input, missing model);
            # a solver hiccup (time limit under CPU load) or a stale input stops only while it lasts
            broken = self._fault_now is not None and self.filter.check_input(inp) is not None
            stale = out.reason.startswith(STALE_PREFIX)
            if out.state == FilterState.FAULT and self.latch_faults and broken and (self.latch_stale or not stale):
                self._latched_fault = out.reason
            elif out.state == FilterState.STOPPING and self._stop_state(out.u_safe_radps, inp) == FilterState.STOPPED:
                out = _replace_state(out, FilterState.STOPPED)
        running = (FilterState.OK, FilterState.FILTERING)
        if out.state not in running and prev_state in running:
            self.stop_events += 1
        self.constraint_counts.update(out.active_constraints)
        self.state_counts[out.state.name] += 1
        self._last = out
        return out

    def fault(self, reason: str, qdot_radps: Any = None, *, elapsed_s: float | None = None,
              latch: bool = True) -> FilterOutput:
        """Run one period whose input could not be assembled at all (e.g. a malformed joint state).

        The command is the controlled stop (``elapsed_s``: time since the last command; zero while
        the e-stop is latched), the state FAULT, and with ``latch`` the fault latches like any
        broken input (``latch_faults``); ``reset`` is refused until a later ``step`` sees a usable
        input again. ``latch=False`` is for a period before the arm ever moved under this filter.
        """
        self.periods += 1
        prev_state = self.state
        text = str(reason).strip() or "input fault (no reason given)"
        self._fault_now = text
        self._stale_periods = 0
        if self._estop_reason is not None:
            u = np.zeros(self.filter.n)
            out = FilterOutput(u_safe_radps=u, state=FilterState.ESTOP,
                               reason=f"{self._estop_reason}; input fault: {text}", intervention_norm=math.nan)
        else:
            if latch and self.latch_faults and self._latched_fault is None:
                self._latched_fault = text
            u = self.filter.controlled_stop(qdot_radps, elapsed_s)
            out = FilterOutput(u_safe_radps=u, state=FilterState.FAULT, reason=text, intervention_norm=math.nan)
        self.filter.record_sent(u)
        if prev_state in (FilterState.OK, FilterState.FILTERING):
            self.stop_events += 1
        self.state_counts[out.state.name] += 1
        self._last = out
        return out

    def _stop_state(self, u: np.ndarray, inp: Any) -> FilterState:
        qd = _as_vector(getattr(inp, "qdot_radps", None), self.filter.n)
        if not np.any(u) and qd is not None and np.all(np.abs(qd) < self.standstill_radps):
            return FilterState.STOPPED
        return FilterState.STOPPING


def _norm(u: np.ndarray, inp: Any) -> float:
    nominal = _as_vector(getattr(inp, "u_nominal_radps", None), len(u))
    return float(np.linalg.norm(u - nominal)) if nominal is not None else float("nan")


def _replace_state(out: FilterOutput, state: FilterState) -> FilterOutput:
    return dataclasses.replace(out, state=state)
