"""The reaching policy, trained by actor-critic inside the world model's imagination (Dreamer-style).

Read top to bottom: config, networks, imagination rollout, λ-returns, the training loop, export.

* Imagined rollouts start from real states (recorded transitions, and task-like start poses) and
  run ``horizon`` control periods through the learned world model; the simulator is never used
  to train the policy.
* The reward is the task's own (``TaskSpec.reward`` / ``TrackSpec.reward``, evaluated on torch
  tensors through differentiable FK of the predicted joint positions), minus a penalty on ensemble
  disagreement so the actor cannot exploit regions where the model does not know, and (with
  ``limit_cost``) minus hinge costs on what the safety filter would change (``LimitCosts``: tool
  speed, nearness to a joint's soft limit, command changes beyond the acceleration limit), so that
  the policy respects the limits itself instead of leaning on the filter.
* The actor is trained by backpropagating λ-returns through the model (dynamics backprop, as
  DreamerV1 for continuous control) with an entropy bonus; the critic regresses the λ-returns of
  a slowly updated target critic.
* With ``prior: scripted`` the actor is a residual policy: the task's scripted baseline (in torch,
  ``robot_wm.learning.scripted_prior``) plus a learned correction bounded by ``residual_fraction``
  of the action limits. Training starts from the baseline's behaviour and learns what it gets
  wrong on the (imagined) arm; the baseline also keeps the tool under its speed cap.
* The exported graph carries observation normalization, the prior and action scaling: input
  ``obs`` in raw units, output ``action_radps`` already within the task's limits.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import nn

from robot_wm.contracts import (
    N_JOINTS,
    OBS_LAYOUT,
    POLICY_KIND,
    join_obs,
    layout_json,
    layout_width,
    policy_signature,
    target_slices,
    track_obs_layout,
)
from robot_wm.core.task import TaskSpec
from robot_wm.core.track import TrackSpec


class ImaginationDynamics(Protocol):
    """What the trainer needs from a world model: a differentiable step over a batch.

    ``history`` is the number of commands (oldest first, current last) the model conditions on.
    ``step`` returns the next joint positions and velocities and a per-sample epistemic spread.
    """

    history: int

    def step(self, q_rad: torch.Tensor, qdot_radps: torch.Tensor, actions_radps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ...


PRIORS = ("none", "scripted")


@dataclass(frozen=True)
class PolicyConfig:
    """Imagination actor-critic settings (config/training.yaml, section ``policy``)."""

    hidden: int = 128
    iterations: int = 2000
    batch: int = 256
    horizon: int = 20
    discount: float = 0.98
    lambda_: float = 0.95
    actor_lr: float = 3e-4
    critic_lr: float = 1e-3
    entropy_coef: float = 1e-3
    disagreement_coef: float = 2.0  # penalty on the task's reward per unit of normalized epistemic std
    near_goal_fraction: float = 0.5  # share of rollouts whose goal is near the start tool position
    task_start_fraction: float = 0.3  # share of rollouts that start at task start poses (else recorded states)
    target_update: float = 0.02  # Polyak rate of the target critic
    grad_clip: float = 100.0
    seed: int = 0
    # the safety filter's limits (config/safety.yaml) as costs in imagination, so that the policy
    # respects them itself and the filter rarely acts (0 = off: the filter alone keeps them)
    limit_cost: float = 0.0  # weight of the summed hinge costs below, per control period
    limit_speed_fraction: float = 0.9  # tool speed above this fraction of tool_speed_max_mps costs (m/s)
    limit_margin_rad: float = 0.15  # a joint within this of a soft limit costs (rad)
    limit_accel_fraction: float = 0.8  # a command change above this fraction of a_max * dt costs (rad/s)
    # "none": the actor outputs the command; "scripted": the task's scripted baseline plus a learned
    # correction bounded by residual_fraction of the action limits (a residual policy)
    prior: str = "none"
    residual_fraction: float = 0.3
    # > 0: the actor's output is scaled so that |J(q) a| <= this fraction of tool_speed_max_mps
    # (robot_wm.learning.scripted_prior.ToolSpeedCap, inside the exported graph); 0 = no cap
    speed_cap_fraction: float = 0.0

    def __post_init__(self) -> None:
        for name in ("hidden", "iterations", "batch", "horizon"):
            if getattr(self, name) <= 0:
                raise ValueError(f"policy.{name}={getattr(self, name)}: expected a positive integer")
        for name in ("discount", "lambda_", "near_goal_fraction", "task_start_fraction", "target_update"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"policy.{name}={getattr(self, name)}: expected a value in [0, 1]")
        for name in ("actor_lr", "critic_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"policy.{name}={getattr(self, name)}: expected a positive learning rate")
        if not 0.0 <= self.speed_cap_fraction <= 1.0:
            raise ValueError(f"policy.speed_cap_fraction={self.speed_cap_fraction}: expected a fraction in [0, 1] (0 = off)")
        for name in ("entropy_coef", "disagreement_coef", "grad_clip", "limit_cost", "limit_margin_rad"):
            if getattr(self, name) < 0:
                raise ValueError(f"policy.{name}={getattr(self, name)}: expected >= 0")
        if self.prior not in PRIORS:
            raise ValueError(f"policy.prior={self.prior!r}: expected one of {list(PRIORS)}")
        for name in ("limit_speed_fraction", "limit_accel_fraction", "residual_fraction"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"policy.{name}={getattr(self, name)}: expected a fraction in (0, 1]")


def speed_cap(cfg: "PolicyConfig", layout: dict[str, slice], fk: nn.Module) -> nn.Module | None:
    """The actor's tool-speed cap for ``cfg`` (None when ``speed_cap_fraction`` is 0): that
    fraction of the safety filter's ``tool_speed_max_mps`` (config/safety.yaml)."""
    if cfg.speed_cap_fraction <= 0:
        return None
    from robot_wm.core.safety import load_safety_limits
    from robot_wm.learning.scripted_prior import ToolSpeedCap

    return ToolSpeedCap(fk, layout["q_rad"], cfg.speed_cap_fraction * load_safety_limits().tool_speed_max_mps)


