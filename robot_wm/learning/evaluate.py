"""Closed-loop evaluation of a policy on the simulator (library mode, no ROS): ``robot-wm eval``.

Every policy compared under one seed meets exactly the same episodes: the same start
configurations (home + uniform(±``task.start_noise_rad``)), the same goals (``task.sample_goals``)
and the same simulator sensor-noise streams. Episode ``i`` depends only on ``(seed, i)``, so the
first 32 episodes of a 200-episode run are the 32 episodes of a 32-episode run.

What the policy sees is what a deployed policy sees: measured (noisy, offset) joint positions and
velocities from the simulated drives, the tool position computed by the URDF kinematics from the
measured q, and the goal. Success and the error metrics use the simulator's *true* tool position.

Metrics (``EvalReport``): success rate (``SuccessTracker``: within ``success_radius_m`` for
``success_hold_s`` within ``episode_s``), final tool error (median, p90), time to goal (when the tool
entered the radius for the hold that succeeded; median over successes), peak tool speed (finite
differences of the true tool position per control period; median and max over episodes).

Imports only numpy, onnxruntime (through robot_wm.core) and the simulator: no torch.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from robot_wm.core.policy_runner import Policy, PolicyOutputError, PolicyRunner, make_obs
from robot_wm.core.task import SuccessTracker, TaskSpec, load_task

DEFAULT_EPISODES = 64


@dataclass(frozen=True)
class Episodes:
    """The episodes of one evaluation: start configurations, goals and the simulator's noise seed."""

    q0_rad: np.ndarray  # (n, N_JOINTS)
    goal_m: np.ndarray  # (n, 3)
    sim_seed: int  # environment i draws its sensor noise from seed sim_seed + i


def make_episodes(task: TaskSpec, n: int, seed: int, q_home_rad: np.ndarray) -> Episodes:
    """Return ``n`` episodes for ``seed``; episode i depends only on (seed, i), not on n.

    The reaching task's episodes (``robot_wm.core.tasks.ReachTask.episodes``: the same for
    ``robot-wm eval`` with and without ``--stack``).

    Args:
        task: start noise and goal box.
        n: number of episodes (>= 1).
        seed: non-negative integer.
        q_home_rad: the home configuration the start noise is added to.
    """
    from robot_wm.core.tasks import ReachTask

    eps = ReachTask(task).episodes(n, seed, q_home_rad)
    return Episodes(eps.q0_rad, eps.targets, eps.sim_seed)


@dataclass
class EvalReport:
    """Result of ``evaluate``: summary metrics plus the per-episode arrays they come from.

    ``to_dict`` holds only what is determined by (policy, profile, episodes, seed): ``wall_s``, the
    run time, is kept out of it so that a rerun gives the same dict.
    """

    policy: str
    profile: str
    episodes: int
    seed: int
    success: np.ndarray  # (n,) bool
    final_error_m: np.ndarray  # (n,) true tool-goal distance at the end of the episode
    time_to_goal_s: np.ndarray  # (n,) entry time of the hold that succeeded; NaN where none did
    peak_tool_speed_mps: np.ndarray  # (n,)
    wall_s: float = field(default=0.0, compare=False)

    @property
    def success_rate(self) -> float:
        return float(np.mean(self.success))

    def to_dict(self) -> dict:
        """Summary metrics as plain JSON-able values (units in the keys; null where undefined)."""
        ttg = self.time_to_goal_s[self.success]

        def r(x: float | None) -> float | None:
            return None if x is None or not np.isfinite(x) else round(float(x), 6)

        return {
            "policy": self.policy,
            "profile": self.profile,
            "episodes": int(self.episodes),
            "seed": int(self.seed),
            "success_rate": r(self.success_rate),
            "successes": int(np.count_nonzero(self.success)),
            "final_error_m_median": r(np.median(self.final_error_m)),
            "final_error_m_p90": r(np.percentile(self.final_error_m, 90)),
            "time_to_goal_s_median": r(np.median(ttg)) if ttg.size else None,
            "peak_tool_speed_mps_median": r(np.median(self.peak_tool_speed_mps)),
            "peak_tool_speed_mps_max": r(np.max(self.peak_tool_speed_mps)),
        }


