"""Plain types shared by the safety layer: states, fault kinds, latches, the QP's input and output.

Everything here is data: enums with their text (moveit_servo's StatusCode idea), and frozen
dataclasses. Nothing in this module computes a command.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

import numpy as np
import osqp


class FilterState(IntEnum):
    """Safety filter state, as the constants of msg/SafetyStatus.msg."""

    OK = 0  # nominal command passes unchanged
    FILTERING = 1  # command modified by the QP to keep the constraints
    STOPPING = 2  # controlled stop (trust scale 0, infeasible QP)
    STOPPED = 3  # at standstill, zero commanded
    ESTOP = 4  # a latch holds the arm: e-stop or "waiting for operator enable" (zero command)
    FAULT = 5  # bad/stale input, solver failure, failed post-check, internal error: controlled stop


#: Human-readable text of each state (SafetyStatus.state_text).
STATE_TEXT: dict[FilterState, str] = {s: s.name for s in FilterState}

#: States in which the command is a filtered (or the nominal) command, not a stop.
RUNNING_STATES = (FilterState.OK, FilterState.FILTERING)


class FaultKind(Enum):
    """Why a period could not be filtered. ``latches`` says whether it holds the arm until a reset."""

    JOINT_STATE = "joint_state"  # malformed or non-finite /joint_states
    NOMINAL = "nominal"  # malformed or non-finite nominal command
    TRUST = "trust"  # malformed TrustState (level or phase out of range)
    WRENCH = "wrench"  # malformed or non-finite wrench, wrong frame
    MODEL = "model"  # world model missing, malformed, non-finite, or failing to run
    MODEL_IMPLAUSIBLE = "model_implausible"  # world model's slope or step physically implausible here
    PARAMETER = "parameter"  # a malformed or out-of-range parameter value was set
    STALE = "stale"  # an input older than its limit
    MISSING = "missing"  # a required input never received or not ready yet (e.g. the F/T tare)
    TIMING = "timing"  # a malformed elapsed time or input age (a caller's bug)
    SOLVER = "solver"  # OSQP did not solve (time or iteration limit, numerical trouble)
    POSTCHECK = "postcheck"  # the solution failed the check against the true hard bounds
    SLACK = "slack"  # a soft constraint exceeded beyond its tolerance for too long
    INTERNAL = "internal"  # an unexpected exception inside a control period

    @property
    def latches(self) -> bool:
        """True when this fault holds the arm stopped until an operator's reset."""
        return self not in _TRANSIENT_FAULTS

    @property
    def text(self) -> str:
        """Short description for status and logs."""
        return _FAULT_TEXT[self]


#: Faults that stop the arm only while they last: a stale input (a publisher's stall), an input not
#: there yet, a solver hiccup under CPU load, a failed post-check of one solve, a model slope
#: implausible in one corner of the state space.
_TRANSIENT_FAULTS = frozenset({FaultKind.STALE, FaultKind.MISSING, FaultKind.SOLVER, FaultKind.POSTCHECK,
                               FaultKind.MODEL_IMPLAUSIBLE})

_FAULT_TEXT = {
    FaultKind.JOINT_STATE: "bad joint state",
    FaultKind.NOMINAL: "bad nominal command",
    FaultKind.TRUST: "bad trust state",
    FaultKind.WRENCH: "bad wrench",
    FaultKind.MODEL: "world model unusable",
    FaultKind.MODEL_IMPLAUSIBLE: "world model implausible",
    FaultKind.PARAMETER: "bad parameter",
    FaultKind.STALE: "stale input",
    FaultKind.MISSING: "input missing",
    FaultKind.TIMING: "bad timing",
    FaultKind.SOLVER: "solver",
    FaultKind.POSTCHECK: "post-check failed",
    FaultKind.SLACK: "soft constraint exceeded",
    FaultKind.INTERNAL: "internal error",
}


class Latch(Enum):
    """What can hold the arm stopped until an operator's reset (``/robot_wm/reset_estop``)."""

    START = "start"  # the filter (re)started or was deactivated: waiting for operator enable
    ESTOP = "estop"  # an operator's e-stop
    FAULT = "fault"  # a latching fault (FaultKind.latches)
    TRUST = "trust"  # trust level STOP or HUMAN


class BoundSource(IntEnum):
    """Which limit binds one side of a joint's command interval (box rows)."""

    SPEED = 0  # the joint speed limit (scaled by trust)
    ACCELERATION = 1  # the acceleration box around the previous command
    POSITION = 2  # the joint-position barrier (its CBF row)
    BRAKING = 3  # the joint-limit braking bound or the "no further into the limit" rule


#: solver_status when no QP was solved this period (not an OSQP value: those start at 1).
SOLVER_NOT_RUN = 0
OSQP_SOLVED = 1
#: OSQP stopped at its iteration/time budget with an approximate answer (OSQP_SOLVED_INACCURATE);
#: accepted only when it passes the post-check at the true hard bounds, like every solution.
OSQP_SOLVED_INACCURATE = 2
OSQP_INFEASIBLE = (3, 4)
#: OSQP spent its budget (OSQP_MAX_ITER_REACHED, OSQP_TIME_LIMIT_REACHED): its last iterate is used only
#: when it keeps every row, hard and soft, as a solution would (``SafetyFilter._solve``); else a stop.
OSQP_BUDGET_SPENT = (7, 8)


