"""The tool-speed polytope: a 26-face polytope inscribed in the speed ball, turned toward the nominal.

The ball ‖v‖ ≤ v_lim is approximated by {v : d_k·v ≤ v_lim cos θ} with the 26 directions of the
3x3x3 grid (faces, edges and corners of a cube). All 48 vertices lie at the same distance, so with
cos θ = 0.886452 the polytope is inscribed in the ball: any command it admits is within the limit,
and the worst direction loses 11.4 % (6 directions would lose 42 %, 14 directions 19 %). Each
period it is rotated so that one vertex points along the nominal tool velocity, where the limit is
then exact (docs/safety_filter.md).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

_EYE3 = np.eye(3)
_GRID = np.array([d for d in itertools.product((-1, 0, 1), repeat=3) if any(d)], dtype=float)
#: Unit directions of the polytope's faces (26).
SPEED_DIRECTIONS = _GRID / np.linalg.norm(_GRID, axis=1, keepdims=True)


def _polytope_vertices(directions: np.ndarray) -> np.ndarray:
    """Vertices of {w : d·w ≤ 1} (brute force over plane triples; 26 planes -> 2600 triples)."""
    verts = []
    for i, j, k in itertools.combinations(range(len(directions)), 3):
        m = directions[[i, j, k]]
        if abs(np.linalg.det(m)) < 1e-9:
            continue
        x = np.linalg.solve(m, np.ones(3))
        if np.all(directions @ x <= 1 + 1e-9):
            verts.append(x)
    return np.array(verts)


_VERTS = _polytope_vertices(SPEED_DIRECTIONS)
#: cos θ: inner radius / outer radius of the speed polytope (0.886452 for the 26 directions).
SPEED_POLYTOPE_COS = float(1.0 / np.linalg.norm(_VERTS, axis=1).max())
#: A vertex direction of the polytope (unit vector).
VERTEX_DIR = _VERTS[np.argmax(np.linalg.norm(_VERTS, axis=1))] / np.linalg.norm(_VERTS, axis=1).max()


def rotation_to(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Rotation matrix R with R a = b for unit vectors a, b (Rodrigues)."""
    v = np.array([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])
    c = float(a @ b)
    if c < -1.0 + 1e-9:  # opposite: rotate by π about an axis orthogonal to a
        axis = np.array([0.0, -a[2], a[1]]) if abs(a[0]) < 0.9 else np.array([-a[2], 0.0, a[0]])
        axis /= math.sqrt(float(axis @ axis))
        return 2.0 * np.outer(axis, axis) - np.eye(3)
    vx = np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])
    return _EYE3 + vx + (vx @ vx) / (1.0 + c)


def speed_rows(jac_tool: np.ndarray, u_nominal: np.ndarray) -> np.ndarray:
    """Rows d_k·R·J (26, n) of the polytope turned so that a vertex points along J u_nominal."""
    v_nom = jac_tool @ u_nominal
    speed = math.sqrt(float(v_nom @ v_nom))
    rotated = jac_tool if speed <= 1e-9 else rotation_to(VERTEX_DIR, v_nom / speed).T @ jac_tool
    return SPEED_DIRECTIONS @ rotated


#: The look-ahead margin of the tool-speed rows is at most this fraction of the limit.
SPEED_MARGIN_MAX_FRACTION = 0.25


def speed_growth(jac_now: np.ndarray, jac_end: np.ndarray, u_prev: np.ndarray, limit_mps: float) -> float:
    """How much the previous command's tool speed grows while the arm moves on with it, m/s.

    ``jac_end`` is the tool Jacobian at the posture where the command ends (the coast time and one
    period along ``u_prev``); the growth ‖J_end u_prev‖ − ‖J_now u_prev‖ is the margin the
    tool-speed rows keep (the new command lies in the acceleration box around ``u_prev``, so its
    growth is the same to first order). Clipped to [0, SPEED_MARGIN_MAX_FRACTION × limit]: near a
    singularity the estimate is poor.
    """
    v_now, v_end = jac_now @ u_prev, jac_end @ u_prev
    growth = math.sqrt(float(v_end @ v_end)) - math.sqrt(float(v_now @ v_now))
    return min(max(growth, 0.0), SPEED_MARGIN_MAX_FRACTION * limit_mps)


def drive_error_tightening(rows: np.ndarray, qd: np.ndarray, u_prev: np.ndarray, limit_mps: float) -> np.ndarray:
    """How much each tool-speed row must come down for the drive's tracking error, m/s (26,).

    The rows bound the command ``u``; the arm moves at ``q̇``. A drive that cannot follow the
    previous command (effort saturated, lagging) keeps part of its error e = q̇ − u_prev into the
    next period, so the tool moves at about J (u + e): row k then needs d_k·R·J u ≤ b − d_k·R·J e.
    Only tightening (an error against the motion never loosens a row) and at most
    SPEED_MARGIN_MAX_FRACTION × limit per row, so that a pushed arm asks the other joints for a
    bounded correction, not a stop. (A hostile run on the nominal arm measured the tool at up to
    0.61 m/s with the commanded speed at 0.485 m/s: the shoulder pan, effort saturated, ran 0.35 rad/s
    faster than commanded for 0.3 s.)
    """
    return np.clip(rows @ (qd - u_prev), 0.0, SPEED_MARGIN_MAX_FRACTION * limit_mps)