def evaluate(
    policy: Policy,
    profile="nominal",
    episodes: int = DEFAULT_EPISODES,
    seed: int = 0,
    task: TaskSpec | None = None,
    batch: bool = True,
    progress: bool = False,
) -> EvalReport:
    """Run ``policy`` closed loop on the simulator for ``episodes`` episodes; deterministic for a seed.

    Args:
        policy: anything with ``act(obs (n, OBS_DIM)) -> (n, N_JOINTS) rad/s`` and a ``name``.
        profile: simulator dynamics profile: "nominal", "real_twin", a YAML path or a DynamicsProfile.
        episodes: number of episodes.
        seed: selects the episodes (see ``make_episodes``).
        task: the task (default config/task.yaml).
        batch: True steps all episodes together in one VecArmSim (the policy sees (n, OBS_DIM) batches);
            False runs them one at a time (same episodes, same noise streams; for policies that
            cannot batch).
        progress: show a tqdm progress bar on stderr.
    Returns:
        The report.
    Raises:
        ProfileError: unknown or malformed profile.
        PolicyOutputError: the policy produced a non-finite action.
    """
    from tqdm import tqdm

    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.sim import load_profile

    task = task if task is not None else load_task()
    prof = load_profile(profile)
    urdf = description.expand()
    names = description.joint_limits(urdf).names
    kin = Kinematics(urdf, names)
    eps = make_episodes(task, episodes, seed, description.initial_positions(names))
    n, steps = int(episodes), task.episode_steps
    chunks = [np.arange(n)] if batch else [np.array([i]) for i in range(n)]
    success = np.zeros(n, dtype=bool)
    final_err, ttg, peak = np.zeros(n), np.full(n, np.nan), np.zeros(n)
    started = time.perf_counter()
    name = getattr(policy, "name", type(policy).__name__)
    interactive = sys.stderr.isatty()
    with tqdm(total=n * steps, unit="step", desc=f"eval {name} [{prof.name}]", file=sys.stderr,
              disable=not progress, leave=False, mininterval=0.1 if interactive else 5.0) as bar:
        for ids in chunks:
            sim_seed = eps.sim_seed + int(ids[0])  # environment i keeps its noise stream in either mode
            result = _run_chunk(policy, prof, kin, task, eps.q0_rad[ids], eps.goal_m[ids], sim_seed, bar)
            success[ids], final_err[ids], ttg[ids], peak[ids] = result
    return EvalReport(name, prof.name, n, int(seed), success, final_err, ttg, peak, time.perf_counter() - started)


def _run_chunk(policy, profile, kin, task: TaskSpec, q0: np.ndarray, goals: np.ndarray, sim_seed: int, bar):
    """Run episodes ``q0``/``goals`` together; return (success, final error, time to goal, peak speed)."""
    from robot_wm.sim import VecArmSim

    n = len(q0)
    dt = task.control_dt_s
    env = VecArmSim(n, profile, seed=sim_seed, control_dt_s=dt)
    o = env.reset(q0_rad=q0)
    tracker = SuccessTracker(task, n)
    tool_prev = o.tool_position_m
    peak = np.zeros(n)
    for step in range(task.episode_steps):
        tool_measured = np.stack([kin.tool_position_m(q) for q in o.q_rad])  # what the robot itself can know
        action = np.asarray(policy.act(make_obs(o.q_rad, o.qdot_radps, tool_measured, goals)), dtype=float)
        if action.shape != (n, len(kin.joint_names)):
            raise ValueError(f"policy {getattr(policy, 'name', policy)!r} returned shape {action.shape}: "
                             f"expected ({n}, {len(kin.joint_names)})")
        if not np.all(np.isfinite(action)):
            raise PolicyOutputError(f"policy {getattr(policy, 'name', policy)!r} returned NaN/Inf at step {step}")
        o = env.step(action)
        tracker.update(step, o.tool_position_m, goals)
        peak = np.maximum(peak, np.linalg.norm(o.tool_position_m - tool_prev, axis=1) / dt)
        tool_prev = o.tool_position_m
        bar.update(n)
    final = task.distance_m(o.tool_position_m, goals)
    ttg = np.where(tracker.success, (tracker.first_inside_step + 1) * dt, np.nan)
    return tracker.success.copy(), final, ttg, peak


