"""Demonstrations: record them in library mode, inspect a directory of them, load them for training.

* ``record_library`` runs task episodes on the library-mode simulator through the objects the nodes
  run (``robot_wm.learning.stack_eval``: policy or scripted baseline → slew limit → safety filter
  with its world model → arm, one period of delay) and writes one bag per episode
  (``robot_wm.bags``) with the messages the nodes would have published, stamped with simulated
  time: ``/joint_states`` and the filter's inputs and outputs every period, the reference window
  (10 Hz) or goal, the trust monitor's ``TrustState`` (a ``TrustTracker`` with the profile's
  calibration watching, as the node does; in library mode its verdict is recorded, not fed to the
  filter — the same stack ``eval --stack`` measures), the intervention flag (1 Hz) and the
  ``EpisodeResult``. Much faster than real time.
* ``inspect_demos`` summarizes a directory (counts, durations, topics, success, gaps, sources,
  problems) without stopping at a bad bag: every bag's problem is listed with its name.
* ``load_demos`` turns the bags into the training format (``Dataset``): each episode resampled
  on the control period from its start (``EpisodeMeta.start_ns``): the joint state interpolated
  at t_k, the command *sent during* period k = the last one received in [t_k, t_k+1) (held from
  before when none arrived: the arm keeps executing its last command), the tool by forward
  kinematics. Any bag that cannot give that — truncated, corrupt, another robot, another task or
  period, a gap in the joint states longer than ``max_gap_s`` — is a ``BagError`` naming it:
  a training set is never silently poisoned or shortened.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from robot_wm import bags
from robot_wm.bags import BagError, EpisodeBagWriter, EpisodeMeta, Messages

REFERENCE_PERIOD_S = 0.1  # library mode: a reference window (or the goal) every 100 ms ...
REFERENCE_WINDOW_S = 0.6  # ... covering the policy's preview until the next one
INTERVENTION_PERIOD_S = 1.0  # the policy node's 1 Hz InterventionState
DEFAULT_MAX_GAP_S = 0.05  # a longer silence of /joint_states inside an episode makes the bag unusable
MIN_STEPS = 50  # control periods: the shortest episode the loader trains on


# ------------------------------------------------------------------------------------------ record
class LibraryRecorder:
    """Writes one library-mode episode's messages (``stack_eval._run_episode``'s ``recorder``)."""

    def __init__(self, writer: EpisodeBagWriter, task, eps, i: int, names, dt_s: float, base_ns: int,
                 tracker=None, predictor=None, phase: int = 0) -> None:
        self.w, self.task, self.eps, self.i, self.names, self.dt = writer, task, eps, i, list(names), dt_s
        self.m = Messages()
        self.base_ns = int(base_ns)
        self.tracker, self.predictor, self.phase = tracker, predictor, phase
        self.t_task: float | None = None
        self.next_ref_s = 0.0
        self.next_flag_s = 0.0
        self.filter_changed = 0
        self.end_ns = self.base_ns
        self.last_trust = None  # the tracker's latest TrustOutput (None: no tracker, or no period yet)

    def ns(self, t_s: float) -> int:
        return self.base_ns + int(round(t_s * 1e9))

    def period(self, t, js, force, torque, nominal, command, res) -> None:
        from robot_wm.core.safety import FilterState

        ns = self.ns(t)
        q, qd = js.position_rad, js.velocity_radps
        self.w.write(bags.STATES_TOPIC, ns, self.m.joint_state(ns, self.names, q, qd, js.effort_nm))
        if force is not None:
            self.w.write("/robot_wm/wrench", ns, self.m.wrench(ns, "tool0", force, torque))
        self.w.write("/robot_wm/action_nominal", ns, self.m.float64_array(nominal))
        self.w.write(bags.COMMAND_TOPIC, ns, self.m.float64_array(command))
        if res is not None:
            norm = float(np.linalg.norm(np.asarray(command) - np.asarray(nominal)))
            self.w.write("/robot_wm/safety_status", ns, self.m.safety_status(
                ns, int(res.state), res.state_text, res.active_constraints, norm, res.reason, res.latches))
            if self.t_task is not None and res.state != FilterState.OK:
                self.filter_changed += 1
        if self.tracker is not None:
            intervened = None if res is None else res.state == FilterState.FILTERING
            out = self.last_trust = self.tracker.measurement(t, q, qd, None, intervened)
            self.w.write("/robot_wm/trust", ns, self.m.trust(ns, out.score, int(out.level), self.phase,
                                                             out.normalized_error, out.threshold, out.reason))
            pred = self.predictor.predict(q, qd, np.asarray(command, dtype=float))
            self.tracker.prediction(t, pred.next_state, pred.epistemic_std, pred.aleatoric_std)
        if t >= self.next_flag_s - 1e-9:
            self.w.write("/robot_wm/intervention/state", ns, self.m.intervention_state(ns, False, 0, "", 0))
            self.next_flag_s += INTERVENTION_PERIOD_S
        if t >= self.next_ref_s - 1e-9:
            self._target(t, ns)
            self.next_ref_s = t + REFERENCE_PERIOD_S
        self.end_ns = ns

    def payload(self, t: float, mass_kg: float, frame: str) -> None:
        """A tare the filter took (start-up, re-tare): what the safety filter node publishes."""
        ns = self.ns(t)
        self.w.write(bags.PAYLOAD_TOPIC, ns, self.m.payload(ns, frame, mass_kg))

    def _target(self, t: float, ns: int) -> None:
        """The sequencer's message: the reference window from now (held at the start before the
        task's clock runs) or the goal."""
        rel = 0.0 if self.t_task is None else t - self.t_task
        if self.task.name == "track":
            k = np.arange(int(np.ceil(REFERENCE_WINDOW_S / self.dt)) + 1)
            times = np.maximum(rel + k * self.dt, 0.0) if self.t_task is not None else np.zeros(len(k))
            pts = self.eps.targets.position(self.i, times)
            self.w.write("/robot_wm/reference", ns, self.m.reference(ns, "base_link", self.dt, pts))
        else:
            self.w.write("/robot_wm/goal", ns, self.m.point(ns, "base_link", self.eps.targets[self.i]))

    def task_started(self, t: float) -> None:
        self.t_task = t
        self.next_ref_s = t  # the first window of the moving reference at once

    def finished(self, t: float, score, interventions: int, js) -> None:
        metrics = score.metrics()
        error = metrics.get("tracking_rms_m", metrics.get("final_error_m", float("nan")))
        ns = self.ns(t)
        self.w.write(bags.STATES_TOPIC, ns, self.m.joint_state(ns, self.names, js.position_rad, js.velocity_radps,
                                                               js.effort_nm))
        self.w.write("/robot_wm/episodes", ns, self.m.episode_result(ns, self.task.name, self.i, score.success,
                                                                     error, t - self.t_task))
        self.end_ns = ns
        self.score, self.error = bool(score.success), float(error)


