"""The tracking task: the tool follows a time-parameterized path, from config/task.yaml (``track``).

A path is a smooth closed or back-and-forth curve in a randomly oriented plane of the reachable
workspace above the table: a **line** (back and forth), an **arc** (back and forth over 90-180°),
a **circle** or a **figure-eight** (Gerono's lemniscate), with a random centre, size and peak
tool speed. The reference holds the path's start point for ``lead_in_s`` (the arm gets there from
its start configuration), then moves along the path; its phase speeds up over ``ramp_s`` so that
the reference velocity is continuous. Errors are scored from ``lead_in_s + ramp_s`` on:
``rms_error_m`` and ``max_error_m`` of the TRUE tool position against the reference; an episode
succeeds when both are within ``success_rms_m`` and ``success_max_m``.

Observation (``TRACK_OBS_LAYOUT``): q, qdot, the measured tool position, and the reference
positions at ``preview_s`` ahead of now (a short preview of the path). The scripted baseline,
:class:`DlsTracker`, is damped least squares with feedforward of the reference velocity (from
the preview) plus a proportional correction.

Only numpy (and pinocchio through the kinematics for the baseline): no torch, no rclpy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robot_wm.contracts import N_JOINTS

SHAPES = ("line", "arc", "circle", "figure8")


class TrackConfigError(ValueError):
    """The ``track`` section of config/task.yaml is malformed; the message names the field."""


@dataclass(frozen=True)
class TrackSpec:
    """Parameters of the tracking task (units in the names)."""

    control_dt_s: float = 0.01
    episode_s: float = 6.0
    lead_in_s: float = 1.5
    ramp_s: float = 0.5
    workspace_min_m: tuple[float, float, float] = (-0.60, -0.30, 0.20)
    workspace_max_m: tuple[float, float, float] = (-0.30, 0.20, 0.50)
    size_m: tuple[float, float] = (0.04, 0.12)
    peak_speed_mps: tuple[float, float] = (0.05, 0.45)
    shapes: tuple[str, ...] = SHAPES
    preview_s: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2)
    start_noise_rad: float = 0.15
    action_limit_radps: tuple[float, ...] = (1.0, 1.0, 1.0, 1.5, 1.5, 1.5)
    feedback_gain_per_s: float = 5.0  # the scripted baseline's correction gain
    success_rms_m: float = 0.005
    success_max_m: float = 0.015
    error_cost: float = 10.0  # reward: -error_cost * |tool - reference| (m) ...
    action_cost: float = 0.002  # ... - action_cost * |a|^2 ((rad/s)^2)

    def __post_init__(self) -> None:
        for name in ("control_dt_s", "episode_s", "lead_in_s", "ramp_s", "success_rms_m", "success_max_m",
                     "feedback_gain_per_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise TrackConfigError(f"track.{name}={v!r}: expected a positive number")
        for name in ("start_noise_rad", "error_cost", "action_cost"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise TrackConfigError(f"track.{name}={v!r}: expected a number >= 0")
        if self.lead_in_s + self.ramp_s + 1.0 > self.episode_s:
            raise TrackConfigError(f"track: lead_in_s + ramp_s = {self.lead_in_s + self.ramp_s} leaves less than 1 s of "
                                   f"scored tracking in episode_s = {self.episode_s}")
        lo, hi = np.asarray(self.workspace_min_m, float), np.asarray(self.workspace_max_m, float)
        if lo.shape != (3,) or hi.shape != (3,) or np.any(lo >= hi) or lo[2] <= 0:
            raise TrackConfigError(f"track.workspace_min_m/max_m = {self.workspace_min_m}/{self.workspace_max_m}: "
                                   "expected 3 numbers each, min below max, above the table (z > 0)")
        for name, low in (("size_m", 0.0), ("peak_speed_mps", 0.0)):
            pair = getattr(self, name)
            if len(pair) != 2 or not (low < pair[0] <= pair[1]):
                raise TrackConfigError(f"track.{name}={pair!r}: expected [min, max] with 0 < min <= max")
        if 2 * self.size_m[1] >= float(np.min(hi - lo)):
            raise TrackConfigError(f"track.size_m max {self.size_m[1]} m: a path must fit in the workspace box")
        unknown = sorted(set(self.shapes) - set(SHAPES))
        if not self.shapes or unknown:
            raise TrackConfigError(f"track.shapes={list(self.shapes)}: expected a non-empty subset of {list(SHAPES)}")
        preview = np.asarray(self.preview_s, float)
        if preview.ndim != 1 or preview.size < 2 or preview[0] != 0.0 or np.any(np.diff(preview) <= 0):
            raise TrackConfigError(f"track.preview_s={self.preview_s!r}: expected increasing offsets starting at 0, "
                                   "at least two")
        limits = np.asarray(self.action_limit_radps, float)
        if limits.shape != (N_JOINTS,) or np.any(limits <= 0):
            raise TrackConfigError(f"track.action_limit_radps={self.action_limit_radps!r}: expected {N_JOINTS} "
                                   "positive numbers")

    @property
    def episode_steps(self) -> int:
        """Control periods per episode."""
        return int(round(self.episode_s / self.control_dt_s))

    @property
    def scored_from_s(self) -> float:
        """Errors count from this time on (after the lead-in and the ramp)."""
        return self.lead_in_s + self.ramp_s

    @property
    def obs_dim(self) -> int:
        """Observation size: q, qdot, tool, and 3 per preview point."""
        return 2 * N_JOINTS + 3 + 3 * len(self.preview_s)

    def sample_paths(self, rng: np.random.Generator, n: int) -> "PathSet":
        """``n`` random paths, each entirely inside the workspace box.

        Path i is drawn from the generator after paths 0..i-1, so the first k paths of n are the
        k paths of a k-path draw (a longer evaluation extends a shorter one).
        """
        rows = [self._sample_one(rng) for _ in range(n)]
        names = tuple(r[0] for r in rows)
        center, e1, e2, size, omega, arc, peak = (np.array([r[k] for r in rows]) for k in range(1, 8))
        return PathSet(names, center, e1, e2, size, omega, arc, peak, self.lead_in_s, self.ramp_s)

    def _sample_one(self, rng: np.random.Generator):
        shape = self.shapes[int(rng.integers(len(self.shapes)))]
        size = rng.uniform(*self.size_m)
        peak = rng.uniform(*self.peak_speed_mps)
        normal = rng.standard_normal(3)
        normal /= np.linalg.norm(normal)
        helper = np.array([1.0, 0, 0]) if abs(normal[0]) < 0.9 else np.array([0, 1.0, 0])
        a = np.cross(normal, helper)
        a /= np.linalg.norm(a)
        b = np.cross(normal, a)
        turn = rng.uniform(0, 2 * np.pi)  # a random orientation within the plane
        e1, e2 = np.cos(turn) * a + np.sin(turn) * b, -np.sin(turn) * a + np.cos(turn) * b
        arc = rng.uniform(np.pi / 2, np.pi)
        center = rng.uniform(np.asarray(self.workspace_min_m) + size, np.asarray(self.workspace_max_m) - size)
        omega = peak / (size * _speed_factor(shape, arc))
        return shape, center, e1, e2, size, omega, arc, peak

    def reward(self, tool_m, reference_m, action_radps, xp=np):
        """Reward of one period per row: ``-error_cost |tool - reference| - action_cost |a|^2``."""
        if xp is np:
            tool_m, reference_m, action_radps = (np.asarray(a, dtype=float) for a in (tool_m, reference_m, action_radps))
        err = xp.linalg.norm(tool_m - reference_m, axis=-1)
        return -self.error_cost * err - self.action_cost * (action_radps**2).sum(axis=-1)

    @classmethod
    def from_mapping(cls, data: dict, source: str = "track") -> "TrackSpec":
        """Build from a mapping of field -> value, rejecting unknown fields by name."""
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise TrackConfigError(f"{source}: unknown track fields {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _unit_shape(shape: str, tau: np.ndarray, arc: float) -> np.ndarray:
    """Plane coordinates (…, 2) of a unit-size shape at phase tau; tau = 0 is the start point."""
    if shape == "circle":
        return np.stack([np.cos(tau), np.sin(tau)], axis=-1)
    if shape == "arc":  # back and forth over the angle `arc`, starting at rest
        theta = 0.5 * arc * (1.0 - np.cos(tau))
        return np.stack([np.cos(theta), np.sin(theta)], axis=-1)
    if shape == "line":  # back and forth over [-1, 1], starting at rest
        return np.stack([-np.cos(tau), np.zeros_like(tau)], axis=-1)
    if shape == "figure8":
        return np.stack([np.sin(tau), 0.5 * np.sin(2 * tau)], axis=-1)
    raise ValueError(f"unknown shape {shape!r}: expected one of {SHAPES}")


def _speed_factor(shape: str, arc: float) -> float:
    """max over tau of |d(unit shape)/d tau| (peak speed = size * omega * this), in closed form:
    circle and line 1 (|sin|, |cos| peak at 1); arc arc/2 (theta' = arc/2 sin tau on the unit
    circle); figure-eight sqrt(2) (|(cos tau, cos 2 tau)| at tau = 0)."""
    return {"circle": 1.0, "line": 1.0, "arc": 0.5 * float(arc), "figure8": math.sqrt(2.0)}[shape]


@dataclass(frozen=True)
class PathSet:
    """``n`` reference paths: p_i(t) = center_i + size_i (x e1_i + y e2_i), (x, y) = shape_i(tau_i(t))."""

    shape: tuple[str, ...]
    center_m: np.ndarray  # (n, 3)
    e1: np.ndarray  # (n, 3) the plane's axes
    e2: np.ndarray
    size_m: np.ndarray  # (n,)
    omega_radps: np.ndarray  # (n,) phase rate after the ramp
    arc_rad: np.ndarray  # (n,) sweep of the arcs
    peak_speed_mps: np.ndarray  # (n,)
    lead_in_s: float
    ramp_s: float

    def __len__(self) -> int:
        return len(self.shape)

    def phase(self, i: int, t_s: np.ndarray) -> np.ndarray:
        """tau(t): 0 during the lead-in, then accelerating uniformly over the ramp, then omega t."""
        t = np.maximum(np.asarray(t_s, dtype=float) - self.lead_in_s, 0.0)
        w, r = self.omega_radps[i], self.ramp_s
        return np.where(t < r, 0.5 * w * t * t / r, w * (t - 0.5 * r))

    def position(self, i: int, t_s) -> np.ndarray:
        """Reference position(s) (…, 3) of path ``i`` at time(s) ``t_s`` (m, base frame)."""
        xy = _unit_shape(self.shape[i], self.phase(i, t_s), self.arc_rad[i])
        return self.center_m[i] + self.size_m[i] * (xy[..., :1] * self.e1[i] + xy[..., 1:] * self.e2[i])

    def preview(self, i: int, t_s: float, offsets_s) -> np.ndarray:
        """The reference at ``t_s + offsets`` flattened (3 per offset): the observation's preview."""
        return self.position(i, t_s + np.asarray(offsets_s, dtype=float)).reshape(-1)


