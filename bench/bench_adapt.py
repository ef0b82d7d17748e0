"""Learning curve of sim-to-real adaptation: the adapted stack's success and tracking error versus the
number of demonstrations, per arm profile, and what ``adapt`` costs on this machine.

    python bench/bench_adapt.py [--profiles real_twin worn_heavy] [--demos 5 10 25 50 100]
                                [--eval-episodes 32] [--out out/bench_adapt] [--json]

Per profile: ``max(--demos)`` library-mode demonstrations of the shipped tracking policy are
recorded once (``robot-wm record --library``, seed 0; reused when the directory holds them), then
for each N the first N go through ``robot-wm adapt`` (config/training.yaml ``adapt``) and the
adapted set is evaluated through the whole stack (``eval --stack``) on that profile, on paths the
demonstrations never showed (seed 1000). The reference row is the shipped set on the nominal
simulator, same paths: the issue's target is the adapted stack within 2 points of its success
and 10 % of its tracking error. Prints a table and, last, one JSON object; writes
``<out>/learning_curve.{json,png}``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _demos(out: Path, profile: str, n: int) -> Path:
    from robot_wm.bags import list_bags
    from robot_wm.learning.demos import record_library

    d = out / f"demos_{profile}"
    have = len(list_bags(d)[0]) if d.is_dir() else 0
    if have < n:
        t = time.perf_counter()
        record_library("track", profile, n - have, d, first_index=have, progress=False)
        print(f"recorded {n - have} demos on {profile} in {time.perf_counter() - t:.0f} s", flush=True)
    return d


def _subset(out: Path, demos: Path, profile: str, n: int) -> Path:
    from robot_wm.bags import list_bags

    sub = out / f"subset_{profile}_{n}"
    sub.mkdir(parents=True, exist_ok=True)
    for bag in list_bags(demos)[0][:n]:
        link = sub / bag.name
        if not link.exists():
            link.symlink_to(bag.resolve(), target_is_directory=True)
    return sub


def main() -> int:
    import shutil

    from robot_wm.learning.adapt import AdaptConfig, _stack_eval, adapt
    from robot_wm.learning.config import load_section
    from robot_wm.paths import config_path, data_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", nargs="+", default=["real_twin", "worn_heavy"])
    ap.add_argument("--demos", nargs="+", type=int, default=[5, 10, 25, 50, 100])
    ap.add_argument("--eval-episodes", type=int, default=32)
    ap.add_argument("--policy-iterations", type=int, default=None, help="override adapt.policy_iterations")
    ap.add_argument("--validation-horizon", type=int, default=None, help="override adapt.validation_horizon (periods)")
    ap.add_argument("--out", default=str(REPO / "out" / "bench_adapt"))
    ap.add_argument("--ablation", type=int, default=25, help="also adapt the first profile's first N demos "
                    "without simulator replay, without the policy fine-tune, and without its validation (0: skip)")
    ap.add_argument("--json", action="store_true", help="only the JSON line")
    args = ap.parse_args()
    out = Path(args.out)
    base = Path(data_path("models", "track"))
    cfg = load_section(config_path("training.yaml"), "adapt", AdaptConfig)
    import dataclasses

    for name in ("policy_iterations", "validation_horizon"):
        if getattr(args, name) is not None:
            cfg = dataclasses.replace(cfg, **{name: getattr(args, name)})
    say = (lambda *a, **k: None) if args.json else print
    result = {"config": cfg.__dict__, "eval_episodes": args.eval_episodes, "profiles": {}}
    ref = _stack_eval(base, "track", "nominal", args.eval_episodes, cfg.eval_seed)
    result["nominal_reference"] = ref
    say(f"reference: shipped set on nominal: success {100 * ref['success_rate']:.0f} %, tracking RMS median "
        f"{1e3 * ref['tracking_rms_m_median']:.2f} mm ({args.eval_episodes} paths, seed {cfg.eval_seed})", flush=True)
    for profile in args.profiles:
        demos = _demos(out, profile, max(args.demos))
        before = _stack_eval(base, "track", profile, args.eval_episodes, cfg.eval_seed)
        rows = {"0": {"stack": before}}
        say(f"\n{profile}: demos | success | RMS median (mm) | RMS p90 | filter | violations | adapt wall / CPU (s)")
        say(f"  {0:>4} | {100 * before['success_rate']:5.1f} % | {1e3 * before['tracking_rms_m_median']:.2f} | "
            f"{1e3 * before['tracking_rms_m_p90']:.2f} | {100 * before['intervention_rate']:.2f} % | {before['violations']} | -", flush=True)
        for n in sorted(args.demos):
            target = out / f"adapted_{profile}_{n}"
            shutil.rmtree(target, ignore_errors=True)
            rep = adapt("track", _subset(out, demos, profile, n), base, target, cfg, evaluate=False, progress=False,
                        command=f"bench/bench_adapt.py ({profile}, {n} demos)")
            after = _stack_eval(target, "track", profile, args.eval_episodes, cfg.eval_seed)
            wm = rep["world_model"]
            rows[str(n)] = {"stack": after, "timing": rep["timing"],
                            "world_model": {"rmse_qdot_before": wm["before"]["one_step"]["rmse_qdot_radps"],
                                            "rmse_qdot_after": wm["after"]["one_step"]["rmse_qdot_radps"],
                                            "coverage90_before": wm["before"]["calibration"]["coverage90"],
                                            "coverage90_after": wm["after"]["calibration"]["coverage90"]}}
            t = rep["timing"]
            say(f"  {n:>4} | {100 * after['success_rate']:5.1f} % | {1e3 * after['tracking_rms_m_median']:.2f} | "
                f"{1e3 * after['tracking_rms_m_p90']:.2f} | {100 * after['intervention_rate']:.2f} % | {after['violations']} | "
                f"{t['train_wall_s']:.0f} / {t['train_cpu_s']:.0f}   (world model q̇ RMSE {wm['before']['one_step']['rmse_qdot_radps']:.4f}"
                f" -> {wm['after']['one_step']['rmse_qdot_radps']:.4f}, coverage {wm['after']['calibration']['coverage90']:.2f})",
                flush=True)
        result["profiles"][profile] = rows
    if args.ablation:
        result["ablation"] = _ablation(out, base, cfg, args.profiles[0], args.ablation, args.eval_episodes, say)
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning_curve.json").write_text(json.dumps(result, indent=1))
    _plot(result, out / "learning_curve.png")
    print(json.dumps(result))
    return 0


ABLATIONS = {
    "no simulator replay": {"replay_transitions": 0},
    "world model only (base policy)": {"policy_iterations": 0},
    "policy fine-tune without validation": {"validate_every": 10**6},
}


def _ablation(out: Path, base: Path, cfg, profile: str, n: int, episodes: int, say) -> dict:
    """What each part of adapt contributes, on ``n`` demos of ``profile``: world-model test error,
    its error on simulator episodes (forgetting), and the stack."""
    import dataclasses
    import shutil

    from robot_wm.learning.adapt import _stack_eval, adapt

    demos = _subset(out, out / f"demos_{profile}", profile, n)
    say(f"\nablation ({profile}, {n} demos): variant | success | RMS median (mm) | world model q̇ RMSE test / simulator")
    rows = {}
    for name, over in {"adapt (default)": {}, **ABLATIONS}.items():
        target = out / f"ablation_{profile}_{n}_{len(rows)}"
        shutil.rmtree(target, ignore_errors=True)
        rep = adapt("track", demos, base, target, dataclasses.replace(cfg, **over), evaluate=False, progress=False)
        stack = _stack_eval(target, "track", profile, episodes, cfg.eval_seed)
        wm = rep["world_model"]
        rows[name] = {"overrides": over, "stack": stack, "rmse_qdot_test": wm["after"]["one_step"]["rmse_qdot_radps"],
                      "rmse_qdot_simulator": wm["simulator_after"]["rmse_qdot_radps"],
                      "rmse_qdot_simulator_base": wm["simulator_before"]["rmse_qdot_radps"],
                      "rmse_qdot_test_base": wm["before"]["one_step"]["rmse_qdot_radps"],
                      "policy_validation": (rep["policy"] or {}).get("validation"), "timing": rep["timing"]}
        say(f"  {name:<38} | {100 * stack['success_rate']:5.1f} % | {1e3 * stack['tracking_rms_m_median']:.2f} | "
            f"{rows[name]['rmse_qdot_test']:.4f} / {rows[name]['rmse_qdot_simulator']:.4f} "
            f"(base {rows[name]['rmse_qdot_test_base']:.4f} / {rows[name]['rmse_qdot_simulator_base']:.4f})", flush=True)
    return rows


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ref = result["nominal_reference"]
    for profile, rows in result["profiles"].items():
        ns = sorted(int(n) for n in rows)
        axes[0].plot(ns, [100 * rows[str(n)]["stack"]["success_rate"] for n in ns], "o-", label=profile)
        axes[1].plot(ns, [1e3 * rows[str(n)]["stack"]["tracking_rms_m_median"] for n in ns], "o-", label=profile)
    axes[0].axhline(100 * ref["success_rate"], color="g", ls="--", label="shipped set on nominal")
    axes[0].axhline(100 * ref["success_rate"] - 2, color="g", ls=":", lw=1, label="target (-2 points)")
    axes[1].axhline(1e3 * ref["tracking_rms_m_median"], color="g", ls="--", label="shipped set on nominal")
    axes[1].axhline(1.1e3 * ref["tracking_rms_m_median"], color="g", ls=":", lw=1, label="target (+10 %)")
    axes[0].set(xlabel="demonstrations", ylabel="success (%)", title="adapted stack: success", ylim=(0, 105))
    axes[1].set(xlabel="demonstrations", ylabel="tracking RMS median (mm)", title="adapted stack: tracking error")
    for ax in axes:
        ax.set_xscale("symlog", linthresh=5)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