def record_library(task_name: str, profile: str, n: int, out: Path, *, seed: int = 0, source: str = "policy",
                   models_dir: Path | None = None, progress: bool = True, first_index: int = 0,
                   joint_calibration=None) -> list[Path]:
    """Record ``n`` episodes of ``task_name`` on the library-mode simulator with ``profile``.

    Args:
        source: "policy" (the model set's policy) or "scripted" (the task's baseline).
        models_dir: the model set (policy and the filter's world model); default the shipped one.
        first_index: index of the first episode (episode i uses the task's episode i of ``seed``),
            so a second call can add to a directory.
        joint_calibration: the driver's joint calibration (file or ``JointCalibration``): the
            bags then carry the calibrated joint states, as a calibrated driver publishes them.
    Returns:
        The bag directories written (``out/<task>_<profile>_<index>``).
    """
    from tqdm import tqdm

    from robot_wm import description
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.tasks import get_task
    from robot_wm.core.trust import TrustConfig, TrustMonitor
    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.core.trust.tracker import TrustTracker
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.learning.stack_eval import PlantCheck, _run_episode, build_stack
    from robot_wm.learning.trust_eval import _recording_calibration, default_calibration_path
    from robot_wm.paths import data_path
    from robot_wm.sim import load_profile

    if source not in ("policy", "scripted"):
        raise ValueError(f"source {source!r}: library mode records the policy or the scripted baseline")
    task = get_task(task_name)
    prof = load_profile(profile)
    dt = task.control_dt_s
    if models_dir is None:
        models_dir = Path(data_path("models", must_exist=False)) if task.name == "reach" else \
            Path(data_path("models", "track", must_exist=False))
    built = build_stack(dt, models_dir, joint_calibration=joint_calibration)
    names = tuple(built.kinematics.joint_names)
    wm = WorldModelRunner(built.world_model_path, names, dt)
    predictor = WorldModelRunner(built.world_model_path, names, dt, analytic=False)  # the world_model node's own
    if source == "policy":
        policy = PolicyRunner(Path(models_dir) / "policy.onnx", names, dt, task.action_limit_radps, task=task.name)
        models = {"policy": policy.version, "world_model": wm.version}
    else:
        policy = task.baseline()
        models = {"policy": "scripted", "world_model": wm.version}
    try:
        cal = calib_io.load(default_calibration_path(prof.name, task.name), wm.version)
        cal_note = f"calibration {default_calibration_path(prof.name, task.name).name}"
    except Exception as exc:  # noqa: BLE001 - any unusable calibration: record the signals, judge nothing
        cal, cal_note = _recording_calibration(wm.version), f"no usable calibration ({exc}): recording only"
    eps = task.episodes(first_index + n, seed, description.initial_positions(names))
    check = PlantCheck(built.kinematics, built.limits)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    base_ns = time.time_ns()
    with tqdm(range(first_index, first_index + n), desc=f"record {task.name} [{prof.name}]", unit="episode",
              file=sys.stderr, disable=not progress) as bar:
        for i in bar:
            path = out / f"{task.name}_{prof.name}_{i:04d}"
            wm.reset()
            predictor.reset()
            tracker = TrustTracker(TrustMonitor(TrustConfig(), cal), built.kinematics, dt)
            with EpisodeBagWriter(path) as writer:
                rec = LibraryRecorder(writer, task, eps, i, names, dt, base_ns, tracker, predictor)
                ep = _run_episode(policy, prof, built, wm, check, task, eps, i, 1, recorder=rec)
                meta = EpisodeMeta(task=task.name, robot=prof.name, source=source, success=bool(ep["success"]),
                                   error_m=rec.error, interventions=0, filter_interventions=int(ep["interventions"]),
                                   start_ns=rec.ns(rec.t_task), end_ns=rec.end_ns, dt_s=dt, joint_names=list(names),
                                   models=models, index=i, library=True,
                                   extra={"seed": seed, "trust": cal_note, **_calibration_note(built),
                                          "violations": {k: int(v) for k, v in ep["violations"].items()}})
                written.append(writer.close(meta))
            base_ns = rec.end_ns + 1_000_000_000  # the next episode a second later on the same clock
    return written


