"""Whole-stack evaluation in library mode: ``robot-wm eval --stack`` (and ``robot-wm eval --task track``).

The loop closes on the simulator through the same core objects the nodes run: the policy
(``PolicyRunner``, or the scripted baseline) proposes a nominal command from the measured state,
the safety filter's ``SafetyController`` — with the world model (``WorldModelRunner``), the wrist
F/T sensor and its tare, the latches — turns it into the command that is sent, and ``ArmSim``
executes it for one control period. So the numbers say what the robot would do, filter included:

* the policy's nominal reaches the filter one control period after the state it was computed
  from (``nominal_delay_periods``: separate node processes, each on its own timer), through the
  policy node's slew limit (``command_slew_fraction`` of config/control.yaml, ``robot_wm.core.slew``);
* every episode starts the way the real stack does: the filter latched at start-up, the arm at
  rest while it tares the F/T sensor, then an operator's enable (these periods are not scored);
* **intervention rate**: the fraction of scored periods in which the filter did not pass the
  nominal command unchanged (FILTERING, or any stop);
* **violations**, measured on the plant's TRUE state at the end of every control period: a joint
  beyond its soft limit by more than ``JOINT_TOL_RAD``, the tool faster than the speed limit plus
  ``SPEED_TOL_MPS`` (averaged over the period), a monitored point below the table or inside a
  keep-out. The tolerances are the end-to-end tests' (test/test_adversarial_e2e.py), for the same
  reasons: drive lag and latency after the filter's command.

Success and the error metrics are the task's, on the true tool position, as in ``robot-wm eval``.
No torch: numpy, onnxruntime, OSQP, pinocchio and MuJoCo.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from robot_wm.core.policy_runner import Policy, PolicyOutputError
from robot_wm.core.task import TaskSpec
from robot_wm.learning.evaluate import DEFAULT_EPISODES

JOINT_TOL_RAD = 0.02  # a joint may coast this far past a soft limit after a braking command (drive lag)
SPEED_TOL_MPS = 0.1  # the drive's tracking overshoot above the commanded tool speed limit
VIOLATION_KINDS = ("joint_limit", "tool_speed", "workspace")


@dataclass
class StackEvalReport:
    """Result of ``evaluate_stack``: summary metrics plus the per-episode arrays they come from.

    ``metrics`` holds the task's per-episode measures: reach ``final_error_m``, ``time_to_goal_s``;
    track ``tracking_rms_m``, ``tracking_max_m``. Without the filter (``stack=False``) there are
    no interventions to count (``intervention_rate`` is None).
    """

    policy: str
    task: str
    profile: str
    episodes: int
    seed: int
    stack: bool
    success: np.ndarray  # (n,) bool
    metrics: dict[str, np.ndarray]  # name -> (n,)
    peak_tool_speed_mps: np.ndarray  # (n,) true tool speed, period average
    interventions: np.ndarray  # (n,) scored periods in which the filter changed the command
    periods: np.ndarray  # (n,) scored periods
    violations: dict[str, np.ndarray]  # kind -> (n,) periods with that breach on the plant
    states: Counter = field(default_factory=Counter)  # filter states over all scored periods
    constraints: Counter = field(default_factory=Counter)  # active constraints over the FILTERING periods
    wall_s: float = field(default=0.0, compare=False)

    @property
    def success_rate(self) -> float:
        return float(np.mean(self.success))

    @property
    def intervention_rate(self) -> float | None:
        return float(self.interventions.sum() / max(self.periods.sum(), 1)) if self.stack else None

    def to_dict(self) -> dict:
        """Summary metrics as plain JSON-able values (units in the keys; null where undefined)."""

        def r(x) -> float | None:
            return None if x is None or not np.isfinite(x) else round(float(x), 6)

        out = {
            "policy": self.policy,
            "task": self.task,
            "profile": self.profile,
            "episodes": int(self.episodes),
            "seed": int(self.seed),
            "success_rate": r(self.success_rate),
            "successes": int(np.count_nonzero(self.success)),
            "intervention_rate": r(self.intervention_rate),
            "violations": int(sum(int(v.sum()) for v in self.violations.values())),
            "violations_by_kind": {k: int(v.sum()) for k, v in self.violations.items()},
            "peak_tool_speed_mps_median": r(np.median(self.peak_tool_speed_mps)),
            "peak_tool_speed_mps_max": r(np.max(self.peak_tool_speed_mps)),
        }
        for name, values in self.metrics.items():
            finite = values[np.isfinite(values)]
            if name == "time_to_goal_s":
                out["time_to_goal_s_median"] = r(np.median(finite)) if finite.size else None
                continue
            out[f"{name}_median"] = r(np.median(finite)) if finite.size else None
            out[f"{name}_p90"] = r(np.percentile(finite, 90)) if finite.size else None
        if self.stack:
            out["filter_states"] = dict(sorted(self.states.items()))
            out["active_constraints"] = dict(self.constraints.most_common())
        return out


class PlantCheck:
    """Limit breaches of the plant's true state (joint limits, tool speed, table and keep-outs)."""

    def __init__(self, kinematics, limits) -> None:
        self.kin, self.limits = kinematics, limits
        self.frames = tuple(limits.monitored_frames)
        self.lo, self.hi = np.asarray(limits.lower_rad), np.asarray(limits.upper_rad)
        self.boxes = np.asarray(limits.keepout_boxes_m, dtype=float).reshape(-1, 6)
        self.spheres = np.asarray(limits.keepout_spheres_m, dtype=float).reshape(-1, 4)

    def __call__(self, q_true: np.ndarray, tool_speed_mps: float) -> dict[str, bool]:
        """Which kinds of limit the true state breaches (beyond the stated tolerances)."""
        over = float(np.max(np.maximum(q_true - self.hi, self.lo - q_true)))
        points = [self.kin.tool_position_m(q_true)] + [self.kin.frame_pose(q_true, f).translation for f in self.frames]
        inside = False
        for p in points:
            inside |= p[2] <= self.limits.table_z_m
            inside |= any(np.all((p > b[:3]) & (p < b[3:])) for b in self.boxes)
            inside |= any(np.linalg.norm(p - s[:3]) < s[3] for s in self.spheres)
        return {"joint_limit": over > JOINT_TOL_RAD,
                "tool_speed": tool_speed_mps > self.limits.tool_speed_max_mps + SPEED_TOL_MPS,
                "workspace": bool(inside)}