def track_obs(q_rad, qdot_radps, tool_m, preview_m) -> np.ndarray:
    """The tracking observation: [q, qdot, tool (3), preview (3 per offset)] (one row)."""
    return np.concatenate([np.asarray(q_rad, float), np.asarray(qdot_radps, float), np.asarray(tool_m, float),
                           np.asarray(preview_m, float)])


class ReferenceWindow:
    """A window of the reference path sampled at equal steps from a start time, as it travels
    between processes (``trajectory_msgs/MultiDOFJointTrajectory``: header stamp = ``start_s``,
    point k at ``start_s + k * step_s``). The receiver reads the preview for *its* current time,
    so a message that took a period to arrive costs no tracking accuracy.

    Args:
        start_s: time of the first sample (s, the publisher's clock; ROS time in the nodes).
        step_s: spacing of the samples (s, > 0).
        points_m: (K, 3) reference positions, K >= 2.
    Raises:
        ValueError: a malformed window (non-finite numbers, fewer than 2 points, step <= 0).
    """

    def __init__(self, start_s: float, step_s: float, points_m) -> None:
        pts = np.asarray(points_m, dtype=float)
        if pts.ndim != 2 or pts.shape[1] != 3 or pts.shape[0] < 2:
            raise ValueError(f"reference window: expected (K >= 2, 3) points, got shape {pts.shape}")
        if not (math.isfinite(start_s) and math.isfinite(step_s) and step_s > 0):
            raise ValueError(f"reference window: start {start_s!r} s, step {step_s!r} s: expected finite, step > 0")
        if not np.all(np.isfinite(pts)):
            raise ValueError("reference window: non-finite reference position(s)")
        self.start_s, self.step_s, self.points_m = float(start_s), float(step_s), pts

    @property
    def end_s(self) -> float:
        """Time of the last sample."""
        return self.start_s + self.step_s * (len(self.points_m) - 1)

    def covers(self, now_s: float, offsets_s) -> bool:
        """True when ``now + every offset`` lies inside the window (no extrapolation needed)."""
        last = now_s + float(np.max(offsets_s))
        return self.start_s - 1e-9 <= now_s and last <= self.end_s + 1e-9

    def preview(self, now_s: float, offsets_s) -> np.ndarray:
        """The reference at ``now + offsets`` (linear between samples, held at the ends), flattened
        3 per offset: the observation's preview block."""
        t = (now_s + np.asarray(offsets_s, dtype=float) - self.start_s) / self.step_s
        grid = np.arange(len(self.points_m), dtype=float)
        return np.stack([np.interp(t, grid, self.points_m[:, k]) for k in range(3)], axis=-1).reshape(-1)