def _calibration_note(built) -> dict:
    cal = built.joint_calibration
    return {} if cal is None else {"joint_calibration": {j: round(float(o), 7) for j, o in
                                                         zip(cal.joint_names, cal.offset_rad)}}


# ------------------------------------------------------------------------------------------ inspect
@dataclass
class BagSummary:
    name: str
    ok: bool
    problem: str = ""
    task: str = ""
    robot: str = ""
    source: str = ""
    success: bool | None = None
    error_m: float | None = None
    duration_s: float = 0.0
    interventions: int = 0
    max_state_gap_s: float = 0.0
    max_command_gap_s: float = 0.0
    topics: dict[str, int] = field(default_factory=dict)


def inspect_demos(directory: Path) -> dict:
    """Summary of a demonstrations directory: per bag and in total; never raises on a bad bag."""
    complete, partial = bags.list_bags(directory)
    rows: list[BagSummary] = []
    for path in complete:
        try:
            ep = bags.read_episode(path)
        except BagError as exc:
            rows.append(BagSummary(path.name, False, str(exc)))
            continue
        m = ep.meta
        inside = (ep.state_t_ns >= m.start_ns) & (ep.state_t_ns <= m.end_ns)
        gaps = np.diff(ep.state_t_ns[inside]) * 1e-9 if inside.sum() > 1 else np.array([m.duration_s])
        cin = (ep.command_t_ns >= m.start_ns) & (ep.command_t_ns <= m.end_ns)
        cgaps = np.diff(ep.command_t_ns[cin]) * 1e-9 if cin.sum() > 1 else np.array([m.duration_s])
        rows.append(BagSummary(path.name, True, "", m.task, m.robot, m.source, m.success, m.error_m, m.duration_s,
                               m.interventions, float(gaps.max()), float(cgaps.max()), ep.topics))
    for path in partial:
        rows.append(BagSummary(path.name, False, bags.broken_reason(path)))
    good = [r for r in rows if r.ok]
    succ = [r.success for r in good if r.success is not None]
    by = lambda key: {v: sum(1 for r in good if getattr(r, key) == v) for v in sorted({getattr(r, key) for r in good})}
    return {
        "directory": str(directory),
        "bags": len(rows), "usable": len(good), "problems": [{"bag": r.name, "problem": r.problem} for r in rows if not r.ok],
        "tasks": by("task"), "robots": by("robot"), "sources": by("source"),
        "success_rate": (sum(succ) / len(succ)) if succ else None,
        "duration_s": {"total": round(sum(r.duration_s for r in good), 3),
                       "min": round(min((r.duration_s for r in good), default=0.0), 3),
                       "max": round(max((r.duration_s for r in good), default=0.0), 3)},
        "interventions": sum(r.interventions for r in good),
        "max_state_gap_s": round(max((r.max_state_gap_s for r in good), default=0.0), 6),
        "max_command_gap_s": round(max((r.max_command_gap_s for r in good), default=0.0), 6),
        "topics": {t: sum(r.topics.get(t, 0) for r in good) for t in sorted({t for r in good for t in r.topics})},
        "episodes": [r.__dict__ for r in rows],
    }


