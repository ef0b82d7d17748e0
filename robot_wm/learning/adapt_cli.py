"""``robot-wm adapt``: the verb around ``robot_wm.learning.adapt.adapt`` — settings, the PNG
report, the registry entry, the printed summary."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from robot_wm.learning.adapt import AdaptConfig, AdaptError, _json_default, adapt


def write_png(report: dict[str, Any], path: Path) -> Path:
    """World-model error and coverage on the held-out real episodes, and the stack's task metrics,
    before and after adaptation (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wm = report["world_model"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    joints = np.arange(6)
    for k, (label, color) in enumerate((("before", "#999999"), ("after", "#1f77b4"))):
        axes[0].bar(joints + (k - 0.5) * 0.38, wm[label]["one_step"]["rmse_qdot_radps_per_joint"], 0.38, label=label, color=color)
    axes[0].set(title="world model: one-step q̇ error (test episodes)", xlabel="joint", ylabel="RMSE (rad/s)")
    axes[0].legend()
    cov = [wm["before"]["calibration"]["coverage90"], wm["after"]["calibration"]["coverage90"]]
    axes[1].bar(["before", "after"], cov, color=["#999999", "#1f77b4"])
    axes[1].axhline(0.9, color="k", ls="--", lw=1, label="target 0.9")
    axes[1].set(title="90 % interval coverage (test episodes)", ylim=(0, 1.05))
    axes[1].legend(loc="lower right")
    stack = {k: v for k, v in (report.get("stack") or {}).items() if isinstance(v, dict) and "before" in v}
    if stack:
        names, x = list(stack), np.arange(len(stack))
        for k, (label, color) in enumerate((("before", "#999999"), ("after", "#1f77b4"))):
            axes[2].bar(x + (k - 0.5) * 0.38, [100 * stack[n][label]["success_rate"] for n in names], 0.38, label=label,
                        color=color)
        ref = report["stack"].get("nominal_reference")
        if ref:
            axes[2].axhline(100 * ref["success_rate"], color="g", ls="--", lw=1, label="base set on nominal")
        axes[2].set_xticks(x, names)
        axes[2].set(title=f"stack success ({report['task']}, {next(iter(stack.values()))['after']['episodes']} episodes)",
                    ylabel="%", ylim=(0, 105))
        axes[2].legend(loc="lower right")
    else:
        axes[2].text(0.5, 0.5, "no simulator evaluation\n(demos from hardware, or --no-eval)", ha="center", va="center")
        axes[2].set_axis_off()
    fig.suptitle(f"robot-wm adapt: {report['episodes']} demos ({', '.join(report['robots'])}) -> {report['versions']['policy']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def default_base(task: str) -> Path:
    """The base set when none is given: the active set of the task in the registry, else the shipped one."""
    from robot_wm.paths import data_path

    try:
        from robot_wm import registry

        active = registry.Registry().active(task)
        if active is not None:
            return Path(active.path)
    except Exception:  # noqa: BLE001 - no usable registry: the shipped set
        pass
    return Path(data_path("models", must_exist=False)) if task == "reach" else Path(data_path("models", "track", must_exist=False))


def register(out: Path, task: str, base: Path, report: dict[str, Any], *, activate: bool, command: str) -> dict:
    """Add the adapted set to the model registry, its parent = the registered set the base is."""
    from robot_wm import registry
    from robot_wm.core.onnx_model import sha256_file

    reg = registry.Registry()
    reg.ensure_shipped()
    base_policy = sha256_file(Path(base) / "policy.onnx")
    parent = next((i.version for i in reg.list(task) if i.files.get("policy.onnx") == base_policy), None)
    metrics = {"world_model_holdout": {k: report["world_model"][k]["one_step"] for k in ("before", "after")},
               "coverage90": {k: report["world_model"][k]["calibration"]["coverage90"] for k in ("before", "after")},
               "stack": report.get("stack")}
    info = reg.add(out, task, parent=parent, activate=activate,
                   lineage={"training_data": {"sim_dataset_sha256": report.get("replay_sha256"),
                                              "demo_bags_sha256": report["demo_bag_sha256"]},
                            "command": command, "metrics": metrics, "base": str(base), "robots": report["robots"]})
    return {"version": info.version, "parent": parent, "active": bool(activate)}


def cmd_adapt(args) -> int:
    from robot_wm.bags import BagError
    from robot_wm.core.joint_calibration import JointCalibrationError
    from robot_wm.learning.config import ConfigError, load_section
    from robot_wm.learning.provenance import command_line
    from robot_wm.paths import config_path

    try:
        cfg = load_section(Path(args.config) if args.config else config_path("training.yaml"), "adapt", AdaptConfig)
        overrides = {k: v for k, v in (("policy_iterations", args.policy_iterations), ("wm_epochs", args.wm_epochs),
                                       ("eval_episodes", args.eval_episodes), ("replay_transitions", args.replay),
                                       ("threads", args.threads), ("seed", args.seed)) if v is not None}
        cfg = dataclasses.replace(cfg, **overrides)
    except (ConfigError, ValueError) as exc:
        print(f"adapt: {exc}", file=sys.stderr)
        return 2
    if args.joint_calibration:  # refused now, not after the training
        from robot_wm import description
        from robot_wm.core import joint_calibration

        try:
            joint_calibration.load(args.joint_calibration, description.joint_limits(description.expand()).names)
        except JointCalibrationError as exc:
            print(f"adapt: --joint-calibration: {exc}", file=sys.stderr)
            return 2
    base = Path(args.base) if args.base else default_base(args.task)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"adapt: --out {out} exists and is not empty (a model set is written once; choose a new directory)",
              file=sys.stderr)
        return 2
    try:
        report = adapt(args.task, Path(args.demos), base, out, cfg, evaluate=not args.no_eval,
                       progress=not args.no_progress, command=command_line(),
                       joint_calibration=args.joint_calibration)
    except (BagError, AdaptError, FileNotFoundError, JointCalibrationError) as exc:
        print(f"adapt: {exc}", file=sys.stderr)
        return 2
    from robot_wm.core.onnx_model import ModelError

    png = write_png(report, out / "adapt.png")
    if args.register or args.activate:
        try:
            report["registry"] = register(out, args.task, base, report, activate=args.activate,
                                          command=command_line())
        except (ModelError, ValueError, OSError) as exc:
            print(f"adapt: the model set was written to {out} but not registered: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(report, default=_json_default))
    else:
        _print_adapt(report, png)
    return 0


def _print_adapt(r: dict[str, Any], png: Path) -> None:
    wm = r["world_model"]
    print(f"adapt {r['task']}: {r['episodes']} demos of {', '.join(r['robots'])} ({r['train_episodes']} train, "
          f"{r['holdout_episodes']} validation, {r['test_episodes']} test) on {r['base']} -> {r['out']}")
    print(f"  world model {r['base_versions']['world_model']} -> {r['versions']['world_model']}: test episodes' one-step q̇ RMSE "
          f"{wm['before']['one_step']['rmse_qdot_radps']:.4f} -> {wm['after']['one_step']['rmse_qdot_radps']:.4f} rad/s, "
          f"90 % coverage {wm['before']['calibration']['coverage90']:.2f} -> {wm['after']['calibration']['coverage90']:.2f}")
    print(f"  on simulator episodes (forgetting): one-step q̇ RMSE {wm['simulator_before']['rmse_qdot_radps']:.4f} -> "
          f"{wm['simulator_after']['rmse_qdot_radps']:.4f} rad/s")
    print(f"  policy {r['base_versions']['policy']} -> {r['versions']['policy']}")
    for robot, row in (r.get("stack") or {}).items():
        if isinstance(row, dict) and "before" in row:
            err = "tracking_rms_m_median" if "tracking_rms_m_median" in row["before"] else "final_error_m_median"
            print(f"  stack on {robot}: success {100 * row['before']['success_rate']:.0f} % -> {100 * row['after']['success_rate']:.0f} %, "
                  f"{err} {1e3 * row['before'][err]:.2f} -> {1e3 * row['after'][err]:.2f} mm, filter "
                  f"{100 * row['before']['intervention_rate']:.1f} -> {100 * row['after']['intervention_rate']:.1f} %, "
                  f"violations {row['after']['violations']}")
        elif robot == "nominal_reference":
            print(f"  base set on nominal (the target): success {100 * row['success_rate']:.0f} %")
        elif isinstance(row, dict):
            print(f"  {robot}: {row.get('skipped')}")
    t = r["timing"]
    print(f"  training {t['train_wall_s']:.0f} s wall, {t['train_cpu_s']:.0f} s CPU ({t['threads']} threads); "
          f"total {t['total_wall_s']:.0f} s; report {png}")
    if "registry" in r:
        print(f"  registered as {r['registry']['version']}{' (active)' if r['registry']['active'] else ''}")
