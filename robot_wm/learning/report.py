"""The seed's headline table as a command: ``robot-wm report sim2real``.

Rows are policies (model sets) and the task's scripted baseline, columns are arm profiles; every
cell is the whole-stack evaluation (``robot-wm eval --stack``: policy -> safety filter -> arm) of
that row on that profile, on the same episodes: success rate, the task's error (reach: final
error; track: tracking RMS), the filter's intervention rate and the plant's limit violations.

* ``--sim-only DIR``: a model set trained on nominal-simulator data only (no randomization): the
  row that shows the sim-to-real gap (default: the shipped ``models/<task>_sim_only/``);
* ``--randomized DIR``: the domain-randomized model set (default: the shipped one of the task);
* ``--models DIR`` (repeatable): adapted model sets (the adaptation issue adds those).

Writes ``sim2real_<task>.md`` (Markdown), ``.json`` (every number) and ``.png`` (the task's error
per profile and row) into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

DEFAULT_OUT = Path("out/report")


def _error_key(task: str) -> tuple[str, str]:
    return ("tracking_rms_m_median", "tracking RMS (mm)") if task == "track" else ("final_error_m_median",
                                                                                      "final error (mm)")


def run_report(task_name: str, profiles: list[str], rows: list[tuple[str, Path | None]], episodes: int, seed: int,
               out_dir: Path, stack: bool = True, progress: bool = False) -> dict:
    """Evaluate every row on every profile; write the Markdown, JSON and PNG; return the JSON dict.

    Args:
        task_name: "reach" or "track".
        profiles: profile names or YAML paths (the columns).
        rows: (label, model set directory) pairs; None is the task's scripted baseline.
    """
    from robot_wm import description
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.stack_eval import evaluate_stack
    from robot_wm.sim import load_profile

    task = get_task(task_name)
    names = description.joint_limits(description.expand()).names
    cells: dict[str, dict[str, dict]] = {}
    for label, models in rows:
        if models is None:
            policy = task.baseline()
        else:
            policy = PolicyRunner(Path(models) / "policy.onnx", names, task.control_dt_s, task.action_limit_radps,
                                  task=task_name)
        for profile in profiles:
            prof = load_profile(profile)
            report = evaluate_stack(policy, prof, episodes, seed, task=task, models_dir=models, stack=stack,
                                    progress=progress)
            cells.setdefault(label, {})[prof.name] = report.to_dict()
            print(f"report: {label} on {prof.name}: success {report.success_rate:.2f}", file=sys.stderr)
    profile_names = [load_profile(p).name for p in profiles]
    doc = {"task": task_name, "episodes": episodes, "seed": seed, "stack": stack, "profiles": profile_names,
           "rows": [label for label, _ in rows],
           "models": {label: (str(m) if m is not None else "scripted baseline") for label, m in rows},
           "cells": cells}
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"sim2real_{task_name}"
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=2))
    stem.with_suffix(".md").write_text(format_markdown(doc))
    _plot(doc, stem.with_suffix(".png"))
    return doc


def format_markdown(doc: dict) -> str:
    """The table: rows x profiles, each cell success / error / interventions / violations."""
    key, label = _error_key(doc["task"])
    head = (f"sim-to-real: task {doc['task']}, {doc['episodes']} episodes, seed {doc['seed']}, "
            f"{'through the whole stack (policy -> safety filter -> arm)' if doc['stack'] else 'no filter'}\n\n"
            f"Each cell: success rate / {label} / filter intervention rate / limit violations on the plant.\n\n")
    lines = ["| row | " + " | ".join(doc["profiles"]) + " |", "|---|" + "---|" * len(doc["profiles"])]
    for row in doc["rows"]:
        cells = []
        for prof in doc["profiles"]:
            d = doc["cells"][row][prof]
            err = d.get(key)
            inter = d.get("intervention_rate")
            cells.append(f"{100 * d['success_rate']:.0f} % / {'-' if err is None else f'{1000 * err:.1f}'} / "
                         f"{'-' if inter is None else f'{100 * inter:.1f} %'} / {d['violations']}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def _plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key, label = _error_key(doc["task"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(doc["profiles"]))
    width = 0.8 / max(len(doc["rows"]), 1)
    for k, row in enumerate(doc["rows"]):
        succ = [100 * doc["cells"][row][p]["success_rate"] for p in doc["profiles"]]
        err = [1000 * (doc["cells"][row][p].get(key) or np.nan) for p in doc["profiles"]]
        axes[0].bar(x + k * width, succ, width, label=row)
        axes[1].bar(x + k * width, err, width, label=row)
    for ax, title in ((axes[0], "success rate (%)"), (axes[1], label)):
        ax.set_xticks(x + width * (len(doc["rows"]) - 1) / 2)
        ax.set_xticklabels(doc["profiles"])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"sim-to-real, task {doc['task']} ({doc['episodes']} episodes per cell)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add_parser(verbs) -> None:
    """``robot-wm report sim2real``."""
    report = verbs.add_parser("report", help="reports over the whole stack").add_subparsers(dest="which", metavar="WHICH",
                                                                                           required=True)
    p = report.add_parser("sim2real", help="the sim-to-real table: policies x arm profiles through the whole stack")
    p.add_argument("--task", default="track", choices=("reach", "track"))
    p.add_argument("--profiles", nargs="+", default=["nominal", "real_twin", "worn_heavy"],
                   help="arm profiles (names or YAML files): the columns")
    p.add_argument("--sim-only", default=None,
                   help="model set trained on nominal-simulator data only (default: the shipped models/<task>_sim_only)")
    p.add_argument("--randomized", default=None, help="the domain-randomized model set (default: the shipped one)")
    p.add_argument("--models", action="append", default=[], help="an adapted model set (repeatable)")
    p.add_argument("--no-baseline", action="store_true", help="leave out the scripted baseline row")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-stack", action="store_true", help="evaluate without the safety filter")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``robot-wm report sim2real``; 0 ok, 2 bad input."""
    from robot_wm.core.onnx_model import ModelError
    from robot_wm.paths import data_path
    from robot_wm.sim import ProfileError

    rows: list[tuple[str, Path | None]] = []
    sim_only = Path(args.sim_only) if args.sim_only else _shipped(f"{args.task}_sim_only", data_path)
    if sim_only is not None:
        rows.append(("sim-only policy", sim_only))
    randomized = Path(args.randomized) if args.randomized else _shipped(args.task, data_path)
    if randomized is not None:
        rows.append(("domain-randomized policy", randomized))
    rows += [(_adapted_label(Path(m)), Path(m)) for m in args.models]
    if not args.no_baseline:
        rows.append(("scripted baseline", None))
    if not rows:
        print("robot-wm report: nothing to evaluate (no model set for this task, baseline left out)", file=sys.stderr)
        return 2
    for label, models in rows:
        if models is not None and not (models / "policy.onnx").is_file():
            print(f"robot-wm report: {label}: {models}/policy.onnx not found", file=sys.stderr)
            return 2
    try:
        doc = run_report(args.task, args.profiles, rows, args.episodes, args.seed, Path(args.out),
                         stack=not args.no_stack, progress=not args.no_progress)
    except (ModelError, ProfileError, ValueError) as exc:
        print(f"robot-wm report: {exc}", file=sys.stderr)
        return 2
    print(format_markdown(doc))
    print(f"report: {Path(args.out) / f'sim2real_{args.task}'}.{{md,json,png}}")
    return 0


def _adapted_label(models: Path) -> str:
    """"adapted on 50 real_twin demos (DIR)" from the set's adapt.json, else "adapted: DIR"."""
    try:
        rep = json.loads((models / "adapt.json").read_text())
        return f"adapted on {rep['episodes']} {'+'.join(rep['robots'])} demos ({models.name})"
    except (OSError, ValueError, KeyError, TypeError):
        return f"adapted: {models.name}"


def _shipped(task: str, data_path) -> Path | None:
    """A shipped model set (reach: models/; any other: models/<name>/), if there is one."""
    directory = data_path("models", must_exist=False) if task == "reach" else data_path("models", task,
                                                                                        must_exist=False)
    return directory if (Path(directory) / "policy.onnx").is_file() else None
