"""Run the exported world model (ONNX) on the hot path: one-step predictions and linearizations.

numpy + onnxruntime only (no torch, no rclpy). The graph is
``robot_wm.contracts.world_model_signature(H, K)``: inputs ``q_rad`` [B, N], ``qdot_radps``
[B, N], ``action_radps`` [B, H, N] (oldest first, last row = the command of this period) and,
for models trained with a qdot history, ``qdot_history_radps`` [B, K, N]; outputs the ensemble
mean ``next_q_rad``, ``next_qdot_radps`` and ``epistemic_var`` / ``aleatoric_var`` [B, 2N]
in STATE_LAYOUT (q, qdot) order (N = N_JOINTS).

The runner keeps the history of commands actually sent (``commit``), so callers pass only the
current state and the candidate command. ``linearize`` runs the model's linearization graph
(``robot_wm.core.wm_linearization``: prediction, Jacobian and std in one batch-1 call, built from the
exported weights and checked against the exported graph at load); a model whose weights that
builder does not recognize is linearized by central differences (a batch of 1 + 2N rows) and
``linearization`` says why. Typical use, once per control period::

    f0, B = runner.linearize(q, qdot, u_nominal)   # safety filter: x⁺ ≈ f0 + B (u − u_nominal)
    u = solve_qp(...)                              # the command that is actually sent
    pred = runner.predict(q, qdot, u)              # commits u; pred is compared with the next state
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from robot_wm.contracts import (
    N_JOINTS,
    WM_ACTIONS,
    WM_ALEATORIC_VAR,
    WM_EPISTEMIC_VAR,
    WM_NEXT_Q,
    WM_NEXT_QDOT,
    WM_Q,
    WM_QDOT,
    WM_QDOT_HISTORY,
    WORLD_MODEL_KIND,
    world_model_signature,
)
from robot_wm.core.onnx_model import ModelError, OnnxModel, check_contract, load_model
from robot_wm.core.wm_linearization import Linearizer, build_linearizer


class WorldModelInputError(ValueError):
    """An input to the runner has the wrong shape or non-finite values; the message names it."""


@dataclass(frozen=True)
class Prediction:
    """Predicted measured state one control period ahead, with its uncertainty (physical units).

    Stds are state vectors in STATE_LAYOUT (q_rad, qdot_radps) order: ``epistemic_std`` is the ensemble's
    disagreement (large where the model has not seen such data), ``aleatoric_std`` the noise
    the model expects even where it knows.
    """

    next_q_rad: np.ndarray  # (N_JOINTS,)
    next_qdot_radps: np.ndarray  # (N_JOINTS,)
    epistemic_std: np.ndarray  # (STATE_DIM,)
    aleatoric_std: np.ndarray  # (STATE_DIM,)

    @property
    def next_state(self) -> np.ndarray:
        """(next_q_rad, next_qdot_radps) as one state vector (STATE_LAYOUT)."""
        return np.concatenate([self.next_q_rad, self.next_qdot_radps])

    @property
    def total_std(self) -> np.ndarray:
        """Predictive std: sqrt(epistemic² + aleatoric²), (STATE_DIM,)."""
        return np.sqrt(self.epistemic_std**2 + self.aleatoric_std**2)


@dataclass(frozen=True)
class BatchPrediction:
    """Predictions for a batch (row i = input row i); arrays as in Prediction with a leading B."""

    next_q_rad: np.ndarray  # (B, N_JOINTS)
    next_qdot_radps: np.ndarray  # (B, N_JOINTS)
    epistemic_var: np.ndarray  # (B, STATE_DIM)
    aleatoric_var: np.ndarray  # (B, STATE_DIM)

    @property
    def next_state(self) -> np.ndarray:
        """(B, STATE_DIM) next states (STATE_LAYOUT)."""
        return np.concatenate([self.next_q_rad, self.next_qdot_radps], axis=-1)


def _vector(name: str, value, n: int = N_JOINTS) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.shape != (n,):
        raise WorldModelInputError(f"{name} has shape {arr.shape}: expected ({n},)")
    if not np.isfinite(arr).all():
        raise WorldModelInputError(f"{name} = {arr.tolist()} contains NaN or Inf")
    return arr


class WorldModelRunner:
    """The exported world-model ensemble with the command history it needs.

    Args:
        onnx_path: the .onnx file; its sidecar is validated by ``load_model`` (hash, kind,
            joint order, dt, graph signature).
        joint_names: the robot's joint order (must equal the sidecar's).
        dt_s: the control period the caller runs at (must equal the sidecar's).
        fd_step_radps: finite-difference step on the command used by ``linearize`` when the
            model has no linearization graph (and by the check of that graph).
        analytic: False = always linearize by finite differences (comparisons, benchmarks).
        pace: called before each step of the load that holds the interpreter lock for milliseconds
            (session creation, graph parsing): the hot swap's loader waits there for a control period's slack.
    Raises:
        ModelError: the model is missing, corrupted, or does not match joints / dt / layout.
    """

    def __init__(
        self, onnx_path: Path, joint_names: tuple[str, ...] | list[str], dt_s: float, fd_step_radps: float = 1e-2,
        analytic: bool = True, pace: Callable[[], object] | None = None,
    ) -> None:
        self.model: OnnxModel = load_model(onnx_path, WORLD_MODEL_KIND, joint_names, dt_s, pace=pace)
        inputs = {d["name"]: d["shape"] for d in self.model.meta["inputs"]}
        # the history lengths H and K are the model's own; everything else is the contract's
        h_shape, k_shape = inputs.get(WM_ACTIONS), inputs.get(WM_QDOT_HISTORY)
        if not (isinstance(h_shape, list) and len(h_shape) == 3 and isinstance(h_shape[1], int) and h_shape[1] >= 1):
            raise ModelError(f"{Path(onnx_path).name}: input {WM_ACTIONS!r} has shape {h_shape}, "
                             f"expected [batch, H, {N_JOINTS}]")
        self.action_history_length = int(h_shape[1])
        self.qdot_history_length = k_shape[1] if isinstance(k_shape, list) and len(k_shape) == 3 and isinstance(k_shape[1], int) else 0
        check_contract(self.model, world_model_signature(self.action_history_length, self.qdot_history_length))
        if not (np.isfinite(fd_step_radps) and fd_step_radps > 0):
            raise ValueError(f"fd_step_radps={fd_step_radps!r}: expected a positive number")
        self.fd_step_radps = float(fd_step_radps)
        eps = self.fd_step_radps
        # linearize's batch: the nominal, then +eps and -eps on each command component
        self._fd_delta = np.vstack([np.zeros(N_JOINTS), eps * np.eye(N_JOINTS), -eps * np.eye(N_JOINTS)])
        b = self._fd_delta.shape[0]
        self._fd_feeds = {WM_Q: np.zeros((b, N_JOINTS), np.float32), WM_QDOT: np.zeros((b, N_JOINTS), np.float32),
                          WM_ACTIONS: np.zeros((b, self.action_history_length, N_JOINTS), np.float32)}
        if self.qdot_history_length:
            self._fd_feeds[WM_QDOT_HISTORY] = np.zeros((b, self.qdot_history_length, N_JOINTS), np.float32)
        self._lin_feeds = {name: arr[:1].copy() for name, arr in self._fd_feeds.items()}
        self._linearizer: Linearizer | None = None
        #: How ``linearize`` computes the Jacobian (and, for finite differences, why).
        self.linearization = "finite differences (analytic=False)"
        if analytic:
            self._linearizer, why = build_linearizer(self.model.path, self.model.meta, lambda f: self.model.run(**f),
                                                     fd_step_radps=self.fd_step_radps, pace=pace)
            self.linearization = "analytic (forward mode, one batch-1 call)" if self._linearizer is not None else \
                f"finite differences ({why})"
        self.joint_names = tuple(joint_names)
        self.dt_s = float(dt_s)
        self.reset()

    @property
    def version(self) -> str:
        """The model's version string (from its sidecar)."""
        return self.model.version

    @property
    def action_history(self) -> np.ndarray:
        """The H-1 most recent committed commands, oldest first, (H-1, N_JOINTS) (a copy)."""
        return self._actions.copy()

    @property
    def qdot_history(self) -> np.ndarray:
        """The K most recent committed measured qdot, oldest first, (K, N_JOINTS) (a copy; K = 0 for most models)."""
        return self._qdots.copy()

    def reset(self, action_history: np.ndarray | None = None, qdot_history: np.ndarray | None = None) -> None:
        """Forget the history: zeros (an arm at rest with a zero command), or the given (H-1, N) / (K, N)."""
        h, k = self.action_history_length - 1, self.qdot_history_length
        self._actions = np.zeros((h, N_JOINTS))
        self._qdots = np.zeros((k, N_JOINTS))
        if action_history is not None:
            arr = np.asarray(action_history, dtype=np.float64)
            if arr.shape != (h, N_JOINTS) or not np.all(np.isfinite(arr)):
                raise WorldModelInputError(f"action_history has shape {arr.shape}: expected finite ({h}, {N_JOINTS})")
            self._actions = arr.copy()
        if qdot_history is not None:
            arr = np.asarray(qdot_history, dtype=np.float64)
            if arr.shape != (k, N_JOINTS) or not np.all(np.isfinite(arr)):
                raise WorldModelInputError(f"qdot_history has shape {arr.shape}: expected finite ({k}, {N_JOINTS})")
            self._qdots = arr.copy()

    def commit(self, action_radps: np.ndarray, qdot_radps: np.ndarray | None = None) -> None:
        """Record the command sent this period (and the measured qdot, for models with a qdot history)."""
        a = _vector("action_radps", action_radps)
        if self._actions.shape[0]:
            self._actions = np.vstack([self._actions[1:], a])
        if self._qdots.shape[0]:
            if qdot_radps is None:
                raise WorldModelInputError("commit: this model has a qdot history; pass qdot_radps too")
            self._qdots = np.vstack([self._qdots[1:], _vector("qdot_radps", qdot_radps)])

    def predict(
        self, q_rad: np.ndarray, qdot_radps: np.ndarray, action_radps: np.ndarray, commit: bool = True
    ) -> Prediction:
        """Predict the measured state after sending ``action_radps`` now.

        Args:
            q_rad, qdot_radps: measured state now, (N_JOINTS,) each, joint order.
            action_radps: the command of this period, (N_JOINTS,).
            commit: record ``action_radps`` as sent (the default; use False for what-if queries).
        Returns:
            The prediction for the next control period.
        """
        q, qd, a = _vector("q_rad", q_rad), _vector("qdot_radps", qdot_radps), _vector("action_radps", action_radps)
        qdots = self._qdots[None] if self.qdot_history_length else None
        out = self.predict_batch(q[None], qd[None], self._window(a[None]), qdots)
        if commit:
            self.commit(a, qd)
        return Prediction(out.next_q_rad[0], out.next_qdot_radps[0],
                          np.sqrt(out.epistemic_var[0]), np.sqrt(out.aleatoric_var[0]))

    def linearize(
        self, q_rad: np.ndarray, qdot_radps: np.ndarray, action_nominal_radps: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Next-state mean and its Jacobian w.r.t. the current command, in ONE call.

        The linearization graph (forward-mode derivative) when the model has one, else central
        differences with step ``fd_step_radps`` on each command component (a batch of 1 + 2 N_JOINTS):
        ``linearization`` says which. The history is read, not changed.

        Returns:
            f0 (STATE_DIM,): predicted next (q, qdot) at the nominal command;
            B (STATE_DIM, N_JOINTS): d next_state / d action, so next_state ≈ f0 + B (u − u_nominal).
        """
        f0, jac, _ = self.linearize_with_std(q_rad, qdot_radps, action_nominal_radps)
        return f0, jac

    def linearize_with_std(
        self, q_rad: np.ndarray, qdot_radps: np.ndarray, action_nominal_radps: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`linearize` plus the predictive std at the nominal command, from the same call.

        The same call gives the std at the nominal command, so the safety filter needs no second
        inference for its κσ margins.

        Returns:
            f0, B as :meth:`linearize`; total_std (STATE_DIM,): sqrt(epistemic² + aleatoric²)
            at the nominal command (= ``predict(..., commit=False).total_std``).
        """
        q, qd = _vector("q_rad", q_rad), _vector("qdot_radps", qdot_radps)
        a = _vector("action_nominal_radps", action_nominal_radps)
        h = self.action_history_length
        if self._linearizer is not None:  # the hot path: float32 feeds made once, inputs checked just above
            feeds = self._lin_feeds
            feeds[WM_Q][0] = q
            feeds[WM_QDOT][0] = qd
            feeds[WM_ACTIONS][0, :h - 1] = self._actions
            feeds[WM_ACTIONS][0, h - 1] = a
            if self.qdot_history_length:
                feeds[WM_QDOT_HISTORY][0] = self._qdots
            return self._linearizer.run(feeds)
        # finite differences (the safety filter, every period): the batch is built in float32 arrays made
        # once, and fed without predict_batch's checks (q, qd and a were checked just above; the
        # committed histories when they were committed)
        feeds = self._fd_feeds
        feeds[WM_Q][:] = q
        feeds[WM_QDOT][:] = qd
        feeds[WM_ACTIONS][:, :h - 1] = self._actions
        np.add(a, self._fd_delta, out=feeds[WM_ACTIONS][:, h - 1])
        if self.qdot_history_length:
            feeds[WM_QDOT_HISTORY][:] = self._qdots
        out = self.model.run(**feeds)
        x = np.concatenate([out[WM_NEXT_Q], out[WM_NEXT_QDOT]], axis=-1).astype(np.float64)
        eps = self.fd_step_radps
        jac = (x[1:1 + N_JOINTS] - x[1 + N_JOINTS:]).T / (2 * eps)
        std = np.sqrt(out[WM_EPISTEMIC_VAR][0] + out[WM_ALEATORIC_VAR][0]).astype(np.float64)
        return x[0], jac, std

    def predict_batch(
        self,
        q_rad: np.ndarray,
        qdot_radps: np.ndarray,
        action_radps: np.ndarray,
        qdot_history_radps: np.ndarray | None = None,
    ) -> BatchPrediction:
        """Stateless batched prediction with explicit histories (evaluation, what-if queries).

        Args:
            q_rad, qdot_radps: (B, N_JOINTS) each.
            action_radps: (B, H, N_JOINTS) commands, oldest first, last row = the current one.
            qdot_history_radps: (B, K, N_JOINTS) previous measured qdot (models with K > 0 only).
        """
        q, qd, a = (np.asarray(x, dtype=np.float64) for x in (q_rad, qdot_radps, action_radps))
        b = q.shape[0] if q.ndim == 2 else -1
        h, k = self.action_history_length, self.qdot_history_length
        checks = [(WM_Q, q, (b, N_JOINTS)), (WM_QDOT, qd, (b, N_JOINTS)), (WM_ACTIONS, a, (b, h, N_JOINTS))]
        feeds = {WM_Q: q, WM_QDOT: qd, WM_ACTIONS: a}
        if k:
            if qdot_history_radps is None:
                raise WorldModelInputError(f"{WM_QDOT_HISTORY}: this model needs (B, {k}, {N_JOINTS})")
            qh = np.asarray(qdot_history_radps, dtype=np.float64)
            checks.append((WM_QDOT_HISTORY, qh, (b, k, N_JOINTS)))
            feeds[WM_QDOT_HISTORY] = qh
        for name, arr, shape in checks:
            if b < 1 or arr.shape != shape:
                expected = shape if b >= 1 else f"(B >= 1, {N_JOINTS})"
                raise WorldModelInputError(f"{name} has shape {arr.shape}: expected {expected}")
            if not np.all(np.isfinite(arr)):
                raise WorldModelInputError(f"{name} contains NaN or Inf")
        out = self.model.run(**feeds)
        return BatchPrediction(out[WM_NEXT_Q], out[WM_NEXT_QDOT], out[WM_EPISTEMIC_VAR], out[WM_ALEATORIC_VAR])

    def linearize_batch(
        self,
        q_rad: np.ndarray,
        qdot_radps: np.ndarray,
        action_radps: np.ndarray,
        qdot_history_radps: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stateless :meth:`linearize_with_std` of many states at once, by central differences
        (``fd_step_radps``) on the current command, in one call of B (1 + 2 N) rows: what the
        safety filter would be given at each of them (a validation gate, an evaluation).

        Args: as :meth:`predict_batch` (the last command row of each is the nominal).
        Returns:
            f0 (B, STATE_DIM), B (B, STATE_DIM, N_JOINTS), total_std (B, STATE_DIM).
        """
        q, qd, a = (np.asarray(x, dtype=np.float64) for x in (q_rad, qdot_radps, action_radps))
        if q.ndim != 2 or a.ndim != 3 or a.shape[0] != q.shape[0]:
            raise WorldModelInputError(f"linearize_batch: q_rad {q.shape} / action_radps {a.shape}: expected "
                                       f"(B, {N_JOINTS}) and (B, H, {N_JOINTS})")
        rows = self._fd_delta.shape[0]  # the nominal, then +eps and -eps on each command component
        acts = np.repeat(a, rows, axis=0)
        acts[:, -1] += np.tile(self._fd_delta, (q.shape[0], 1))
        hist = None if qdot_history_radps is None else np.repeat(np.asarray(qdot_history_radps, dtype=np.float64), rows, 0)
        out = self.predict_batch(np.repeat(q, rows, 0), np.repeat(qd, rows, 0), acts, hist)
        x = out.next_state.astype(np.float64).reshape(q.shape[0], rows, -1)
        jac = (x[:, 1:1 + N_JOINTS] - x[:, 1 + N_JOINTS:]).transpose(0, 2, 1) / (2 * self.fd_step_radps)
        var = (out.epistemic_var + out.aleatoric_var).astype(np.float64).reshape(q.shape[0], rows, -1)[:, 0]
        return x[:, 0], jac, np.sqrt(var)

    def _window(self, actions: np.ndarray) -> np.ndarray:
        """(B, N) current commands -> (B, H, N) with the committed history in front."""
        past = np.repeat(self._actions[None], actions.shape[0], 0)
        return np.concatenate([past, actions[:, None, :]], axis=1)