def build_actor(cfg: "PolicyConfig", task: "TaskSpec | TrackSpec", mean: np.ndarray, std: np.ndarray,
                layout: dict[str, slice], fk: nn.Module, action_limit_radps=None) -> "Actor":
    """The actor ``cfg`` describes for ``task``: networks, the scripted prior (``prior: scripted``)
    and the tool-speed cap; ``action_limit_radps`` defaults to the task's."""
    prior = None
    if cfg.prior == "scripted":
        from robot_wm.core.tasks import ReachTask, TrackTask
        from robot_wm.learning.scripted_prior import scripted_prior

        prior = scripted_prior(TrackTask(task) if isinstance(task, TrackSpec) else ReachTask(task), layout, fk)
    limits = np.asarray(task.action_limit_radps if action_limit_radps is None else action_limit_radps, dtype=float)
    return Actor(ObsNormalizer(mean, std, layout), limits, cfg.hidden, prior, cfg.residual_fraction,
                 speed_cap(cfg, layout, fk))


def task_layout(task: "TaskSpec | TrackSpec") -> dict[str, slice]:
    """The observation layout of a task (reach: OBS_LAYOUT; track: with its preview)."""
    return track_obs_layout(len(task.preview_s)) if isinstance(task, TrackSpec) else OBS_LAYOUT


def task_name(task: "TaskSpec | TrackSpec") -> str:
    """"track" or "reach"."""
    return "track" if isinstance(task, TrackSpec) else "reach"


class ObsNormalizer(nn.Module):
    """Fixed affine normalization of the raw observation, plus target-minus-tool features (one per
    target block of the layout: the goal, or each preview point of the reference path)."""

    def __init__(self, mean: np.ndarray, std: np.ndarray, layout: dict[str, slice] | None = None) -> None:
        super().__init__()
        layout = OBS_LAYOUT if layout is None else layout
        self.tool = layout["tool_m"]
        self.targets = target_slices(layout)
        #: width of ``forward``'s output
        self.features = layout_width(layout) + 3 * len(self.targets)
        #: scale of the target-minus-tool features (m): a reach goal is decimetres away, a tracking
        #: error millimetres (at 0.1 m a 5 mm error would be a 0.05 input the network barely sees)
        self.error_scale_m = 0.02 if "preview_m" in layout else 0.1
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        tool = obs[..., self.tool]
        err = torch.cat([obs[..., t] - tool for t in self.targets], dim=-1)  # target - tool, m
        return torch.cat([(obs - self.mean) / self.std, err / self.error_scale_m], dim=-1)


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, n_out))


