"""What a solved period of the safety filter reports: the constraints that bind, the soft rows' slack.

Read from a ``robot_wm.core.safety.qp.SafetyFilter`` right after its solve: the rows, true bounds, box
sources, tool Jacobian and speed limit it assembled for that period (its own state, read only). The
numbers go into ``FilterOutput`` and SafetyStatus.
"""
from __future__ import annotations

import math

import numpy as np

from robot_wm.core.safety.types import BoundSource


def active_names(filt, val: np.ndarray) -> tuple[str, ...]:
    """Names of the rows within ACTIVE_TOL of (or beyond) a bound, unique, in row order."""
    tol, lay = filt.ACTIVE_TOL, filt.layout
    near = (val <= filt._l + tol) | (val >= filt._u - tol)
    near[lay.slack] = False
    names: list[str] = []
    for idx in np.nonzero(near)[0]:
        if idx < lay.box.stop:  # box row: the velocity, acceleration or (merged) joint limit that binds
            i = idx - lay.box.start
            src = filt._hi_src[i] if val[idx] >= filt._u[idx] - tol else filt._lo_src[i]
            kind = {BoundSource.SPEED: "velocity_limit:", BoundSource.ACCELERATION: "acceleration_limit:"}.get(
                BoundSource(src), "joint_limit:")
            names.append(kind + filt._joint_short[i])
        else:
            names.append(filt.row_names[idx])
    return tuple(dict.fromkeys(names))


def unkept_soft_row(filt, val: np.ndarray, tol: float) -> str:
    """The soft row (tool speed, workspace, force) that ``val`` = A u misses at its true bound by more
    than ``tol``, and by how much ("" when it keeps them all).

    ADMM converges slowly on some hostile periods (6 in 10,000 of the adversarial runs of the e2e
    test's source in library mode; one needed 11,875 iterations against the 4,000 allowed). Its last
    iterate is as safe as a solution when it keeps every row at its true bound: the hard ones exactly
    (the post-check every solution passes) and the soft ones without slack; only its distance to the
    nominal is not the least. Otherwise the period stops the arm, as it did.
    """
    soft = filt.layout.soft
    over = np.maximum(filt._l[soft] - val[soft], val[soft] - filt._u[soft])
    if not over.size or float(over.max()) <= tol:
        return ""
    i = int(np.argmax(over))
    return f"exceeds {filt.row_names[soft.start + i]} by {over[i]:.3g}"


def slack_record(filt, u: np.ndarray, val: np.ndarray) -> dict[str, float]:
    """How far the final command exceeds each soft family, in that family's units (0 = met).

    Tool speed: commanded tool speed |J u| above the limit, m/s, measured on the ball (not on
    the polytope); workspace: barrier deficit of the next state, m; force: speed into the
    contact, m/s.
    """
    lay = filt.layout
    v = filt._jac_tool @ u
    over = np.maximum(val - filt._u, filt._l - val)
    return {
        "tool_speed_mps": max(math.sqrt(float(v @ v)) - filt._tool_speed_lim, 0.0),
        "workspace_m": max(float(over[lay.ws].max(initial=0.0)), 0.0) * filt.dt_s,
        "contact_force_mps": max(float(over[lay.force]), 0.0),
    }