# --------------------------------------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``eval`` options to ``parser`` (for embedding as a ``robot-wm`` subcommand)."""
    parser.add_argument("--profile", default="nominal",
                        help="simulator profile: nominal | real_twin | <file.yaml> (default nominal)")
    parser.add_argument("--episodes", type=_positive_int, default=DEFAULT_EPISODES,
                        help=f"episodes (default {DEFAULT_EPISODES})")
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="episode seed (default 0)")
    parser.add_argument("--policy", default=None,
                        help="policy ONNX file with its .json sidecar (default: the model set's policy.onnx)")
    parser.add_argument("--task", default="reach", choices=("reach", "track"),
                        help="the task: reach (goals) or track (paths); default reach")
    parser.add_argument("--task-file", default=None, help="reach task YAML (default config/task.yaml)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--no-baseline", action="store_true", help="skip the scripted DLS baseline")
    which.add_argument("--no-policy", action="store_true", help="evaluate only the scripted baseline (no model needed)")
    parser.add_argument("--stack", action="store_true",
                        help="close the loop through the whole stack: policy -> safety filter (SafetyController with "
                             "the world model, F/T, latches) -> arm; adds intervention_rate and violations")
    parser.add_argument("--models", default=None,
                        help="a model set's directory (policy.onnx, world_model.onnx + sidecars); default models/ (reach), models/track/ (track)")
    parser.add_argument("--joint-calibration", default=None, help="--stack: " + "the arm driver's joint calibration (robot-wm calibrate joints) applied to the library arm's joint states")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


def build_parser(prog: str = "robot-wm eval") -> argparse.ArgumentParser:
    """Return the standalone ``robot-wm eval`` parser."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Evaluate the learned policy and the scripted baseline closed loop on the simulator, "
                    "on the same episodes.",
    )
    return add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``robot-wm eval`` with parsed arguments; return the exit code (0 ok, 1 policy failed, 2 bad input)."""
    from robot_wm import description
    from robot_wm.core.onnx_model import ModelError
    from robot_wm.core.task import TaskConfigError
    from robot_wm.paths import DataFileError, data_path
    from robot_wm.sim import ProfileError, load_profile

    def fail(msg: str, code: int = 2) -> int:
        print(f"robot-wm eval: {msg}", file=sys.stderr)
        return code

    from robot_wm.core.tasks import ReachTask, TrackTask
    from robot_wm.core.track import TrackConfigError

    try:
        if args.task == "track":
            if args.task_file:
                return fail("--task-file is for the reach task (the track task reads config/task.yaml's track section)")
            task_obj = TrackTask()
        else:
            task_obj = ReachTask(load_task(Path(args.task_file) if args.task_file else None))
        task = task_obj.spec
        profile = load_profile(args.profile)
    except (TaskConfigError, TrackConfigError, ProfileError, DataFileError, OSError) as exc:
        return fail(str(exc))
    policies: dict[str, Policy | None] = {"policy": None, "baseline": None}
    models_dir = Path(args.models) if args.models else None
    if models_dir is not None and not models_dir.is_dir():
        return fail(f"--models {models_dir}: not a directory")
    if models_dir is None and args.task == "track":
        models_dir = Path(data_path("models", "track", must_exist=False))  # the shipped track set
    if not args.no_policy:
        path = (Path(args.policy) if args.policy else models_dir / "policy.onnx" if models_dir is not None
                else data_path("models", "policy.onnx", must_exist=False))
        try:
            names = description.joint_limits(description.expand()).names
            policies["policy"] = PolicyRunner(path, names, task.control_dt_s, task.action_limit_radps, task=args.task)
        except (ModelError, ValueError) as exc:
            hint = "" if args.policy else " (train one first, or run the baseline only with --no-policy)"
            return fail(f"cannot use policy {path}: {exc}{hint}")
    if not args.no_baseline:
        policies["baseline"] = task_obj.baseline()

    reports: dict[str, EvalReport | None] = {}
    with native_stdout_to_stderr():
        status = _run_reports(args, policies, profile, task, task_obj, models_dir, reports, fail)
    if status is not None:
        return status
    if args.json:
        out = {"task": args.task, "profile": profile.name, "episodes": args.episodes, "seed": args.seed,
               "stack": bool(args.stack),
               **{k: (r.to_dict() if r is not None else None) for k, r in reports.items()}}
        print(json.dumps(out))
    else:
        print(format_table(profile.name, args.episodes, args.seed, reports))
    return 0