class Actor(nn.Module):
    """Tanh-squashed Gaussian policy over joint velocities; ``forward`` is the deterministic action.

    With a ``prior`` (a module obs -> command, robot_wm.learning.scripted_prior) the action is
    ``prior(obs) + tanh(x) * residual_fraction * limit``, scaled as a whole into the limits; the
    correction starts near zero, so training starts from the scripted baseline. A ``speed_cap``
    (``ToolSpeedCap``) scales the final command so the tool speed it implies stays under a cap.
    The prior and the cap each compute the tool kinematics they need, unless ``kinematics`` is set
    (``export_form``, for the exported graph): then it computes them once and hands them to both.
    """

    def __init__(self, normalizer: ObsNormalizer, action_limit_radps: np.ndarray, hidden: int,
                 prior: nn.Module | None = None, residual_fraction: float = 1.0, speed_cap: nn.Module | None = None) -> None:
        super().__init__()
        self.speed_cap = speed_cap
        self.norm = normalizer
        self.net = _mlp(normalizer.features, hidden, 2 * N_JOINTS)  # mean and log-std per joint
        self.prior = prior
        self.register_buffer("limit", torch.as_tensor(action_limit_radps, dtype=torch.float32))
        self.register_buffer("scale", self.limit * (residual_fraction if prior is not None else 1.0))
        #: obs -> (tool position, Jacobian) for the prior and the cap, or None: each computes its own
        self.kinematics: nn.Module | None = None
        if prior is not None:
            with torch.no_grad():  # a small correction with modest exploration at first
                last = self.net[-1]
                last.weight.mul_(0.01)
                last.bias.zero_()
                last.bias[N_JOINTS:] = -1.0

    def _action(self, obs: torch.Tensor, squashed: torch.Tensor) -> torch.Tensor:
        kin = None if self.kinematics is None else self.kinematics(obs)
        if self.prior is None:
            action = squashed * self.limit
        else:
            action = self.prior(obs, kin) + squashed * self.scale
            ratio = (action.abs() / self.limit).amax(-1, keepdim=True)
            action = action / torch.clamp(ratio, min=1.0)
        return action if self.speed_cap is None else self.speed_cap(obs, action, kin)

    def dist(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (mean, std) of the pre-tanh Gaussian."""
        mean, log_std = self.net(self.norm(obs)).chunk(2, dim=-1)
        return mean, torch.exp(torch.clamp(log_std, -5.0, 1.0))

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return a reparameterized action (rad/s) and its entropy estimate (nats)."""
        mean, std = self.dist(obs)
        eps = torch.randn_like(mean)
        pre = mean + std * eps
        squashed = torch.tanh(pre)
        # entropy of the Gaussian minus the tanh log-Jacobian (a one-sample estimate)
        entropy = (0.5 * np.log(2 * np.pi * np.e) + torch.log(std) + torch.log(1 - squashed**2 + 1e-6)).sum(-1)
        return self._action(obs, squashed), entropy

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deployed action: tanh(mean) scaled to the limits (rad/s)."""
        mean, _ = self.dist(obs)
        return self._action(obs, torch.tanh(mean))


class Critic(nn.Module):
    """State value V(obs)."""

    def __init__(self, normalizer: ObsNormalizer, hidden: int) -> None:
        super().__init__()
        self.norm = normalizer
        self.net = _mlp(normalizer.features, hidden, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.norm(obs)).squeeze(-1)


class LimitCosts:
    """The safety filter's limits as hinge costs on an imagined step (what the filter would change).

    Per rollout: tool speed above ``limit_speed_fraction`` of the limit (m/s), joint positions
    within ``limit_margin_rad`` of a soft limit (rad), and command changes beyond
    ``limit_accel_fraction`` of the acceleration limit times the period (rad/s), summed. The
    velocity limit is the action parameterization's (tanh into the task's action limits, which lie
    inside the filter's). Differentiable through the world model and the kinematics.
    """

    def __init__(self, cfg: "PolicyConfig", limits, dt_s: float) -> None:
        self.dt = float(dt_s)
        self.speed = cfg.limit_speed_fraction * limits.tool_speed_max_mps
        self.lo = torch.as_tensor(limits.lower_rad + cfg.limit_margin_rad, dtype=torch.float32)
        self.hi = torch.as_tensor(limits.upper_rad - cfg.limit_margin_rad, dtype=torch.float32)
        self.accel = torch.as_tensor(cfg.limit_accel_fraction * limits.accel_max_radps2 * dt_s, dtype=torch.float32)

    def __call__(self, q_next, tool_prev, tool_next, action, previous_action) -> torch.Tensor:
        speed = torch.linalg.norm(tool_next - tool_prev, dim=-1) / self.dt
        over_speed = torch.relu(speed - self.speed)
        near_limit = (torch.relu(q_next - self.hi) + torch.relu(self.lo - q_next)).sum(-1)
        cost = over_speed + near_limit
        if previous_action is not None:
            cost = cost + torch.relu((action - previous_action).abs() - self.accel).sum(-1)
        return cost


def lambda_returns(rewards: torch.Tensor, values: torch.Tensor, discount: float, lambda_: float) -> torch.Tensor:
    """λ-returns R_t = r_t + γ((1-λ) V_{t+1} + λ R_{t+1}), bootstrapped with V_H (rewards: H x B, values: H+1 x B)."""
    horizon = rewards.shape[0]
    out = []
    last = values[-1]
    for t in reversed(range(horizon)):
        last = rewards[t] + discount * ((1 - lambda_) * values[t + 1] + lambda_ * last)
        out.append(last)
    return torch.stack(out[::-1])


@dataclass
class PolicyReport:
    """What policy training did."""

    iterations: int
    seconds: float
    final_imagined_return: float
    final_imagined_distance_m: float
    final_disagreement: float
    history: list[dict]
    validation: list = field(default_factory=list)  # (iteration, score) when train_policy validated


def obs_normalization(dataset, task) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of the observation from recorded data (targets: uniform over the goal box, or
    over the tracking workspace for every preview point)."""
    q = dataset.q_rad.reshape(-1, N_JOINTS)
    qd = dataset.qdot_radps.reshape(-1, N_JOINTS)
    tool = dataset.tool_m.reshape(-1, 3)
    if isinstance(task, TrackSpec):
        lo, hi = np.asarray(task.workspace_min_m), np.asarray(task.workspace_max_m)
        k = len(task.preview_s)
        t_mean, t_std = np.tile((lo + hi) / 2, k), np.tile((hi - lo) / np.sqrt(12), k)
    else:
        lo, hi = np.asarray(task.goal_box_min_m), np.asarray(task.goal_box_max_m)
        t_mean, t_std = (lo + hi) / 2, (hi - lo) / np.sqrt(12)  # uniform: width/sqrt(12)
    mean = join_obs(q.mean(0), np.zeros(N_JOINTS), tool.mean(0), t_mean)
    std = join_obs(q.std(0), np.maximum(qd.std(0), 0.05), tool.std(0), t_std)
    return mean.astype(np.float32), np.maximum(std, 1e-3).astype(np.float32)


class ReachRollouts:
    """The reaching task in imagination: a goal per rollout (near the start tool position or anywhere)."""

    def __init__(self, cfg: "PolicyConfig", task: TaskSpec) -> None:
        self.cfg, self.task = cfg, task
        self.lo = torch.as_tensor(task.goal_box_min_m, dtype=torch.float32)
        self.hi = torch.as_tensor(task.goal_box_max_m, dtype=torch.float32)
        self.goal = torch.zeros(0, 3)

    def start(self, rng: np.random.Generator, tool0: torch.Tensor) -> None:
        """Targets for a batch of rollouts starting with the tool at ``tool0`` (B, 3)."""
        B = tool0.shape[0]
        goal = self.lo + (self.hi - self.lo) * torch.rand(B, 3)
        near = torch.as_tensor(rng.random(B) < self.cfg.near_goal_fraction)
        scale = torch.as_tensor(rng.choice([0.01, 0.03, 0.1], size=(B, 1)), dtype=torch.float32)
        near_goal = torch.clamp(tool0.detach() + scale * torch.randn(B, 3), self.lo - 0.05, self.hi + 0.05)
        self.goal = torch.where(near.unsqueeze(-1), near_goal, goal)

    def obs(self, k: int, q, qd, tool) -> torch.Tensor:
        return join_obs(q, qd, tool, self.goal, xp=torch)

    def reward(self, k: int, tool, action) -> torch.Tensor:
        """The task's reward for step k (``tool``: after the step)."""
        return self.task.reward(tool, self.goal, action, xp=torch)

    def error(self, k: int, tool) -> torch.Tensor:
        return self.task.distance_m(tool, self.goal, xp=torch)


class TrackRollouts:
    """The tracking task in imagination: a reference path per rollout, placed so that it passes the
    start tool position at a random time of the episode (or, for a share of the rollouts, so that
    the arm starts away from it, as in the lead-in)."""

    def __init__(self, cfg: "PolicyConfig", task: TrackSpec, horizon: int) -> None:
        self.cfg, self.task, self.horizon = cfg, task, horizon
        self.offsets = np.asarray(task.preview_s, dtype=float)
        self.refs = torch.zeros(0, horizon + 1, len(self.offsets), 3)

    def start(self, rng: np.random.Generator, tool0: torch.Tensor) -> None:
        task, dt = self.task, self.task.control_dt_s
        B = tool0.shape[0]
        paths = task.sample_paths(rng, B)
        t_hi = task.episode_s - self.horizon * dt
        t0 = rng.uniform(0.0, t_hi, size=B)  # from the lead-in to the end
        times = t0[:, None, None] + np.arange(self.horizon + 1)[None, :, None] * dt + self.offsets[None, None, :]
        refs = np.stack([paths.position(i, times[i]) for i in range(B)])  # (B, H+1, K, 3)
        # shift each path so that the reference now is near the start tool position: close by (tracking)
        # or up to 25 cm away (the approach during the lead-in)
        gap = rng.choice([0.003, 0.01, 0.03, 0.25], size=(B, 1)) * rng.standard_normal((B, 3))
        shift = tool0.detach().numpy() + gap - refs[:, 0, 0]
        self.refs = torch.as_tensor(refs + shift[:, None, None, :], dtype=torch.float32)

    def obs(self, k: int, q, qd, tool) -> torch.Tensor:
        return join_obs(q, qd, tool, self.refs[:, k].reshape(tool.shape[0], -1), xp=torch)

    def reward(self, k: int, tool, action) -> torch.Tensor:
        return self.task.reward(tool, self.refs[:, k + 1, 0], action, xp=torch)

    def error(self, k: int, tool) -> torch.Tensor:
        return torch.linalg.norm(tool - self.refs[:, k + 1, 0], dim=-1)


def train_policy(cfg: PolicyConfig, dynamics: ImaginationDynamics, fk: nn.Module, dataset, task,
                 q_home_rad: np.ndarray, progress: bool = True, init_actor: Actor | None = None,
                 critic_warmup: int = 0, validate=None, validate_every: int = 25,
                 critic: "Critic | None" = None) -> tuple[Actor, PolicyReport]:
    """Train the actor and critic in imagination.

    Args:
        cfg: settings.
        dynamics: the world model's differentiable step (see ImaginationDynamics).
        fk: differentiable q -> tool position (TorchToolFK of the same URDF).
        dataset: recorded transitions supplying real start states (robot_wm.learning.data.Dataset).
        task: the task spec: ``TaskSpec`` (reach) or ``TrackSpec`` (track): the reward, targets,
            action limits, start noise.
        q_home_rad: the task's nominal start configuration.
        progress: show a progress bar.
        init_actor: fine-tune this actor (a copy; its observation normalization is kept) instead
            of training a new one; the critic is fresh unless ``critic`` is given.
        critic_warmup: iterations at the start that train only the critic (the actor is held):
            a fresh critic's values must not steer an actor that already works.
        validate: ``validate(actor) -> score`` (lower is better), called before the first update,
            every ``validate_every`` iterations and at the end; the actor with the best score is
            returned (so a fine-tune never returns an actor its validation finds worse than the
            one it started from). The scores are in the report's ``validation``.
        critic: go on training this critic (in place) instead of a fresh one: a training that
            comes in rounds (``train mixed``) keeps what its critic learned.
    Returns:
        The trained actor and a report.
    """
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    layout = task_layout(task)
    if init_actor is not None:
        actor = copy.deepcopy(init_actor).train()
        mean, std = actor.norm.mean.numpy().astype(float), actor.norm.std.numpy().astype(float)
    else:
        mean, std = obs_normalization(dataset, task)
        actor = build_actor(cfg, task, mean, std, layout, fk)
    if critic is None:
        critic = Critic(ObsNormalizer(mean, std, layout), cfg.hidden)
    target = copy.deepcopy(critic).requires_grad_(False)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=cfg.actor_lr)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    dynamics_params = [p for p in getattr(dynamics, "parameters", lambda: [])()]
    for p in dynamics_params:
        p.requires_grad_(False)
    rollouts = TrackRollouts(cfg, task, cfg.horizon) if isinstance(task, TrackSpec) else ReachRollouts(cfg, task)
    limit_costs = None
    if cfg.limit_cost > 0:
        from robot_wm.core.safety import load_safety_limits

        limit_costs = LimitCosts(cfg, load_safety_limits(), task.control_dt_s)

    H = dynamics.history
    q_data = torch.as_tensor(dataset.q_rad[:, H - 1:-1].reshape(-1, N_JOINTS), dtype=torch.float32)
    qd_data = torch.as_tensor(dataset.qdot_radps[:, H - 1:-1].reshape(-1, N_JOINTS), dtype=torch.float32)
    # the H-1 commands before each start state (oldest first)
    a_hist = np.stack([dataset.action_radps[:, k:dataset.n_steps - (H - 1) + k] for k in range(H - 1)], axis=2) if H > 1 else None
    hist_data = torch.as_tensor(a_hist.reshape(-1, H - 1, N_JOINTS), dtype=torch.float32) if H > 1 else None
    history = []
    validation: list[tuple[int, float]] = []
    best_score, best_actor = math.inf, None

    def checkpoint(it: int) -> None:
        nonlocal best_score, best_actor
        if validate is None:
            return
        actor.eval()
        with torch.no_grad():
            score = float(validate(actor))
        actor.train()
        validation.append((it, score))
        if score < best_score:
            best_score, best_actor = score, copy.deepcopy(actor.state_dict())

    started = time.perf_counter()
    bar = tqdm(range(cfg.iterations), desc=f"train policy ({task_name(task)})", unit="it", disable=not progress)
    for it in bar:
        if it == critic_warmup or (it > critic_warmup and it % validate_every == 0):
            checkpoint(it)  # the first one: the actor as it started (the warm-up leaves it untouched)
        q, qd, hist = _starts(cfg, rng, q_data, qd_data, hist_data, q_home_rad, task, H)
        tool = fk(q)
        rollouts.start(rng, tool)
        obs_seq, rewards, entropies, disagreements, dists, costs = [], [], [], [], [], []
        for k in range(cfg.horizon):
            obs = rollouts.obs(k, q, qd, tool)
            action, entropy = actor.sample(obs)
            previous = hist[:, -1] if hist is not None else None
            actions = torch.cat([hist, action.unsqueeze(1)], dim=1) if hist is not None else action.unsqueeze(1)
            q, qd, disagreement = dynamics.step(q, qd, actions)
            hist = actions[:, 1:] if hist is not None else None
            tool_prev, tool = tool, fk(q)  # reward of this step and observation of the next
            reward = rollouts.reward(k, tool, action) - cfg.disagreement_coef * disagreement
            if limit_costs is not None:
                cost = limit_costs(q, tool_prev, tool, action, previous)
                reward = reward - cfg.limit_cost * cost
                costs.append(cost.detach())
            obs_seq.append(obs)
            rewards.append(reward)
            entropies.append(entropy)
            disagreements.append(disagreement)
            dists.append(rollouts.error(k, tool).detach())
        obs_seq.append(rollouts.obs(cfg.horizon, q, qd, tool))
        obs_all = torch.stack(obs_seq)  # (horizon+1, B, obs width)
        rewards_t = torch.stack(rewards)
        values_target = target(obs_all)
        returns = lambda_returns(rewards_t, values_target, cfg.discount, cfg.lambda_)
        weights = torch.cumprod(torch.cat([torch.ones(1), torch.full((cfg.horizon - 1,), cfg.discount)]), 0).unsqueeze(-1)
        actor_loss = -(weights * (returns + cfg.entropy_coef * torch.stack(entropies))).mean()
        actor_opt.zero_grad()
        if it >= critic_warmup:
            actor_loss.backward()
            nn.utils.clip_grad_norm_(actor.parameters(), cfg.grad_clip)
            actor_opt.step()

        critic_loss = 0.5 * ((critic(obs_all[:-1].detach()) - returns.detach()) ** 2 * weights).mean()
        critic_opt.zero_grad()
        critic_loss.backward()
        nn.utils.clip_grad_norm_(critic.parameters(), cfg.grad_clip)
        critic_opt.step()
        with torch.no_grad():
            for p, tp in zip(critic.parameters(), target.parameters()):
                tp.lerp_(p, cfg.target_update)
        if it % 50 == 0 or it == cfg.iterations - 1:
            row = {"iteration": it, "return": float(returns[0].mean().detach()), "reward": float(rewards_t.mean().detach()), "distance_m": float(dists[-1].mean()),
                   "disagreement": float(torch.stack(disagreements).mean().detach()), "critic_loss": float(critic_loss.detach()),
                   "limit_cost": float(torch.stack(costs).mean()) if costs else 0.0}
            history.append(row)
            bar.set_postfix(dist=f"{row['distance_m']:.3f}", ret=f"{row['return']:.2f}")
    bar.close()
    checkpoint(cfg.iterations)
    if best_actor is not None:
        actor.load_state_dict(best_actor)
    for p in dynamics_params:
        p.requires_grad_(True)
    last = history[-1]
    report = PolicyReport(cfg.iterations, round(time.perf_counter() - started, 1), last["return"], last["distance_m"],
                          last["disagreement"], history, validation)
    return actor.eval(), report


