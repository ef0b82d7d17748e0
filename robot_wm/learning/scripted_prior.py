"""The tasks' scripted baselines in torch, as the prior of a residual policy.

A policy with ``prior: scripted`` (config/training.yaml) outputs the scripted baseline's command
plus a learned, bounded correction (residual policy learning: Johannink et al. 2019, Silver et
al. 2018). The baseline already follows the path and keeps the tool speed under its cap; what is
left to learn is what it gets wrong on a real arm, mostly the lag between command and motion.

The modules here compute exactly what ``robot_wm.core.reacher.DlsReacher`` (and the reach and
track baselines built on it) compute, on batches, differentiably (imagination backpropagates
through them), and with plain tensor ops so that the exported ONNX graph carries the prior: the
deployed policy is still one ``obs -> action_radps`` graph. Their parameters are read from the
numpy baseline objects themselves (``task.baseline()``), so the two cannot drift apart; a test
checks them against each other.

Each module computes the tool position and Jacobian at the measured posture itself (training runs
them so), or takes them as ``kin``: the exported graph computes them once, in
``ExportToolFK``'s few-node form, for the prior and the cap together (``shared_kinematics``).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from robot_wm.contracts import N_JOINTS
from robot_wm.learning.torch_kinematics import ExportToolFK, TorchToolFK, cross3


def inverse3(m: torch.Tensor) -> torch.Tensor:
    """Inverse of (…, 3, 3) matrices by the adjugate (ONNX has no solve; DLS matrices are SPD)."""
    c0, c1, c2 = m[..., :, 0], m[..., :, 1], m[..., :, 2]
    r0, r1, r2 = cross3(c1, c2), cross3(c2, c0), cross3(c0, c1)
    det = (c0 * r0).sum(-1)
    return torch.stack([r0, r1, r2], dim=-2) / det[..., None, None]


class TorchDls(nn.Module):
    """``DlsReacher._command`` on batches: a tool velocity (capped) as joint velocities by damped
    least squares, plus the null-space pull toward home, scaled as a whole into the limits."""

    def __init__(self, fk: TorchToolFK, reacher) -> None:
        super().__init__()
        self.fk = fk
        f32 = dict(dtype=torch.float32)
        self.register_buffer("q_home", torch.as_tensor(reacher.q_home, **f32))
        self.register_buffer("v_limit", torch.as_tensor(reacher.v_limit, **f32))
        self.damping = float(reacher.damping)
        self.max_tool_speed = float(reacher.max_tool_speed)
        self.home_gain = float(reacher.home_gain)

    def command(self, q: torch.Tensor, v_tool_of_p,
                kin: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Joint velocities for tool velocity ``v_tool_of_p(p_tool)`` (a function of the tool position);
        ``kin``: the tool position and Jacobian at ``q`` if already computed."""
        tool, jac = self.fk.position_and_jacobian(q) if kin is None else kin
        v_tool = v_tool_of_p(tool)
        speed = torch.sqrt((v_tool * v_tool).sum(-1, keepdim=True))
        v_tool = v_tool * (self.max_tool_speed / torch.clamp(speed, min=self.max_tool_speed))
        jt = jac.transpose(-1, -2)  # (B, N, 3)
        eye3 = torch.eye(3, dtype=q.dtype)
        pinv = jt @ inverse3(jac @ jt + self.damping**2 * eye3)  # (B, N, 3)
        null = torch.eye(N_JOINTS, dtype=q.dtype) - pinv @ jac
        v = (pinv @ v_tool.unsqueeze(-1) + null @ (self.home_gain * (self.q_home - q)).unsqueeze(-1)).squeeze(-1)
        ratio = (v.abs() / self.v_limit).amax(-1, keepdim=True)
        return v / torch.clamp(ratio, min=1.0)


