"""The ML engineer's commands: collect, train world-model, train policy, export.

Each reads its settings from config/training.yaml (validated), takes a seed, shows a progress
bar, writes a checkpoint or artifact, and ends with a summary. ``robot-wm <verb> --help`` lists
the options; models/README.md lists the exact commands behind the shipped models.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from robot_wm.learning.provenance import command_line

DEFAULT_DATA = Path("data/sim_100k.npz")
DEFAULT_RUNS = Path("runs")
POLICY_CHECKPOINT_FORMAT = "robot_wm-policy-checkpoint/1"


def _config_path(args: argparse.Namespace) -> Path:
    from robot_wm.paths import config_path

    return Path(args.config) if args.config else config_path("training.yaml")


def _print_summary(title: str, rows: dict[str, Any]) -> None:
    print(f"---- {title} ----")
    for key, value in rows.items():
        print(f"  {key:<28} {value}")


# ------------------------------------------------------------------------------------- collect
def cmd_collect(args: argparse.Namespace) -> int:
    """Collect domain-randomized simulated transitions into a dataset file."""
    from robot_wm.core.task import load_task
    from robot_wm.learning.config import load_section
    from robot_wm.learning.data import CollectConfig, collect, load_randomization

    path = _config_path(args)
    cfg = load_section(path, "collect", CollectConfig)
    overrides = {k: v for k, v in (("transitions", args.transitions), ("seed", args.seed)) if v is not None}
    if args.no_randomization:
        overrides["randomize"] = False
    cfg = replace(cfg, **overrides)
    started = time.perf_counter()
    data = collect(cfg, load_task(), randomization=load_randomization(path), progress=not args.no_progress)
    seconds = time.perf_counter() - started
    data.meta["command"] = " ".join(sys.argv)
    out = data.save(Path(args.out))
    _print_summary("collect", {
        "dataset": out, "transitions": data.n_transitions, "episodes": data.n_episodes,
        "seconds": f"{seconds:.1f}", "transitions per second": f"{data.n_transitions / seconds:,.0f}",
        "domain randomization": cfg.randomize, "sha256": data.sha256,
    })
    return 0


# ------------------------------------------------------------------------------- world model
def cmd_train_world_model(args: argparse.Namespace) -> int:
    """Train the world-model ensemble on a dataset; save a checkpoint and its evaluation."""
    import torch

    from robot_wm.learning.config import load_section
    from robot_wm.learning.data import Dataset
    from robot_wm.learning.world_model import WorldModelConfig, save_checkpoint
    from robot_wm.learning.world_model_training import train_world_model

    torch.set_num_threads(args.threads)
    cfg = load_section(_config_path(args), "world_model", WorldModelConfig)
    if args.seed is not None:
        cfg = replace(cfg, seed=args.seed)
    data = Dataset.load(Path(args.data))
    model, report = train_world_model(cfg, data, progress=not args.no_progress)
    metrics = report.to_dict()
    metrics["command"] = command_line()
    out = Path(args.out)
    save_checkpoint(model, out / "world_model.pt", dataset_sha256=data.sha256, metrics=metrics)
    (out / "world_model_report.json").write_text(json.dumps(metrics, indent=2, default=str))
    _print_summary("train world-model", {"checkpoint": out / "world_model.pt", "dataset": f"{args.data} ({data.n_transitions} transitions)",
                                         **{k: v for k, v in metrics.items() if not isinstance(v, (list, dict))}})
    return 0


class WorldModelDynamics:
    """Adapter from WorldModel.step to the policy trainer's ImaginationDynamics protocol.

    Each imagined row follows one randomly chosen ensemble member per step (TS-1), and the
    disagreement fed to the reward penalty is the epistemic std in units of the typical one-step
    change of each state component (so joints and q/qdot weigh alike).
    """

    def __init__(self, model, member: str = "random") -> None:
        import torch

        self.model = model
        self.member = member
        self.history = model.action_history
        self.scale = torch.clamp(model.delta_std.detach().clone(), min=1e-6)

    def parameters(self):
        return self.model.parameters()

    def step(self, q_rad, qdot_radps, actions_radps):
        import torch

        from robot_wm.contracts import STATE_LAYOUT

        state, epistemic_std = self.model.step(torch.cat([q_rad, qdot_radps], -1), actions_radps, member=self.member)
        return state[:, STATE_LAYOUT["q_rad"]], state[:, STATE_LAYOUT["qdot_radps"]], (epistemic_std / self.scale).mean(-1)


def cmd_train_policy(args: argparse.Namespace) -> int:
    """Train the policy by actor-critic inside the world model's imagination."""
    import torch

    from robot_wm import description
    from robot_wm.contracts import layout_json
    from robot_wm.core.task import load_task
    from robot_wm.core.track import load_track
    from robot_wm.learning.config import load_section
    from robot_wm.learning.data import Dataset
    from robot_wm.learning.policy import PolicyConfig, task_layout, task_name, train_policy
    from robot_wm.learning.torch_kinematics import TorchToolFK
    from robot_wm.learning.world_model import load_checkpoint

    torch.set_num_threads(args.threads)
    cfg = load_section(_config_path(args), "policy", PolicyConfig)
    overrides = {k: v for k, v in (("seed", args.seed), ("iterations", args.iterations)) if v is not None}
    cfg = replace(cfg, **overrides)
    task = load_track() if args.task == "track" else load_task()
    data = Dataset.load(Path(args.data))
    model, wm_meta = load_checkpoint(Path(args.world_model))
    urdf = description.expand()
    names = description.joint_limits(urdf).names
    actor, report = train_policy(cfg, WorldModelDynamics(model), TorchToolFK(urdf, names), data, task,
                                 description.initial_positions(names), progress=not args.no_progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({
        "format": POLICY_CHECKPOINT_FORMAT, "state_dict": actor.state_dict(), "config": asdict(cfg),
        "task": task_name(task), "obs_layout": layout_json(task_layout(task)),
        "obs_mean": actor.norm.mean.tolist(), "obs_std": actor.norm.std.tolist(),
        "action_limit_radps": list(task.action_limit_radps), "joint_names": list(names),
        "dataset_sha256": data.sha256, "world_model_dataset_sha256": wm_meta.get("dataset_sha256", ""),
        "report": asdict(report), "command": command_line(),
        "world_model_command": wm_meta.get("metrics", {}).get("command", ""),
    }, out / "policy.pt")
    _print_summary("train policy", {"checkpoint": out / "policy.pt", "iterations": report.iterations,
                                    "seconds": report.seconds, "imagined final distance (m)": f"{report.final_imagined_distance_m:.4f}",
                                    "imagined disagreement": f"{report.final_disagreement:.4f}"})
    return 0


def load_policy_checkpoint(path: Path):
    """Rebuild the Actor from a policy checkpoint; return (actor, record)."""
    import numpy as np
    import torch

    from robot_wm.learning.policy import PolicyConfig, build_actor, task_layout

    record = torch.load(Path(path), map_location="cpu", weights_only=False)
    if not isinstance(record, dict) or record.get("format") != POLICY_CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a robot_wm policy checkpoint (format {POLICY_CHECKPOINT_FORMAT!r})")
    from robot_wm import description
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.torch_kinematics import TorchToolFK

    task = get_task(record.get("task", "reach")).spec
    layout = {k: slice(*v) for k, v in record["obs_layout"].items()} if record.get("obs_layout") else task_layout(task)
    urdf = description.expand()
    actor = build_actor(PolicyConfig(**record["config"]), task, np.array(record["obs_mean"]), np.array(record["obs_std"]),
                        layout, TorchToolFK(urdf, description.joint_limits(urdf).names), record["action_limit_radps"])
    actor.load_state_dict(record["state_dict"])
    return actor.eval(), record


# ------------------------------------------------------------------------------------- export
def cmd_export(args: argparse.Namespace) -> int:
    """Export the world model and the policy to ONNX with sidecars (into models/ by default)."""
    from robot_wm import description
    from robot_wm.contracts import POLICY_KIND, WORLD_MODEL_KIND
    from robot_wm.core.onnx_model import load_model
    from robot_wm.core.task import load_task
    from robot_wm.core.track import load_track
    from robot_wm.learning.policy import PolicyConfig, export_policy
    from robot_wm.learning.world_model import export_world_model, load_checkpoint

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    task = load_task()
    names = description.joint_limits(description.expand()).names
    written = {}
    if args.world_model:
        model, meta = load_checkpoint(Path(args.world_model))
        sha = meta.get("dataset_sha256", "")
        path = export_world_model(model, out / "world_model.onnx", sha, metrics=meta.get("metrics"),
                                  version=f"wm-{sha[:8]}-s{model.config.seed}-{{onnx_sha8}}",
                                  training_command=(meta.get("metrics") or {}).get("command"))
        written[WORLD_MODEL_KIND] = load_model(path, WORLD_MODEL_KIND, names, task.control_dt_s)
    if args.policy:
        actor, record = load_policy_checkpoint(Path(args.policy))
        policy_task = load_track() if record.get("task") == "track" else task
        cfg = PolicyConfig(**record["config"])
        metrics = {"imagined_final_distance_m": record["report"]["final_imagined_distance_m"]}
        if args.eval_metrics:
            metrics.update(json.loads(Path(args.eval_metrics).read_text()))
        path = export_policy(actor, out / "policy.onnx", joint_names=names, task=policy_task,
                             dataset_sha256=record["dataset_sha256"],
                             version=f"policy-{record['dataset_sha256'][:8]}-s{cfg.seed}-{{onnx_sha8}}",
                             metrics=metrics, config=cfg,
                             training_command=record.get("command"))
        written[POLICY_KIND] = load_model(path, POLICY_KIND, names, task.control_dt_s)
    if not written:
        print("export: nothing to do (give --world-model and/or --policy)", file=sys.stderr)
        return 2
    _print_summary("export", {kind: f"{m.path} ({m.path.stat().st_size / 1e3:.0f} kB, sha256 {m.meta['sha256'][:12]}..., version {m.version})"
                              for kind, m in written.items()})
    return 0


# --------------------------------------------------------------------------------------- CLI
def _add_world_model_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of eval-world-model; torch is imported only when it runs (the ablation study is
    ``python -m robot_wm.learning.world_model_eval --ablation``)."""
    parser.add_argument("--model", type=Path, required=True, help="checkpoint (.pt) or exported world_model.onnx")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--out", type=Path, help="write the full metrics as JSON here")
    parser.add_argument("--eval-transitions", type=int, default=20_000, help="held-out transitions per data set")

    def run(args: argparse.Namespace) -> int:
        from robot_wm.learning import world_model_eval

        args.ablation = False
        return world_model_eval.run(args)

    parser.set_defaults(func=run)


def add_parsers(verbs: argparse._SubParsersAction) -> None:
    """Register collect, train, export and eval on the robot-wm parser."""
    from robot_wm.learning import evaluate

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", default=None, help="training YAML (default: config/training.yaml)")
        p.add_argument("--seed", type=int, default=None, help="override the config's seed")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = verbs.add_parser("collect", help="collect domain-randomized simulated transitions (learning data)")
    common(p)
    p.add_argument("--out", default=str(DEFAULT_DATA), help=f"dataset file (default {DEFAULT_DATA})")
    p.add_argument("--transitions", type=int, default=None, help="override the number of transitions")
    p.add_argument("--no-randomization", action="store_true", help="collect on the nominal profile only")
    p.set_defaults(func=cmd_collect)

    train = verbs.add_parser("train", help="train the world model or the policy, or the policy on the arm (mixed)").add_subparsers(dest="what", metavar="WHAT", required=True)
    p = train.add_parser("world-model", help="train the world-model ensemble on a dataset")
    common(p)
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--out", default=str(DEFAULT_RUNS / "world_model"), help="checkpoint directory")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.set_defaults(func=cmd_train_world_model)
    p = train.add_parser("policy", help="train the policy by actor-critic in the world model's imagination")
    common(p)
    p.add_argument("--data", default=str(DEFAULT_DATA), help="recorded transitions for imagination start states")
    p.add_argument("--world-model", default=str(DEFAULT_RUNS / "world_model" / "world_model.pt"))
    p.add_argument("--out", default=str(DEFAULT_RUNS / "policy"), help="checkpoint directory")
    p.add_argument("--task", default="reach", choices=("reach", "track"), help="the task to train for (default reach)")
    p.add_argument("--iterations", type=int, default=None, help="override the number of iterations")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.set_defaults(func=cmd_train_policy)
    from robot_wm.learning import mixed_cli

    mixed_cli.add_parser(train, common)

    p = verbs.add_parser("export", help="export checkpoints to ONNX + JSON sidecars")
    p.add_argument("--world-model", default=None, help="world-model checkpoint (.pt)")
    p.add_argument("--policy", default=None, help="policy checkpoint (.pt)")
    p.add_argument("--eval-metrics", default=None, help="JSON file of evaluation numbers to record in the policy sidecar")
    p.add_argument("--out", default="models", help="output directory (default models/)")
    p.set_defaults(func=cmd_export)

    p = verbs.add_parser("eval-world-model", help="world-model accuracy and calibration on held-out nominal, randomized and real_twin data")
    _add_world_model_eval_arguments(p)

    p = verbs.add_parser("eval", help="evaluate the ONNX policy and the scripted baseline on the simulator")
    evaluate.add_arguments(p)
    p.set_defaults(func=evaluate.run)
