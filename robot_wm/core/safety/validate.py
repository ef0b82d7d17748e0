"""Input validation for the safety layer: every check returns a reason naming the input, never raises.

The QP (:mod:`~robot_wm.core.safety.qp`) and the controller
(:mod:`~robot_wm.core.safety.controller`) both take inputs from outside (messages, callers); a
malformed one must become a FAULT with a clear reason, not an exception inside the control period.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from robot_wm.contracts import N_JOINTS, STATE_LAYOUT
from robot_wm.core.safety.types import FaultKind, FilterInput, LinearizedModel


@dataclass(frozen=True)
class Problem:
    """Why an input cannot be used: its kind and a reason naming the input, value and expectation."""

    kind: FaultKind
    reason: str


def as_vector(value: Any, n: int) -> np.ndarray | None:
    """``value`` as a finite float vector of length ``n``, or None."""
    if value is None:
        return None
    try:
        arr = np.array(value, dtype=float)
    except (TypeError, ValueError):
        return None
    if arr.shape != (n,) or not np.isfinite(arr).all():
        return None
    return arr


def as_scalar(value: Any) -> float | None:
    """``value`` as a finite float (bools refused), or None."""
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def show(value: Any) -> str:
    """A short printable form of ``value`` for a reason text."""
    try:
        return repr(np.asarray(value).tolist())[:120]
    except Exception:  # noqa: BLE001 (only for the message; any object must print)
        return repr(value)[:120]


@dataclass(frozen=True)
class ParsedInput:
    """A validated FilterInput as arrays and numbers."""

    q: np.ndarray
    qd: np.ndarray
    u_nom: np.ndarray
    u_prev: np.ndarray
    model: LinearizedModel | None
    force: np.ndarray | None
    s_v: float
    s_a: float
    age: float
    elapsed: float | None


def parse_filter_input(inp: Any, n: int, stale_limit_periods: float) -> ParsedInput | Problem:
    """Validate one FilterInput (the model's consistency is checked separately)."""
    if not isinstance(inp, FilterInput):
        return Problem(FaultKind.INTERNAL, f"input is {type(inp).__name__}, expected FilterInput")
    elapsed = None
    if inp.elapsed_s is not None:
        elapsed = as_scalar(inp.elapsed_s)
        if elapsed is None or elapsed < 0:
            return Problem(FaultKind.TIMING, f"elapsed_s = {inp.elapsed_s!r}: expected a finite time >= 0 s or None")
    arrays = {}
    for name, kind in (("q_rad", FaultKind.JOINT_STATE), ("qdot_radps", FaultKind.JOINT_STATE),
                       ("u_nominal_radps", FaultKind.NOMINAL)):
        vec = as_vector(getattr(inp, name), n)
        if vec is None:
            return Problem(kind, f"{name} = {show(getattr(inp, name))}: expected {n} finite values")
        arrays[name] = vec
    if inp.u_prev_radps is None:
        u_prev = np.zeros(n)
    else:
        u_prev = as_vector(inp.u_prev_radps, n)
        if u_prev is None:
            return Problem(FaultKind.INTERNAL, f"u_prev_radps = {show(inp.u_prev_radps)}: expected {n} finite values")
    age = as_scalar(inp.input_age_periods)
    if age is None or age < 0:
        return Problem(FaultKind.TIMING, f"input_age_periods = {inp.input_age_periods!r}: expected a finite age >= 0 periods")
    if age > stale_limit_periods:
        return Problem(FaultKind.STALE, f"stale input: {age:g} periods old > stale_limit_periods {stale_limit_periods}")
    s_v = as_scalar(inp.trust_scale)
    if s_v is None or not 0.0 <= s_v <= 1.0:
        return Problem(FaultKind.TRUST, f"trust_scale = {inp.trust_scale!r}: expected a number in [0, 1]")
    s_a = s_v if inp.accel_scale is None else as_scalar(inp.accel_scale)
    if s_a is None or not 0.0 <= s_a <= 1.0:
        return Problem(FaultKind.TRUST, f"accel_scale = {inp.accel_scale!r}: expected a number in [0, 1] or None")
    force = None
    if inp.force_n is not None:
        force = as_vector(inp.force_n, 3)
        if force is None:
            return Problem(FaultKind.WRENCH, f"force_n = {show(inp.force_n)}: expected 3 finite values (N, base frame) or None")
    if inp.model is not None and not isinstance(inp.model, LinearizedModel):
        return Problem(FaultKind.MODEL, f"model is {type(inp.model).__name__}, expected LinearizedModel")
    return ParsedInput(arrays["q_rad"], arrays["qdot_radps"], arrays["u_nominal_radps"], u_prev, inp.model, force,
                       s_v, s_a, age, elapsed)


#: A world model's own-joint slope may be negative by this fraction of the full slope (dt for
#: dq⁺/du, 1 for dq̇⁺/du) before it counts as implausible: where the drive saturates the learned
#: slope is ~0 and its finite difference scatters around it (measured under hostile commands on
#: the shipped model: 98 % of the negative diagonals lie within 0.05, none beyond 0.06). Such a
#: diagonal is taken as 0 ("the command does not move this joint this period"), which the command
#: braking bound covers. A clearly negative slope would make the filter push the wrong way.
SLOPE_NOISE = 0.1


def check_model(mdl: LinearizedModel, q: np.ndarray, hw_velocity_radps: np.ndarray, dt_s: float,
                joint_names: tuple[str, ...]) -> LinearizedModel | Problem:
    """Validate a linearized world model at joint position ``q``; return it as float arrays.

    Malformed or non-finite values, and a prediction the arm cannot physically produce (a step or
    velocity beyond twice the hardware speed) are FaultKind.MODEL: the model is broken. A local
    slope the arm cannot have — |dq⁺/du| > 2 dt or |dq̇⁺/du| > 2, or a diagonal more negative than
    SLOPE_NOISE of the full slope (a command moving the joint backwards would make the filter push
    the wrong way) — is
    FaultKind.MODEL_IMPLAUSIBLE: a learned model can be wrong like that in a corner of the state
    space it has seen little of, while its prediction is fine.
    """
    n = len(q)
    dim = 2 * n  # STATE_LAYOUT: positions, then velocities
    Q, QD = STATE_LAYOUT["q_rad"], STATE_LAYOUT["qdot_radps"]
    try:
        f0, B, sig = (np.asarray(x, dtype=float) if x is not None else None for x in (mdl.f0, mdl.B, mdl.sigma))
    except (TypeError, ValueError):
        return Problem(FaultKind.MODEL, "model f0/B/sigma are not numeric arrays")
    if not (n == N_JOINTS and f0 is not None and f0.shape == (dim,) and B is not None and B.shape == (dim, n)
            and sig is not None and sig.shape == (dim,)):
        shapes = [None if x is None else np.shape(x) for x in (mdl.f0, mdl.B, mdl.sigma)]
        return Problem(FaultKind.MODEL, f"model shapes f0/B/sigma = {shapes}: expected ({dim},), ({dim}, {n}), ({dim},)")
    if not (np.isfinite(f0).all() and np.isfinite(B).all() and np.isfinite(sig).all()):
        return Problem(FaultKind.MODEL, "model contains NaN or Inf")
    if (sig < 0).any():
        return Problem(FaultKind.MODEL, f"model sigma has negative entries {sig[sig < 0].tolist()}")
    step = np.abs(f0[Q] - q)
    reach = 2.0 * hw_velocity_radps * dt_s + 1e-3
    if (step > reach).any():
        i = int(np.argmax(step - reach))
        return Problem(FaultKind.MODEL,
                       f"model inconsistent: predicts {joint_names[i]} moves {step[i]:.3g} rad in one period "
                       f"(at most {reach[i]:.3g} rad at the hardware speed limit)")
    if (np.abs(f0[QD]) > 2.0 * hw_velocity_radps).any():
        return Problem(FaultKind.MODEL, "model inconsistent: predicts joint velocities beyond twice the hardware limit")
    bq, bqd = B[Q], B[QD]
    diag_q, diag_qd = np.diag(bq) / dt_s, np.diag(bqd)  # in units of the full slope (dt, 1)
    if ((np.abs(bq) > 2.0 * dt_s).any() or (np.abs(bqd) > 2.0).any()
            or (diag_q < -SLOPE_NOISE).any() or (diag_qd < -SLOPE_NOISE).any()):
        i = int(np.argmin(np.minimum(diag_q, diag_qd)))
        return Problem(FaultKind.MODEL_IMPLAUSIBLE,
                       f"model slope B implausible here (expected |dq+/du| <= 2 dt, |dqdot+/du| <= 2, diagonals >= "
                       f"-{SLOPE_NOISE:g} of the full slope; {joint_names[i]}: dq+/du = {diag_q[i]:.3g} dt, "
                       f"dqdot+/du = {diag_qd[i]:.3g})")
    if (diag_q < 0).any() or (diag_qd < 0).any():  # noise-level negatives: the command does not move it
        B = B.copy()
        idx = np.arange(n)
        B[Q][idx, idx] = np.maximum(np.diag(bq), 0.0)
        B[QD][idx, idx] = np.maximum(np.diag(bqd), 0.0)
    return LinearizedModel(f0, B, sig)
