"""The reaching task: goal sampling, reward and success, from config/task.yaml.

A goal is a tool position in a reachable box above the table (base frame). An episode succeeds
when the tool stays within ``success_radius_m`` of the goal for ``success_hold_s`` within
``episode_s``. Observations are ``[q (6), qdot (6), tool position (3), goal (3)]``; actions are
joint velocity commands, one per control period, within ``action_limit_radps``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

OBS_DIM = 18  # q, qdot, tool position, goal
OBS_LAYOUT = {"q_rad": slice(0, 6), "qdot_radps": slice(6, 12), "tool_m": slice(12, 15), "goal_m": slice(15, 18)}


class TaskConfigError(ValueError):
    """config/task.yaml (or a mapping given instead) is malformed; the message names the field."""


@dataclass(frozen=True)
class TaskSpec:
    """Parameters of the reaching task (units in the names)."""

    control_dt_s: float = 0.01
    episode_s: float = 4.0
    success_radius_m: float = 0.02
    success_hold_s: float = 0.3
    goal_box_min_m: tuple[float, float, float] = (-0.60, -0.30, 0.15)
    goal_box_max_m: tuple[float, float, float] = (-0.30, 0.20, 0.50)
    start_noise_rad: float = 0.15
    action_limit_radps: tuple[float, ...] = (1.0, 1.0, 1.0, 1.5, 1.5, 1.5)

    def __post_init__(self) -> None:
        for name in ("control_dt_s", "episode_s", "success_radius_m", "success_hold_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
                raise TaskConfigError(f"task.{name}={value!r}: expected a positive number")
        if self.start_noise_rad < 0:
            raise TaskConfigError(f"task.start_noise_rad={self.start_noise_rad!r}: expected >= 0")
        lo, hi = np.asarray(self.goal_box_min_m, float), np.asarray(self.goal_box_max_m, float)
        if lo.shape != (3,) or hi.shape != (3,):
            raise TaskConfigError(f"task.goal_box_min_m/max_m: expected 3 numbers each, got {self.goal_box_min_m}, {self.goal_box_max_m}")
        if np.any(lo >= hi):
            raise TaskConfigError(f"task.goal_box_min_m {list(lo)} must be below goal_box_max_m {list(hi)} on every axis")
        if lo[2] <= 0:
            raise TaskConfigError(f"task.goal_box_min_m z={lo[2]}: goals must be above the table (z > 0)")
        limits = np.asarray(self.action_limit_radps, float)
        if limits.shape != (6,) or np.any(limits <= 0) or not np.all(np.isfinite(limits)):
            raise TaskConfigError(f"task.action_limit_radps={self.action_limit_radps!r}: expected 6 positive numbers")
        if self.success_hold_s >= self.episode_s:
            raise TaskConfigError(f"task.success_hold_s={self.success_hold_s} must be shorter than episode_s={self.episode_s}")

    @property
    def episode_steps(self) -> int:
        """Control periods per episode."""
        return int(round(self.episode_s / self.control_dt_s))

    @property
    def hold_steps(self) -> int:
        """Consecutive control periods within the radius that make a success."""
        return int(np.ceil(self.success_hold_s / self.control_dt_s - 1e-9))

    def sample_goals(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Return ``n`` goals (n x 3, m) uniform in the goal box."""
        return rng.uniform(self.goal_box_min_m, self.goal_box_max_m, size=(n, 3))

    def reward(self, tool_m: np.ndarray, goal_m: np.ndarray) -> np.ndarray:
        """Dense reward: minus the distance (m), plus a bonus of 1 per step inside the success radius."""
        dist = np.linalg.norm(np.asarray(tool_m) - np.asarray(goal_m), axis=-1)
        return -dist + (dist < self.success_radius_m).astype(float)

    @classmethod
    def from_mapping(cls, data: dict, source: str = "task") -> "TaskSpec":
        """Build from a mapping of field -> value, rejecting unknown fields by name."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise TaskConfigError(f"{source}: unknown task fields {unknown}; known: {sorted(known)}")
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**kwargs)


def load_task(path: Path | None = None) -> TaskSpec:
    """Read the task from config/task.yaml (ROS parameter format, key ``/**.ros__parameters.task``)."""
    import yaml

    from robot_wm.paths import config_path

    path = path or config_path("task.yaml")
    try:
        data = yaml.safe_load(Path(path).read_text())
        task = data["/**"]["ros__parameters"]["task"]
    except (OSError, yaml.YAMLError) as exc:
        raise TaskConfigError(f"{path}: cannot read the task: {exc}") from exc
    except (KeyError, TypeError) as exc:
        raise TaskConfigError(f"{path}: expected /** -> ros__parameters -> task mapping") from exc
    return TaskSpec.from_mapping(task, source=str(path))


class SuccessTracker:
    """Track success over a batch of episodes, one control period at a time."""

    def __init__(self, task: TaskSpec, n: int) -> None:
        self.task = task
        self.inside_steps = np.zeros(n, dtype=int)
        self.success = np.zeros(n, dtype=bool)
        self.success_step = np.full(n, -1)
        self.first_inside_step = np.full(n, -1)

    def update(self, step: int, tool_m: np.ndarray, goal_m: np.ndarray) -> np.ndarray:
        """Record one period; return the per-episode distance (m)."""
        dist = np.linalg.norm(tool_m - goal_m, axis=-1)
        inside = dist < self.task.success_radius_m
        self.inside_steps = np.where(inside, self.inside_steps + 1, 0)
        entered = inside & (self.inside_steps == 1)
        self.first_inside_step = np.where(entered & ~self.success, step, self.first_inside_step)
        newly = (self.inside_steps >= self.task.hold_steps) & ~self.success
        self.success_step = np.where(newly, step, self.success_step)
        self.success |= newly
        return dist