class TrackScore:
    """Tracking errors of one episode: RMS and max of |true tool - reference| after the lead-in."""

    def __init__(self, spec: TrackSpec) -> None:
        self.spec = spec
        self.errors: list[float] = []

    def update(self, t_s: float, tool_true_m: np.ndarray, reference_m: np.ndarray) -> float:
        """Record the error at time ``t_s`` (scored from ``spec.scored_from_s`` on); return it."""
        err = float(np.linalg.norm(np.asarray(tool_true_m) - np.asarray(reference_m)))
        if t_s >= self.spec.scored_from_s - 1e-9:
            self.errors.append(err)
        return err

    @property
    def rms_m(self) -> float:
        return float(np.sqrt(np.mean(np.square(self.errors)))) if self.errors else math.nan

    @property
    def max_m(self) -> float:
        return float(np.max(self.errors)) if self.errors else math.nan

    @property
    def success(self) -> bool:
        return bool(self.errors) and self.rms_m <= self.spec.success_rms_m and self.max_m <= self.spec.success_max_m


class DlsTracker:
    """The scripted baseline: v_tool = v_ref + k (p_ref - p), mapped by damped least squares.

    The reference velocity is estimated from the observation's preview (the first two points), so
    the baseline sees exactly what a policy sees. Redundancy is resolved by the reacher's null-space
    pull toward the home posture.

    Args:
        reacher: a ``DlsReacher`` (kinematics, home posture, velocity limits, damping).
        spec: the task (preview offsets, feedback gain).
    """

    def __init__(self, reacher, spec: TrackSpec) -> None:
        self.reacher, self.spec = reacher, spec
        self.gain = float(spec.feedback_gain_per_s)
        self.name = f"scripted DLS tracker (feedforward + {self.gain:g}/s)"

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Joint velocity command (rad/s) for one observation row."""
        obs = np.asarray(obs, dtype=float)
        n = N_JOINTS
        q = obs[:n]
        preview = obs[2 * n + 3:].reshape(-1, 3)
        return self.reacher.track(q, preview[0], self._velocity(preview), self.gain)

    def _velocity(self, preview: np.ndarray) -> np.ndarray:
        """The reference velocity now, from the preview: the slope at 0 of the parabola through the
        first three points (second-order accurate; a two-point difference lags at high curvature)."""
        t = np.asarray(self.spec.preview_s, dtype=float)
        if len(t) < 3:
            return (preview[1] - preview[0]) / (t[1] - t[0])
        t1, t2 = t[1], t[2]
        # Lagrange derivative at 0 of the interpolant through (0, p0), (t1, p1), (t2, p2)
        w0 = -(t1 + t2) / (t1 * t2)
        w1 = t2 / (t1 * (t2 - t1))
        w2 = -t1 / (t2 * (t2 - t1))
        return w0 * preview[0] + w1 * preview[1] + w2 * preview[2]


def load_track(path: Path | None = None) -> TrackSpec:
    """Read the ``track`` section of config/task.yaml (``/** -> ros__parameters -> track``)."""
    from robot_wm.core.task import TaskConfigError, load_task_section
    from robot_wm.paths import config_path

    path = path or config_path("task.yaml")
    try:
        section = load_task_section("track", path)
    except TaskConfigError as exc:
        raise TrackConfigError(str(exc)) from exc
    return TrackSpec.from_mapping(section, source=str(path))