@dataclass
class Stack:
    """The objects the nodes build: the filter's controller (with its world model), the policy
    node's slew limit (rad/s per period, None = off) and the plant checks."""

    kinematics: object
    limits: object
    world_model_path: Path
    config: object
    slew_delta_radps: np.ndarray | None = None
    joint_calibration: object = None  # robot_wm.core.joint_calibration.JointCalibration the driver applies


#: How long the start-up may wait for the arm to come to rest under its zero command before the
#: F/T tare (s); the episode's clock starts after the enable, so this is not scored.
START_SETTLE_S = 2.0

def build_stack(control_dt_s: float, models_dir: Path | None = None, phase=None, joint_calibration=None) -> Stack:
    """The safety filter as the node configures it on the embedded arm, and the world model file.

    ``phase``: the deployment phase whose limit scales apply (default SIM, as on the embedded arm;
    ``train mixed`` runs its real episodes in MIXED). ``joint_calibration``: a calibration file
    (``robot-wm calibrate joints``) or ``JointCalibration`` the arm's driver applies to the joint
    states it publishes (``library_arm``); None: the encoders as they read."""
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.core.safety import ControllerConfig, Phase, TrustLevel, load_safety_limits
    from robot_wm.core.slew import load_slew_fraction, slew_delta
    from robot_wm.paths import data_path

    urdf = description.expand()
    names = description.joint_limits(urdf).names
    path = (Path(models_dir) / "world_model.onnx") if models_dir is not None else data_path("models", "world_model.onnx")
    # the node's parameters on the embedded arm: config/control.yaml + graph.plan (SIM phase)
    config = ControllerConfig(dt_s=control_dt_s, require_model=True, default_trust_level=TrustLevel.FULL,
                              default_phase=Phase.SIM if phase is None else Phase(phase), force_sensor=True)
    limits, fraction = load_safety_limits(), load_slew_fraction()
    slew = slew_delta(limits, control_dt_s, fraction, config.default_phase) if fraction > 0 else None
    if joint_calibration is not None and not hasattr(joint_calibration, "correct"):
        from robot_wm.core import joint_calibration as jc

        joint_calibration = jc.load(joint_calibration, names)
    return Stack(Kinematics(urdf, names), limits, Path(path), config, slew, joint_calibration)