def _starts(cfg, rng, q_data, qd_data, hist_data, q_home, task, H):
    """Draw start states: recorded ones, and task-like ones (home + the task's start noise)."""
    B = cfg.batch
    n_task = int(round(cfg.task_start_fraction * B))
    idx = torch.as_tensor(rng.integers(0, q_data.shape[0], B - n_task))
    q_task = torch.as_tensor(q_home + rng.uniform(-task.start_noise_rad, task.start_noise_rad, (n_task, N_JOINTS)),
                             dtype=torch.float32)
    q = torch.cat([q_data[idx], q_task])
    qd = torch.cat([qd_data[idx], torch.zeros(n_task, N_JOINTS)])
    hist = torch.cat([hist_data[idx], torch.zeros(n_task, H - 1, N_JOINTS)]) if hist_data is not None else None
    return q, qd, hist


def export_form(actor: Actor) -> Actor:
    """A copy of ``actor`` as it is exported: the same function, with the tool position and Jacobian
    that its prior and cap use computed once per forward, by ``ExportToolFK`` (a few dozen ONNX
    nodes instead of ~140 per computation, twice). ``actor`` itself keeps ``TorchToolFK``: training
    runs it, and the shipped policies were trained with its exact rounding."""
    from robot_wm.learning.scripted_prior import shared_kinematics

    form = copy.deepcopy(actor).eval()
    form.kinematics = shared_kinematics(form.prior, form.speed_cap)
    return form