def format_inspection(report: dict) -> str:
    lines = [f"{report['directory']}: {report['usable']} usable of {report['bags']} bag(s)"]
    if report["usable"]:
        sr = report["success_rate"]
        lines += [f"  tasks {report['tasks']}  robots {report['robots']}  sources {report['sources']}",
                  f"  success {'-' if sr is None else f'{100 * sr:.0f} %'}  duration {report['duration_s']['total']:.1f} s "
                  f"(per episode {report['duration_s']['min']:.2f}-{report['duration_s']['max']:.2f} s)  "
                  f"operator take-overs {report['interventions']}",
                  f"  largest gap: joint states {1e3 * report['max_state_gap_s']:.1f} ms, "
                  f"commands {1e3 * report['max_command_gap_s']:.1f} ms",
                  "  topics: " + ", ".join(f"{t} {n}" for t, n in report["topics"].items())]
    for p in report["problems"]:
        lines.append(f"  PROBLEM {p['bag']}: {p['problem']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ load
def episode_arrays(ep: bags.Episode, steps: int, dt_s: float, max_gap_s: float = DEFAULT_MAX_GAP_S):
    """(q (T+1, N), qdot (T+1, N), action (T, N)) of one episode on the control period grid."""
    where = ep.path
    if abs(ep.meta.dt_s - dt_s) > 1e-9:
        raise BagError(f"{where}: recorded at a control period of {ep.meta.dt_s} s, training needs {dt_s} s")
    grid = ep.meta.start_ns + np.round(np.arange(steps + 1) * dt_s * 1e9).astype(np.int64)
    ts = ep.state_t_ns
    if ts.size < 2 or np.any(np.diff(ts) < 0):
        raise BagError(f"{where}: /joint_states stamps are not in order (or fewer than two states)")
    if ts[0] > grid[0] + max_gap_s * 1e9 or ts[-1] < grid[-1] - max_gap_s * 1e9:
        have = (ts[-1] - grid[0]) * 1e-9
        raise BagError(f"{where}: joint states cover {max(have, 0):.3f} s from the episode's start, "
                       f"training needs {steps * dt_s:.3f} s (truncated, or the episode was cut short)")
    inside = ts[(ts >= grid[0] - int(max_gap_s * 1e9)) & (ts <= grid[-1] + int(max_gap_s * 1e9))]
    if inside.size > 1 and np.max(np.diff(inside)) > max_gap_s * 1e9:
        k = int(np.argmax(np.diff(inside)))
        raise BagError(f"{where}: /joint_states silent for {np.diff(inside)[k] * 1e-9 * 1e3:.0f} ms at "
                       f"{(inside[k] - grid[0]) * 1e-9:.3f} s into the episode (max {max_gap_s * 1e3:.0f} ms)")
    tsf = (ts - grid[0]).astype(float)
    gf = (grid - grid[0]).astype(float)
    q = np.stack([np.interp(gf, tsf, ep.q_rad[:, j]) for j in range(ep.q_rad.shape[1])], -1)
    qd = np.stack([np.interp(gf, tsf, ep.qdot_radps[:, j]) for j in range(ep.q_rad.shape[1])], -1)
    ct = ep.command_t_ns
    if ct.size == 0:
        raise BagError(f"{where}: no command sent in the episode")
    if ct[0] > grid[0] + max_gap_s * 1e9:
        raise BagError(f"{where}: no command in the episode's first {(ct[0] - grid[0]) * 1e-9:.3f} s "
                       f"(max {max_gap_s * 1e3:.0f} ms)")
    # the command in force during period k: the last one received before t_k+1 (at t_k itself counts);
    # before the bag's first command (the filter began publishing with the episode, as after its
    # enable) none was in force: the driver holds the arm, a zero command
    last = np.searchsorted(ct, grid[1:], side="left") - 1
    action = np.where((last >= 0)[:, None], ep.command_radps[np.maximum(last, 0)], 0.0)
    return q, qd, action


def load_demos(directory: Path | list[Path], *, task: str | None = None, steps: int | None = None,
               max_gap_s: float = DEFAULT_MAX_GAP_S):
    """Load every bag of ``directory`` (or the given bag paths) as one ``Dataset``.

    Args:
        task: the task the demos must be of (default: theirs; mixed tasks are an error).
        steps: control periods per episode (default: the task's episode length, or the shortest
            episode's when shorter — a reach episode ends when the goal is reached — but never
            fewer than ``MIN_STEPS``: a bag shorter than that is refused by name).
    Returns:
        (dataset, episodes' metadata, bag sha256s) — the dataset's ``profiles`` are the recorded
        robots, its ``meta`` says where it came from.
    Raises:
        BagError: naming the first bag that cannot be used and why.
    """
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.data import Dataset

    urdf = description.expand()
    names = description.joint_limits(urdf).names
    if isinstance(directory, (list, tuple)):
        paths = [Path(p) for p in directory]
    else:
        complete, broken = bags.list_bags(Path(directory))
        if broken:
            raise BagError(f"{directory}: {', '.join(f'{p.name} ({bags.broken_reason(p)})' for p in broken)}: "
                           f"delete or move them, or record again")
        paths = complete
    if not paths:
        raise BagError(f"{directory}: no demonstration bags")
    metas = [bags.read_meta(p) for p in paths]
    tasks = {m.task for m in metas}
    if task is None:
        if len(tasks) > 1:
            raise BagError(f"{directory}: bags of several tasks ({', '.join(sorted(tasks))}): give --task")
        task = tasks.pop()
    for p, m in zip(paths, metas):
        if m.task != task:
            raise BagError(f"{p}: a demonstration of task {m.task!r}, not {task!r}")
    spec = get_task(task)
    dt = spec.control_dt_s
    if steps is None:
        lengths = [int(np.floor(m.duration_s / dt + 1e-6)) for m in metas]
        short = [p.name for p, n in zip(paths, lengths) if n < MIN_STEPS]
        if short:
            raise BagError(f"{', '.join(short)}: shorter than {MIN_STEPS} control periods ({MIN_STEPS * dt:g} s): "
                           f"too short to train on (remove them from {directory})")
        steps = min([spec.episode_steps] + lengths)
    kin = Kinematics(urdf, names)
    qs, qds, acts, tools, robots, shas = [], [], [], [], [], []
    for p in paths:
        ep = bags.read_episode(p, names)
        q, qd, a = episode_arrays(ep, steps, dt, max_gap_s)
        qs.append(q); qds.append(qd); acts.append(a)
        tools.append(np.array([kin.tool_position_m(x) for x in q]))
        robots.append(ep.meta.robot)
        shas.append(ep.sha256)
    data = Dataset(np.stack(qs), np.stack(qds), np.stack(acts), np.stack(tools), tuple(names), dt, tuple(robots),
                   {"source": "demonstrations", "directory": str(directory) if not isinstance(directory, list) else "",
                    "bags": [p.name for p in paths], "bag_sha256": shas, "task": task,
                    "sources": [m.source for m in metas]})
    return data, metas, shas
