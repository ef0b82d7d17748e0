"""Transition datasets: the one format simulated data is collected in and real data is converted into.

A dataset is a set of equal-length episodes sampled at the control period:

    q_rad        (E, T+1, N)  measured joint positions (what the robot's sensors report)
    qdot_radps   (E, T+1, N)  measured joint velocities
    action_radps (E, T, N)    joint velocity command sent during period t
    tool_m       (E, T+1, 3)  tool position in the base frame (from the URDF kinematics of q)
    + joint_names (N of them, in their order), dt_s, a profile name per episode, and free-form provenance

stored as one compressed .npz. ``Dataset.sha256`` hashes the arrays, so a model's sidecar can name
exactly the data it was trained on. A rosbag2 recording of /joint_states and the command topic is
resampled to this layout by the adaptation issue's converter (same loader, same checks).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ARRAYS = ("q_rad", "qdot_radps", "action_radps", "tool_m")


class DatasetError(ValueError):
    """A dataset file or array is malformed; the message names the array and the problem."""


@dataclass
class Dataset:
    """Episodes of measured joint states and the commands sent (see the module docstring)."""

    q_rad: np.ndarray
    qdot_radps: np.ndarray
    action_radps: np.ndarray
    tool_m: np.ndarray
    joint_names: tuple[str, ...]
    dt_s: float
    profiles: tuple[str, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        e, t1, n = self.q_rad.shape if self.q_rad.ndim == 3 else (None, None, None)
        if e is None:
            raise DatasetError(f"q_rad has shape {self.q_rad.shape}: expected (episodes, steps+1, joints)")
        expected = {"qdot_radps": (e, t1, n), "action_radps": (e, t1 - 1, n), "tool_m": (e, t1, 3)}
        for name, shape in expected.items():
            if getattr(self, name).shape != shape:
                raise DatasetError(f"{name} has shape {getattr(self, name).shape}: expected {shape}")
        for name in ARRAYS:
            if not np.all(np.isfinite(getattr(self, name))):
                raise DatasetError(f"{name} contains NaN or Inf")
        if len(self.joint_names) != n:
            raise DatasetError(f"joint_names has {len(self.joint_names)} names for {n} joints")
        if len(self.profiles) != e:
            raise DatasetError(f"profiles names {len(self.profiles)} episodes, the arrays hold {e}")
        if not (self.dt_s > 0):
            raise DatasetError(f"dt_s={self.dt_s}: expected a positive control period")

    @property
    def n_episodes(self) -> int:
        return self.q_rad.shape[0]

    @property
    def n_steps(self) -> int:
        return self.action_radps.shape[1]

    @property
    def n_transitions(self) -> int:
        return self.n_episodes * self.n_steps

    @property
    def sha256(self) -> str:
        """Hash of the arrays and the settings that give them meaning."""
        digest = hashlib.sha256()
        for name in ARRAYS:
            digest.update(np.ascontiguousarray(getattr(self, name), dtype=np.float64).tobytes())
        digest.update(json.dumps([list(self.joint_names), self.dt_s]).encode())
        return digest.hexdigest()

    def split(self, holdout_fraction: float, seed: int = 0) -> tuple["Dataset", "Dataset"]:
        """Split by episode into (train, held-out)."""
        rng = np.random.default_rng(seed)
        order = rng.permutation(self.n_episodes)
        n_hold = max(1, int(round(holdout_fraction * self.n_episodes)))
        return self.subset(order[n_hold:]), self.subset(order[:n_hold])

    def subset(self, episodes: np.ndarray) -> "Dataset":
        """Return the dataset restricted to the given episode indices."""
        idx = np.asarray(episodes)
        return Dataset(
            self.q_rad[idx], self.qdot_radps[idx], self.action_radps[idx], self.tool_m[idx],
            self.joint_names, self.dt_s, tuple(self.profiles[i] for i in idx), dict(self.meta),
        )

    @staticmethod
    def concatenate(parts: list["Dataset"]) -> "Dataset":
        """Join datasets with the same joints, period and episode length."""
        first = parts[0]
        for p in parts[1:]:
            if p.joint_names != first.joint_names or p.dt_s != first.dt_s or p.n_steps != first.n_steps:
                raise DatasetError("cannot concatenate datasets with different joints, dt_s or episode length")
        return Dataset(
            *(np.concatenate([getattr(p, a) for p in parts]) for a in ARRAYS),
            first.joint_names, first.dt_s, tuple(x for p in parts for x in p.profiles), dict(first.meta),
        )

    def save(self, path: Path) -> Path:
        """Write the dataset to ``path`` (.npz)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = {"format": "robot_wm-dataset/1", "joint_names": list(self.joint_names), "dt_s": self.dt_s,
                  "profiles": list(self.profiles), "meta": self.meta, "sha256": self.sha256}
        np.savez_compressed(path, header=np.array(json.dumps(header)), **{a: getattr(self, a) for a in ARRAYS})
        return path

    @classmethod
    def load(cls, path: Path) -> "Dataset":
        """Read a dataset written by ``save`` (or a converter), checking shapes, values and the hash."""
        path = Path(path)
        if not path.is_file():
            raise DatasetError(f"dataset not found: {path}")
        try:
            with np.load(path, allow_pickle=False) as npz:
                header = json.loads(str(npz["header"]))
                arrays = {a: npz[a] for a in ARRAYS}
        except (OSError, ValueError, KeyError) as exc:
            raise DatasetError(f"{path}: not a robot_wm dataset ({exc})") from exc
        if header.get("format") != "robot_wm-dataset/1":
            raise DatasetError(f"{path}: format {header.get('format')!r}, expected 'robot_wm-dataset/1'")
        data = cls(**arrays, joint_names=tuple(header["joint_names"]), dt_s=float(header["dt_s"]),
                   profiles=tuple(header["profiles"]), meta=header.get("meta", {}))
        if header.get("sha256") and header["sha256"] != data.sha256:
            raise DatasetError(f"{path}: content hash differs from its header (file modified?)")
        return data