def export_policy(actor: Actor, path, *, joint_names, task, dataset_sha256: str, version: str,
                  metrics: dict | None = None, config: PolicyConfig | None = None, training_command: str | None = None):
    """Export the deterministic actor (normalization and scaling inside, ``export_form``) with its
    sidecar (task and layout in it)."""
    from robot_wm.learning.export import example_inputs, export_onnx, write_sidecar

    layout = task_layout(task)
    signature = policy_signature(layout_width(layout))
    path = export_onnx(export_form(actor.eval()), example_inputs(signature, batch=1), path, signature.input_names,
                       signature.output_names)
    reward_fields = (("error_cost", "action_cost") if isinstance(task, TrackSpec)
                     else ("goal_bonus", "goal_bonus_radius_m", "action_cost"))
    extra = {
        "task": task_name(task),
        "action_limit_radps": list(task.action_limit_radps),
        "obs_layout": layout_json(layout),
        "reward": {name: getattr(task, name) for name in reward_fields},
        "normalization": {"obs_mean": actor.norm.mean.tolist(), "obs_std": actor.norm.std.tolist(),
                          "note": "applied inside the graph; feed raw observations"},
        "metrics": metrics or {},
        "config": asdict(config) if config else {},
        "prior": ("scripted baseline + learned correction within "
                  f"{config.residual_fraction:g} x action_limit_radps (inside the graph)"
                  if config is not None and config.prior == "scripted" else "none"),
        "tool_speed_cap_mps": (actor.speed_cap.cap if actor.speed_cap is not None else None),
    }
    if isinstance(task, TrackSpec):
        extra["preview_s"] = list(task.preview_s)
    write_sidecar(path, model_kind=POLICY_KIND, version=version, joint_names=joint_names, dt_s=task.control_dt_s,
                  training_data_sha256=dataset_sha256, training_command=training_command, extra=extra,
                  signature=signature)
    return path
