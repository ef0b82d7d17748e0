"""One interface over the tasks (``reach``, ``track``): every verb takes the task by name.

Each task defines, in one place, what an episode is (start configurations and the goal or path),
what the policy observes, how an episode is scored, and its scripted baseline::

    task = get_task("track")
    eps = task.episodes(n, seed, q_home)
    obs = task.observation(eps, i, t_s, q, qdot, tool_measured)
    score = task.new_score(eps, i); score.update(t_s, tool_true); score.metrics()
    baseline = task.baseline()

The reaching task's definition is ``robot_wm.core.task`` (``TaskSpec``), the tracking task's
``robot_wm.core.track`` (``TrackSpec``); this module only puts them behind the same calls.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from robot_wm.core.task import SuccessTracker, TaskSpec, load_task
from robot_wm.core.track import DlsTracker, PathSet, TrackScore, TrackSpec, load_track, track_obs

TASK_NAMES = ("reach", "track")


@dataclass(frozen=True)
class TaskEpisodes:
    """The episodes of one evaluation: start configurations, the task's targets, the noise seed."""

    q0_rad: np.ndarray  # (n, N_JOINTS)
    targets: Any  # reach: goals (n, 3); track: a PathSet
    sim_seed: int

    def __len__(self) -> int:
        return len(self.q0_rad)


def _episodes(n, seed, q_home_rad, start_noise_rad: float, sample_targets) -> TaskEpisodes:
    """Start configurations, targets (``sample_targets(rng, n)``) and a simulator seed for ``n``
    episodes, from independent streams of ``seed``: episode i depends only on (seed, i)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"episodes={n!r}: expected an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r}: expected an integer >= 0")
    target_rng, start_rng, sim_rng = (np.random.default_rng(np.random.SeedSequence([int(seed), k])) for k in range(3))
    targets = sample_targets(target_rng, int(n))
    q0 = np.asarray(q_home_rad, float) + start_rng.uniform(-start_noise_rad, start_noise_rad,
                                                            size=(int(n), len(q_home_rad)))
    return TaskEpisodes(q0, targets, int(sim_rng.integers(0, 2**31 - 2**20)))


class ReachScore:
    """Reaching: success (within the radius for the hold), final error, time to goal."""

    def __init__(self, spec: TaskSpec, goal: np.ndarray) -> None:
        self.spec, self.goal = spec, np.asarray(goal, dtype=float)
        self.tracker = SuccessTracker(spec, 1)
        self.step = 0
        self.final_m = math.nan

    def update(self, t_s: float, tool_true_m: np.ndarray) -> None:
        """Record the true tool position at the end of a period."""
        self.final_m = float(self.tracker.update(self.step, np.asarray(tool_true_m)[None, :], self.goal[None, :])[0])
        self.step += 1

    @property
    def success(self) -> bool:
        return bool(self.tracker.success[0])

    def metrics(self) -> dict[str, float]:
        ttg = (self.tracker.first_inside_step[0] + 1) * self.spec.control_dt_s if self.success else math.nan
        return {"final_error_m": self.final_m, "time_to_goal_s": ttg}


class TrackEpisodeScore:
    """Tracking: RMS and max error against the reference after the lead-in; success on both."""

    def __init__(self, spec: TrackSpec, paths: PathSet, i: int) -> None:
        self.paths, self.i = paths, i
        self.score = TrackScore(spec)

    def update(self, t_s: float, tool_true_m: np.ndarray) -> None:
        self.score.update(t_s, tool_true_m, self.paths.position(self.i, t_s))

    @property
    def success(self) -> bool:
        return self.score.success

    def metrics(self) -> dict[str, float]:
        return {"tracking_rms_m": self.score.rms_m, "tracking_max_m": self.score.max_m}


class ReachTask:
    """The reaching task (``config/task.yaml`` ``task``) behind the common interface."""

    name = "reach"

    def __init__(self, spec: TaskSpec | None = None) -> None:
        self.spec = spec if spec is not None else load_task()

    def __getattr__(self, item):  # control_dt_s, episode_steps, action_limit_radps, ...
        return getattr(self.spec, item)

    def episodes(self, n: int, seed: int, q_home_rad: np.ndarray) -> TaskEpisodes:
        """``n`` episodes; episode i depends only on (seed, i) (as ``robot-wm eval``)."""
        return _episodes(n, seed, q_home_rad, self.spec.start_noise_rad, self.spec.sample_goals)

    def observation(self, eps: TaskEpisodes, i: int, t_s: float, q, qdot, tool_m) -> np.ndarray:
        from robot_wm.core.policy_runner import make_obs

        return make_obs(q, qdot, tool_m, eps.targets[i])

    def new_score(self, eps: TaskEpisodes, i: int) -> ReachScore:
        return ReachScore(self.spec, eps.targets[i])

    def baseline(self):
        from robot_wm.core.policy_runner import ScriptedPolicy

        return ScriptedPolicy.from_description(self.spec)


class TrackTask:
    """The tracking task (``config/task.yaml`` ``track``) behind the common interface."""

    name = "track"

    def __init__(self, spec: TrackSpec | None = None) -> None:
        self.spec = spec if spec is not None else load_track()

    def __getattr__(self, item):
        return getattr(self.spec, item)

    def episodes(self, n: int, seed: int, q_home_rad: np.ndarray) -> TaskEpisodes:
        """``n`` episodes; episode i depends only on (seed, i)."""
        return _episodes(n, seed, q_home_rad, self.spec.start_noise_rad, self.spec.sample_paths)

    def observation(self, eps: TaskEpisodes, i: int, t_s: float, q, qdot, tool_m) -> np.ndarray:
        return track_obs(q, qdot, tool_m, eps.targets.preview(i, t_s, self.spec.preview_s))

    def new_score(self, eps: TaskEpisodes, i: int) -> TrackEpisodeScore:
        return TrackEpisodeScore(self.spec, eps.targets, i)

    def baseline(self) -> DlsTracker:
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.reacher import DlsReacher

        urdf = description.expand()
        names = description.joint_limits(urdf).names
        limits = np.asarray(self.spec.action_limit_radps, dtype=float)
        reacher = DlsReacher(Kinematics(urdf, names), description.initial_positions(names), limits,
                             max_tool_speed_mps=0.5)
        return DlsTracker(reacher, self.spec)


def get_task(name: str):
    """The task called ``name`` ("reach" or "track"), from config/task.yaml."""
    if name == "reach":
        return ReachTask()
    if name == "track":
        return TrackTask()
    raise ValueError(f"unknown task {name!r}: expected one of {list(TASK_NAMES)}")
