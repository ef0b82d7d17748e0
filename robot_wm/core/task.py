"""The reaching task: goal sampling, reward and success, from config/task.yaml.

A goal is a tool position in a reachable box above the table (base frame). An episode succeeds
when the tool stays within ``success_radius_m`` of the goal for ``success_hold_s`` within
``episode_s``. Observations are ``robot_wm.contracts.OBS_LAYOUT`` (q, qdot, tool position, goal);
actions are joint velocity commands, one per control period, within ``action_limit_radps``.

The reward (``TaskSpec.reward``) is the one the policy is trained on: it is written once, over an
array module, so the imagination trainer evaluates it on torch tensors (differentiably) and
numpy callers on arrays, with the same operations.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robot_wm.contracts import N_JOINTS


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
    goal_bonus: float = 0.5  # reward per period at the goal, fading as exp(-(d / goal_bonus_radius_m)^2)
    goal_bonus_radius_m: float = 0.03
    action_cost: float = 0.002  # reward penalty per (rad/s)^2 of the command, summed over joints

    def __post_init__(self) -> None:
        for name in ("control_dt_s", "episode_s", "success_radius_m", "success_hold_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
                raise TaskConfigError(f"task.{name}={value!r}: expected a positive number")
        for name in ("start_noise_rad", "goal_bonus", "action_cost"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 0):
                raise TaskConfigError(f"task.{name}={value!r}: expected a number >= 0")
        if not (isinstance(self.goal_bonus_radius_m, (int, float)) and np.isfinite(self.goal_bonus_radius_m)
                and self.goal_bonus_radius_m > 0):
            raise TaskConfigError(f"task.goal_bonus_radius_m={self.goal_bonus_radius_m!r}: expected a positive number")
        lo, hi = np.asarray(self.goal_box_min_m, float), np.asarray(self.goal_box_max_m, float)
        if lo.shape != (3,) or hi.shape != (3,):
            raise TaskConfigError(f"task.goal_box_min_m/max_m: expected 3 numbers each, got {self.goal_box_min_m}, {self.goal_box_max_m}")
        if np.any(lo >= hi):
            raise TaskConfigError(f"task.goal_box_min_m {list(lo)} must be below goal_box_max_m {list(hi)} on every axis")
        if lo[2] <= 0:
            raise TaskConfigError(f"task.goal_box_min_m z={lo[2]}: goals must be above the table (z > 0)")
        limits = np.asarray(self.action_limit_radps, float)
        if limits.shape != (N_JOINTS,) or np.any(limits <= 0) or not np.all(np.isfinite(limits)):
            raise TaskConfigError(f"task.action_limit_radps={self.action_limit_radps!r}: "
                                  f"expected {N_JOINTS} positive numbers (one per joint)")
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

    def distance_m(self, tool_m, goal_m, xp=np):
        """Tool-to-goal distance (m) per row: what success, reward and evaluation measure.

        Args:
            tool_m, goal_m: (..., 3) positions in the base frame; ``xp`` arrays (a goal broadcasts).
            xp: the array module (numpy, or torch for differentiable tensors).
        """
        return xp.linalg.norm(tool_m - goal_m, axis=-1)

    def reward(self, tool_m, goal_m, action_radps, xp=np):
        """The reward of one control period, per row: the only definition (the trainer uses it too).

        ``-d + goal_bonus * exp(-(d / goal_bonus_radius_m)^2) - action_cost * |a|^2``, with d the
        tool-to-goal distance after the period and a the command sent during it: closer is better
        everywhere, a smooth bonus near the goal (differentiable, unlike a step at the success
        radius), and a small cost on the command.

        Args:
            tool_m, goal_m: (..., 3) tool position after the period and goal (m, base frame).
            action_radps: (..., N_JOINTS) the command of the period (rad/s).
            xp: the array module of the arguments (numpy by default; torch in the trainer).
        Returns:
            (...) rewards, an ``xp`` array.
        """
        if xp is np:
            tool_m, goal_m, action_radps = (np.asarray(a, dtype=float) for a in (tool_m, goal_m, action_radps))
        dist = self.distance_m(tool_m, goal_m, xp)
        return (-dist + self.goal_bonus * xp.exp(-(dist / self.goal_bonus_radius_m) ** 2)
                - self.action_cost * (action_radps**2).sum(axis=-1))

    @classmethod
    def from_mapping(cls, data: dict, source: str = "task") -> "TaskSpec":
        """Build from a mapping of field -> value, rejecting unknown fields by name."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise TaskConfigError(f"{source}: unknown task fields {unknown}; known: {sorted(known)}")
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**kwargs)


def load_task_section(key: str, path: Path | None = None) -> dict:
    """One task's mapping from config/task.yaml (``/** -> ros__parameters -> <key>``).

    Raises:
        TaskConfigError: unreadable file or a missing section (the message names the file and key).
    """
    import yaml

    from robot_wm.paths import config_path

    path = path or config_path("task.yaml")
    try:
        data = yaml.safe_load(Path(path).read_text())
        return data["/**"]["ros__parameters"][key]
    except (OSError, yaml.YAMLError) as exc:
        raise TaskConfigError(f"{path}: cannot read the task: {exc}") from exc
    except (KeyError, TypeError) as exc:
        raise TaskConfigError(f"{path}: expected /** -> ros__parameters -> {key} mapping") from exc


def load_task(path: Path | None = None) -> TaskSpec:
    """Read the task from config/task.yaml (ROS parameter format, key ``/**.ros__parameters.task``)."""
    from robot_wm.paths import config_path

    path = path or config_path("task.yaml")
    return TaskSpec.from_mapping(load_task_section("task", path), source=str(path))


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
        dist = self.task.distance_m(tool_m, goal_m)
        inside = dist < self.task.success_radius_m
        self.inside_steps = np.where(inside, self.inside_steps + 1, 0)
        entered = inside & (self.inside_steps == 1)
        self.first_inside_step = np.where(entered & ~self.success, step, self.first_inside_step)
        newly = (self.inside_steps >= self.task.hold_steps) & ~self.success
        self.success_step = np.where(newly, step, self.success_step)
        self.success |= newly
        return dist
