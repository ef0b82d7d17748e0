"""``robot-wm train mixed``: the policy keeps learning on the arm it will run on (the MIXED phase).

The seed's second mechanism: in the MIXED phase the policy alternates real episodes — run by the
stack (policy → slew limit → safety filter with its world model → arm) with the phase's reduced
limits, the trust monitor watching, an operator standing by — with training in the world model's
imagination. ``adapt`` fixes the world model once from demonstrations; this loop goes on:

1. **Real episodes** (a round of ``real_per_round``), each recorded as a demonstration bag
   (``robot_wm.bags``, source ``policy``, the round and exploration in its metadata). The policy
   explores with temporally correlated noise (Ornstein-Uhlenbeck) **bounded by the world model's
   uncertainty** (``exploration_scale``): full where the model's epistemic std of the next joint
   velocities is below ``uncertainty_low_radps``, falling linearly to zero at
   ``uncertainty_high_radps`` and off above (conservative: the deterministic policy alone); the
   trust level applies on top (FULL 1, CAUTIOUS 0.5, lower 0). **An intervention** (the filter
   stops or latches the arm) **or a trust drop** (to SLOW or lower from a better level: the
   monitor starts low and climbs after its clean hold times) **ends the episode**; the
   bag says why (``extra.ended``) and the episode counts as failed.
2. **The world model** is fine-tuned from the current one on every real episode so far (cut into
   windows of ``window_steps`` periods, so an episode that ended early is used too) plus simulator
   replay, early-stopped and its variances recalibrated on the validation episodes (every fifth
   one, fixed for the run: never trained on), as ``adapt`` does. A round whose usable episodes do
   not give both yet (interventions ended them early) trains nothing (``skipped`` says why); the
   next round trains on them too.
3. **The trust calibration** of the new world model is made from the real bags (conformal
   quantiles at ``calibration_exceedance``: with a few minutes of data it cannot rest on
   config/trust.yaml's 1e-4, which needs five; a larger exceedance gives lower thresholds, more
   alarms, never fewer).
4. **The policy** trains by the same limit-aware actor-critic as ``adapt`` in the new model's
   imagination, from the real states (the real transitions as imagination's starts and as the
   model's data), for ``I/R`` imagination episodes per real episode (``--ratio R:I``; one
   imagination episode is one batch of imagined rollouts, 256 × 20 periods), the critic kept
   across rounds. The update is **accepted** only when an imagined tracking validation on the
   validation episodes' states improves on the round's starting actor; else the round keeps
   the previous policy with the new world model.
5. Every round's set (world model, policy, trust calibration) is written to
   ``OUT/rounds/rNNN`` with its lineage and, with ``register``, added to the model registry;
   ``OUT/mixed.json`` is rewritten atomically after each round, so a killed run resumes from the
   last finished round (the real episodes of an unfinished round are kept: complete bags count,
   an interrupted one is moved to ``OUT/interrupted``).

The run never leaves the MIXED phase: promotion stays an operator's decision, with the run's
numbers (``mixed.json``) as evidence. ``robot_wm.learning.mixed_episodes`` runs the real episodes on the library-mode
simulator (``--library --profile P``): the same core objects the nodes run, much faster than
real time.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from robot_wm.learning.mixed_episodes import (  # noqa: F401 - the verb's public names live here too
    ContinuousTrust, EpisodeGuard, ExploringPolicy, MixedConfig, MixedError, _r, exploration_scale,
    imagination_episodes, parse_ratio, run_real_episodes)

STATE_FILE = "mixed.json"


# ------------------------------------------------------------------------------ training data
def load_windows(bag_paths: list[Path], task: str, window: int, problems: list[str] | None = None):
    """The real episodes as one ``Dataset`` of windows of ``window`` periods (the last window of an
    episode ends at its end); episodes shorter than a window are left out and counted. With
    ``problems``, a bag the loader refuses (a live episode with a hole in its joint states: a
    stalled machine) is left out too and its reason appended there; without, it raises."""
    from robot_wm.bags import BagError
    from robot_wm.learning.data import Dataset
    from robot_wm.learning.demos import load_demos

    parts, short = [], 0
    for p in bag_paths:
        try:
            data, _, _ = load_demos([p], task=task)
        except BagError as exc:
            if problems is None:
                raise
            problems.append(str(exc))
            short += 1
            continue
        steps = data.n_steps
        if steps < window:
            short += 1
            continue
        starts = list(range(0, steps - window + 1, window))
        if starts[-1] != steps - window:
            starts.append(steps - window)
        for s in starts:
            parts.append(Dataset(data.q_rad[:, s:s + window + 1], data.qdot_radps[:, s:s + window + 1],
                                 data.action_radps[:, s:s + window], data.tool_m[:, s:s + window + 1],
                                 data.joint_names, data.dt_s, data.profiles))
    return (Dataset.concatenate(parts) if parts else None), short


def _long_enough(bag_paths: list[Path], window: int) -> list[Path]:
    """The bags with at least one training window (an episode that ended sooner is kept on disk
    and in the report, but gives no window)."""
    from robot_wm import bags

    out = []
    for p in bag_paths:
        meta = bags.read_meta(p)
        if meta.duration_s / meta.dt_s + 1e-6 >= window:
            out.append(p)
    return out


def split_bags(bag_paths: list[Path], every: int) -> tuple[list[Path], list[Path]]:
    """(training, validation) bags: the episode index decides, so the split never changes in a run
    (when no validation episode is usable yet, the last training one validates)."""
    from robot_wm import bags

    train, val = [], []
    for p in bag_paths:
        (val if bags.read_meta(p).index % every == every - 1 else train).append(p)
    if not val and len(train) > 1:
        val.append(train.pop())
    return train, val


def calibrate(bag_dir: Path, world_model: Path, exceedance: float, task: str, out: Path,
              inherit_from: Path | None = None) -> str:
    """The trust calibration of ``world_model`` from the bags of ``bag_dir`` (conformal quantiles
    at ``exceedance``), written to ``out``. Too little operation for that: ``inherit_from``'s
    thresholds re-issued for the new model (its variances were recalibrated on the real episodes,
    so the normalized signals carry over, as the online learner's do); None: MixedError.
    Returns what was done, for the report."""
    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.core.trust.settings import load_trust_config
    from robot_wm.learning.bag_calibration import needed_seconds, replay_run
    from robot_wm.learning.trust_eval import calibrate_run

    config, settings = load_trust_config(None)
    skipped: list[str] = []
    run, version, n = replay_run(bag_dir, world_model, config, task=task, skipped=skipped,
                                 command_timeout_s=settings.command_timeout_s)
    n -= len(skipped)
    seconds = float(len(run.t_s) * 0.01)
    out.parent.mkdir(parents=True, exist_ok=True)
    if seconds < needed_seconds(exceedance):
        short = (f"{bag_dir}: {n} episode(s), {seconds:.0f} s: a calibration at exceedance {exceedance:g} needs "
                 f"{needed_seconds(exceedance):.0f} s")
        if inherit_from is None:
            raise MixedError(short)
        doc = json.loads(Path(inherit_from).read_text())
        doc["source"] = (f"inherited from {doc.get('model_version')} ({doc.get('source')}) by train mixed: {short}; the "
                         f"new model's variances were recalibrated on the real episodes")
        doc["model_version"] = version
        out.write_text(json.dumps(doc, indent=2) + "\n")
        calib_io.load(out, version)  # still a valid calibration
        return f"inherited ({short})"
    cal = calibrate_run(run, exceedance, settings.floor_map(), config, model_version=version,
                        source=f"train-mixed:{bag_dir.name}:{n}ep:{seconds:.0f}s:exceedance{exceedance:g}")
    calib_io.save(cal, out)
    left_out = f"; left out: {'; '.join(skipped)}" if skipped else ""
    return f"calibrated on {n} real episodes ({seconds:.0f} s) at exceedance {exceedance:g}{left_out}"


# ------------------------------------------------------------------------------ the loop
def train_mixed(task: str, base: Path, out: Path, profile: str, real_episodes: int, cfg: MixedConfig,
                adapt_cfg=None, *, ratio: str | None = None, register: bool = False, evaluate: bool = True,
                progress: bool = True, command: str = "", stop_after_rounds: int | None = None,
                arm=None, joint_calibration=None) -> dict[str, Any]:
    """Run (or resume) the loop of the module docstring until ``real_episodes`` real episodes are
    done; returns the report (also ``out/mixed.json``). ``stop_after_rounds``: end after that many
    rounds in this call (the state is kept: a later call resumes). ``arm``: a running stack
    (``robot_wm.learning.mixed_live.LiveArm``; ``profile`` is then the arm's name, its trust
    calibration's) instead of the library-mode simulator; every round's set is then registered and
    activated, so that the next round's episodes run it. ``joint_calibration``: library mode, the
    simulated arm driver's joint calibration (a file; part of the run's settings)."""
    import torch

    from robot_wm.core.atomic import write_json
    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.learning.adapt import AdaptConfig, _collect_replay, _json_default, finetune_world_model
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.onnx_import import policy_from_onnx, world_model_from_onnx
    from robot_wm.learning.stack_eval import build_stack
    from robot_wm.sim import load_profile

    adapt_cfg = adapt_cfg or AdaptConfig()
    ratio = ratio or cfg.ratio
    parse_ratio(ratio)
    if real_episodes < 1:
        raise MixedError(f"--real-episodes {real_episodes}: expected >= 1")
    live = arm is not None
    register = register or live
    prof_name = Path(profile).stem if live else load_profile(profile).name
    base, out = Path(base).resolve(), Path(out)
    for f in ("world_model.onnx", "policy.onnx"):
        if not (base / f).is_file():
            raise MixedError(f"--base {base}: no {f} (a model set directory holds world_model.onnx and policy.onnx)")
    state_path = out / STATE_FILE
    args = {"task": task, "base": str(base), "profile": prof_name, "ratio": ratio, "config": dataclasses.asdict(cfg)}
    if live:
        args["live"] = True
    if joint_calibration is not None:
        if live:
            raise MixedError("--joint-calibration is for --library: a running stack's driver applies its own "
                             "(its joint_calibration_file parameter)")
        joint_calibration = str(Path(joint_calibration).resolve())
        jcal = build_stack(0.01, base, joint_calibration=joint_calibration).joint_calibration  # refused now, not after hours
        if jcal.robot and jcal.robot != prof_name:
            raise MixedError(f"--joint-calibration {joint_calibration} was measured on arm {jcal.robot!r}, not {prof_name!r}")
        # the file and what it held: a resume with another file, or this one changed, is another run
        args["joint_calibration"] = {"file": joint_calibration, "offset_rad": jcal.offset_rad.tolist()}
    if state_path.exists():
        state = json.loads(state_path.read_text())
        if state.get("args") != args:
            raise MixedError(f"{out}: holds a run with other settings ({state.get('args')}); resume it with those, "
                             f"or choose a new --out")
        if real_episodes < state["real_episodes_done"]:
            raise MixedError(f"{out}: {state['real_episodes_done']} real episodes already done (> --real-episodes "
                             f"{real_episodes})")
    elif out.exists() and any(out.iterdir()):
        raise MixedError(f"--out {out} exists, is not empty and holds no {STATE_FILE}: choose a new directory")
    else:
        out.mkdir(parents=True, exist_ok=True)
        state = {"args": args, "real_episodes_done": 0, "rounds": [], "current": str(base), "calibration_source": None,
                 "registered": None, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    state["real_episodes_target"] = int(real_episodes)
    real_dir, rounds_dir = out / "real", out / "rounds"
    _set_aside_interrupted(real_dir, out / "interrupted")
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(adapt_cfg.threads)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        current = Path(state["current"])
        cal_path = current / "trust" / f"{prof_name}.json"
        if live:
            arm.check(current, resume_set=state.get("registered"), reason=f"train mixed resumed ({out})")
            if not state["rounds"] and not cal_path.exists():
                cal_path = _live_calibration(task, prof_name, state)
            calibration = trust = None  # the graph's trust monitor watches the live episodes
        else:
            if not state["rounds"] and not cal_path.exists():
                cal_path = _base_calibration(task, prof_name, base, out, cfg, state, progress, joint_calibration)
            calibration = calib_io.load(cal_path, _wm_version(current))
            dt = get_task(task).control_dt_s
            trust = ContinuousTrust(build_stack(dt, current).kinematics, calibration, dt)
        replay = None
        critic = _load_critic(current)
        done_rounds = 0
        while state["real_episodes_done"] < real_episodes:
            if stop_after_rounds is not None and done_rounds >= stop_after_rounds:
                break
            r = len(state["rounds"]) + 1
            round_started, round_cpu = time.perf_counter(), time.process_time()
            done_bags = _bags(real_dir)
            have = {int(p.name.rsplit("_", 1)[1]) for p in done_bags}
            first = state["real_episodes_done"]
            n = min(cfg.real_per_round, real_episodes - first)
            indices = [k for k in range(first, first + n) if k not in have]
            episodes = [_bag_summary(p) for p in done_bags if first <= int(p.name.rsplit("_", 1)[1]) < first + n]
            if indices and live:
                episodes += arm.run_episodes(current, indices, real_dir, r)
            elif indices:
                episodes += run_real_episodes(task, prof_name, current, calibration, indices, real_dir, cfg,
                                              round_index=r, trust=trust, progress=progress,
                                              joint_calibration=joint_calibration)
            episodes.sort(key=lambda e: e["index"])
            t_real = time.perf_counter() - round_started

            # the world model, on every real episode so far
            all_bags = _bags(real_dir)
            usable = _long_enough(all_bags, cfg.window_steps)
            train_bags, val_bags = split_bags(usable, cfg.validation_every)
            unusable: list[str] | None = [] if live else None
            train, bad_train = load_windows(train_bags, task, cfg.window_steps, unusable)
            hold, bad_hold = load_windows(val_bags, task, cfg.window_steps, unusable)
            short = len(all_bags) - len(usable) + bad_train + bad_hold
            # every round starts from the set in force as exported (read back from its graphs, checked):
            # what the real episodes ran is what goes on training, and a resumed run is the same run
            if train is None or hold is None:  # collected, not trained: the next round trains on these too
                why = (f"too few usable real episodes to train on (training windows: {0 if train is None else train.n_episodes}, "
                       f"validation: {0 if hold is None else hold.n_episodes}; {short} episode(s) ended before "
                       f"{cfg.window_steps} periods; this round's: {[e.get('ended') or 'ran its length' for e in episodes]})")
                if progress:
                    print(f"round {r}: {why}: the set in force stays, the next round trains on them too", flush=True)
                row = _round_row(r, episodes, state["real_episodes_done"] + n, None, None, False, 0, current, t_real, 0.0,
                                 time.perf_counter() - round_started, time.process_time() - round_cpu, short, 0, 0)
                state["rounds"].append(dict(row, skipped=why))
                state["real_episodes_done"] += n
                write_json(state_path, json.loads(json.dumps(state, default=_json_default)))
                done_rounds += 1
                continue
            wm0 = world_model_from_onnx(current / "world_model.onnx")
            actor0, pcfg, _ = policy_from_onnx(current / "policy.onnx", task)
            round_dir = rounds_dir / f"r{r:03d}"
            if round_dir.exists():
                shutil.rmtree(round_dir)  # a round killed before it was recorded in the state
            round_dir.mkdir(parents=True)
            if replay is None:
                replay = _collect_replay(adapt_cfg.replay_transitions, adapt_cfg.seed + 7, progress)
            wm_cfg = dataclasses.replace(adapt_cfg, seed=adapt_cfg.seed + r)
            wm, wm_report = finetune_world_model(wm0, train, hold, replay, wm_cfg, progress)
            t_wm = time.perf_counter() - round_started - t_real

            # the policy, in the new model's imagination
            actor, accepted, pol = actor0, False, None
            iters = imagination_episodes(len(episodes), ratio)
            if iters > 0:
                actor, accepted, pol, critic = _train_policy_round(task, wm, actor0, pcfg, train, hold, adapt_cfg, iters,
                                                                   critic, seed=adapt_cfg.seed + r, progress=progress)
            _export_round(round_dir, task, wm, actor, pcfg, current, r, all_bags, replay, command, accepted, iters, ratio)
            if critic is not None:
                torch.save(critic, round_dir / "critic.pt")  # a state dict
            cal_note = calibrate(real_dir, round_dir / "world_model.onnx", cfg.calibration_exceedance, task,
                                 round_dir / "trust" / f"{prof_name}.json", inherit_from=cal_path)
            row = _round_row(r, episodes, state["real_episodes_done"] + n, wm_report, pol, accepted, iters, round_dir,
                             t_real, t_wm, time.perf_counter() - round_started, time.process_time() - round_cpu,
                             short, train.n_episodes, hold.n_episodes)
            row["trust_calibration"] = cal_note
            if unusable:
                row["unusable_bags"] = unusable
            if register:
                previous = state.get("registered")
                row["registry"] = _register(round_dir, task, current, state, row, command, activate=live)
                state["registered"] = row["registry"]["version"]
            state["rounds"].append(row)
            state["real_episodes_done"] += n
            state["current"] = str(round_dir.resolve())
            write_json(state_path, json.loads(json.dumps(state, default=_json_default)))
            if live:  # after the state: a run stopped here resumes with this round done, and puts its set in force
                arm.put_in_force(state["registered"], previous or "", f"train mixed round {r} ({out})")
            current = round_dir
            cal_path = current / "trust" / f"{prof_name}.json"
            calibration = None if live else calib_io.load(cal_path, _wm_version(current))
            done_rounds += 1
        finished = state["real_episodes_done"] >= real_episodes
        if finished:
            _publish(out, Path(state["current"]))
        state["timing"] = {"this_call_wall_s": round(time.perf_counter() - wall0, 1),
                           "this_call_cpu_s": round(time.process_time() - cpu0, 1), "threads": adapt_cfg.threads,
                           "rounds_wall_s": round(sum(x["seconds"]["total"] for x in state["rounds"]), 1),
                           "rounds_cpu_s": round(sum(x["seconds"]["cpu"] for x in state["rounds"]), 1)}
        state["summary"] = _summary(state)
        if finished and evaluate and adapt_cfg.eval_episodes > 0 and _is_profile(prof_name):
            from robot_wm.learning.adapt import _stack_eval

            state["stack"] = {
                "before": _stack_eval(base, task, prof_name, adapt_cfg.eval_episodes, adapt_cfg.eval_seed,
                                      joint_calibration),
                "after": _stack_eval(Path(state["current"]), task, prof_name, adapt_cfg.eval_episodes, adapt_cfg.eval_seed,
                                     joint_calibration),
                "nominal_reference": _stack_eval(base, task, "nominal", adapt_cfg.eval_episodes, adapt_cfg.eval_seed)}
        state["finished"] = finished
        write_json(state_path, json.loads(json.dumps(state, default=_json_default)))
        return state
    finally:
        torch.set_num_threads(torch_threads)


def _wm_version(set_dir: Path) -> str:
    from robot_wm.core.onnx_model import read_sidecar

    return read_sidecar(Path(set_dir) / "world_model.onnx")["version"]


def _bags(directory: Path) -> list[Path]:
    from robot_wm import bags

    if not directory.exists():
        return []
    complete, _ = bags.list_bags(directory)
    return sorted(complete)


def _set_aside_interrupted(real_dir: Path, aside: Path) -> None:
    """Bags a kill left unfinished are moved out of the training directory (kept, not used)."""
    from robot_wm import bags

    if not real_dir.exists():
        return
    _, broken = bags.list_bags(real_dir)
    for p in broken:
        aside.mkdir(parents=True, exist_ok=True)
        shutil.move(str(p), str(aside / p.name))


def _bag_summary(path: Path) -> dict:
    from robot_wm import bags

    meta = bags.read_meta(path)
    return dict(meta.extra.get("mixed") or {"index": meta.index, "success": meta.success})


def _base_calibration(task: str, profile: str, base: Path, out: Path, cfg: MixedConfig, state: dict, progress: bool,
                      joint_calibration=None) -> Path:
    """A trust calibration of the base world model for this arm: the set's, the package's, or one
    made from ``calibration_episodes`` episodes of the base policy without exploration."""
    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.learning.trust_eval import _recording_calibration, default_calibration_path

    version = _wm_version(base)
    for candidate in (base / "trust" / f"{profile}.json", default_calibration_path(profile, task)):
        try:
            calib_io.load(candidate, version)
        except Exception:  # noqa: BLE001 - missing, or made for another model: look further
            continue
        state["calibration_source"] = str(candidate)
        return candidate
    cal_dir = out / "calibration"
    have = len(_bags(cal_dir))
    if have < cfg.calibration_episodes:
        run_real_episodes(task, profile, base, _recording_calibration(version),
                          list(range(10_000 + have, 10_000 + cfg.calibration_episodes)), cal_dir, cfg, explore=False,
                          round_index=0, progress=progress, joint_calibration=joint_calibration)
    path = out / "calibration" / "trust" / f"{profile}.json"
    calibrate(cal_dir, base / "world_model.onnx", cfg.calibration_exceedance, task, path)
    state["calibration_source"] = f"{cfg.calibration_episodes} episodes of the base set without exploration ({path})"
    return path


def _load_critic(set_dir: Path):
    import torch

    path = Path(set_dir) / "critic.pt"
    return torch.load(path, weights_only=True) if path.exists() else None


def _train_policy_round(task: str, wm, actor0, pcfg, train, hold, adapt_cfg, iterations: int, critic_state, *, seed: int,
                        progress: bool):
    """One round's policy update; accepted only when the imagined tracking validation improves."""
    from robot_wm import description
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.adapt import ImaginedTracking
    from robot_wm.learning.pipeline import WorldModelDynamics
    from robot_wm.learning.policy import Critic, ObsNormalizer, task_layout, train_policy
    from robot_wm.learning.torch_kinematics import TorchToolFK

    urdf = description.expand()
    names = description.joint_limits(urdf).names
    spec = get_task(task).spec
    fk = TorchToolFK(urdf, names)
    policy_cfg = dataclasses.replace(pcfg, iterations=iterations, actor_lr=adapt_cfg.policy_actor_lr, seed=seed)
    critic = Critic(ObsNormalizer(actor0.norm.mean.numpy().astype(float), actor0.norm.std.numpy().astype(float),
                                  task_layout(spec)), policy_cfg.hidden)
    fresh = critic_state is None
    if not fresh:
        critic.load_state_dict(critic_state if isinstance(critic_state, dict) else critic_state.state_dict())
    warmup = min(adapt_cfg.critic_warmup, iterations // 2) if fresh else 0
    horizon = adapt_cfg.validation_horizon or (60 if task == "track" else 150)
    validate = ImaginedTracking(wm, hold, spec, fk, seed=seed, horizon=horizon)
    actor, report = train_policy(policy_cfg, WorldModelDynamics(wm), fk, train, spec, description.initial_positions(names),
                                 progress=progress, init_actor=copy.deepcopy(actor0), critic_warmup=warmup,
                                 validate=validate, validate_every=max(1, min(adapt_cfg.validate_every, iterations)),
                                 critic=critic)
    scores = [s for _, s in report.validation]
    accepted = len(scores) > 1 and min(scores) < scores[0]
    return (actor if accepted else actor0), accepted, report, critic.state_dict()


def _export_round(round_dir: Path, task: str, wm, actor, pcfg, parent: Path, r: int, bags_used: list[Path], replay,
                  command: str, accepted: bool, iterations: int, ratio: str) -> None:
    from robot_wm import description
    from robot_wm.bags import bag_sha256
    from robot_wm.core.onnx_model import read_sidecar
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.adapt import _lineage_sha
    from robot_wm.learning.policy import export_policy
    from robot_wm.learning.world_model import export_world_model

    names = description.joint_limits(description.expand()).names
    shas = [bag_sha256(p) for p in bags_used]
    lineage = _lineage_sha(shas, replay)
    parent_wm, parent_pol = read_sidecar(parent / "world_model.onnx"), read_sidecar(parent / "policy.onnx")
    wm_path = export_world_model(wm, round_dir / "world_model.onnx", lineage, metrics={"mixed_round": r, "command": command},
                                 version=f"wm-mixed{r:03d}-{lineage[:8]}-{{onnx_sha8}}", training_command=command)
    if accepted:
        pol_path = export_policy(actor, round_dir / "policy.onnx", joint_names=names, task=get_task(task).spec,
                                 dataset_sha256=lineage, version=f"policy-mixed{r:03d}-{lineage[:8]}-{{onnx_sha8}}",
                                 metrics={"mixed_round": r, "imagination_episodes": iterations, "ratio": ratio},
                                 config=pcfg, training_command=command)
    else:  # the previous policy, unchanged (same file, same version)
        for suffix in (".onnx", ".json"):
            shutil.copyfile(parent / f"policy{suffix}", round_dir / f"policy{suffix}")
        pol_path = round_dir / "policy.onnx"
    for path, parent_side, changed in ((wm_path, parent_wm, True), (pol_path, parent_pol, accepted)):
        side_path = path.with_suffix(".json")
        side = json.loads(side_path.read_text())
        if changed:
            side["lineage"] = {"parent_version": parent_side.get("version"), "mixed_round": r,
                               "real_bag_sha256": sorted(shas), "replay_dataset_sha256": replay.sha256 if replay else None}
        side_path.write_text(json.dumps(side, indent=2))


def _round_row(r, episodes, done, wm_report, pol, accepted, iters, round_dir, t_real, t_wm, total, cpu, short, n_train,
               n_hold) -> dict:
    ended = [e for e in episodes if e.get("ended")]
    rms = [e["tracking_rms_m"] for e in episodes if e.get("tracking_rms_m") is not None and not e.get("ended")]
    periods = sum(e.get("periods", 0) for e in episodes)
    return {
        "round": r, "real_episodes": len(episodes), "real_episodes_done": done,
        "successes": sum(bool(e.get("success")) for e in episodes),
        "ended_by_intervention": sum(str(e["ended"]).startswith("intervention") for e in ended),
        "ended_by_trust": sum(str(e["ended"]).startswith("trust") for e in ended),
        "ended": [{"index": e["index"], "why": e["ended"]} for e in ended],
        "filter_intervention_rate": _r(sum(e.get("filter_periods", 0) for e in episodes) / max(periods, 1)),
        "violations": sum(sum(e.get("violations", {}).values()) for e in episodes),
        "tracking_rms_m_median": _r(np.median(rms)) if rms else None,
        "exploration_scale_mean": _r(np.mean([e["exploration"]["scale_mean"] for e in episodes
                                              if e.get("exploration", {}).get("scale_mean") is not None] or [np.nan])),
        "exploration_off_share": _r(np.mean([e["exploration"]["share_off"] for e in episodes
                                             if e.get("exploration", {}).get("share_off") is not None] or [np.nan])),
        "episodes": episodes,
        "world_model": None if wm_report is None else {  # None: a round that collected and did not train
            "holdout_nll_before": _r(wm_report.initial_holdout_nll),
            "holdout_nll_after": _r(float(np.mean(wm_report.best_holdout_nll))),
            "epochs": wm_report.epochs_run, "variance_scale": wm_report.variance_scale,
            "training_windows": n_train, "validation_windows": n_hold, "episodes_too_short": short},
        "policy": {"imagination_episodes": iters, "accepted": bool(accepted),
                   "validation_start_m": _r(pol.validation[0][1]) if pol and pol.validation else None,
                   "validation_best_m": _r(min(s for _, s in pol.validation)) if pol and pol.validation else None},
        "set": str(Path(round_dir).resolve()),
        "seconds": {"real": round(t_real, 1), "world_model": round(t_wm, 1), "total": round(total, 1), "cpu": round(cpu, 1)},
    }


def _is_profile(name: str) -> bool:
    """A simulator profile (the library stack evaluation can run on it), not a hardware arm's name."""
    from robot_wm.sim import ProfileError, load_profile

    try:
        load_profile(name)
    except (ProfileError, OSError, ValueError):
        return False
    return True


def _live_calibration(task: str, robot: str, state: dict) -> Path:
    """The trust calibration the running stack's monitor uses for ``robot`` (the registry's), which
    the run's first own calibration inherits from when there is too little data."""
    from robot_wm.registry import resolve

    try:
        path = Path(resolve(task, "calibration", profile=robot))
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
    except (OSError, ValueError) as exc:
        raise MixedError(f"no trust calibration for {robot!r} in the active {task} set: the trust monitor cannot reach "
                         f"FULL without one (robot-wm trust calibrate --live); {exc}") from exc
    state["calibration_source"] = str(path)
    return path


def _register(round_dir: Path, task: str, parent_dir: Path, state: dict, row: dict, command: str,
              activate: bool = False) -> dict:
    from robot_wm import registry
    from robot_wm.core.onnx_model import sha256_file

    reg = registry.Registry()
    reg.ensure_shipped()
    parent = state.get("registered")
    if parent is None:
        base_policy = sha256_file(Path(parent_dir) / "policy.onnx")
        base_wm = sha256_file(Path(parent_dir) / "world_model.onnx")
        parent = next((i.version for i in reg.list(task) if i.files.get("policy.onnx") == base_policy
                       and i.files.get("world_model.onnx") == base_wm), None)
    metrics = {k: row[k] for k in ("round", "real_episodes_done", "successes", "ended_by_intervention", "ended_by_trust",
                                   "filter_intervention_rate", "tracking_rms_m_median", "violations")}
    metrics |= {"world_model": row["world_model"], "policy": row["policy"]}
    info = reg.add(round_dir, task, parent=parent, activate=activate,
                   lineage={"training_data": {"sim_dataset_sha256": None,
                                              "demo_bags_sha256": sorted(json.loads((round_dir / "world_model.json").read_text())
                                                                         ["lineage"]["real_bag_sha256"])},
                            "command": command, "metrics": metrics, "phase": "MIXED", "robots": [state["args"]["profile"]]})
    return {"version": info.version, "parent": parent}


def _publish(out: Path, final: Path) -> None:
    """The last round's set, also at the top of ``out`` (a model set directory like any other)."""
    for name in ("world_model.onnx", "world_model.json", "policy.onnx", "policy.json"):
        tmp = out / f".{name}.tmp"
        shutil.copyfile(final / name, tmp)
        tmp.replace(out / name)
    if (final / "trust").exists():
        shutil.copytree(final / "trust", out / "trust", dirs_exist_ok=True)


def _summary(state: dict) -> dict:
    rounds = state["rounds"]
    eps = [e for r in rounds for e in r["episodes"]]
    n = len(eps)
    return {"real_episodes": n, "rounds": len(rounds), "accepted_policy_updates": sum(r["policy"]["accepted"] for r in rounds),
            "success_rate": _r(np.mean([bool(e.get("success")) for e in eps])) if n else None,
            "interventions_per_100": _r(100.0 * sum(r["ended_by_intervention"] for r in rounds) / max(n, 1), 2),
            "trust_drops_per_100": _r(100.0 * sum(r["ended_by_trust"] for r in rounds) / max(n, 1), 2),
            "violations": sum(r["violations"] for r in rounds),
            "filter_intervention_rate": _r(np.mean([r["filter_intervention_rate"] for r in rounds])) if rounds else None}
