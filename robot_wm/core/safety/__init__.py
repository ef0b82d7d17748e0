"""The safety layer in core (numpy, osqp, pinocchio; no rclpy, no torch).

* :mod:`~robot_wm.core.safety.limits`: ``SafetyLimits`` from config/safety.yaml, trust/phase
  scaling and the tightening-only rule;
* :mod:`~robot_wm.core.safety.cbf_qp`: ``SafetyFilter``, the CBF-QP (one OSQP problem, set up once);
* :mod:`~robot_wm.core.safety.supervisor`: ``SafetySupervisor``, the e-stop latch and fault state machine.
"""
from robot_wm.core.safety.cbf_qp import (
    SOLVER_NOT_RUN,
    SPEED_POLYTOPE_COS,
    STATE_TEXT,
    FilterInput,
    FilterOutput,
    FilterState,
    LinearizedModel,
    SafetyFilter,
    solver_status_text,
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
from robot_wm.core.safety.supervisor import SafetySupervisor

__all__ = [
    "FilterInput",
    "FilterOutput",
    "FilterState",
    "GROW_ONLY_FIELDS",
    "LOOSENING_FIELDS",
    "LOOSENING_IF_DECREASED",
    "LinearizedModel",
    "Phase",
    "SCHEMA",
    "SOLVER_NOT_RUN",
    "SPEED_POLYTOPE_COS",
    "STATE_TEXT",
    "SafetyFilter",
    "SafetyLimits",
    "SafetyLimitsError",
    "SafetySupervisor",
    "ScaleFactors",
    "TrustLevel",
    "load_safety_limits",
    "solver_status_text",
]
