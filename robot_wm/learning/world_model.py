"""The world model: a probabilistic ensemble that predicts the arm's next measured joint state.

What it is
----------
``M`` (default 5) action-conditioned MLPs, all in ONE module with batched weights (each layer's
weight is ``[M, in, out]`` and runs as one batched matmul), so the exported ONNX file is one
fused graph. Each member predicts the change of the measured state over one control period
(Δq, Δqdot: 12 numbers) as a Gaussian: a mean and a log-variance (aleatoric noise: sensor noise
and everything the inputs cannot explain), with the soft log-variance bounds of PETS /
mbrl-lib. Members are trained on bootstrap resamples from different initializations; where the
training data said nothing, they disagree, and their spread is the **epistemic** variance: the
model knows when it does not know. Input normalization (mean/std of the training features) and
output de-normalization are registered buffers inside the module, so the exported graph takes
and returns physical units and nobody can forget the scaling.

Inputs (the state layout, ``STATE_LAYOUT``)
-------------------------------------------
* ``q_rad`` [B, 6] and ``qdot_radps`` [B, 6]: the measured joint state at t, in joint order.
* ``action_radps`` [B, H, 6]: the velocity commands of periods t-H+1 … t, oldest first; the last
  row is the command being sent now. Before an episode's first command the history is zeros
  (the arm starts at rest with a zero command); ``H = config.action_history``.
* Joint positions are fed as q itself (normalized), not sin/cos(q): the arm's joints stay well
  inside one turn in every dataset we train on, sin/cos doubles the width of the input layer
  for nothing, and in the ablation below it drifted more.

The history decision (measured with ``python -m robot_wm.learning.world_model_eval --ablation``)
--------------------------------------------------------------------------------------------
The drive has a command latency (real twin 4 ms, randomized 0-8 ms) and a first-order lag (8 ms,
randomized 0-15 ms) at a 10 ms control period, plus a PI velocity loop whose integral reference is
delayed as well: the previous command is still acting during this period, so (q, qdot, a_t) alone
is not a Markov state. Every variant had the same budget: 5 members x 3 x 200, 60k randomized
transitions (the first 300 episodes of ``collect`` seed 0), 12 epochs; evaluated on 25.6k held-out
randomized transitions (``collect`` seed 101, "rand") and 25.6k real_twin transitions
(``collect_profile_dataset`` seed 202, "twin"); tool error = open-loop drift of the tool position on the recorded
commands (mean over 2048 start points). Two seeds where two numbers are given.

    variant                     1-step qdot RMSE, rad/s    tool err @10 steps, mm    tool err @50 steps, mm
                                rand          twin         rand        twin          rand        twin
    constant velocity           0.092         0.070        11.3        11.1          101         101
    H=1  (q, qdot, a_t)         .0512/.0511   .0337/.0338  1.59/1.56   1.20/1.15     4.87/4.88   3.82/3.71
    H=2  (+ a_t-1)              .0455/.0454   .0269/.0265  1.14/1.12   0.69/0.64     3.72/3.80   2.71/2.62
    H=3  (+ a_t-1, a_t-2)       .0452/.0450   .0252/.0245  1.12/1.08   0.65/0.54     3.84/3.48   2.87/2.19
    H=5                         .0450         .0246        1.12        0.62          3.92        2.72
    H=3 + 1 previous qdot       .0450         .0239        1.10        0.66          3.78        2.82
    H=3 + 3 previous qdot       .0447         .0237        1.05        0.60          3.62        2.54
    H=5 + 4 previous qdot       .0446         .0246        1.04        0.58          3.55        2.52
    H=3, sin/cos(q)             .0454         .0243        1.22        0.75          4.28        3.24

Trained to the full budget instead (all 102k transitions, 40 epochs, the config's settings, seed 0;
``--transitions 102400 --epochs 40 --variants H1 H2 H3 H3+qdot3``):

    H=1                         .0504         .0315        1.55        1.23          4.94        4.39
    H=2                         .0439         .0224        1.06        0.65          3.70        2.66
    H=3  (the default)          .0321         .0207        1.03        0.73          3.55        2.67
    H=3 + 3 previous qdot       .0274         .0159        0.92        0.65          3.45        2.48

Chosen: **H = 3, no qdot history, raw q.** One previous command removes most of the error (real
twin, full budget: one-step -29 %, 10-step drift -47 %, 50-step -39 %); the second one is worth
another 27 % of one-step error on randomized data once trained long enough (latency + lag + the
integral reference's delay reach two periods back) and costs nothing on the hot path (the twin's
drift is the same with 2 or 3 commands, within the seed-to-seed spread of the first table); five
commands gain nothing over three. Previous measured qdot lets the network identify the episode's
lag and friction from the recent response: -15 % (randomized) / -23 % (twin) one-step qdot error
at the full budget, but the open-loop drift only -3 to -11 %. It also adds a second history to
every consumer's state (runner, imagination trainer), so it is not the default yet; every piece
here supports it (``qdot_history: 3`` in config/training.yaml; ``step``/``rollout`` take
``qdot_history_radps``, the graph gets a ``qdot_history_radps`` input, the runner keeps it),
and it is the first thing to switch on once the imagination trainer carries a qdot history.
sin/cos(q) drifts 10-30 % more than raw q. What the inputs cannot identify (the episode's lag,
latency, friction, payload) the aleatoric variance absorbs, so on the real twin, a single
mid-range profile, the 90 % intervals are conservative (coverage ~0.99) until the model is adapted.

Outputs
-------
Next measured state = current + ensemble-mean delta; epistemic variance = variance of the
member means across members (population variance, 1/M); aleatoric variance = mean over members
of each member's predicted variance. Both are [B, 12] in (q, qdot) order and physical units
(rad², rad²/s²). The predictive ("total") variance is their sum.

The contract (mbrl-lib style ``Model``)
---------------------------------------
``WorldModel`` is the only model class; everything that consumes it relies on exactly this:

``predict(q_rad, qdot_radps, action_radps) -> Prediction``
    torch tensors in, ``Prediction(next_q_rad, next_qdot_radps, epistemic_var, aleatoric_var)``
    out ([B,6], [B,6], [B,12], [B,12]); differentiable.
``step(state, action_history, member="mean", sample=False, generator=None) -> (next_state, epistemic_std)``
    The imagination step. ``state`` [B, 12] = (q_rad, qdot_radps); ``action_history`` [B, H, 6],
    oldest first, last row = the action taken now. ``member``: an int (that member only),
    ``"mean"`` (ensemble mean) or ``"random"`` (an independent member per row, TS-1 style).
    ``sample=True`` adds reparameterized aleatoric noise (the chosen member's variance; for
    "mean" the mean aleatoric variance). Returns the next state [B, 12] and the epistemic std
    [B, 12] at this step (for uncertainty penalties). Differentiable w.r.t. state and actions.
    The caller shifts its own action history: ``torch.cat([hist[:, 1:], a_next[:, None]], 1)``.
``rollout(q_rad, qdot_radps, actions, action_history=None, member="mean", sample=False) -> Rollout``
    Open-loop multi-step prediction: ``actions`` [B, T, 6] applied at t … t+T-1, the H-1 actions
    before t in ``action_history`` [B, H-1, 6] (default zeros: starting at rest). Returns
    ``Rollout(q_rad [B,T+1,6], qdot_radps [B,T+1,6], epistemic_std [B,T,12])`` (index 0 = start).
``forward(q_rad, qdot_radps, action_radps)``
    The exported graph: ``(next_q_rad, next_qdot_radps, epistemic_var, aleatoric_var)``.

Training (``robot_wm.learning.world_model_training.train_world_model``) is Gaussian NLL per member on its own bootstrap of the training
episodes' transitions, Adam(W), best checkpoint per member on the held-out NLL (episodes held out
by ``Dataset.split``), early stopping when no member improved for ``patience`` epochs, a tqdm
progress bar, and bit-for-bit determinism for a seed (same torch thread count).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from robot_wm.contracts import N_JOINTS, STATE_DIM, STATE_LAYOUT, WORLD_MODEL_KIND, layout_json, world_model_signature

CHECKPOINT_FORMAT = "robot_wm-world-model-checkpoint/1"
_Q, _QD = STATE_LAYOUT["q_rad"], STATE_LAYOUT["qdot_radps"]  # blocks of the state vectors and variances
Q_FEATURES = ("raw", "sincos")


@dataclass(frozen=True)
class WorldModelConfig:
    """World-model architecture and training settings (config/training.yaml, section ``world_model``)."""

    members: int = 5  # ensemble size (>= 2: the epistemic variance needs a spread)
    hidden_sizes: tuple[int, ...] = (200, 200, 200)
    action_history: int = 3  # commands in the input, incl. the current one (see the module docstring)
    qdot_history: int = 0  # previous measured qdot vectors in the input (0: none; the ablation found no gain)
    q_features: str = "raw"  # "raw": q itself; "sincos": sin(q), cos(q)
    epochs: int = 40  # upper bound; early stopping usually ends sooner
    batch_size: int = 256  # per member
    lr: float = 1e-3
    weight_decay: float = 1e-5  # AdamW decay on the weights (not on biases or log-variance bounds)
    holdout_fraction: float = 0.1  # share of episodes held out for early stopping / checkpointing
    patience: int = 5  # epochs without any member improving before stopping
    bootstrap: bool = True  # each member trains on its own resample (with replacement)
    init_min_logvar: float = -10.0  # soft log-variance bounds (normalized target space), learned
    init_max_logvar: float = 0.5
    logvar_bound_weight: float = 0.01  # loss weight pulling the bounds together (mbrl-lib)
    max_train_transitions: int = 0  # 0: all; else a random subset of the training transitions
    num_threads: int = 2  # torch CPU threads while training (0: leave torch's setting alone)
    seed: int = 0

    def __post_init__(self) -> None:
        def positive_int(name: str, minimum: int = 1) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"world_model.{name}={value!r}: expected an integer >= {minimum}")

        positive_int("members", 2)
        positive_int("action_history", 1)
        positive_int("qdot_history", 0)
        positive_int("epochs", 1)
        positive_int("batch_size", 1)
        positive_int("patience", 1)
        positive_int("max_train_transitions", 0)
        positive_int("num_threads", 0)
        positive_int("seed", 0)
        sizes = tuple(self.hidden_sizes)
        if not sizes or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in sizes):
            raise ValueError(
                f"world_model.hidden_sizes={self.hidden_sizes!r}: expected a non-empty list of positive integers")
        object.__setattr__(self, "hidden_sizes", sizes)
        if self.q_features not in Q_FEATURES:
            raise ValueError(f"world_model.q_features={self.q_features!r}: expected one of {list(Q_FEATURES)}")
        for name in ("lr", "weight_decay", "logvar_bound_weight", "init_min_logvar", "init_max_logvar"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"world_model.{name}={value!r}: expected a finite number")
        if self.lr <= 0:
            raise ValueError(f"world_model.lr={self.lr!r}: expected > 0")
        if self.weight_decay < 0 or self.logvar_bound_weight < 0:
            raise ValueError("world_model.weight_decay and logvar_bound_weight: expected >= 0")
        if not self.init_min_logvar < self.init_max_logvar:
            raise ValueError(
                f"world_model.init_min_logvar={self.init_min_logvar} must be below "
                f"init_max_logvar={self.init_max_logvar}"
            )
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f"world_model.holdout_fraction={self.holdout_fraction!r}: expected a value in (0, 1)")


class Prediction(NamedTuple):
    """One-step prediction (torch tensors, physical units; variances in STATE_LAYOUT order)."""

    next_q_rad: torch.Tensor  # [B, 6]
    next_qdot_radps: torch.Tensor  # [B, 6]
    epistemic_var: torch.Tensor  # [B, 12]
    aleatoric_var: torch.Tensor  # [B, 12]


class Rollout(NamedTuple):
    """Open-loop prediction over T steps (index 0 is the start state)."""

    q_rad: torch.Tensor  # [B, T+1, 6]
    qdot_radps: torch.Tensor  # [B, T+1, 6]
    epistemic_std: torch.Tensor  # [B, T, 12]


class EnsembleLinear(nn.Module):
    """``M`` independent linear layers applied as one batched matmul: [M, B, in] -> [M, B, out]."""

    def __init__(self, members: int, n_in: int, n_out: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(n_in)
        self.weight = nn.Parameter(torch.empty(members, n_in, n_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.zeros(members, 1, n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply each member's layer to its own slice of ``x``."""
        return torch.baddbmm(self.bias, x, self.weight)


