"""``robot-wm train mixed``: the verb around ``robot_wm.learning.mixed.train_mixed`` — settings,
the PNG report, the printed summary."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any


def add_parser(train: argparse._SubParsersAction, common) -> None:
    p = train.add_parser("mixed", help="MIXED-phase training: real episodes (with uncertainty-bounded exploration) "
                                       "alternate with the policy's training in the world model's imagination")
    common(p)
    p.add_argument("--task", default="track", choices=("reach", "track"), help="the task (default track)")
    p.add_argument("--base", default=None, help="model set to start from (default: the task's active set, else the shipped one)")
    p.add_argument("--out", required=True, help="directory of the run: rounds/rNNN sets, real/ bags, mixed.json; the "
                                                "final set at its top. An existing run there is resumed")
    p.add_argument("--real-episodes", type=int, required=True, help="real episodes in all (a resumed run goes on to this)")
    p.add_argument("--ratio", default=None, help="R:I real to imagination episodes (one imagination episode = one batch "
                                                 "of 256 imagined rollouts); default config/training.yaml mixed.ratio")
    p.add_argument("--real-per-round", type=int, default=None, help="real episodes between two imagination phases")
    p.add_argument("--library", action="store_true", help="real episodes on the library-mode simulator instead of the "
                                                          "running stack")
    p.add_argument("--profile", default=None, help="the arm's profile: --library: the simulated 'real' arm; on a running "
                                                   "stack: the profile the embedded arm runs (its trust calibration's name)")
    p.add_argument("--robot", default=None, help="on a running stack with hardware: the arm's name (its trust calibration's "
                                                 "and the bags')")
    p.add_argument("--joint-calibration", default=None, help="--library: the arm driver's joint calibration (robot-wm "
                                                             "calibrate joints) applied to the simulated arm's joint states")
    p.add_argument("--episode-timeout", type=float, default=120.0, help="on a running stack: seconds a real episode may "
                                                                        "take before the run stops (default 120)")
    p.add_argument("--register", action="store_true", help="add every round's set to the model registry (with --library "
                                                           "not activated; on a running stack always, and activated)")
    p.add_argument("--eval-episodes", type=int, default=None, help="final stack evaluation episodes (0: none)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=cmd_train_mixed)


def cmd_train_mixed(args) -> int:
    from robot_wm.bags import BagError
    from robot_wm.core.onnx_model import ModelError
    from robot_wm.learning.adapt import AdaptConfig, AdaptError, _json_default
    from robot_wm.learning.adapt_cli import default_base
    from robot_wm.learning.config import ConfigError, load_section
    from robot_wm.learning.mixed import MixedConfig, MixedError, train_mixed
    from robot_wm.learning.provenance import command_line
    from robot_wm.paths import config_path
    from robot_wm.sim import ProfileError

    if args.library and not args.profile:
        print("train mixed: --library needs --profile (the simulated arm the real episodes run on)", file=sys.stderr)
        return 2
    if not args.library and not (args.profile or args.robot):
        print("train mixed: say which arm the running stack drives: --profile P (the embedded arm's profile) or --robot "
              "NAME (hardware); its trust calibration and the bags carry that name", file=sys.stderr)
        return 2
    if args.library and args.robot:
        print("train mixed: --robot is for a running stack; --library runs the simulator --profile", file=sys.stderr)
        return 2
    try:
        path = Path(args.config) if args.config else config_path("training.yaml")
        cfg = load_section(path, "mixed", MixedConfig)
        acfg = load_section(path, "adapt", AdaptConfig)
        cfg = dataclasses.replace(cfg, **{k: v for k, v in (("real_per_round", args.real_per_round), ("seed", args.seed))
                                          if v is not None})
        acfg = dataclasses.replace(acfg, **{k: v for k, v in (("eval_episodes", args.eval_episodes),
                                                               ("threads", args.threads), ("seed", args.seed)) if v is not None})
        if args.ratio is not None:
            cfg = dataclasses.replace(cfg, ratio=args.ratio)
        if not args.library and args.threads is None:
            # beside a running stack the trainer gets what the control processes leave (it runs at nice 10):
            # a second torch thread mostly waits for the first (2 threads there: 13-14 s per policy iteration)
            acfg = dataclasses.replace(acfg, threads=1)
    except (ConfigError, ValueError) as exc:
        print(f"train mixed: {exc}", file=sys.stderr)
        return 2
    base = Path(args.base) if args.base else default_base(args.task)
    state = Path(args.out) / "mixed.json"
    if not args.base and state.is_file():  # resuming: the run's base (on a live run the active set has moved on since)
        try:
            base = Path(json.loads(state.read_text())["args"]["base"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # train_mixed names what is wrong with the state file
    arm = None
    try:
        if not args.library:
            from robot_wm.learning.mixed_live import LiveArm

            try:  # the graph's control processes come first: recording and training wait (as the online learner does)
                os.nice(10)
            except OSError:
                pass

            arm = LiveArm(args.task, args.robot or Path(args.profile).stem, cfg, episode_timeout_s=args.episode_timeout,
                          progress=lambda line: print(f"train mixed: {line}", flush=True,
                                                      file=sys.stderr if args.json else sys.stdout))
        report = train_mixed(args.task, base, Path(args.out), args.robot or args.profile, args.real_episodes, cfg, acfg,
                             register=args.register, progress=not args.no_progress, command=command_line(), arm=arm,
                             joint_calibration=args.joint_calibration)
    except (MixedError, BagError, AdaptError, ModelError, ProfileError, FileNotFoundError, ValueError) as exc:
        print(f"train mixed: {exc}", file=sys.stderr)
        return 2
    finally:
        if arm is not None:
            arm.close()
    png = write_png(report, Path(args.out) / "mixed.png")
    if args.json:
        print(json.dumps(report, default=_json_default))
    else:
        _print(report, png)
    return 0


def write_png(report: dict[str, Any], path: Path) -> Path:
    """Per round: the real episodes' success and tracking error, how they ended, and the
    exploration's scale (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rounds = report["rounds"]
    x = [r["real_episodes_done"] for r in rounds]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    axes[0].plot(x, [100 * r["successes"] / max(r["real_episodes"], 1) for r in rounds], "o-", label="success (%)")
    ax2 = axes[0].twinx()
    ax2.plot(x, [1e3 * (r["tracking_rms_m_median"] or np.nan) for r in rounds], "s--", color="#d62728",
             label="tracking RMS median (mm)")
    axes[0].set(title="real episodes per round (MIXED limits, exploring)", xlabel="real episodes", ylabel="success (%)",
                ylim=(0, 105))
    ax2.set_ylabel("tracking RMS median (mm)")
    axes[1].bar(x, [r["ended_by_intervention"] for r in rounds], width=2, label="intervention")
    axes[1].bar(x, [r["ended_by_trust"] for r in rounds], width=2, bottom=[r["ended_by_intervention"] for r in rounds],
                label="trust drop")
    axes[1].set(title="episodes ended early", xlabel="real episodes")
    axes[1].legend()
    us, ss = [], []
    for r in rounds:
        for e in r["episodes"]:
            ex = e.get("exploration") or {}
            if ex.get("uncertainty_median_radps") is not None:
                us.append(ex["uncertainty_median_radps"])
                ss.append(ex["scale_mean"])
    axes[2].scatter(us, ss, s=12)
    cfg = report["args"]["config"]
    u = np.linspace(0, 1.5 * cfg["uncertainty_high_radps"], 100)
    from robot_wm.learning.mixed import exploration_scale

    axes[2].plot(u, [exploration_scale(v, cfg["uncertainty_low_radps"], cfg["uncertainty_high_radps"]) for v in u], "k--",
                 lw=1, label="the rule (trust FULL)")
    axes[2].set(title="exploration vs uncertainty (per episode)", xlabel="median epistemic std of q̇ (rad/s)",
                ylabel="mean scale", ylim=(-0.05, 1.05))
    axes[2].legend()
    fig.suptitle(f"robot-wm train mixed: {report['args']['task']} on {report['args']['profile']}, ratio {report['args']['ratio']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _print(r: dict[str, Any], png: Path) -> None:
    a = r["args"]
    print(f"train mixed {a['task']} on {a['profile']} (MIXED phase, ratio {a['ratio']}) from {a['base']}: "
          f"{r['real_episodes_done']} / {r['real_episodes_target']} real episodes in {len(r['rounds'])} rounds")
    print(f"  trust calibration of the base model: {r.get('calibration_source')}")
    for row in r["rounds"]:
        p = row["policy"]
        rms = row["tracking_rms_m_median"]
        print(f"  round {row['round']}: {row['successes']}/{row['real_episodes']} succeeded, tracking RMS median "
              f"{'-' if rms is None else f'{1e3 * rms:.2f} mm'}, ended {row['ended_by_intervention']} by intervention / "
              f"{row['ended_by_trust']} by trust, filter {100 * (row['filter_intervention_rate'] or 0):.1f} %, violations "
              f"{row['violations']}, exploration scale {row['exploration_scale_mean']}; "
              + (f"not trained: {row['skipped']}" if row.get("skipped") else
                 f"world model NLL {row['world_model']['holdout_nll_before']:.2f} -> "
                 f"{row['world_model']['holdout_nll_after']:.2f}; "
                 f"policy {'accepted' if p['accepted'] else 'kept'} ({p['imagination_episodes']} imagination episodes, "
                 f"validation {p['validation_start_m']} -> {p['validation_best_m']} m)")
              + f"; {row['seconds']['total']:.0f} s"
              + (f"; registered {row['registry']['version']}" if "registry" in row else ""))
    s = r.get("summary") or {}
    print(f"  in all: success {s.get('success_rate')}, interventions {s.get('interventions_per_100')} and trust drops "
          f"{s.get('trust_drops_per_100')} per 100 real episodes, violations {s.get('violations')}")
    for k in ("before", "after", "nominal_reference"):
        row = (r.get("stack") or {}).get(k)
        if row:
            print(f"  stack {k:>17}: success {100 * row['success_rate']:.0f} %, tracking RMS median "
                  f"{1e3 * (row.get('tracking_rms_m_median') or float('nan')):.2f} mm, filter "
                  f"{100 * (row.get('intervention_rate') or 0):.1f} %")
    print(f"  report {png}{'' if r.get('finished') else ' (not finished: run the same command again to resume)'}")
