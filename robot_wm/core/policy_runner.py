"""Policy runners: the learned ONNX policy and the scripted baseline behind one ``act(obs)`` call.

Both take observations in the shared layout (``robot_wm.contracts.OBS_LAYOUT``, raw units:
``[q rad, qdot rad/s, tool position m (3), goal m (3)]``) and return joint velocity commands in
rad/s, one row per observation row, so the evaluator and the policy node treat them alike. The
graph's input and output are ``robot_wm.contracts.policy_signature()``.

Output contract of :meth:`PolicyRunner.act` (the safety filter downstream is still the last gate):

* a **non-finite** output (NaN/Inf anywhere in the batch) raises :class:`PolicyOutputError` —
  the runner never returns NaN, and it does not invent a command either: a network that emits NaN
  is broken, and the caller (node, evaluator) must treat it as a fault (no nominal command, so the
  filter performs its controlled stop);
* a finite output **beyond the action limits** is clipped element-wise to ``±action_limit_radps``
  (the exported graph already scales into the limits; clipping removes float overshoot and keeps
  a mis-scaled graph inside the task's envelope). ``clipped_count`` counts clipped elements.

Only numpy and onnxruntime (through ``robot_wm.core.onnx_model``) are used: no torch, no rclpy.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from robot_wm.contracts import (
    N_JOINTS,
    OBS_LAYOUT,
    layout_width,
    track_obs_layout,
    POLICY_ACTION,
    POLICY_KIND,
    POLICY_OBS,
    layout_json,
    policy_signature,
)
from robot_wm.core.onnx_model import ModelError, check_contract, load_model


class PolicyOutputError(RuntimeError):
    """The policy produced a non-finite action; the message names the rows and the model."""


class Policy(Protocol):
    """Anything the evaluator can drive: ``act`` maps observations (n, OBS_DIM) to actions (n, N_JOINTS), rad/s."""

    name: str

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Return joint velocity commands for one observation (OBS_DIM,) or a batch (n, OBS_DIM)."""
        ...


def make_obs(q_rad: np.ndarray, qdot_radps: np.ndarray, tool_m: np.ndarray, goal_m: np.ndarray) -> np.ndarray:
    """Build observations in OBS_LAYOUT order from their parts (one (…,k) array per block).

    Args:
        q_rad: joint positions, (N_JOINTS,) or (n, N_JOINTS).
        qdot_radps: joint velocities, (N_JOINTS,) or (n, N_JOINTS).
        tool_m: tool position in the base frame, (3,) or (n, 3).
        goal_m: goal position in the base frame, (3,) or (n, 3); a single goal broadcasts over a batch.
    Returns:
        float64 array (OBS_DIM,) or (n, OBS_DIM).
    Raises:
        ValueError: a part has the wrong last dimension or the batch sizes disagree.
    """
    parts = {"q_rad": q_rad, "qdot_radps": qdot_radps, "tool_m": tool_m, "goal_m": goal_m}
    arrays = {}
    for name, value in parts.items():
        a = np.asarray(value, dtype=float)
        width = OBS_LAYOUT[name].stop - OBS_LAYOUT[name].start
        if a.ndim not in (1, 2) or a.shape[-1] != width:
            raise ValueError(f"make_obs: {name} has shape {a.shape}: expected ({width},) or (n, {width})")
        arrays[name] = a
    batch = {a.shape[0] for a in arrays.values() if a.ndim == 2}
    if len(batch) > 1:
        raise ValueError(f"make_obs: batch sizes differ: { {k: a.shape for k, a in arrays.items()} }")
    if not batch:
        return np.concatenate([arrays[k] for k in OBS_LAYOUT])
    n = batch.pop()
    return np.concatenate([np.broadcast_to(arrays[k], (n, arrays[k].shape[-1])) for k in OBS_LAYOUT], axis=1)