@dataclass(frozen=True)
class CollectConfig:
    """Data collection settings (config/training.yaml, section ``collect``)."""

    transitions: int = 100_000
    n_envs: int = 32
    episode_steps: int = 200  # 2 s episodes: more start states per transition than the task's 4 s
    reacher_fraction: float = 0.5  # episodes driven by the noisy scripted reacher (rest: smooth random)
    ou_theta_per_s: float = 2.0  # smooth random commands: Ornstein-Uhlenbeck mean reversion
    ou_sigma_radps: float = 0.8  # ... and its stationary spread scale
    reacher_noise_radps: float = 0.15
    start_spread_rad: float = 0.6  # start configurations: home +- this (rejecting poses below the table)
    randomize: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("transitions", "n_envs", "episode_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"collect.{name}={getattr(self, name)}: expected a positive integer")
        if not 0.0 <= self.reacher_fraction <= 1.0:
            raise ValueError(f"collect.reacher_fraction={self.reacher_fraction}: expected a value in [0, 1]")
        for name in ("ou_theta_per_s", "ou_sigma_radps", "reacher_noise_radps", "start_spread_rad"):
            if getattr(self, name) < 0:
                raise ValueError(f"collect.{name}={getattr(self, name)}: expected >= 0")


def load_randomization(path: Path) -> dict[str, tuple[Any, Any]]:
    """Read the ``randomization`` section ({profile field: [low, high]}); checked by sample_profile."""
    import yaml

    raw = yaml.safe_load(Path(path).read_text()) or {}
    ranges = raw.get("randomization") or {}
    if not isinstance(ranges, dict):
        raise DatasetError(f"{path} [randomization]: expected a mapping of profile field -> [low, high]")
    return {k: tuple(v) for k, v in ranges.items()}


def collect(cfg: CollectConfig, task, randomization: dict | None = None, progress: bool = True) -> Dataset:
    """Collect simulated transitions with domain randomization and mixed exploration.

    Args:
        cfg: collection settings.
        task: the TaskSpec (control period, action limits, goal box).
        randomization: ``{profile field: (low, high)}`` (default: the sim's default ranges);
            each round of ``n_envs`` episodes draws new profiles.
        progress: show a progress bar.
    Returns:
        The dataset (measured states, as a real robot would record them).
    """
    from tqdm import tqdm

    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.core.reacher import DlsReacher
    from robot_wm.sim import VecArmSim, default_randomization_ranges, sample_profile

    rng = np.random.default_rng(cfg.seed)
    urdf = description.expand()
    names = description.joint_limits(urdf).names
    kin = Kinematics(urdf, names)
    q_home = description.initial_positions(names)
    v_lim = np.asarray(task.action_limit_radps)
    reacher = DlsReacher(kin, q_home, v_lim)
    ranges = default_randomization_ranges() if randomization is None else randomization
    n_rounds = int(np.ceil(cfg.transitions / (cfg.n_envs * cfg.episode_steps)))
    parts = []
    started = time.perf_counter()
    bar = tqdm(total=n_rounds * cfg.n_envs * cfg.episode_steps, unit="tr", desc="collect", disable=not progress)
    for _ in range(n_rounds):
        if cfg.randomize:
            profiles = [sample_profile(rng, ranges, name=f"dr{int(rng.integers(1 << 30))}") for _ in range(cfg.n_envs)]
        else:
            profiles = ["nominal"] * cfg.n_envs
        env = VecArmSim(cfg.n_envs, profiles, seed=int(rng.integers(1 << 30)), control_dt_s=task.control_dt_s)
        q0 = _sample_starts(rng, kin, q_home, cfg.start_spread_rad, cfg.n_envs)
        obs = env.reset(q0_rad=q0)
        goals = rng.uniform(np.asarray(task.goal_box_min_m) - 0.1, np.asarray(task.goal_box_max_m) + 0.1, (cfg.n_envs, 3))
        goals[:, 2] = np.maximum(goals[:, 2], 0.08)
        use_reacher = rng.random(cfg.n_envs) < cfg.reacher_fraction
        ou = np.zeros((cfg.n_envs, len(names)))
        scale = rng.uniform(0.2, 1.0, (cfg.n_envs, 1)) * v_lim
        q, qd, act, tool = [obs.q_rad], [obs.qdot_radps], [], [obs.tool_position_m]
        dt = task.control_dt_s
        for step in range(cfg.episode_steps):
            ou += cfg.ou_theta_per_s * (-ou) * dt + cfg.ou_sigma_radps * np.sqrt(2 * cfg.ou_theta_per_s * dt) * rng.standard_normal(ou.shape)
            random_cmd = np.clip(ou, -1, 1) * scale
            if step % 50 == 0:  # reacher episodes get a fresh goal now and then: more varied motion
                fresh = rng.random(cfg.n_envs) < 0.3
                goals[fresh] = task.sample_goals(rng, int(fresh.sum()))
            expert = reacher.batch(obs.q_rad, goals) + cfg.reacher_noise_radps * rng.standard_normal((cfg.n_envs, len(names)))
            action = np.clip(np.where(use_reacher[:, None], expert, random_cmd), -v_lim, v_lim)
            obs = env.step(action)
            q.append(obs.q_rad); qd.append(obs.qdot_radps); act.append(action); tool.append(obs.tool_position_m)
            bar.update(cfg.n_envs)
        parts.append(Dataset(np.stack(q, 1), np.stack(qd, 1), np.stack(act, 1), np.stack(tool, 1),
                             tuple(names), dt, tuple(p if isinstance(p, str) else p.name for p in profiles)))
    bar.close()
    data = Dataset.concatenate(parts)
    data.meta = {"source": "simulation", "collect": cfg.__dict__ | {}, "randomization": {k: [np.asarray(v).tolist() for v in r] for k, r in ranges.items()} if cfg.randomize else None,
                 "seconds": round(time.perf_counter() - started, 2)}
    return data


def _sample_starts(rng: np.random.Generator, kin, q_home: np.ndarray, spread: float, n: int) -> np.ndarray:
    """Start configurations around home whose tool and wrist stay above the table."""
    starts = []
    while len(starts) < n:
        q = q_home + rng.uniform(-spread, spread, len(q_home))
        if kin.tool_position_m(q)[2] > 0.12 and kin.frame_pose(q, "wrist_1_link").translation[2] > 0.15:
            starts.append(q)
    return np.array(starts)