class CalibratedArm:
    """The library arm as its driver publishes it with a joint calibration: ``joint_state`` is
    corrected (``JointCalibration.correct``), everything else — the true state, the tool, the
    commands — is the arm's own."""

    def __init__(self, sim, calibration) -> None:
        self._sim, self._cal = sim, calibration.reordered(sim.joint_names)

    def joint_state(self):
        js = self._sim.joint_state()
        return dataclasses.replace(js, position_rad=self._cal.correct(js.position_rad))

    def __getattr__(self, name):
        return getattr(self._sim, name)


def library_arm(profile, seed: int, q0_rad, joint_calibration=None):
    """An ``ArmSim`` for a library-mode episode, behind its driver's joint calibration if any
    (refused, naming both, when the calibration was made on another arm)."""
    from robot_wm.core.joint_calibration import JointCalibrationError
    from robot_wm.sim import ArmSim

    sim = ArmSim(profile, seed=seed, q0_rad=q0_rad)
    robot = getattr(joint_calibration, "robot", "")
    if robot and robot != sim.profile.name:
        raise JointCalibrationError(f"joint calibration of arm {robot!r} on the arm {sim.profile.name!r}: a "
                                    "calibration belongs to the arm it was measured on")
    return sim if joint_calibration is None else CalibratedArm(sim, joint_calibration)


def evaluate_stack(
    policy: Policy,
    profile="nominal",
    episodes: int = DEFAULT_EPISODES,
    seed: int = 0,
    task=None,
    models_dir: Path | None = None,
    nominal_delay_periods: int = 1,
    stack: bool = True,
    progress: bool = False,
    trace: list | None = None,
    joint_calibration=None,
) -> StackEvalReport:
    """Run ``policy`` through the safety filter on the simulator; deterministic for a seed.

    Args:
        policy: anything with ``act(obs) -> rad/s`` and a ``name`` (PolicyRunner, a scripted baseline).
        profile: simulator dynamics profile.
        episodes, seed: the episodes (``task.episodes``: for reach the same as ``robot-wm eval``'s).
        task: a task of ``robot_wm.core.tasks`` (or its name, or a reach ``TaskSpec``); default reach.
        models_dir: a model set's directory (its world_model.onnx); default the shipped models.
        nominal_delay_periods: control periods between the state a nominal was computed from and
            the period that filters it (0: the same period, as in one process).
        stack: False sends the policy's command straight to the arm (no filter, no world model):
            the task's own numbers, as ``robot-wm eval`` without ``--stack``.
        progress: a tqdm progress bar on stderr.
        trace: a list to append every filter period to (``PeriodTrace``: the inputs the filter got
            and the command it returned), e.g. to replay them through the node.
        joint_calibration: the driver's joint calibration (a file or ``JointCalibration``; ``build_stack``).
    Raises:
        ProfileError, ModelError: a bad profile or model; PolicyOutputError: a non-finite action.
    """
    from tqdm import tqdm

    from robot_wm import description
    from robot_wm.core.tasks import ReachTask, get_task
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.sim import load_profile

    if isinstance(nominal_delay_periods, bool) or not isinstance(nominal_delay_periods, int) or nominal_delay_periods < 0:
        raise ValueError(f"nominal_delay_periods={nominal_delay_periods!r}: expected an integer >= 0")
    if task is None or isinstance(task, TaskSpec):
        task = ReachTask(task)
    elif isinstance(task, str):
        task = get_task(task)
    prof = load_profile(profile)
    built = build_stack(task.control_dt_s, models_dir, joint_calibration=joint_calibration)
    names = tuple(built.kinematics.joint_names)
    wm = WorldModelRunner(built.world_model_path, names, task.control_dt_s) if stack else None
    eps = task.episodes(episodes, seed, description.initial_positions(names))
    check = PlantCheck(built.kinematics, built.limits)
    n, steps = len(eps), task.episode_steps
    success, peak = np.zeros(n, bool), np.zeros(n)
    interventions, periods = np.zeros(n, int), np.full(n, steps)
    metrics: dict[str, np.ndarray] = {}
    violations = {k: np.zeros(n, int) for k in VIOLATION_KINDS}
    states: Counter = Counter()
    constraints: Counter = Counter()
    name = getattr(policy, "name", type(policy).__name__)
    started = time.perf_counter()
    with tqdm(total=n * steps, unit="step", desc=f"eval {task.name}{' --stack' if stack else ''} {name} [{prof.name}]",
              file=sys.stderr, disable=not progress, leave=False,
              mininterval=0.1 if sys.stderr.isatty() else 5.0) as bar:
        for i in range(n):
            ep = _run_episode(policy, prof, built, wm, check, task, eps, i, nominal_delay_periods, trace)
            success[i], peak[i], interventions[i] = ep["success"], ep["peak"], ep["interventions"]
            for key, value in ep["metrics"].items():
                metrics.setdefault(key, np.full(n, np.nan))[i] = value
            for k in VIOLATION_KINDS:
                violations[k][i] = ep["violations"][k]
            states.update(ep["states"])
            constraints.update(ep["constraints"])
            bar.update(steps)
    return StackEvalReport(name, task.name, prof.name, n, int(seed), bool(stack), success, metrics, peak,
                           interventions, periods, violations, states, constraints, time.perf_counter() - started)