def check_obs(obs: np.ndarray, who: str = "policy", layout: dict[str, slice] | None = None) -> tuple[np.ndarray, bool]:
    """Validate observations; return them as a float (n, width) array and whether the input was a single row.

    Args:
        obs: one row or a batch.
        who: named in the errors.
        layout: the task's observation layout (default the reaching task's OBS_LAYOUT).
    Raises:
        ValueError: wrong shape, or NaN/Inf (naming the rows and layout blocks affected).
    """
    layout = OBS_LAYOUT if layout is None else layout
    width = layout_width(layout)
    try:
        a = np.asarray(obs, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{who}: obs is not a numeric array ({exc}); "
                         f"expected shape ({width},) or (n, {width})") from exc
    single = a.ndim == 1
    if single:
        a = a[None, :]
    if a.ndim != 2 or a.shape[1] != width or a.shape[0] == 0:
        raise ValueError(f"{who}: obs has shape {np.shape(obs)}: expected ({width},) or (n, {width}) with n >= 1 "
                         f"(layout {list(layout)})")
    finite = np.isfinite(a)
    if not finite.all():
        rows = np.flatnonzero(~finite.all(axis=1))
        blocks = [name for name, s in layout.items() if not finite[:, s].all()]
        raise ValueError(f"{who}: obs contains NaN/Inf in rows {rows[:10].tolist()}{'...' if rows.size > 10 else ''} "
                         f"(blocks {blocks}); expected finite values")
    return a, single


