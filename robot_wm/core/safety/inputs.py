"""The safety controller's inputs: stamped samples as the node receives them, and their checks.

Each check returns the usable values and a ``Problem`` (kind + a reason naming the input, the
value and what was expected) instead of raising. The controller runs them every period on the
newest sample of each input, and :meth:`SafetyController.note` runs them on every message as it
arrives, so that a malformed message replaced by a good one before the next period still latches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from robot_wm.core.safety.limits import Phase, TrustLevel
from robot_wm.core.safety.types import FaultKind
from robot_wm.core.safety.validate import Problem, as_scalar, as_vector, show

#: Trust levels at which the arm may move.
MOVING_LEVELS = (TrustLevel.FULL, TrustLevel.CAUTIOUS, TrustLevel.SLOW)


@dataclass(frozen=True)
class JointSample:
    """A joint state: positions (rad) and velocities (rad/s) in joint order, and when it was measured.

    ``error`` non-empty: the message could not be read (unknown joints, wrong lengths); the text
    says why and the arrays are ignored.
    """

    q_rad: Any
    qdot_radps: Any
    stamp_s: float
    error: str = ""


@dataclass(frozen=True)
class NominalSample:
    """The proposed command (rad/s, joint order) and when it was received."""

    u_radps: Any
    stamp_s: float


@dataclass(frozen=True)
class WrenchSample:
    """The wrist F/T force reading (N) in the sensor's frame ``frame_id``, and when it was measured."""

    force_n: Any
    stamp_s: float
    frame_id: str = ""


@dataclass(frozen=True)
class TrustSample:
    """A TrustState: level (TrustLevel value), phase (Phase value), when, and the monitor's reason."""

    level: Any
    phase: Any
    stamp_s: float
    reason: str = ""


def check_stamp(name: str, stamp_s: Any, now_s: float, dt_s: float) -> Problem | None:
    """A stamp must be a finite time, not later than this period (one period of clock skew allowed)."""
    t = as_scalar(stamp_s)
    if t is None:
        return Problem(FaultKind.TIMING, f"{FaultKind.TIMING.text}: the {name}'s stamp {stamp_s!r} is not a finite time")
    if t > now_s + dt_s:
        return Problem(FaultKind.TIMING, f"{FaultKind.TIMING.text}: the {name}'s stamp is {t - now_s:.3g} s in the future")
    return None


def check_joint(sample: JointSample, n: int) -> tuple[np.ndarray | None, np.ndarray | None, Problem | None]:
    """(q, qdot, problem) of a joint state."""
    if sample.error:
        return None, None, Problem(FaultKind.JOINT_STATE, f"{FaultKind.JOINT_STATE.text}: {sample.error}")
    q, qd = as_vector(sample.q_rad, n), as_vector(sample.qdot_radps, n)
    if q is None or qd is None:
        return None, None, Problem(FaultKind.JOINT_STATE, f"{FaultKind.JOINT_STATE.text}: q = {show(sample.q_rad)}, "
                                                          f"qdot = {show(sample.qdot_radps)}: expected {n} finite values each")
    return q, qd, None


def check_nominal(sample: NominalSample, n: int) -> tuple[np.ndarray | None, Problem | None]:
    """(u, problem) of a nominal command."""
    u = as_vector(sample.u_radps, n)
    if u is None:
        return None, Problem(FaultKind.NOMINAL, f"{FaultKind.NOMINAL.text}: u_nominal_radps = {show(sample.u_radps)}: "
                                                f"expected {n} finite values")
    return u, None


def check_wrench(sample: WrenchSample, ft_frame: str) -> tuple[np.ndarray | None, Problem | None]:
    """(force in the sensor frame, problem) of a wrench."""
    force = as_vector(sample.force_n, 3)
    if force is None:
        return None, Problem(FaultKind.WRENCH, f"{FaultKind.WRENCH.text}: force = {show(sample.force_n)}: "
                                               "expected 3 finite values (N)")
    if sample.frame_id != ft_frame:
        return None, Problem(FaultKind.WRENCH, f"{FaultKind.WRENCH.text}: frame_id {sample.frame_id!r}: expected "
                                               f"{ft_frame!r} (ft_frame)")
    return force, None


def _enum_value(value: Any, enum: type) -> Any:
    """``enum(value)`` for an exact integer value (no bools, no 2.9 -> 2), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, float, np.floating)):
        return None
    if not math.isfinite(float(value)) or float(value) != int(value):
        return None
    try:
        return enum(int(value))
    except ValueError:
        return None


def parse_trust(sample: TrustSample) -> tuple[TrustLevel | None, Phase | None, Problem | None]:
    """(level, phase, problem) of a TrustState; level and phase must be exact values of their enums."""
    level, phase = _enum_value(sample.level, TrustLevel), _enum_value(sample.phase, Phase)
    if level is None or phase is None:
        return None, None, Problem(
            FaultKind.TRUST, f"{FaultKind.TRUST.text}: level={sample.level!r}, phase={sample.phase!r}: expected level in "
            f"{[f'{x.name}={x.value}' for x in TrustLevel]} and phase in {[f'{x.name}={x.value}' for x in Phase]}")
    return level, phase, None