def format_table(profile: str, episodes: int, seed: int, reports: dict[str, EvalReport | None]) -> str:
    """Return a readable side-by-side table of the reports."""
    cols = [(k, r) for k, r in reports.items() if r is not None]
    mm = lambda key: lambda d, r: "-" if d.get(key) is None else f"{1000 * d[key]:.1f}"  # noqa: E731
    rows = [("success rate", lambda d, r: f"{100 * d['success_rate']:.1f} % ({d['successes']}/{d['episodes']})")]
    first = cols[0][1].to_dict() if cols else {}
    if "tracking_rms_m_median" in first:  # the tracking task
        rows += [("tracking RMS error median (mm)", mm("tracking_rms_m_median")),
                 ("tracking RMS error p90 (mm)", mm("tracking_rms_m_p90")),
                 ("tracking max error median (mm)", mm("tracking_max_m_median")),
                 ("tracking max error p90 (mm)", mm("tracking_max_m_p90"))]
    else:
        rows += [("final error median (mm)", mm("final_error_m_median")),
                 ("final error p90 (mm)", mm("final_error_m_p90")),
                 ("time to goal median (s)",
                  lambda d, r: "-" if d["time_to_goal_s_median"] is None else f"{d['time_to_goal_s_median']:.2f}")]
    rows += [("peak tool speed median (m/s)", lambda d, r: f"{d['peak_tool_speed_mps_median']:.3f}"),
             ("peak tool speed max (m/s)", lambda d, r: f"{d['peak_tool_speed_mps_max']:.3f}")]
    if first.get("intervention_rate") is not None:  # through the whole stack
        rows += [("filter intervention rate", lambda d, r: f"{100 * d['intervention_rate']:.1f} %")]
    if "violations" in first:
        rows += [("violations on the plant", lambda d, r: f"{d['violations']} " + str(d["violations_by_kind"]))]
    rows += [("wall time (s)", lambda d, r: f"{r.wall_s:.1f}")]
    dicts = [(r.to_dict(), r) for _, r in cols]
    headers = [f"{k}: {r.policy}" for k, r in cols]
    width0 = max(len(label) for label, _ in rows)
    cells = [[fmt(d, r) for d, r in dicts] for _, fmt in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = [f"eval on profile {profile}: {episodes} episodes, seed {seed} (the same episodes for every column)",
             "  ".join([" " * width0] + [h.ljust(w) for h, w in zip(headers, widths)])]
    for (label, _), row in zip(rows, cells):
        lines.append("  ".join([label.ljust(width0)] + [c.ljust(w) for c, w in zip(row, widths)]))
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``robot-wm eval``; returns the exit code (argparse errors and --help included)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help or a usage error: argparse already printed it
        return int(exc.code or 0)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("robot-wm eval: interrupted", file=sys.stderr)
        return 130


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected an integer >= 1")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: expected an integer >= 0")
    return value


def _run_reports(args, policies, profile, task, task_obj, models_dir, reports, fail) -> int | None:
    """Evaluate each policy into ``reports``; a non-None return is the command's exit status."""
    from robot_wm.core.joint_calibration import JointCalibrationError
    from robot_wm.core.onnx_model import ModelError

    if getattr(args, "joint_calibration", None) and not args.stack:
        return fail("--joint-calibration is for --stack: the arm's driver applies it inside the stack's loop")
    for key, pol in policies.items():
        if pol is None:
            reports[key] = None
            continue
        try:
            if args.stack or args.task == "track":
                from robot_wm.learning.stack_eval import evaluate_stack

                reports[key] = evaluate_stack(pol, profile, args.episodes, args.seed, task=task_obj,
                                              models_dir=models_dir, stack=args.stack, progress=not args.no_progress,
                                              joint_calibration=getattr(args, "joint_calibration", None))
            else:
                reports[key] = evaluate(pol, profile, args.episodes, args.seed, task=task, progress=not args.no_progress)
        except PolicyOutputError as exc:
            return fail(f"{key} failed during evaluation: {exc}", 1)
        except (ModelError, RuntimeError, JointCalibrationError) as exc:
            return fail(f"{key}: the stack could not run: {exc}")
        print(f"eval{' --stack' if args.stack else ''}: {reports[key].policy}: {args.episodes} episodes on "
              f"{profile.name} in {reports[key].wall_s:.1f} s", file=sys.stderr)
    return None


@contextlib.contextmanager
def native_stdout_to_stderr():
    """Route file descriptor 1 to stderr while solvers run, so that ``--json`` stdout carries only
    JSON: OSQP >= 1.0 prints "Polishing not needed - no active set detected at optimal point"
    from C on such solves whatever its ``verbose`` setting (osqp/osqp#785)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


if __name__ == "__main__":
    sys.exit(main())

