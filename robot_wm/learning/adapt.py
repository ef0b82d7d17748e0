"""``robot-wm adapt``: carry a model set across the sim-to-real gap with recorded demonstrations.

Given a base model set (world model + policy, e.g. the shipped domain-randomized one) and a
directory of demonstration bags from the real arm (``robot-wm record``):

1. **Load** the demonstrations (``robot_wm.learning.demos.load_demos``: every bag checked, resampled
   on the control period) and split them **by episode** into training and held-out episodes.
2. **Fine-tune the world model** from the base set's weights (read back from its ONNX graph and
   checked against it: ``world_model_from_onnx``): the Gaussian NLL of the ensemble on batches that
   are ``demo_share`` demonstration transitions and the rest **replayed simulator data** (a fresh
   domain-randomized collection, so that the model does not forget the states the demonstrations
   never visit), early-stopped per member on the held-out real episodes.
3. **Recalibrate its uncertainty** on the held-out real episodes: one variance scale per state
   component so that the 90 % interval covers 90 % of the held-out one-step errors (the scale is
   part of the exported graph: the filter and the trust monitor see calibrated variances).
4. **Fine-tune the policy inside the adapted model's imagination** with the same limit-aware
   actor-critic as ``robot-wm train policy``, starting from the base policy's actor (read back from
   its ONNX graph, checked), a fresh critic warmed up first, imagined rollouts starting from the
   recorded real states.
5. **Export** both (ONNX + sidecars with the lineage: the parent set, the demonstrations' bag
   hashes, the replay data's hash, the command) and **evaluate**: the world model's one-step errors
   and interval coverage on the held-out real episodes before and after; the whole stack
   (``eval --stack``) on the recorded profile before and after, when the demonstrations come from
   a simulator profile.

The numbers go to a JSON report (``adapt.json`` in the output set) and a PNG. Torch runs here only;
the nodes run the exported ONNX files.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robot_wm.learning.data import Dataset
from robot_wm.learning.world_model import WorldModel
from robot_wm.learning.onnx_import import AdaptError, policy_from_onnx, world_model_from_onnx  # noqa: F401
from robot_wm.learning.world_model_training import _gaussian_nll, make_transitions

Z90 = 1.6448536269514722
SIM_CHECK_TRANSITIONS = 6400  # randomized simulator transitions on which forgetting is measured


@dataclass(frozen=True)
class AdaptConfig:
    """Settings of ``adapt`` (config/training.yaml, section ``adapt``)."""

    holdout_fraction: float = 0.2  # share of the demonstration EPISODES for validation (early stopping,
    #                                recalibration, policy validation; at least one)
    test_fraction: float = 0.2  # share held out for the report only (at least one; never trained or tuned on)
    wm_epochs: int = 40  # upper bound; one epoch = the demonstration transitions once (plus replay)
    wm_lr: float = 3e-4
    wm_batch: int = 256  # per member
    wm_patience: int = 6
    demo_share: float = 0.5  # share of each batch drawn from the demonstrations (rest: simulator replay)
    replay_transitions: int = 25_600  # simulator replay collected for the run (0: no replay)
    recalibrate: bool = True
    policy_iterations: int = 300
    policy_actor_lr: float = 1e-4
    critic_warmup: int = 50  # iterations that train the fresh critic before the actor moves
    validate_every: int = 25  # policy iterations between two validations (the best actor is kept)
    validation_horizon: int = 0  # periods of each imagined validation rollout (0: 60 for track, 150 for reach)
    real_start_fraction: float = 1.0  # imagination starts from recorded real states (rest: replay)
    eval_episodes: int = 32
    eval_seed: int = 1000  # not the demonstrations' seed: the evaluation paths are new
    threads: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("holdout_fraction", "test_fraction"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"adapt.{name}={getattr(self, name)}: expected a value in (0, 1)")
        if self.holdout_fraction + self.test_fraction >= 1.0:
            raise ValueError(f"adapt.holdout_fraction + test_fraction = {self.holdout_fraction + self.test_fraction}: "
                             f"expected < 1 (episodes must be left to train on)")
        if not 0.0 < self.demo_share <= 1.0:
            raise ValueError(f"adapt.demo_share={self.demo_share}: expected a value in (0, 1]")
        for name in ("wm_epochs", "wm_batch", "wm_patience", "threads", "validate_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"adapt.{name}={getattr(self, name)}: expected an integer >= 1")
        for name in ("replay_transitions", "policy_iterations", "critic_warmup", "eval_episodes", "seed",
                     "validation_horizon"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"adapt.{name}={getattr(self, name)}: expected an integer >= 0")
        if not 0.0 <= self.real_start_fraction <= 1.0:
            raise ValueError(f"adapt.real_start_fraction={self.real_start_fraction}: expected a value in [0, 1]")


# ------------------------------------------------------------------------------ world model
@dataclass
class FinetuneReport:
    epochs_run: int
    best_epoch: list[int]
    initial_holdout_nll: float
    best_holdout_nll: list[float]
    holdout_nll: list[float] = field(default_factory=list)
    variance_scale: list[float] | None = None
    seconds: float = 0.0


def finetune_world_model(model: WorldModel, train: Dataset, hold: Dataset, replay: Dataset | None, cfg: AdaptConfig,
                         progress: bool = True, on_batch=None) -> tuple[WorldModel, FinetuneReport]:
    """Fine-tune a copy of ``model`` on ``train`` (+ ``replay``), early-stopped on ``hold`` (see the module docstring).

    ``on_batch(busy_s) -> bool``: called after each batch with the seconds it took (the online
    learner sleeps there to cap its CPU); False ends the training after this epoch's batch (a time
    budget), keeping the best state so far.
    """
    from tqdm import tqdm

    started = time.perf_counter()
    model = copy.deepcopy(model).train()
    gen = torch.Generator().manual_seed(cfg.seed)
    h, k = model.action_history, model.config.qdot_history

    def normalized(data: Dataset):
        tr = make_transitions(data, h, k)
        x = (model.features(*tr.inputs()) - model.feature_mean) / model.feature_std
        y = (tr.delta() - model.delta_mean) / model.delta_std
        return x.detach(), y.detach()

    x_demo, y_demo = normalized(train)
    x_hold, y_hold = normalized(hold)
    x_rep, y_rep = normalized(replay) if replay is not None and cfg.demo_share < 1.0 else (None, None)
    m, bs = model.members, cfg.wm_batch
    n_demo_b = bs if x_rep is None else max(1, int(round(cfg.demo_share * bs)))
    n_rep_b = bs - n_demo_b
    batches = max(1, int(math.ceil(x_demo.shape[0] / n_demo_b)))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.wm_lr)

    def hold_nll() -> torch.Tensor:
        with torch.no_grad():
            mean, logvar = model.members_normalized(x_hold)
            return _gaussian_nll(mean, logvar, y_hold)

    model.eval()
    best = hold_nll()
    report = FinetuneReport(0, [0] * m, float(best.mean()), best.tolist())
    best_state = copy.deepcopy(model.state_dict())
    stale = 0
    bar = tqdm(range(1, cfg.wm_epochs + 1), desc="adapt world model", unit="epoch", disable=not progress, file=sys.stderr)
    out_of_time = False
    for epoch in bar:
        model.train()
        for _ in range(batches):
            batch_started = time.perf_counter()
            idx = torch.randint(0, x_demo.shape[0], (m, n_demo_b), generator=gen)
            xb, yb = x_demo[idx], y_demo[idx]
            if n_rep_b:
                ridx = torch.randint(0, x_rep.shape[0], (m, n_rep_b), generator=gen)
                xb, yb = torch.cat([xb, x_rep[ridx]], 1), torch.cat([yb, y_rep[ridx]], 1)
            mean, logvar = model.members_normalized(xb)
            loss = _gaussian_nll(mean, logvar, yb).sum()
            loss = loss + model.config.logvar_bound_weight * (model.max_logvar.sum() - model.min_logvar.sum())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if on_batch is not None and not on_batch(time.perf_counter() - batch_started):
                out_of_time = True
                break
        model.eval()
        nll = hold_nll()
        improved = nll < best
        if improved.any():
            for key, value in model.named_parameters():
                best_state[key][improved] = value.detach()[improved]
            for i in torch.nonzero(improved).flatten().tolist():
                report.best_epoch[i] = epoch
            best = torch.where(improved, nll, best)
            stale = 0
        else:
            stale += 1
        report.holdout_nll.append(float(nll.mean()))
        report.epochs_run = epoch
        bar.set_postfix(holdout_nll=f"{float(nll.mean()):.3f}")
        if stale >= cfg.wm_patience or out_of_time:
            break
    bar.close()
    model.load_state_dict(best_state)
    model.eval()
    report.best_holdout_nll = best.tolist()
    if cfg.recalibrate:
        scale = variance_scale(model, hold)
        model.set_variance_scale(scale)
        report.variance_scale = [round(float(s), 4) for s in scale]
    report.seconds = round(time.perf_counter() - started, 2)
    return model, report


def variance_scale(model: WorldModel, hold: Dataset) -> torch.Tensor:
    """Per state component s: the 90 % interval of variance s·(epistemic + aleatoric) covers 90 %
    of the held-out one-step errors (s = (q90 |z| / 1.645)², z the standardized error)."""
    tr = make_transitions(hold, model.action_history, model.config.qdot_history)
    previous = model.variance_scale_or_none()
    model.set_variance_scale(None)
    with torch.no_grad():
        p = model.predict(*tr.inputs())
    model.set_variance_scale(previous)
    mean = torch.cat([p.next_q_rad, p.next_qdot_radps], -1)
    truth = torch.cat([tr.next_q_rad, tr.next_qdot_radps], -1)
    z = ((truth - mean).abs() / torch.sqrt(p.epistemic_var + p.aleatoric_var).clamp_min(1e-12)).double()
    q90 = torch.quantile(z, 0.9, dim=0)
    return ((q90 / Z90) ** 2).clamp(1e-2, 1e4).float()


# ------------------------------------------------------------------------------ policy validation
class ImaginedTracking:
    """The policy fine-tune's validation: a deterministic actor's mean tracking error (m) in the
    adapted world model (ensemble mean), ``horizon`` periods from fixed states of the validation
    episodes (with the commands before them), on fixed reference paths passing near the start tool
    position (reach: fixed goals in the task's box, the distance over the last third), with the
    stack's one-period delay between a nominal and the period that executes it. Lower is better;
    the same starts and targets for every call."""

    def __init__(self, wm: WorldModel, data: Dataset, task, fk, *, n: int = 256, horizon: int = 60, seed: int = 0) -> None:
        from robot_wm.learning.pipeline import WorldModelDynamics

        rng = np.random.default_rng(seed)
        h = wm.action_history
        ep = rng.integers(0, data.n_episodes, n)
        t = rng.integers(h, data.n_steps - 1, n)
        self.q = torch.as_tensor(data.q_rad[ep, t], dtype=torch.float32)
        self.qd = torch.as_tensor(data.qdot_radps[ep, t], dtype=torch.float32)
        # the commands before period t, and the one period t executes (the nominal made at t-1)
        self.hist = torch.as_tensor(np.stack([data.action_radps[ep, t - h + 1 + k] for k in range(h - 1)], 1), dtype=torch.float32) \
            if h > 1 else torch.zeros(n, 0, data.action_radps.shape[-1])
        self.in_flight = torch.as_tensor(data.action_radps[ep, t], dtype=torch.float32)
        self.fk, self.task, self.horizon = fk, task, horizon
        self.dyn = WorldModelDynamics(wm, member="mean")
        self.goals = None
        if not hasattr(task, "preview_s"):  # reach: goals anywhere in the task's box, judged once there
            lo, hi = np.asarray(task.goal_box_min_m), np.asarray(task.goal_box_max_m)
            self.goals = torch.as_tensor(rng.uniform(lo, hi, (n, 3)), dtype=torch.float32)
            return
        dt = task.control_dt_s
        offsets = np.asarray(task.preview_s, dtype=float)
        paths = task.sample_paths(rng, n)
        t0 = rng.uniform(task.lead_in_s + task.ramp_s, task.episode_s - horizon * dt, size=n)  # on the moving path
        times = t0[:, None, None] + np.arange(horizon + 1)[None, :, None] * dt + offsets[None, None, :]
        refs = np.stack([paths.position(i, times[i]) for i in range(n)])
        with torch.no_grad():
            tool0 = fk(self.q).numpy()
        shift = tool0 + 0.003 * rng.standard_normal((n, 3)) - refs[:, 0, 0]  # the arm a few mm off the path
        self.refs = torch.as_tensor(refs + shift[:, None, None, :], dtype=torch.float32)

    @torch.no_grad()
    def __call__(self, actor) -> float:
        from robot_wm.contracts import join_obs

        q, qd, hist, pending = self.q, self.qd, self.hist, self.in_flight
        tool = self.fk(q)
        errors = []
        for k in range(self.horizon):
            target = self.goals if self.goals is not None else self.refs[:, k].reshape(q.shape[0], -1)
            action = actor(join_obs(q, qd, tool, target, xp=torch))
            actions = torch.cat([hist, pending.unsqueeze(1)], 1)  # this period executes the previous nominal
            q, qd, _ = self.dyn.step(q, qd, actions)
            hist, pending = actions[:, 1:], action
            tool = self.fk(q)
            goal = self.goals if self.goals is not None else self.refs[:, k + 1, 0]
            errors.append(torch.linalg.norm(tool - goal, dim=-1))
        if self.goals is not None:  # reach: the distance over the last third (arrived and holding)
            return float(torch.stack(errors[-(self.horizon // 3):]).mean())
        return float(torch.stack(errors).mean())


# ------------------------------------------------------------------------------ the whole run
def _collect_replay(n: int, seed: int, progress: bool) -> Dataset | None:
    from robot_wm.core.task import load_task
    from robot_wm.learning.data import CollectConfig, collect, load_randomization
    from robot_wm.paths import config_path

    if n <= 0:
        return None
    ranges = load_randomization(config_path("training.yaml")) or None
    return collect(CollectConfig(transitions=n, seed=seed), load_task(), ranges, progress=progress)


def _stack_eval(models_dir: Path, task: str, profile: str, episodes: int, seed: int, joint_calibration=None) -> dict:
    from robot_wm import description
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.stack_eval import evaluate_stack

    t = get_task(task)
    names = description.joint_limits(description.expand()).names
    policy = PolicyRunner(Path(models_dir) / "policy.onnx", names, t.control_dt_s, t.action_limit_radps, task=task)
    rep = evaluate_stack(policy, profile, episodes, seed, task=t, models_dir=Path(models_dir),
                         joint_calibration=joint_calibration)
    d = rep.to_dict()
    keys = ("success_rate", "tracking_rms_m_median", "tracking_rms_m_p90", "tracking_max_m_median", "final_error_m_median",
            "intervention_rate", "violations")
    return {k: d[k] for k in keys if k in d} | {"episodes": episodes, "seed": seed, "wall_s": round(rep.wall_s, 1)}


def adapt(task: str, demos: Path, base: Path, out: Path, cfg: AdaptConfig = AdaptConfig(), *,
          evaluate: bool = True, progress: bool = True, command: str = "", joint_calibration=None) -> dict[str, Any]:
    """Run the whole adaptation (module docstring); returns the report (also ``out/adapt.json``).
    ``joint_calibration``: the driver's joint calibration for the stack evaluation on the demos'
    profile (the one the demos were recorded through; the nominal reference has no offsets)."""
    from robot_wm import description
    from robot_wm.bags import BagError
    from robot_wm.core.onnx_model import read_sidecar
    from robot_wm.learning.demos import load_demos
    from robot_wm.learning.pipeline import WorldModelDynamics
    from robot_wm.learning.policy import export_policy, train_policy
    from robot_wm.learning.torch_kinematics import TorchToolFK
    from robot_wm.learning.world_model import export_world_model
    from robot_wm.learning.world_model_eval import evaluate_world_model
    from robot_wm.core.tasks import get_task
    from robot_wm.sim import ProfileError, load_profile

    wall0, cpu0 = time.perf_counter(), time.process_time()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        base, out = Path(base), Path(out)
        data, metas, shas = load_demos(demos, task=task)
        if evaluate and cfg.eval_episodes > 0:
            _check_demo_calibration(metas, joint_calibration)
        train, hold, test = split_episodes(data, cfg, demos)
        robots = sorted(set(data.profiles))
        base_wm = world_model_from_onnx(base / "world_model.onnx")
        actor, pcfg, pside = policy_from_onnx(base / "policy.onnx", task)
        if tuple(base_wm.joint_names) != tuple(data.joint_names) or abs(base_wm.dt_s - data.dt_s) > 1e-9:
            raise AdaptError(f"{base}: world model for joints {base_wm.joint_names} at {base_wm.dt_s} s; the demos "
                             f"are {data.joint_names} at {data.dt_s} s")
        replay = _collect_replay(cfg.replay_transitions, cfg.seed + 7, progress)
        wm, wm_report = finetune_world_model(base_wm, train, hold, replay, cfg, progress)
        wm_before = evaluate_world_model(base_wm, test, horizons=(10, 50))  # episodes nothing was fit or tuned on
        wm_after = evaluate_world_model(wm, test, horizons=(10, 50))
        # forgetting: the same models on randomized simulator episodes neither saw (another seed)
        sim_check = _collect_replay(SIM_CHECK_TRANSITIONS, cfg.seed + 11, False)
        sim_before = evaluate_world_model(base_wm, sim_check, horizons=(10,))["one_step"]
        sim_after = evaluate_world_model(wm, sim_check, horizons=(10,))["one_step"]
        t_wm = time.perf_counter() - wall0

        urdf = description.expand()
        names = description.joint_limits(urdf).names
        spec = get_task(task).spec
        starts = train if replay is None or cfg.real_start_fraction >= 1.0 else _mix_starts(train, replay, cfg)
        pol_report = None
        new_actor = actor
        if cfg.policy_iterations > 0:
            policy_cfg = dataclasses.replace(pcfg, iterations=cfg.policy_iterations, actor_lr=cfg.policy_actor_lr,
                                             seed=cfg.seed)
            fk = TorchToolFK(urdf, names)
            horizon = cfg.validation_horizon or (60 if task == "track" else 150)
            validate = ImaginedTracking(wm, hold, spec, fk, seed=cfg.seed, horizon=horizon)
            new_actor, pol_report = train_policy(policy_cfg, WorldModelDynamics(wm), fk, starts,
                                                 spec, description.initial_positions(names), progress=progress,
                                                 init_actor=actor, critic_warmup=cfg.critic_warmup,
                                                 validate=validate, validate_every=cfg.validate_every)
        else:
            policy_cfg = pcfg
        train_wall, train_cpu = time.perf_counter() - wall0, time.process_time() - cpu0

        out.mkdir(parents=True, exist_ok=True)
        lineage_sha = _lineage_sha(shas, replay)
        wm_side = read_sidecar(base / "world_model.onnx")
        wm_path = export_world_model(wm, out / "world_model.onnx", lineage_sha,
                                     metrics={"adapt": {"holdout_before": wm_before["one_step"], "holdout_after": wm_after["one_step"],
                                                        "coverage90_before": wm_before["calibration"]["coverage90"],
                                                        "coverage90_after": wm_after["calibration"]["coverage90"]},
                                              "command": command},
                                     version=f"wm-{lineage_sha[:8]}-s{cfg.seed}-{{onnx_sha8}}", training_command=command)
        _add_lineage(wm_path, wm_side.get("version"), shas, replay, metas)
        pol_path = export_policy(new_actor, out / "policy.onnx", joint_names=names, task=spec,
                                 dataset_sha256=lineage_sha, version=f"policy-{lineage_sha[:8]}-s{cfg.seed}-{{onnx_sha8}}",
                                 metrics={"adapt_imagined_final_distance_m": pol_report.final_imagined_distance_m
                                          if pol_report else None},
                                 config=policy_cfg, training_command=command)
        _add_lineage(pol_path, pside.get("version"), shas, replay, metas)

        report: dict[str, Any] = {
            "task": task, "demos": str(demos), "episodes": data.n_episodes, "train_episodes": train.n_episodes,
            "holdout_episodes": hold.n_episodes, "test_episodes": test.n_episodes, "robots": robots, "sources": sorted({m.source for m in metas}),
            "base": str(base), "out": str(out),
            "base_versions": {"world_model": wm_side.get("version"), "policy": pside.get("version")},
            "versions": {"world_model": read_sidecar(wm_path)["version"], "policy": read_sidecar(pol_path)["version"]},
            "world_model": {"before": wm_before, "after": wm_after, "finetune": dataclasses.asdict(wm_report),
                            "simulator_before": sim_before, "simulator_after": sim_after},
            "policy": dataclasses.asdict(pol_report) if pol_report else None,
            "config": dataclasses.asdict(cfg),
            "timing": {"world_model_wall_s": round(t_wm, 1), "train_wall_s": round(train_wall, 1),
                       "train_cpu_s": round(train_cpu, 1), "threads": cfg.threads},
            "demo_bag_sha256": shas,
            "replay_sha256": replay.sha256 if replay is not None else None,
        }
        if evaluate and cfg.eval_episodes > 0:
            stack: dict[str, Any] = {}
            for robot in robots:
                try:
                    load_profile(robot)
                except ProfileError:
                    stack[robot] = {"skipped": f"{robot!r} is not a simulator profile (hardware): evaluate on the arm"}
                    continue
                stack[robot] = {"before": _stack_eval(base, task, robot, cfg.eval_episodes, cfg.eval_seed,
                                                      joint_calibration),
                                "after": _stack_eval(out, task, robot, cfg.eval_episodes, cfg.eval_seed,
                                                     joint_calibration)}
                if joint_calibration is not None:
                    stack[robot]["joint_calibration"] = str(joint_calibration)
            stack["nominal_reference"] = _stack_eval(base, task, "nominal", cfg.eval_episodes, cfg.eval_seed)
            report["stack"] = stack
        report["timing"]["total_wall_s"] = round(time.perf_counter() - wall0, 1)
        (out / "adapt.json").write_text(json.dumps(report, indent=1, default=_json_default))
        return report
    except BagError:
        raise
    finally:
        torch.set_num_threads(previous_threads)


def _check_demo_calibration(metas, joint_calibration) -> None:
    """The stack evaluation runs behind the joint calibration the demos were recorded through
    (``extra.joint_calibration`` of library bags): refused, naming both, when it is another."""
    from robot_wm.core import joint_calibration as jc

    given = None
    if joint_calibration is not None:
        cal = joint_calibration if hasattr(joint_calibration, "offset_rad") else jc.load(joint_calibration)
        given = {j: round(float(o), 7) for j, o in zip(cal.joint_names, cal.offset_rad)}
    for meta in metas:
        recorded = (meta.extra or {}).get("joint_calibration")
        if meta.library and recorded != given and (recorded or given):
            raise AdaptError(f"demo {meta.robot} #{meta.index} was recorded behind joint calibration {recorded}, the "
                             f"evaluation would run behind {given}: pass the --joint-calibration the demos were recorded "
                             "with (or none)")


def split_episodes(data: Dataset, cfg: AdaptConfig, where) -> tuple[Dataset, Dataset, Dataset]:
    """(train, validation, test) by episode: validation for early stopping, the variance scale and
    the policy's validation; test only for the report. At least one episode each."""
    n = data.n_episodes
    if n < 3:
        raise AdaptError(f"{where}: {n} demonstration(s): adapt needs at least 3 (train, validation, test)")
    order = np.random.default_rng(cfg.seed).permutation(n)
    n_val = min(max(1, int(round(cfg.holdout_fraction * n))), n - 2)
    n_test = min(max(1, int(round(cfg.test_fraction * n))), n - 1 - n_val)
    return (data.subset(np.sort(order[n_val + n_test:])), data.subset(np.sort(order[:n_val])),
            data.subset(np.sort(order[n_val:n_val + n_test])))


def _mix_starts(data: Dataset, replay: Dataset, cfg: AdaptConfig) -> Dataset:
    """Start states: real episodes plus a share of replay episodes cropped to the same length."""
    n_rep = int(round(data.n_episodes * (1 - cfg.real_start_fraction) / max(cfg.real_start_fraction, 1e-6)))
    t = min(data.n_steps, replay.n_steps)
    crop = lambda d, idx: Dataset(d.q_rad[idx, :t + 1], d.qdot_radps[idx, :t + 1], d.action_radps[idx, :t],  # noqa: E731
                                  d.tool_m[idx, :t + 1], d.joint_names, d.dt_s, tuple(d.profiles[i] for i in idx))
    return Dataset.concatenate([crop(data, np.arange(data.n_episodes)),
                                crop(replay, np.arange(min(n_rep, replay.n_episodes)))])


def _lineage_sha(bag_shas: list[str], replay: Dataset | None) -> str:
    import hashlib

    digest = hashlib.sha256()
    for s in sorted(bag_shas):
        digest.update(s.encode())
    digest.update((replay.sha256 if replay is not None else "no-replay").encode())
    return digest.hexdigest()


def _add_lineage(onnx_path: Path, parent: str | None, shas: list[str], replay: Dataset | None, metas) -> None:
    """The sidecar's lineage block: the parent version, the data it was adapted on."""
    side_path = onnx_path.with_suffix(".json")
    side = json.loads(side_path.read_text())
    side["lineage"] = {"parent_version": parent, "demo_bag_sha256": sorted(shas),
                       "demo_robots": sorted({m.robot for m in metas}),
                       "replay_dataset_sha256": replay.sha256 if replay is not None else None}
    side_path.write_text(json.dumps(side, indent=2))


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(type(x).__name__)