@dataclass(frozen=True)
class PeriodTrace:
    """One filter period of an evaluation: what the filter was given and what it commanded."""

    episode: int
    t_s: float
    q_rad: np.ndarray
    qdot_radps: np.ndarray
    force_sensor_n: np.ndarray
    nominal_radps: np.ndarray
    nominal_stamp_s: float
    command_radps: np.ndarray
    enabled_after: bool  # an operator's reset was accepted after this period


def _run_episode(policy, profile, built: Stack, wm, check: PlantCheck, task, eps, i: int, delay: int,
                 trace: list | None = None, recorder=None, end_early=None, fault: tuple | None = None) -> dict:
    """One episode (through the filter when ``wm`` is given: enabled by an operator after its tare).

    ``recorder`` (e.g. ``robot_wm.learning.demos.LibraryRecorder``) sees every period as the
    topics would carry it: ``period(t, js, force, torque, nominal, command, result)``, then
    ``task_started(t)`` after the start-up and ``finished(t, score, interventions, js)``.
    ``end_early(result) -> str | None``: asked after every scored period with the filter's output;
    a reason ends the episode there (``train mixed``: an intervention or a trust drop), returned
    as ``ended`` (None: the episode ran its length) and the episode counts as failed.
    ``fault``: (task time s, ``FaultInjector.apply`` keyword arguments) injected into the arm then."""
    from robot_wm.core.safety import JointSample, NominalSample, SafetyController, WrenchSample
    from robot_wm.core.slew import SlewLimiter

    dt, kin, cfg = task.control_dt_s, built.kinematics, built.config
    n_j = len(kin.joint_names)
    sim = library_arm(profile, eps.sim_seed + i, eps.q0_rad[i], built.joint_calibration)
    sim_steps = int(round(dt / sim.dt_s))
    t = 0.0
    ctrl = slew = None
    recorded_tare = [None]  # the filter's tare last given to the recorder
    if wm is not None:
        wm.reset()
        ctrl = SafetyController(built.limits, kin, cfg, model=wm)
        if built.slew_delta_radps is not None:  # the policy node's output stage
            slew = SlewLimiter(built.slew_delta_radps)

    def period(js, nominal: np.ndarray, nominal_stamp: float):
        """One control period on the published joint state (the one the policy saw too)."""
        nonlocal t
        res = None
        command = nominal
        force, torque = sim.wrench() if (ctrl is not None or recorder is not None) else (None, None)
        if ctrl is not None:
            res = ctrl.step(t, joint=JointSample(js.position_rad, js.velocity_radps, t),
                            nominal=NominalSample(nominal, nominal_stamp), wrench=WrenchSample(force, t, cfg.ft_frame))
            command = res.u_safe_radps
            if trace is not None:
                trace.append(PeriodTrace(i, t, js.position_rad, js.velocity_radps, np.array(force), np.array(nominal),
                                         nominal_stamp, np.array(command), False))
        if recorder is not None:
            tare = None if ctrl is None else ctrl.tare.declared  # the filter's /robot_wm/payload
            if tare is not None and tare is not recorded_tare[0] and hasattr(recorder, "payload"):
                recorded_tare[0] = tare
                recorder.payload(t, tare.payload_kg, cfg.ft_frame)
            recorder.period(t, js, force, torque, nominal, command, res)
        sim.set_command(command)
        sim.step(sim_steps)
        t += dt
        return res

    if ctrl is not None:  # start-up: latched, at rest, the F/T tare; then the operator's enable (not scored)
        # a heavy, laggy arm settles for a while under its zero command before the tare can be taken
        for _ in range(int(round((cfg.tare_window_s + START_SETTLE_S) / dt)) + 5):
            period(sim.joint_state(), np.zeros(n_j), t)
            if ctrl.reset()[0]:
                if trace is not None:
                    trace[-1] = dataclasses.replace(trace[-1], enabled_after=True)
                break
        else:
            raise RuntimeError(f"the safety filter could not be enabled at the start of the episode: {ctrl.summary()}")
    t_task = t  # the task's clock starts now (the reference path, the score)
    if recorder is not None:
        recorder.task_started(t_task)
    score = task.new_score(eps, i)
    pending: list[tuple[np.ndarray, float]] = []  # nominals on their way from the policy to the filter
    tool_prev = sim.tool_position_m()
    peak, interventions = 0.0, 0
    violations: Counter = Counter()
    states: Counter = Counter()
    constraints: Counter = Counter()
    ended = None
    for step in range(task.episode_steps):
        if fault is not None and t - t_task >= fault[0] - 1e-9:
            sim.faults.apply(**fault[1])
            fault = None
        js = sim.joint_state()
        q = js.position_rad
        obs = task.observation(eps, i, t - t_task, q, js.velocity_radps, kin.tool_position_m(q))
        action = np.asarray(policy.act(obs), dtype=float)
        if action.shape != (n_j,) or not np.all(np.isfinite(action)):
            raise PolicyOutputError(f"policy {getattr(policy, 'name', policy)!r} returned {action.tolist()} at step {step}")
        if slew is not None:
            action = slew.limit(action, js.velocity_radps)
        if ctrl is None:
            res = period(js, action, t)
        else:
            pending.append((action, t))
            nominal, stamp = pending.pop(0) if len(pending) > delay else (np.zeros(n_j), t)
            res = period(js, nominal, stamp)
            states[res.state.name] += 1
            interventions += res.state.name != "OK"
            if res.state.name == "FILTERING":
                constraints.update(res.active_constraints)
        tool = sim.tool_position_m()
        speed = float(np.linalg.norm(tool - tool_prev) / dt)
        tool_prev = tool
        peak = max(peak, speed)
        for kind, bad in check(sim.true_joint_state().position_rad, speed).items():
            violations[kind] += bad
        score.update(t - t_task, tool)
        if end_early is not None and (ended := end_early(res)) is not None:
            break
    if recorder is not None:
        recorder.finished(t, score, interventions, sim.joint_state())  # the state the last command led to
    return {"success": score.success and ended is None, "metrics": score.metrics(), "peak": peak,
            "interventions": interventions, "violations": violations, "states": states, "constraints": constraints,
            "ended": ended, "periods": step + 1}