def solver_status_text(status: int) -> str:
    """Text of an OSQP status value (or of SOLVER_NOT_RUN)."""
    if status == SOLVER_NOT_RUN:
        return "not run"
    try:
        return osqp.SolverStatus(status).name.removeprefix("OSQP_").lower().replace("_", " ")
    except ValueError:
        return f"unknown status {status}"


@dataclass(frozen=True)
class LinearizedModel:
    """One-step prediction x⁺ ≈ f0 + B (u − u_nominal), x = (q_rad, qdot_radps), with its std.

    This is ``WorldModelRunner.linearize_with_std`` (f0, B, sigma).
    """

    f0: np.ndarray  # (2n,) predicted next (q, qdot) at the nominal command
    B: np.ndarray  # (2n, n) d x⁺ / d u
    sigma: np.ndarray  # (2n,) predictive std of x⁺


@dataclass(frozen=True)
class FilterInput:
    """Everything the QP needs for one control period (arrays in joint order).

    Attributes:
        q_rad, qdot_radps: measured joint state.
        u_nominal_radps: the proposed command (e.g. the policy's action).
        u_prev_radps: the command sent last period (None = nothing sent yet = zero). The
            acceleration box and the controlled stop start from it, never from the measured
            velocity (a glitchy or stale sample must not open the box).
        model: the world model's linearization; None = kinematic model q⁺ = q + u dt, qdot⁺ = u
            with the error bound ½ a_max dt² on q⁺ (see docs/safety_filter.md).
        force_n: external contact force on the tool, base frame, N: the force the environment
            exerts ON the tool (pressing down on a table reads +z), payload weight and bias removed.
        trust_scale: factor on the speed limits in [0, 1] (0 = controlled stop).
        accel_scale: factor on the acceleration limits (speeding up only) in [0, 1]; None = trust_scale.
        input_age_periods: age of the oldest input in control periods. It is added to
            ``reaction_time_s`` in the braking distances.
        elapsed_s: time since the previous command was sent, s; None = one period. The
            acceleration box and the controlled-stop ramp use it (clipped to
            [dt, stale_limit_periods * dt]), so a late period brakes as hard in real time as an
            on-time one instead of stretching the stop.
        model_checked: ``model`` is what ``validate.check_model`` returned for this ``q_rad`` this
            period (``SafetyController`` passes it so); the filter does not check it again. False
            (the default): the filter checks it.
    """

    q_rad: Any
    qdot_radps: Any
    u_nominal_radps: Any
    u_prev_radps: Any = None
    model: LinearizedModel | None = None
    force_n: Any = None
    trust_scale: float = 1.0
    accel_scale: float | None = None
    input_age_periods: float = 0.0
    elapsed_s: float | None = None
    model_checked: bool = False


#: Soft families and the unit of their slack.
SLACK_FAMILIES = ("tool_speed_mps", "workspace_m", "contact_force_mps")


def no_slack() -> dict[str, float]:
    """A slack record with every soft family met."""
    return dict.fromkeys(SLACK_FAMILIES, 0.0)


@dataclass(frozen=True)
class FilterOutput:
    """The command to send and everything SafetyStatus.msg reports about this period."""

    u_safe_radps: np.ndarray
    state: FilterState
    reason: str = ""
    fault_kind: FaultKind | None = None
    active_constraints: tuple[str, ...] = ()
    intervention_norm: float = 0.0
    solver_status: int = SOLVER_NOT_RUN
    solver_status_text: str = "not run"
    iterations: int = 0
    solve_time_s: float = 0.0
    max_slack: float = 0.0
    slack: dict[str, float] = field(default_factory=no_slack)

    @property
    def state_text(self) -> str:
        """Name of the state (SafetyStatus.state_text)."""
        return STATE_TEXT[self.state]

    @property
    def fault_reason(self) -> str:
        """The reason for FAULT or ESTOP; empty otherwise (SafetyStatus.fault_reason)."""
        return self.reason if self.state in (FilterState.FAULT, FilterState.ESTOP) else ""

    @property
    def is_stop(self) -> bool:
        """True when the command is a controlled stop (or zero) rather than a filtered command."""
        return self.state not in RUNNING_STATES


@dataclass(frozen=True)
class QpSnapshot:
    """The QP of the latest solved period as the solver saw it (for benchmarks and comparisons).

    minimize ½ uᵀu − uᵀu_nom + ½ w ‖s‖² subject to l <= A [u; s] <= u_bound, with ``u_nom = −q[:n]``.
    """

    A: np.ndarray  # (m, nx) dense
    l: np.ndarray  # (m,) lower bounds (QP margins applied)
    u: np.ndarray  # (m,) upper bounds
    q: np.ndarray  # (nx,) linear cost
    slack_weight: float
    layout: Any  # robot_wm.core.safety.layout.RowLayout