class PolicyRunner:
    """Run an exported policy (``policy.onnx`` + ``policy.json``) on raw observations.

    Args:
        onnx_path: the policy graph; its sidecar is the .json next to it.
        joint_names: the robot's joint order (must match the sidecar's).
        dt_s: the control period the runner is called at (must match the sidecar's).
        action_limit_radps: per-joint limits the output is clipped to (rad/s, one per joint); default the
            sidecar's ``extra.action_limit_radps``. Given both, the tighter limit of each joint applies.
        task: the task the caller runs ("reach", "track"); None accepts a policy of any task (see
            ``self.task``). The sidecar names its task (no name: reach) and its observation layout.
        pace: called just before the session is created (``load_model``).
    Raises:
        ModelError: missing/corrupt model or sidecar, wrong kind, joint order, period, graph signature,
            task, observation layout, or no action limits known.
    """

    def __init__(
        self,
        onnx_path: Path | str,
        joint_names: tuple[str, ...] | list[str],
        dt_s: float,
        action_limit_radps: np.ndarray | list[float] | tuple[float, ...] | None = None,
        task: str | None = None,
        pace: Callable[[], object] | None = None,
    ) -> None:
        self.model = load_model(Path(onnx_path), kind=POLICY_KIND, joint_names=joint_names, dt_s=dt_s, pace=pace)
        meta = self.model.meta
        name = self.model.path.name
        #: The task this policy was trained for ("reach" for sidecars that name none).
        self.task = str(meta.get("task", "reach"))
        if task is not None and self.task != task:
            raise ModelError(f"{name}: a policy for the {self.task!r} task, not for {task!r}")
        self.obs_layout = self._layout(meta.get("obs_layout"), name)
        check_contract(self.model, policy_signature(layout_width(self.obs_layout)))
        limits = [_limits(action_limit_radps, "action_limit_radps")] if action_limit_radps is not None else []
        if meta.get("action_limit_radps") is not None:
            try:
                limits.append(_limits(meta["action_limit_radps"], f"{name} sidecar action_limit_radps"))
            except ValueError as exc:
                raise ModelError(str(exc)) from exc
        if not limits:
            raise ModelError(f"{name}: the sidecar has no action_limit_radps and none was given")
        self.action_limit_radps = np.minimum.reduce(limits)
        self.clipped_count = 0
        self.name = f"{name} v{self.model.version}"

    def _layout(self, declared, name: str) -> dict[str, slice]:
        """The observation layout of this policy's task, checked against its sidecar."""
        if self.task == "reach":
            expected = OBS_LAYOUT
        elif self.task == "track":
            block = (declared or {}).get("preview_m")
            if not block or (block[1] - block[0]) % 3 or block[1] <= block[0]:
                raise ModelError(f"{name}: a track policy's sidecar must give obs_layout.preview_m (3 per preview point)")
            expected = track_obs_layout((block[1] - block[0]) // 3)
        else:
            raise ModelError(f"{name}: sidecar task {self.task!r}: expected 'reach' or 'track'")
        if declared is not None and declared != layout_json(expected):
            raise ModelError(f"{name}: sidecar obs_layout {declared} differs from the {self.task} contract's "
                             f"{layout_json(expected)}")
        return expected

    @property
    def version(self) -> str:
        """The model's version (from its sidecar)."""
        return self.model.version

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Return joint velocity commands (rad/s) for obs (OBS_DIM,) → (N_JOINTS,) or (n, OBS_DIM) → (n, N_JOINTS).

        Raises:
            ValueError: obs has the wrong shape or is not finite.
            PolicyOutputError: the graph produced NaN/Inf (see the module docstring).
        """
        x, single = check_obs(obs, who=self.model.path.name, layout=self.obs_layout)
        out = self.model.run(**{POLICY_OBS: x})[POLICY_ACTION]
        if out.shape != (x.shape[0], N_JOINTS):
            raise PolicyOutputError(f"{self.model.path.name}: output has shape {out.shape}, "
                                    f"expected ({x.shape[0]}, {N_JOINTS})")
        out = out.astype(float)
        finite = np.isfinite(out).all(axis=1)
        if not finite.all():
            rows = np.flatnonzero(~finite)
            raise PolicyOutputError(f"{self.model.path.name}: the policy output NaN/Inf for observation rows "
                                    f"{rows[:10].tolist()}{'...' if rows.size > 10 else ''}; no action returned")
        clipped = np.clip(out, -self.action_limit_radps, self.action_limit_radps)
        self.clipped_count += int(np.count_nonzero(clipped != out))
        return clipped[0] if single else clipped


class ScriptedPolicy:
    """The damped-least-squares reacher (:class:`robot_wm.core.reacher.DlsReacher`) behind ``act(obs)``.

    It reads q and the goal from the observation (the tool position it computes itself from q).

    Args:
        reacher: the reacher; its joint order is the observation's.
        action_limit_radps: per-joint clip of the output (rad/s); default the reacher's own limits.
    """

    def __init__(self, reacher, action_limit_radps: np.ndarray | None = None) -> None:
        self.reacher = reacher
        self.action_limit_radps = (np.asarray(reacher.v_limit, dtype=float) if action_limit_radps is None
                                   else _limits(action_limit_radps, "action_limit_radps"))
        self.name = "scripted DLS reacher"

    @classmethod
    def from_description(cls, task, urdf_xml: str | None = None) -> "ScriptedPolicy":
        """Build the baseline for ``task`` from the robot description (home posture, joint order, task limits)."""
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.reacher import DlsReacher

        urdf = urdf_xml if urdf_xml is not None else description.expand()
        names = description.joint_limits(urdf).names
        kin = Kinematics(urdf, names)
        limits = np.asarray(task.action_limit_radps, dtype=float)
        return cls(DlsReacher(kin, description.initial_positions(names), limits), limits)

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Return joint velocity commands (rad/s) for obs (OBS_DIM,) → (N_JOINTS,) or (n, OBS_DIM) → (n, N_JOINTS)."""
        x, single = check_obs(obs, who=self.name)
        q, goal = x[:, OBS_LAYOUT["q_rad"]], x[:, OBS_LAYOUT["goal_m"]]
        out = np.clip(self.reacher.batch(q, goal), -self.action_limit_radps, self.action_limit_radps)
        return out[0] if single else out


def _limits(value, what: str) -> np.ndarray:
    try:
        a = np.asarray(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}={value!r}: expected {N_JOINTS} positive numbers (rad/s)") from exc
    if a.shape != (N_JOINTS,) or not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{what}={value!r}: expected {N_JOINTS} positive finite numbers (rad/s)")
    return a
