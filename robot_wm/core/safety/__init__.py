"""The safety layer in core (numpy, osqp, pinocchio; no rclpy, no torch).

* :mod:`~robot_wm.core.safety.controller`: ``SafetyController``, the whole control period of the
  safety filter (inputs with stamps -> one command and status); what the node runs;
* :mod:`~robot_wm.core.safety.qp`: ``SafetyFilter``, the CBF-QP (one OSQP problem, set up once);
* :mod:`~robot_wm.core.safety.supervisor`: ``SafetySupervisor``, the latches and the reset rules;
* :mod:`~robot_wm.core.safety.limits`: ``SafetyLimits`` from config/safety.yaml, trust/phase scaling
  and the tightening-only rule;
* :mod:`~robot_wm.core.safety.barriers`, :mod:`~robot_wm.core.safety.speed`,
  :mod:`~robot_wm.core.safety.layout`: the constraint families and the QP's row layout;
* :mod:`~robot_wm.core.safety.wrench`: the F/T tare and the contact force;
* :mod:`~robot_wm.core.safety.validate`, :mod:`~robot_wm.core.safety.types`: input checks and
  the shared types (states, fault kinds, latches).
"""
from robot_wm.core.safety.controller import (
    ControllerConfig,
    ControllerOutput,
    JointSample,
    NominalSample,
    SafetyController,
    TrustSample,
    WrenchSample,
)
from robot_wm.core.safety.limits import (
    GROW_ONLY_FIELDS,
    LOOSENING_FIELDS,
    LOOSENING_IF_DECREASED,
    SCHEMA,
    Phase,
    SafetyLimits,
    SafetyLimitsError,
    ScaleFactors,
    TrustLevel,
    load_safety_limits,
)
from robot_wm.core.safety.qp import SafetyFilter
from robot_wm.core.safety.speed import SPEED_POLYTOPE_COS
from robot_wm.core.safety.supervisor import SafetySupervisor
from robot_wm.core.safety.types import (
    SOLVER_NOT_RUN,
    STATE_TEXT,
    BoundSource,
    FaultKind,
    FilterInput,
    FilterOutput,
    FilterState,
    Latch,
    LinearizedModel,
    solver_status_text,
)

__all__ = [
    "BoundSource",
    "ControllerConfig",
    "ControllerOutput",
    "FaultKind",
    "FilterInput",
    "FilterOutput",
    "FilterState",
    "GROW_ONLY_FIELDS",
    "JointSample",
    "LOOSENING_FIELDS",
    "LOOSENING_IF_DECREASED",
    "Latch",
    "LinearizedModel",
    "NominalSample",
    "Phase",
    "SCHEMA",
    "SOLVER_NOT_RUN",
    "SPEED_POLYTOPE_COS",
    "STATE_TEXT",
    "SafetyController",
    "SafetyFilter",
    "SafetyLimits",
    "SafetyLimitsError",
    "SafetySupervisor",
    "ScaleFactors",
    "TrustLevel",
    "TrustSample",
    "WrenchSample",
    "load_safety_limits",
    "solver_status_text",
]