class WorldModel(nn.Module):
    """Probabilistic ensemble over (q, qdot, action history) -> next (q, qdot); see the module docstring."""

    def __init__(self, config: WorldModelConfig, joint_names: tuple[str, ...] | list[str], dt_s: float) -> None:
        super().__init__()
        if len(joint_names) != N_JOINTS:
            raise ValueError(f"joint_names has {len(joint_names)} names: expected {N_JOINTS}")
        self.config = config
        self.joint_names = tuple(joint_names)
        self.dt_s = float(dt_s)
        q_width = 2 * N_JOINTS if config.q_features == "sincos" else N_JOINTS
        self.n_features = q_width + N_JOINTS * (1 + config.action_history + config.qdot_history)
        sizes = (self.n_features, *config.hidden_sizes)
        self.hidden = nn.ModuleList(EnsembleLinear(config.members, a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.head = EnsembleLinear(config.members, sizes[-1], 2 * STATE_DIM)
        m = config.members
        self.max_logvar = nn.Parameter(torch.full((m, 1, STATE_DIM), float(config.init_max_logvar)))
        self.min_logvar = nn.Parameter(torch.full((m, 1, STATE_DIM), float(config.init_min_logvar)))
        self.register_buffer("feature_mean", torch.zeros(self.n_features))
        self.register_buffer("feature_std", torch.ones(self.n_features))
        self.register_buffer("delta_mean", torch.zeros(STATE_DIM))
        self.register_buffer("delta_std", torch.ones(STATE_DIM))

    # ----------------------------------------------------------------------------- building blocks
    @property
    def members(self) -> int:
        return self.config.members

    @property
    def action_history(self) -> int:
        return self.config.action_history

    def features(
        self, q_rad: torch.Tensor, qdot_radps: torch.Tensor, action_radps: torch.Tensor,
        qdot_history_radps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Raw (un-normalized) input features [B, F] from the physical inputs."""
        qf = torch.cat([torch.sin(q_rad), torch.cos(q_rad)], -1) if self.config.q_features == "sincos" else q_rad
        parts = [qf, qdot_radps, action_radps.reshape(action_radps.shape[0], -1)]
        if self.config.qdot_history:
            parts.append(qdot_history_radps.reshape(qdot_history_radps.shape[0], -1))
        return torch.cat(parts, -1)

    def members_normalized(self, x_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-member (delta mean, bounded log-variance) in normalized target space.

        Args:
            x_norm: normalized features, [B, F] (shared by all members) or [M, B, F].
        Returns:
            mean [M, B, 12], logvar [M, B, 12].
        """
        h = x_norm.unsqueeze(0).expand(self.members, -1, -1) if x_norm.dim() == 2 else x_norm
        for layer in self.hidden:
            h = F.silu(layer(h))
        out = self.head(h)
        mean, logvar = out[..., :STATE_DIM], out[..., STATE_DIM:]
        logvar = self.max_logvar - F.softplus(self.max_logvar - logvar)
        logvar = self.min_logvar + F.softplus(logvar - self.min_logvar)
        return mean, logvar

    def members_physical(
        self, q_rad: torch.Tensor, qdot_radps: torch.Tensor, action_radps: torch.Tensor,
        qdot_history_radps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-member next-state mean [M, B, 12] and aleatoric variance [M, B, 12], physical units."""
        self._check_inputs(q_rad, qdot_radps, action_radps, qdot_history_radps)
        x = (self.features(q_rad, qdot_radps, action_radps, qdot_history_radps) - self.feature_mean) / self.feature_std
        mean_n, logvar_n = self.members_normalized(x)
        state = torch.cat([q_rad, qdot_radps], -1)
        next_mean = state + mean_n * self.delta_std + self.delta_mean
        return next_mean, torch.exp(logvar_n) * self.delta_std**2

    def _check_inputs(self, q, qdot, act, qdot_hist) -> None:
        if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            return
        b = q.shape[0]
        if q.shape != (b, N_JOINTS) or qdot.shape != (b, N_JOINTS):
            raise ValueError(f"q_rad {tuple(q.shape)} / qdot_radps {tuple(qdot.shape)}: expected [B, {N_JOINTS}] each")
        if act.shape != (b, self.action_history, N_JOINTS):
            raise ValueError(f"action_radps has shape {tuple(act.shape)}: "
                             f"expected [{b}, {self.action_history}, {N_JOINTS}]"
                             " (oldest first, last row = the current command)")
        k = self.config.qdot_history
        if k and (qdot_hist is None or qdot_hist.shape != (b, k, N_JOINTS)):
            got = None if qdot_hist is None else tuple(qdot_hist.shape)
            raise ValueError(f"qdot_history_radps has shape {got}: expected [{b}, {k}, {N_JOINTS}]")

    # ----------------------------------------------------------------------------- the contract
    def predict(
        self, q_rad: torch.Tensor, qdot_radps: torch.Tensor, action_radps: torch.Tensor,
        qdot_history_radps: torch.Tensor | None = None,
    ) -> Prediction:
        """Ensemble-mean next state with epistemic and aleatoric variances (see the module docstring).

        Args:
            q_rad, qdot_radps: measured state at t, [B, 6] each.
            action_radps: commands t-H+1 … t, [B, H, 6], oldest first.
            qdot_history_radps: previous measured qdot [B, K, 6] (only when config.qdot_history = K > 0).
        Returns:
            Prediction of the measured state at t+1.
        """
        means, ale = self.members_physical(q_rad, qdot_radps, action_radps, qdot_history_radps)
        mean = means.mean(0)
        epistemic = means.var(0, unbiased=False)
        scale = self._buffers.get("variance_scale")
        if scale is not None:  # recalibrated on real data (robot-wm adapt); absent in a model never recalibrated
            return Prediction(mean[:, :_Q.stop], mean[:, _QD.start:], epistemic * scale, ale.mean(0) * scale)
        # the exported graph traces this line: the open-ended qdot slice keeps its Slice op (end INT64_MAX)
        # as in the shipped models, so that a re-export reproduces their bytes
        return Prediction(mean[:, :_Q.stop], mean[:, _QD.start:], epistemic, ale.mean(0))

    def set_variance_scale(self, scale) -> None:
        """Scale both predicted variances per state component (``None``: remove the scale). Set by
        the recalibration of ``robot-wm adapt``; exported in the graph as ``variance_scale``."""
        if scale is None:
            self._buffers.pop("variance_scale", None)
            return
        value = torch.as_tensor(scale, dtype=torch.float32).reshape(STATE_DIM).clone()
        if not bool(torch.all(torch.isfinite(value) & (value > 0))):
            raise ValueError(f"variance scale {value.tolist()}: expected finite positive values")
        self._buffers.pop("variance_scale", None)
        self.register_buffer("variance_scale", value)

    def variance_scale_or_none(self) -> torch.Tensor | None:
        return self._buffers.get("variance_scale")

    def forward(self, q_rad: torch.Tensor, qdot_radps: torch.Tensor, action_radps: torch.Tensor, *rest: torch.Tensor):
        """The exported graph: (next_q_rad, next_qdot_radps, epistemic_var, aleatoric_var)."""
        return tuple(self.predict(q_rad, qdot_radps, action_radps, *rest))

    def step(
        self,
        state: torch.Tensor,
        action_history: torch.Tensor,
        member: int | str = "mean",
        sample: bool = False,
        generator: torch.Generator | None = None,
        qdot_history_radps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One differentiable imagination step (the contract in the module docstring).

        Args:
            state: [B, 12] = (q_rad, qdot_radps).
            action_history: [B, H, 6], oldest first; the last row is the action taken now.
            member: member index, "mean" (ensemble mean) or "random" (a member per row).
            sample: add reparameterized aleatoric noise.
            generator: torch generator for "random" and ``sample`` (default: torch's global one).
            qdot_history_radps: [B, K, 6] when config.qdot_history = K > 0.
        Returns:
            next_state [B, 12], epistemic_std [B, 12].
        """
        if state.dim() != 2 or state.shape[1] != STATE_DIM:
            raise ValueError(f"state has shape {tuple(state.shape)}: expected [B, {STATE_DIM}] = (q_rad, qdot_radps)")
        means, ale = self.members_physical(state[:, _Q], state[:, _QD], action_history, qdot_history_radps)
        epistemic_std = means.var(0, unbiased=False).sqrt()
        if member == "mean":
            mean, var = means.mean(0), ale.mean(0)
        elif member == "random":
            pick = torch.randint(0, self.members, (state.shape[0],), generator=generator, device=state.device)
            rows = torch.arange(state.shape[0], device=state.device)
            mean, var = means[pick, rows], ale[pick, rows]
        elif isinstance(member, int) and not isinstance(member, bool) and 0 <= member < self.members:
            mean, var = means[member], ale[member]
        else:
            raise ValueError(f"member={member!r}: expected 'mean', 'random' or an index in [0, {self.members})")
        if sample:
            noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
            mean = mean + noise * var.sqrt()
        return mean, epistemic_std

    def rollout(
        self,
        q_rad: torch.Tensor,
        qdot_radps: torch.Tensor,
        actions: torch.Tensor,
        action_history: torch.Tensor | None = None,
        member: int | str = "mean",
        sample: bool = False,
        generator: torch.Generator | None = None,
        qdot_history_radps: torch.Tensor | None = None,
    ) -> Rollout:
        """Open-loop prediction of T steps under ``actions`` [B, T, 6] (see the module docstring).

        Args:
            q_rad, qdot_radps: start state [B, 6] each.
            actions: commands applied at t … t+T-1, [B, T, 6].
            action_history: the H-1 commands before t, [B, H-1, 6], oldest first (default zeros).
            member, sample, generator: as for ``step`` (a "random" member is drawn anew each step).
            qdot_history_radps: the K measured qdot before t, [B, K, 6] (default zeros).
        Returns:
            The predicted trajectory and the epistemic std at each step.
        """
        b, horizon = actions.shape[0], actions.shape[1]
        h, k = self.action_history, self.config.qdot_history
        if action_history is None:
            action_history = actions.new_zeros(b, h - 1, N_JOINTS)
        if k and qdot_history_radps is None:
            qdot_history_radps = actions.new_zeros(b, k, N_JOINTS)
        window = torch.cat([action_history, actions], 1)  # [B, H-1+T, 6]
        state = torch.cat([q_rad, qdot_radps], -1)
        states, stds = [state], []
        for t in range(horizon):
            nxt, std = self.step(state, window[:, t:t + h], member, sample, generator, qdot_history_radps)
            if k:
                qdot_history_radps = torch.cat([qdot_history_radps[:, 1:], state[:, None, _QD]], 1)
            state = nxt
            states.append(state)
            stds.append(std)
        traj = torch.stack(states, 1)
        return Rollout(traj[..., _Q], traj[..., _QD], torch.stack(stds, 1))


# --------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(model: WorldModel, path: Path, dataset_sha256: str = "", metrics: dict | None = None) -> Path:
    """Save weights, normalization (buffers), config, joint order and dt to ``path`` (torch.save)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({
        "format": CHECKPOINT_FORMAT,
        "config": dataclasses.asdict(model.config),
        "joint_names": list(model.joint_names),
        "dt_s": model.dt_s,
        "state_dict": model.state_dict(),
        "dataset_sha256": dataset_sha256,
        "metrics": metrics or {},
    }, path)
    return path


def load_checkpoint(path: Path) -> tuple[WorldModel, dict[str, Any]]:
    """Load a checkpoint written by ``save_checkpoint``; returns (model in eval mode, the raw record)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"world-model checkpoint not found: {path}")
    record = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(record, dict) or record.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a world-model checkpoint (expected format {CHECKPOINT_FORMAT!r})")
    raw = dict(record["config"])
    raw["hidden_sizes"] = tuple(raw["hidden_sizes"])
    model = WorldModel(WorldModelConfig(**raw), record["joint_names"], record["dt_s"])
    if "variance_scale" in record["state_dict"]:
        model.set_variance_scale(record["state_dict"]["variance_scale"])
    model.load_state_dict(record["state_dict"])
    return model.eval(), record


# --------------------------------------------------------------------------------------- export
def export_world_model(
    model: WorldModel, path: Path, dataset_sha256: str, metrics: dict | None = None, version: str = "0.1.0",
    training_command: str | None = None,
) -> Path:
    """Export the ensemble as ONE ONNX graph plus its JSON sidecar; return the .onnx path.

    Graph: ``robot_wm.contracts.world_model_signature(H, K)``: inputs ``q_rad``, ``qdot_radps``
    [batch, N], ``action_radps`` [batch, H, N] (oldest first, last row = current command) and,
    only when config.qdot_history = K > 0, ``qdot_history_radps`` [batch, K, N]; outputs
    ``next_q_rad``, ``next_qdot_radps`` [batch, N] (ensemble mean), ``epistemic_var`` and
    ``aleatoric_var`` [batch, 2N] (STATE_LAYOUT), N = N_JOINTS.
    Normalization is inside the graph; the sidecar repeats it (and the layout, ensemble size,
    history length and metrics) for people and tools.
    """
    from robot_wm.learning.export import example_inputs, export_onnx, write_sidecar

    model = model.eval()
    h, k = model.action_history, model.config.qdot_history
    signature = world_model_signature(h, k)
    path = export_onnx(model, example_inputs(signature, batch=2), path, signature.input_names, signature.output_names)
    extra = {
        "ensemble_size": model.members,
        "action_history": h,
        "qdot_history": k,
        "q_features": model.config.q_features,
        "hidden_sizes": list(model.config.hidden_sizes),
        "state_layout": layout_json(STATE_LAYOUT),
        "prediction": "measured state at t+1 = state at t + ensemble-mean delta; variances per state component",
        "action_layout": "action_radps[:, -1] is the command sent in period t; rows oldest first; "
                         "zeros before the first command",
        "normalization": {
            "inside_graph": True,
            "feature_mean": model.feature_mean.tolist(), "feature_std": model.feature_std.tolist(),
            "delta_mean": model.delta_mean.tolist(), "delta_std": model.delta_std.tolist(),
        },
        "metrics": metrics or {},
        "config": dataclasses.asdict(model.config),
    }
    write_sidecar(path, model_kind=WORLD_MODEL_KIND, version=version, joint_names=model.joint_names, dt_s=model.dt_s,
                  training_data_sha256=dataset_sha256, training_command=training_command, extra=extra,
                  signature=signature)
    return path
