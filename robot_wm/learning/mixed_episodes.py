"""The real episodes of ``robot-wm train mixed`` (``robot_wm.learning.mixed``): its settings, the
exploration rule and the policy that applies it, when an episode ends early, the run's one trust
monitor, and the loop that runs and records a round's episodes in the MIXED phase through the
objects the nodes run."""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robot_wm.core.safety import FilterState, TrustLevel

from robot_wm.core.exploration import TRUST_FACTORS, OUNoise, check_settings, explore, exploration_scale  # noqa: F401


class MixedError(ValueError):
    """A run that cannot start or go on; the message says why."""


@dataclass(frozen=True)
class MixedConfig:
    """Settings of ``train mixed`` (config/training.yaml, section ``mixed``; the world model's and
    the policy's fine-tune settings are ``adapt``'s)."""

    real_per_round: int = 10  # real episodes between two imagination phases
    ratio: str = "1:10"  # real episodes : imagination episodes (one = one batch of imagined rollouts)
    exploration_std: float = 0.1  # stationary std of the exploration noise, fraction of the action limit in force
    exploration_tau_s: float = 0.2  # its correlation time (Ornstein-Uhlenbeck)
    uncertainty_low_radps: float = 0.008  # epistemic std of the next q̇ (max joint) below which exploration is full
    uncertainty_high_radps: float = 0.02  # ... at and above which it is off
    end_level: str = "SLOW"  # a trust level at or below this ends a real episode
    window_steps: int = 100  # real episodes are cut into windows of this many periods for training
    validation_every: int = 5  # every n-th real episode is a validation episode (never trained on)
    calibration_exceedance: float = 1e-3  # the run's own trust calibrations (see the module docstring)
    calibration_episodes: int = 8  # base model without a calibration for the arm: episodes recorded first
    seed: int = 0

    def __post_init__(self) -> None:
        parse_ratio(self.ratio)
        for name in ("real_per_round", "window_steps", "validation_every", "calibration_episodes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"mixed.{name}={getattr(self, name)}: expected an integer >= 1")
        if int(self.window_steps) < 50:
            raise ValueError(f"mixed.window_steps={self.window_steps}: expected >= 50 (the loader's shortest episode)")
        check_settings(self.exploration_std, self.exploration_tau_s, self.uncertainty_low_radps,
                       self.uncertainty_high_radps, prefix="mixed.")
        if self.end_level not in TrustLevel.__members__:
            raise ValueError(f"mixed.end_level={self.end_level!r}: expected one of {', '.join(TrustLevel.__members__)}")
        if not 0.0 < self.calibration_exceedance < 0.5:
            raise ValueError(f"mixed.calibration_exceedance={self.calibration_exceedance}: expected a value in (0, 0.5)")


def parse_ratio(text: str) -> tuple[int, int]:
    """"R:I" -> (R, I): R real episodes alternate with I imagination episodes (integers >= 1, >= 0)."""
    parts = str(text).split(":")
    try:
        r, i = (int(p) for p in parts)
    except ValueError:
        r = i = -1
    if len(parts) != 2 or r < 1 or i < 0:
        raise ValueError(f"ratio {text!r}: expected R:I with integers R >= 1 real and I >= 0 imagination episodes, "
                         f"e.g. 1:10")
    return r, i


def imagination_episodes(real_episodes: int, ratio: str) -> int:
    """Imagination episodes (policy-training batches) that ``real_episodes`` real ones earn."""
    r, i = parse_ratio(ratio)
    return (int(real_episodes) * i) // r


class ExploringPolicy:
    """A deterministic policy plus uncertainty-bounded exploration noise (see the module docstring).

    ``predictor``: the world model runner that pairs states with the commands sent (its what-if
    query does not disturb its history); ``trust_level()``: the monitor's level now;
    ``speed_factor()``: what the policy node scales its command by (``robot_wm.core.slew.trust_scales``:
    the phase's and the level's reduced speed, so that the policy respects them itself);
    ``kinematics`` and ``tool_speed_max_mps`` (the tool-speed limit at speed factor 1): the noise
    keeps the tool within the budget of the limit in force (``robot_wm.core.exploration``). Every
    period's (uncertainty, scale) goes to ``log``."""

    def __init__(self, policy, predictor, cfg: MixedConfig, action_limit_radps, dt_s: float, seed: int,
                 trust_level=lambda: TrustLevel.FULL, speed_factor=lambda: 1.0, kinematics=None,
                 tool_speed_max_mps: float = math.inf) -> None:
        self.policy, self.predictor, self.cfg = policy, predictor, cfg
        self.kinematics, self.tool_speed_max_mps = kinematics, float(tool_speed_max_mps)  # at speed factor 1
        self.speed_factor = speed_factor
        self.name = f"{getattr(policy, 'name', 'policy')}+exploration"
        self.limit = np.asarray(action_limit_radps, dtype=float)
        self.noise = OUNoise(self.limit.shape[0], dt_s, cfg.exploration_tau_s, seed)
        self.trust_level = trust_level
        self.log: list[tuple[float, float, int]] = []  # (uncertainty, scale, trust level) per period

    def act(self, obs: np.ndarray) -> np.ndarray:
        speed = self.speed_factor()
        action = np.asarray(self.policy.act(obs), dtype=float) * speed
        n = action.shape[0]
        pred = self.predictor.predict(obs[:n], obs[n:2 * n], action, commit=False)
        u = float(np.max(pred.epistemic_std[n:]))
        scale = exploration_scale(u, self.cfg.uncertainty_low_radps, self.cfg.uncertainty_high_radps, self.trust_level())
        noise = self.noise.step()  # unit-variance OU noise; its size is set per period by the rule
        self.log.append((u, scale, int(self.trust_level())))
        jac = self.kinematics.tool_jacobian(obs[:n])[:3] if self.kinematics is not None and scale > 0.0 else None
        return explore(action, noise, scale, self.cfg.exploration_std, self.limit * speed,  # the limits in force
                       jac, self.tool_speed_max_mps * speed)


# ------------------------------------------------------------------------------ real episodes
class EpisodeGuard:
    """When a real episode ends early: the safety filter stopped or latched the arm (an
    intervention: any state but OK and FILTERING), or the trust level fell to ``end_level`` or
    lower from a better one reached in this episode (a trust drop). Call once per period with the
    filter's output and the monitor's; returns the reason, or None to go on."""

    def __init__(self, end_level: TrustLevel) -> None:
        self.end_level = TrustLevel(end_level)
        self.best = TrustLevel.HUMAN  # the best level reached so far (the monitor climbs after a start)

    def __call__(self, result, trust) -> str | None:
        if result is not None and result.state not in (FilterState.OK, FilterState.FILTERING):
            return f"intervention: the safety filter went to {result.state.name} ({result.reason or result.state_text})"
        if trust is None:
            return None
        if trust.level >= self.end_level and self.best < self.end_level:
            return f"trust drop: {self.best.name} -> {trust.level.name} ({trust.reason})"
        self.best = min(self.best, TrustLevel(trust.level))
        return None


class ContinuousTrust:
    """One trust monitor over the whole run, as the trust_monitor node runs beside the arm: the
    episodes' clocks laid end to end (no prediction pairs across two episodes),
    the calibration replaced when a round's model comes in (``set_calibration``, as after a swap).

    The monitor starts at STOP and climbs one level per clean hold; ``settle`` holds the arm at
    rest (zero command, the world model predicting) until it is FULL, as an operator waits before
    starting an episode."""

    MAX_SETTLE_S = 20.0

    def __init__(self, kinematics, calibration, dt_s: float) -> None:
        from robot_wm.core.trust import TrustConfig, TrustMonitor
        from robot_wm.core.trust.tracker import TrustTracker

        self.tracker = TrustTracker(TrustMonitor(TrustConfig(), calibration), kinematics, dt_s)
        self.dt_s = dt_s
        self.offset = 0.0
        self.last = -1.0
        self.settled_s = 0.0  # time spent at rest waiting for FULL, in all

    def set_calibration(self, calibration) -> None:
        self.tracker.monitor.set_calibration(calibration)

    @property
    def level(self) -> TrustLevel:
        return TrustLevel(self.tracker.monitor.level)

    def new_episode(self) -> None:
        """The next episode's clock goes on one period after this one's end (a longer silence would
        read as stale inputs); the predictions pending for the old episode's states are dropped."""
        self.offset = self.last + self.dt_s
        self.tracker.drop_through(math.inf)

    def measurement(self, t_s, *args):
        self.last = t_s + self.offset
        return self.tracker.measurement(self.last, *args)

    def prediction(self, t_s, *args) -> None:
        self.tracker.prediction(t_s + self.offset, *args)

    def settle(self, profile, q0_rad, predictor, seed: int, joint_calibration=None) -> float:
        """Hold the arm at rest at ``q0_rad`` until the level is FULL (at most MAX_SETTLE_S); seconds spent."""
        from robot_wm.learning.stack_eval import library_arm

        if self.level == TrustLevel.FULL:
            return 0.0
        self.new_episode()
        sim = library_arm(profile, seed, q0_rad, joint_calibration)
        steps = int(round(self.dt_s / sim.dt_s))
        predictor.reset()
        zero = np.zeros(len(q0_rad))
        t = 0.0
        while self.level != TrustLevel.FULL and t < self.MAX_SETTLE_S:
            js = sim.joint_state()
            self.measurement(t, js.position_rad, js.velocity_radps, None, False)
            pred = predictor.predict(js.position_rad, js.velocity_radps, zero)
            self.prediction(t, pred.next_state, pred.epistemic_std, pred.aleatoric_std)
            sim.set_command(zero)
            sim.step(steps)
            t += self.dt_s
        self.settled_s += t
        return t


def run_real_episodes(task_name: str, profile: str, set_dir: Path, calibration, indices: list[int], out: Path,
                      cfg: MixedConfig, *, explore: bool = True, round_index: int = 0, trust: ContinuousTrust | None = None,
                      progress: bool = True, fault: tuple | None = None, joint_calibration=None) -> list[dict]:
    """Run and record the real episodes ``indices`` (the task's episodes of ``cfg.seed``) with the
    set in ``set_dir`` in the MIXED phase; one bag each in ``out``. ``trust``: the run's monitor
    (its calibration set to ``calibration``; a new one when None). ``fault``: (task time s, the
    ``FaultInjector.apply`` arguments) injected into every episode (fault-injection tests).
    ``joint_calibration``: the arm driver's (``build_stack``). Returns one summary per episode."""
    from tqdm import tqdm

    from robot_wm import description
    from robot_wm.bags import EpisodeBagWriter, EpisodeMeta
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.safety import Phase
    from robot_wm.core.slew import trust_scales
    from robot_wm.core.tasks import get_task
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.learning.demos import LibraryRecorder
    from robot_wm.learning.stack_eval import PlantCheck, _run_episode, build_stack
    from robot_wm.sim import load_profile

    task = get_task(task_name)
    prof = load_profile(profile)
    dt = task.control_dt_s
    built = build_stack(dt, set_dir, phase=Phase.MIXED, joint_calibration=joint_calibration)
    names = tuple(built.kinematics.joint_names)
    wm = WorldModelRunner(built.world_model_path, names, dt)
    predictor = WorldModelRunner(built.world_model_path, names, dt, analytic=False)
    policy = PolicyRunner(Path(set_dir) / "policy.onnx", names, dt, task.action_limit_radps, task=task.name)
    models = {"policy": policy.version, "world_model": wm.version}
    eps = task.episodes(max(indices) + 1, cfg.seed, description.initial_positions(names))
    check = PlantCheck(built.kinematics, built.limits)
    tool_max = built.limits.tool_speed_max_mps * built.limits.scale_for(TrustLevel.FULL, Phase.SIM).speed  # speed factor 1
    end_level = TrustLevel[cfg.end_level]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summaries = []
    base_ns = time.time_ns()
    if trust is None:
        trust = ContinuousTrust(built.kinematics, calibration, dt)
    else:
        trust.set_calibration(calibration)
    for i in tqdm(indices, desc=f"real episodes [{prof.name}, MIXED]", unit="episode", file=sys.stderr,
                  disable=not progress, leave=False):
        settled = trust.settle(prof, eps.q0_rad[i], predictor, seed=eps.sim_seed + i,
                               joint_calibration=built.joint_calibration)
        wm.reset()
        predictor.reset()
        trust.new_episode()
        tracker = trust
        path = out / f"{task.name}_{prof.name}_{i:04d}"
        with EpisodeBagWriter(path) as writer:
            rec = LibraryRecorder(writer, task, eps, i, names, dt, base_ns, tracker, predictor, phase=int(Phase.MIXED))
            level = lambda: rec.last_trust.level if rec.last_trust is not None else TrustLevel.FULL  # noqa: E731
            # the policy node in MIXED: its command scaled to the phase's and the level's speed (its own
            # limits are the simulator's), its slew limit the phase's (build_stack)
            speed = lambda: trust_scales(built.limits, level(), Phase.MIXED, base_phase=Phase.SIM)[0]  # noqa: E731
            actor = ExploringPolicy(policy, predictor, cfg if explore else dataclasses.replace(cfg, exploration_std=0.0),
                                    task.action_limit_radps, dt, seed=cfg.seed * 100_003 + i, trust_level=level,
                                    speed_factor=speed, kinematics=built.kinematics, tool_speed_max_mps=tool_max)

            guard = EpisodeGuard(end_level)
            ep = _run_episode(actor, prof, built, wm, check, task, eps, i, 1, recorder=rec,
                              end_early=lambda res: guard(res, rec.last_trust), fault=fault)
            u = np.array([x[0] for x in actor.log]) if actor.log else np.zeros(0)
            s = np.array([x[1] for x in actor.log]) if actor.log else np.zeros(0)
            summary = {"index": i, "round": round_index, "success": bool(ep["success"]), "ended": ep["ended"],
                       "trust_settle_s": round(settled, 2),
                       "periods": int(ep["periods"]), "tracking_rms_m": _metric(ep), "filter_periods": int(ep["interventions"]),
                       "violations": {k: int(v) for k, v in ep["violations"].items()},
                       "exploration": {"enabled": bool(explore), "std_fraction": cfg.exploration_std if explore else 0.0,
                                       "uncertainty_median_radps": _r(np.median(u)) if u.size else None,
                                       "scale_mean": _r(s.mean()) if s.size else None,
                                       "share_off": _r(np.mean(s <= 0.0)) if s.size else None,
                                       "trust_full_share": _r(np.mean([x[2] == 0 for x in actor.log])) if s.size else None}}
            meta = EpisodeMeta(task=task.name, robot=prof.name, source="policy", success=bool(ep["success"]),
                               error_m=rec.error, interventions=0, filter_interventions=int(ep["interventions"]),
                               start_ns=rec.ns(rec.t_task), end_ns=rec.end_ns, dt_s=dt, joint_names=list(names),
                               models=models, index=i, library=True,
                               extra={"seed": cfg.seed, "phase": "MIXED", "mixed": summary})
            writer.close(meta)
        summaries.append(summary)
        base_ns = rec.end_ns + 1_000_000_000
    return summaries


def _metric(ep: dict) -> float | None:
    m = ep["metrics"]
    v = m.get("tracking_rms_m", m.get("final_error_m"))
    return _r(v) if v is not None and np.isfinite(v) else None


def _r(x, digits: int = 6):
    return None if x is None or not np.isfinite(x) else round(float(x), digits)
