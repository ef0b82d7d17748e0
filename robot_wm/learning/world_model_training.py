"""Training the world model: one-step samples from recorded episodes, and the ensemble's fit.

``make_transitions`` flattens a :class:`~robot_wm.learning.data.Dataset`'s episodes into one-step
samples with their command (and optional qdot) histories; ``train_world_model`` fits every member
of a :class:`~robot_wm.learning.world_model.WorldModel` on its own bootstrap resample with the
Gaussian NLL, early-stopped per member on held-out episodes (what the model is and why: the
``world_model`` module's docstring).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from robot_wm.learning.data import Dataset
from robot_wm.learning.world_model import WorldModel, WorldModelConfig


# --------------------------------------------------------------------------------------- data
@dataclass
class Transitions:
    """Flat one-step training samples built from a Dataset (float32 torch tensors)."""

    q_rad: torch.Tensor  # [N, 6]
    qdot_radps: torch.Tensor  # [N, 6]
    action_radps: torch.Tensor  # [N, H, 6] oldest first
    qdot_history_radps: torch.Tensor  # [N, K, 6] (K may be 0)
    next_q_rad: torch.Tensor  # [N, 6]
    next_qdot_radps: torch.Tensor  # [N, 6]
    delta_state: torch.Tensor  # [N, 12] next minus current (q, qdot), differenced in float64

    def __len__(self) -> int:
        return self.q_rad.shape[0]

    def inputs(self) -> tuple[torch.Tensor, ...]:
        """Positional inputs of WorldModel.predict."""
        return self.q_rad, self.qdot_radps, self.action_radps, self.qdot_history_radps

    def delta(self) -> torch.Tensor:
        """Targets: change of the measured state, [N, 12]."""
        return self.delta_state


def history_windows(x: np.ndarray, length: int, include_current: bool) -> np.ndarray:
    """Zero-padded windows over an episode axis: x (E, T, 6) -> (E, T, length, 6), oldest first.

    ``include_current``: window t ends at x[:, t] (actions); else at x[:, t-1] (previous states).
    """
    e, t, n = x.shape
    if length == 0:
        return np.zeros((e, t, 0, n), dtype=x.dtype)
    pad = length - 1 if include_current else length
    padded = np.concatenate([np.zeros((e, pad, n), dtype=x.dtype), x], 1)
    windows = np.lib.stride_tricks.sliding_window_view(padded, length, axis=1)  # (E, T+?, n, length)
    return np.ascontiguousarray(np.moveaxis(windows, -1, 2)[:, :t])


def make_transitions(dataset: Dataset, action_history: int, qdot_history: int = 0) -> Transitions:
    """Flatten a dataset's episodes into one-step samples with their action (and qdot) histories."""
    t = dataset.n_steps
    acts = history_windows(dataset.action_radps, action_history, include_current=True)
    qd_hist = history_windows(dataset.qdot_radps[:, :t], qdot_history, include_current=False)

    def flat(a: np.ndarray) -> torch.Tensor:
        rows = a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])
        return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))

    return Transitions(
        flat(dataset.q_rad[:, :t]), flat(dataset.qdot_radps[:, :t]), flat(acts), flat(qd_hist),
        flat(dataset.q_rad[:, 1:]), flat(dataset.qdot_radps[:, 1:]),
        flat(np.concatenate([np.diff(dataset.q_rad, axis=1), np.diff(dataset.qdot_radps, axis=1)], -1)),
    )


# --------------------------------------------------------------------------------------- training
@dataclass
class TrainReport:
    """What a training run did: loss curves, chosen epochs, sizes, timing."""

    dataset_sha256: str
    n_train: int
    n_holdout: int
    epochs_run: int
    best_epoch: list[int]  # per member, 1-based (0: the initialization was never beaten)
    best_holdout_nll: list[float]  # per member, normalized target space
    train_loss: list[float] = field(default_factory=list)  # per epoch, mean over members
    holdout_nll: list[float] = field(default_factory=list)  # per epoch, mean over members
    holdout_mse: list[float] = field(default_factory=list)  # per epoch, ensemble mean, normalized
    initial_holdout_nll: float = float("nan")
    initial_holdout_mse: float = float("nan")
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return dataclasses.asdict(self)


