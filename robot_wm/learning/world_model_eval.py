"""Evaluate a world model (torch module, ONNX runner, or a baseline) on held-out episodes.

Metrics (``evaluate_world_model``):
  * one-step RMSE of the predicted next measured q (rad) and qdot (rad/s), overall and per joint;
  * open-loop drift: from start points every ``start_stride`` steps, the model is rolled out on the
    recorded commands alone (its own predictions fed back) and the TOOL POSITION of the predicted
    q is compared with that of the measured q (same URDF kinematics for both, so an encoder offset
    does not count as model error) at each horizon: mean and p90, metres;
  * calibration: the fraction of one-step truths inside the predicted central 90 % interval,
    mu ± 1.645 sqrt(epistemic + aleatoric), per component (0.90 is perfect; lower is
    overconfident), and the mean predicted stds.

``collect_profile_dataset`` records held-out data on one fixed dynamics profile (e.g. the
real_twin) with exactly the exploration of ``robot_wm.learning.data.collect``.

``python -m robot_wm.learning.world_model_eval --ablation`` reruns the history-window ablation
whose numbers are in ``robot_wm.learning.world_model``'s docstring.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from robot_wm.learning.data import CollectConfig, Dataset, collect
from robot_wm.contracts import STATE_LAYOUT
from robot_wm.learning.world_model import WorldModel, WorldModelConfig, load_checkpoint
from robot_wm.learning.world_model_training import history_windows, train_world_model

Q, QD = STATE_LAYOUT["q_rad"], STATE_LAYOUT["qdot_radps"]  # blocks of the (q, qdot) vectors
Z90 = 1.6448536269514722  # two-sided 90 % interval of a standard normal
PredictFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray, np.ndarray]]


class ConstantVelocityPredictor:
    """The trivial baseline: q⁺ = q + qdot·dt, qdot⁺ = qdot (no uncertainty)."""

    def __init__(self, dt_s: float, action_history: int = 1) -> None:
        self.dt_s = float(dt_s)
        self.action_history = action_history
        self.qdot_history = 0

    def predict_arrays(self, q, qdot, actions, qdot_hist=None):
        """Mean next state (B, 12) and zero variances."""
        mean = np.concatenate([q + qdot * self.dt_s, qdot], -1)
        return mean, np.zeros_like(mean), np.zeros_like(mean)


def _predictor(model: Any) -> tuple[PredictFn, int, int]:
    """Wrap a WorldModel, a WorldModelRunner or a baseline as (predict_fn, H, K)."""
    from robot_wm.core.world_model_runner import WorldModelRunner

    if isinstance(model, WorldModel):
        model = model.eval()

        def run(q, qd, a, qh):
            with torch.no_grad():
                t = lambda x: None if x is None else torch.tensor(x, dtype=torch.float32)  # noqa: E731
                p = model.predict(t(q), t(qd), t(a), t(qh))
            mean = torch.cat([p.next_q_rad, p.next_qdot_radps], -1)
            return mean.double().numpy(), p.epistemic_var.double().numpy(), p.aleatoric_var.double().numpy()

        return run, model.action_history, model.config.qdot_history
    if isinstance(model, WorldModelRunner):
        def run(q, qd, a, qh):
            p = model.predict_batch(q, qd, a, qh)
            return tuple(x.astype(np.float64) for x in (p.next_state, p.epistemic_var, p.aleatoric_var))

        return run, model.action_history_length, model.qdot_history_length
    if hasattr(model, "predict_arrays"):
        return model.predict_arrays, model.action_history, model.qdot_history
    raise TypeError(f"cannot evaluate {type(model).__name__}: expected a WorldModel, WorldModelRunner or baseline")


def _batched(fn: PredictFn, *arrays, chunk: int = 16384):
    """Call ``fn`` on row chunks (bounded memory) and concatenate the three outputs."""
    n = arrays[0].shape[0]
    outs = [fn(*(None if a is None else a[s:s + chunk] for a in arrays)) for s in range(0, n, chunk)]
    return tuple(np.concatenate([o[i] for o in outs]) for i in range(3))


def evaluate_world_model(
    model: Any,
    dataset: Dataset,
    horizons: tuple[int, ...] = (10, 50),
    start_stride: int = 10,
    urdf_xml: str | None = None,
) -> dict[str, Any]:
    """One-step accuracy, open-loop tool-position drift and calibration on ``dataset``.

    Args:
        model: a ``WorldModel``, a ``robot_wm.core.world_model_runner.WorldModelRunner`` or a
            baseline with ``predict_arrays`` (``ConstantVelocityPredictor``).
        dataset: held-out episodes (never the training episodes).
        horizons: rollout lengths (control periods) at which the tool error is reported.
        start_stride: rollout start points every this many steps in each episode.
        urdf_xml: robot description for the tool kinematics (default: the package's).
    Returns:
        A JSON-ready dict (units in the keys; see the module docstring).
    """
    from robot_wm import description
    from robot_wm.learning.torch_kinematics import TorchToolFK

    fn, h, k = _predictor(model)
    e, t = dataset.n_episodes, dataset.n_steps
    q, qd, act = dataset.q_rad, dataset.qdot_radps, dataset.action_radps
    windows = history_windows(act, h, include_current=True)  # (E, T, H, N)
    qd_windows = history_windows(qd[:, :t], k, include_current=False)  # (E, T, K, N)

    # one step, every transition
    flat = lambda x: x.reshape(e * t, *x.shape[2:])  # noqa: E731
    mean, epi, ale = _batched(fn, flat(q[:, :t]), flat(qd[:, :t]), flat(windows), flat(qd_windows) if k else None)
    truth = np.concatenate([flat(q[:, 1:]), flat(qd[:, 1:])], -1)
    err = mean - truth
    rmse = np.sqrt(np.mean(err**2, axis=0))
    std = np.sqrt(epi + ale)
    inside = np.abs(err) <= Z90 * std
    result: dict[str, Any] = {
        "episodes": e,
        "transitions": e * t,
        "one_step": {
            "rmse_q_rad": float(np.sqrt(np.mean(err[:, Q] ** 2))),
            "rmse_qdot_radps": float(np.sqrt(np.mean(err[:, QD] ** 2))),
            "rmse_q_rad_per_joint": rmse[Q].round(7).tolist(),
            "rmse_qdot_radps_per_joint": rmse[QD].round(6).tolist(),
        },
        "calibration": {
            "coverage90": float(inside.mean()),
            "coverage90_q": float(inside[:, Q].mean()),
            "coverage90_qdot": float(inside[:, QD].mean()),
            "mean_epistemic_std_q_rad": float(np.sqrt(epi[:, Q]).mean()),
            "mean_epistemic_std_qdot_radps": float(np.sqrt(epi[:, QD]).mean()),
            "mean_aleatoric_std_q_rad": float(np.sqrt(ale[:, Q]).mean()),
            "mean_aleatoric_std_qdot_radps": float(np.sqrt(ale[:, QD]).mean()),
        },
    }

    # open-loop rollouts on the recorded commands
    horizon = max(horizons)
    starts = np.arange(0, t - horizon + 1, start_stride)
    if starts.size == 0:
        raise ValueError(f"episodes have {t} steps: too short for a {horizon}-step rollout")
    ep_idx, st_idx = np.repeat(np.arange(e), starts.size), np.tile(starts, e)
    cur_q, cur_qd = q[ep_idx, st_idx], qd[ep_idx, st_idx]
    qd_hist = qd_windows[ep_idx, st_idx] if k else None
    pred_q = [cur_q]
    epi_sum = np.zeros(len(ep_idx))
    for step in range(horizon):
        nxt, epi_step, _ = _batched(fn, cur_q, cur_qd, windows[ep_idx, st_idx + step], qd_hist)
        if k:
            qd_hist = np.concatenate([qd_hist[:, 1:], cur_qd[:, None]], 1)
        cur_q, cur_qd = nxt[:, Q], nxt[:, QD]
        pred_q.append(cur_q)
        epi_sum += np.sqrt(epi_step[:, QD]).mean(-1)
    fk = TorchToolFK(urdf_xml or description.expand(), dataset.joint_names).double()
    tool = lambda x: fk(torch.as_tensor(x, dtype=torch.float64)).numpy()  # noqa: E731
    result["rollout"] = {"starts": int(len(ep_idx))}
    for hz in horizons:
        d = np.linalg.norm(tool(pred_q[hz]) - tool(q[ep_idx, st_idx + hz]), axis=-1)
        q_err = np.sqrt(np.mean((pred_q[hz] - q[ep_idx, st_idx + hz]) ** 2))
        result["rollout"][str(hz)] = {"tool_err_mean_m": float(d.mean()), "tool_err_p90_m": float(np.quantile(d, 0.9)),
                                      "q_rmse_rad": float(q_err)}
    return result


def collect_profile_dataset(
    profile: str | Path = "real_twin",
    transitions: int = 20_000,
    seed: int = 1,
    task=None,
    collect_config: CollectConfig | None = None,
    progress: bool = False,
) -> Dataset:
    """Record episodes on ONE fixed dynamics profile with ``data.collect``'s exploration.

    Every numeric profile field is pinned (a randomization range [v, v]), so each episode runs
    exactly ``profile`` while the starts, goals, commands and sensor noise are drawn as in
    ``collect``.

    Args:
        profile: a shipped profile name or a YAML path.
        transitions, seed: size and seed of the recording.
        task: the TaskSpec (default: config/task.yaml).
        collect_config: other collection settings (transitions/seed/randomize are overridden).
        progress: show a progress bar.
    """
    from robot_wm.core.task import load_task
    from robot_wm.sim import load_profile
    from robot_wm.sim.profiles import SCHEMA

    prof = load_profile(profile)
    pinned = {k: (v, v) for k, v in dataclasses.asdict(prof).items() if SCHEMA[k].kind != "str"}
    base = collect_config or CollectConfig()
    cfg = dataclasses.replace(base, transitions=transitions, seed=seed, randomize=True)
    data = collect(cfg, task or load_task(), pinned, progress=progress)
    data.profiles = tuple(prof.name for _ in data.profiles)
    data.meta["randomization"] = None
    data.meta["profile"] = prof.name
    return data


# --------------------------------------------------------------------------------------- ablation
ABLATION_VARIANTS: dict[str, dict[str, Any]] = {
    "H1": {"action_history": 1},
    "H2": {"action_history": 2},
    "H3": {"action_history": 3},
    "H5": {"action_history": 5},
    "H3+qdot1": {"action_history": 3, "qdot_history": 1},
    "H3+qdot3": {"action_history": 3, "qdot_history": 3},
    "H5+qdot4": {"action_history": 5, "qdot_history": 4},
    "H3-sincos": {"action_history": 3, "q_features": "sincos"},
}


def history_ablation(
    train: Dataset, held_out: dict[str, Dataset], base: WorldModelConfig, variants: dict[str, dict] | None = None,
    progress: bool = False,
) -> dict[str, dict[str, Any]]:
    """Train one model per input variant on ``train`` and evaluate each on every held-out set."""
    results = {}
    for name, changes in (variants or ABLATION_VARIANTS).items():
        model, report = train_world_model(dataclasses.replace(base, **changes), train, progress=progress)
        results[name] = {"train_seconds": report.seconds, "epochs": report.epochs_run,
                         **{k: evaluate_world_model(model, d) for k, d in held_out.items()}}
        summary = {k: _summary(v) for k, v in results[name].items() if isinstance(v, dict)}
        print(name, json.dumps(summary), flush=True)
    return results


def _summary(metrics: dict[str, Any]) -> dict[str, float]:
    """The handful of numbers that decide between variants."""
    r = metrics["rollout"]
    return {"qdot_rmse": round(metrics["one_step"]["rmse_qdot_radps"], 5),
            "q_rmse": round(metrics["one_step"]["rmse_q_rad"], 7),
            "tool10_mm": round(1e3 * r["10"]["tool_err_mean_m"], 3),
            "tool10_p90_mm": round(1e3 * r["10"]["tool_err_p90_m"], 3),
            "tool50_mm": round(1e3 * r["50"]["tool_err_mean_m"], 2),
            "tool50_p90_mm": round(1e3 * r["50"]["tool_err_p90_m"], 2),
            "cov90": round(metrics["calibration"]["coverage90"], 3)}


def evaluate_on_profiles(model: Any, transitions: int = 20_000, seed: int = 300, progress: bool = False) -> dict[str, Any]:
    """Evaluate on fresh held-out data: nominal, domain-randomized (config ranges) and real_twin.

    The seeds differ from the training collection's, so none of these episodes was seen in training.
    """
    from robot_wm.core.task import load_task
    from robot_wm.learning.data import load_randomization
    from robot_wm.paths import config_path

    task = load_task()
    sets = {
        "nominal": collect_profile_dataset("nominal", transitions, seed=seed, task=task, progress=progress),
        "randomized": collect(CollectConfig(transitions=transitions, seed=seed + 1), task,
                              load_randomization(config_path("training.yaml")), progress=progress),
        "real_twin": collect_profile_dataset("real_twin", transitions, seed=seed + 2, task=task, progress=progress),
    }
    return {name: evaluate_world_model(model, data) for name, data in sets.items()}


def _load_for_eval(path: Path):
    """A checkpoint (.pt) as a WorldModel, or an exported .onnx through the core runner."""
    if path.suffix == ".onnx":
        from robot_wm import description
        from robot_wm.core.world_model_runner import WorldModelRunner

        return WorldModelRunner(path, description.joint_limits(description.expand()).names, 0.01)
    model, _ = load_checkpoint(path)
    return model


def format_profile_report(results: dict[str, Any]) -> str:
    """A readable table of evaluate_on_profiles' results."""
    lines = [f"{'data':<12} {'1-step q RMSE':>14} {'1-step qdot RMSE':>17} {'tool err @10':>14} {'@10 p90':>9} "
             f"{'tool err @50':>13} {'@50 p90':>9} {'90% coverage':>13}"]
    for name, m in results.items():
        s = _summary(m)
        lines.append(f"{name:<12} {s['q_rmse']:>12.2e}rad {s['qdot_rmse']:>13.4f}rad/s {s['tool10_mm']:>12.2f}mm "
                     f"{s['tool10_p90_mm']:>7.2f}mm {s['tool50_mm']:>11.2f}mm {s['tool50_p90_mm']:>7.2f}mm {s['cov90']:>13.3f}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of `robot-wm eval-world-model` (also this module's command line)."""
    parser.add_argument("--model", type=Path, help="world model to evaluate: checkpoint (.pt) or exported .onnx")
    parser.add_argument("--json", action="store_true", help="with --model: print one JSON object")
    parser.add_argument("--ablation", action="store_true", help="run the history-window ablation")
    parser.add_argument("--train", type=Path, help="training dataset .npz (default: collect --transitions)")
    parser.add_argument("--held-out", type=Path, help="held-out randomized dataset .npz")
    parser.add_argument("--twin", type=Path, help="held-out real_twin dataset .npz")
    parser.add_argument("--transitions", type=int, default=60_000)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", choices=sorted(ABLATION_VARIANTS), help="default: all")
    parser.add_argument("--out", type=Path, help="write all results as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command line: evaluate a trained model (--model), or run the history ablation (--ablation)."""
    parser = add_arguments(argparse.ArgumentParser(prog="robot-wm eval-world-model", description=__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    if not (args.model or args.ablation):
        parser.error("nothing to do: pass --model PATH or --ablation")
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Run what the parsed arguments ask for."""
    if args.model:
        if not args.model.is_file():
            print(f"eval-world-model: model not found: {args.model}", file=sys.stderr)
            return 2
        results = evaluate_on_profiles(_load_for_eval(args.model), transitions=getattr(args, "eval_transitions", 20_000))
        if args.out:
            args.out.write_text(json.dumps(results, indent=1, default=float))
        if args.json:
            print(json.dumps({k: _summary(v) for k, v in results.items()}))
        else:
            print(f"world model {args.model}: held-out data ({getattr(args, 'eval_transitions', 20_000)} transitions each, unseen seeds)")
            print(format_profile_report(results))
        return 0
    if not args.ablation:
        print("eval-world-model: nothing to do: pass --model PATH or --ablation", file=sys.stderr)
        return 2
    from robot_wm.core.task import load_task
    from robot_wm.learning.data import load_randomization
    from robot_wm.paths import config_path

    task = load_task()
    ranges = load_randomization(config_path("training.yaml"))
    started = time.perf_counter()
    if args.train:
        train = Dataset.load(args.train)
    else:
        train = collect(CollectConfig(transitions=args.transitions, seed=0), task, ranges)
    if args.train and args.transitions < train.n_transitions:
        train = train.subset(np.arange(int(np.ceil(args.transitions / train.n_steps))))
    if args.held_out:
        held = Dataset.load(args.held_out)
    else:
        held = collect(CollectConfig(transitions=20_000, seed=101), task, ranges)
    twin = Dataset.load(args.twin) if args.twin else collect_profile_dataset("real_twin", 20_000, seed=202)
    print(f"data: train {train.n_transitions}, held-out {held.n_transitions}, "
          f"real_twin {twin.n_transitions} transitions")
    variants = {k: ABLATION_VARIANTS[k] for k in args.variants} if args.variants else None
    results = history_ablation(train, {"randomized": held, "real_twin": twin},
                               WorldModelConfig(epochs=args.epochs, seed=args.seed), variants)
    print(f"ablation took {time.perf_counter() - started:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