class ReachPrior(nn.Module):
    """The reach baseline (``ScriptedPolicy``): v_tool = gain (goal - tool)."""

    def __init__(self, fk: TorchToolFK, baseline, layout: dict[str, slice]) -> None:
        super().__init__()
        self.dls = TorchDls(fk, baseline.reacher)
        self.gain = float(baseline.reacher.gain)
        self.q, self.goal = layout["q_rad"], layout["goal_m"]
        self.register_buffer("limit", torch.as_tensor(baseline.action_limit_radps, dtype=torch.float32))

    def forward(self, obs: torch.Tensor, kin: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        goal = obs[..., self.goal]
        v = self.dls.command(obs[..., self.q], lambda tool: self.gain * (goal - tool), kin)
        return torch.minimum(torch.maximum(v, -self.limit), self.limit)


class TrackPrior(nn.Module):
    """The track baseline (``DlsTracker``): v_tool = v_ref + gain (p_ref - tool), v_ref from the preview."""

    def __init__(self, fk: TorchToolFK, baseline, layout: dict[str, slice]) -> None:
        super().__init__()
        self.dls = TorchDls(fk, baseline.reacher)
        self.gain = float(baseline.gain)
        self.q, self.preview = layout["q_rad"], layout["preview_m"]
        # the baseline's velocity estimate is linear in the preview points: recover its weights
        k = (self.preview.stop - self.preview.start) // 3
        weights = [float(baseline._velocity(np.eye(k)[:, i:i + 1] * np.ones((1, 3)))[0]) for i in range(k)]
        self.register_buffer("velocity_weights", torch.as_tensor(weights, dtype=torch.float32))

    def forward(self, obs: torch.Tensor, kin: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        preview = obs[..., self.preview].reshape(*obs.shape[:-1], -1, 3)
        v_ref = (self.velocity_weights[:, None] * preview).sum(-2)
        ref = preview[..., 0, :]
        return self.dls.command(obs[..., self.q], lambda tool: v_ref + self.gain * (ref - tool), kin)


def scripted_prior(task, layout: dict[str, slice], fk: TorchToolFK) -> nn.Module:
    """The torch prior of ``task`` (a ``robot_wm.core.tasks`` task: ``ReachTask`` or ``TrackTask``)."""
    baseline = task.baseline()
    return TrackPrior(fk, baseline, layout) if task.name == "track" else ReachPrior(fk, baseline, layout)


class ToolSpeedCap(nn.Module):
    """Scale a joint-velocity command as a whole so that the tool's speed it implies at the
    measured posture, |J(q) a|, stays within ``cap_mps`` (an action parameterization that cannot
    ask for more than the safety filter's tool-speed limit)."""

    def __init__(self, fk: TorchToolFK, q_slice: slice, cap_mps: float) -> None:
        super().__init__()
        if not cap_mps > 0:
            raise ValueError(f"tool speed cap {cap_mps!r} m/s: expected > 0")
        self.fk, self.q, self.cap = fk, q_slice, float(cap_mps)

    def forward(self, obs: torch.Tensor, action: torch.Tensor,
                kin: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        _, jac = self.fk.position_and_jacobian(obs[..., self.q]) if kin is None else kin
        v = (jac @ action.unsqueeze(-1)).squeeze(-1)
        speed = torch.sqrt((v * v).sum(-1, keepdim=True))
        return action * (self.cap / torch.clamp(speed, min=self.cap))


class ObservedToolKinematics(nn.Module):
    """The tool position and linear Jacobian at an observation's measured joint positions."""

    def __init__(self, fk: nn.Module, q_slice: slice) -> None:
        super().__init__()
        self.fk, self.q = fk, q_slice

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fk.position_and_jacobian(obs[..., self.q])


def shared_kinematics(prior: nn.Module | None, cap: ToolSpeedCap | None) -> ObservedToolKinematics | None:
    """One ``ExportToolFK`` computation for a prior (``scripted_prior``) and a cap, handed to both as
    ``kin`` (what the exported graph runs); None when neither needs the kinematics."""
    users = ([(prior.dls.fk, prior.q)] if prior is not None else []) + ([(cap.fk, cap.q)] if cap is not None else [])
    if not users:
        return None
    fk, q = users[0]
    for other_fk, other_q in users[1:]:
        same = other_fk.index == fk.index and all(torch.equal(getattr(other_fk, b), getattr(fk, b))
                                                  for b in ("rot", "trans", "tool_trans"))
        if other_q != q or not same:
            raise ValueError("the prior and the tool-speed cap use different kinematics: they cannot share one")
    return ObservedToolKinematics(ExportToolFK(fk, q.stop - q.start), q)