def _gaussian_nll(mean: torch.Tensor, logvar: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-member Gaussian NLL (constant dropped), averaged over batch and outputs: [M]."""
    return (((mean - target) ** 2) * torch.exp(-logvar) + logvar).mean((-2, -1))


@torch.no_grad()
def _holdout_scores(model: WorldModel, x_norm: torch.Tensor, y_norm: torch.Tensor, chunk: int = 8192):
    """Per-member held-out NLL [M] and ensemble-mean MSE (normalized space)."""
    nll = torch.zeros(model.members)
    sq = torch.zeros(())
    for s in range(0, x_norm.shape[0], chunk):
        mean, logvar = model.members_normalized(x_norm[s:s + chunk])
        y = y_norm[s:s + chunk]
        nll += _gaussian_nll(mean, logvar, y) * y.shape[0]
        sq += ((mean.mean(0) - y) ** 2).mean(-1).sum()
    n = x_norm.shape[0]
    return nll / n, float(sq / n)


def _set_normalization(model: WorldModel, features: torch.Tensor, delta: torch.Tensor) -> None:
    def stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        std = x.std(0)
        return x.mean(0), torch.where(std > 1e-6, std, torch.ones_like(std))  # constant column: leave as is

    model.feature_mean.copy_(stats(features)[0]); model.feature_std.copy_(stats(features)[1])
    model.delta_mean.copy_(stats(delta)[0]); model.delta_std.copy_(stats(delta)[1])


def train_world_model(
    cfg: WorldModelConfig, dataset: Dataset, progress: bool = True
) -> tuple[WorldModel, TrainReport]:
    """Train the ensemble on ``dataset`` (episodes are split into train / held-out by ``cfg``).

    Args:
        cfg: architecture and training settings.
        dataset: transitions (e.g. from ``robot_wm.learning.data.collect``).
        progress: show a tqdm progress bar over epochs.
    Returns:
        The model (each member at its best held-out epoch, in eval mode) and the training report.
    """
    from tqdm import tqdm

    started = time.perf_counter()
    previous_threads = torch.get_num_threads()
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    try:
        torch.manual_seed(cfg.seed)
        gen = torch.Generator().manual_seed(cfg.seed)
        train_set, hold_set = dataset.split(cfg.holdout_fraction, cfg.seed)
        train = make_transitions(train_set, cfg.action_history, cfg.qdot_history)
        hold = make_transitions(hold_set, cfg.action_history, cfg.qdot_history)
        model = WorldModel(cfg, dataset.joint_names, dataset.dt_s)
        x_train = model.features(*train.inputs())
        y_train = train.delta()
        if cfg.max_train_transitions and cfg.max_train_transitions < len(train):
            keep = torch.randperm(len(train), generator=gen)[: cfg.max_train_transitions]
            x_train, y_train = x_train[keep], y_train[keep]
        _set_normalization(model, x_train, y_train)
        x_train = (x_train - model.feature_mean) / model.feature_std
        y_train = (y_train - model.delta_mean) / model.delta_std
        x_hold = (model.features(*hold.inputs()) - model.feature_mean) / model.feature_std
        y_hold = (hold.delta() - model.delta_mean) / model.delta_std

        n, m, bs = x_train.shape[0], cfg.members, cfg.batch_size
        if cfg.bootstrap:
            boot = torch.randint(0, n, (m, n), generator=gen)
        else:
            boot = torch.arange(n).expand(m, n).clone()
        decay = [p for name, p in model.named_parameters() if name.endswith("weight")]
        other = [p for name, p in model.named_parameters() if not name.endswith("weight")]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                 {"params": other, "weight_decay": 0.0}], lr=cfg.lr)

        nll0, mse0 = _holdout_scores(model, x_hold, y_hold)
        best = nll0.clone()
        best_state = copy.deepcopy(model.state_dict())
        best_epoch = [0] * m
        report = TrainReport(dataset.sha256, n, x_hold.shape[0], 0, best_epoch, best.tolist(),
                             initial_holdout_nll=float(nll0.mean()), initial_holdout_mse=mse0)
        stale = 0
        bar = tqdm(range(1, cfg.epochs + 1), desc="world model", unit="epoch", disable=not progress)
        for epoch in bar:
            model.train()
            order = torch.argsort(torch.rand(m, n, generator=gen), dim=1)
            idx_all = torch.gather(boot, 1, order)
            total, batches = 0.0, 0
            for s in range(0, n, bs):
                idx = idx_all[:, s:s + bs]  # [M, b]
                mean, logvar = model.members_normalized(x_train[idx])
                loss = _gaussian_nll(mean, logvar, y_train[idx]).sum()
                loss = loss + cfg.logvar_bound_weight * (model.max_logvar.sum() - model.min_logvar.sum())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += float(loss.detach()) / m
                batches += 1
            model.eval()
            nll, mse = _holdout_scores(model, x_hold, y_hold)
            improved = nll < best
            if improved.any():
                for key, value in model.named_parameters():  # every parameter is [M, ...]
                    best_state[key][improved] = value.detach()[improved]
                for i in torch.nonzero(improved).flatten().tolist():
                    best_epoch[i] = epoch
                best = torch.where(improved, nll, best)
                stale = 0
            else:
                stale += 1
            report.train_loss.append(total / batches)
            report.holdout_nll.append(float(nll.mean()))
            report.holdout_mse.append(mse)
            report.epochs_run = epoch
            bar.set_postfix(train=f"{total / batches:.3f}", holdout_nll=f"{float(nll.mean()):.3f}", mse=f"{mse:.4f}")
            if stale >= cfg.patience:
                break
        bar.close()
        model.load_state_dict(best_state)
        model.eval()
        _, final_mse = _holdout_scores(model, x_hold, y_hold)
        report.best_epoch = best_epoch
        report.best_holdout_nll = best.tolist()
        report.holdout_mse.append(final_mse)  # last entry: the returned (per-member best) model
        report.seconds = round(time.perf_counter() - started, 2)
        return model, report
    finally:
        torch.set_num_threads(previous_threads)

