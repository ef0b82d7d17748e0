"""Learning curve of MIXED-phase training: the stack's success and tracking error versus the number
of real episodes, per arm profile, and what ``train mixed`` costs on this machine.

    python bench/bench_mixed.py [--profiles real_twin worn_heavy] [--checkpoints 10 25 50]
                                [--base models/track] [--real-per-round 5] [--eval-episodes 32]
                                [--exploration-std 0] [--joint-calibration FILE] [--seed 0]
                                [--out out/bench_mixed] [--json]

Per profile: one ``train mixed --library`` run (config/training.yaml ``mixed`` and ``adapt``;
``--real-per-round`` so that the checkpoints fall on round ends) up to the largest checkpoint;
then the base set (0 real episodes) and the set in force after each checkpoint are evaluated
through the whole stack (``eval --stack``, SIM-phase limits: what the arm runs once promoted) on
that profile, on paths the real episodes never showed (seed 1000). The reference row is the base
set on the nominal simulator, same paths (the issue's target: within 1 point of its success and
5 % of its tracking error). Besides: interventions and trust drops per 100 real episodes, the
filter's intervention rate and violations in the real episodes, wall-clock and CPU. A run
directory that exists is resumed (``train mixed`` resumes). Prints a table and, last, one JSON
object; writes ``<out>/learning_curve.{json,png}``. ``--joint-calibration``: the arm driver's
joint calibration (``robot-wm calibrate joints``) on the profiles' arms, in the real episodes and
their evaluations (the nominal reference has no encoder offsets to calibrate). ``--seed``: the
real episodes' paths and exploration noise (``mixed.seed``) and the training's seeds (``adapt.seed``)
— another run of the same loop; the evaluation paths stay the same.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    from robot_wm.learning.adapt import AdaptConfig, _stack_eval
    from robot_wm.learning.config import load_section
    from robot_wm.learning.mixed import MixedConfig, train_mixed
    from robot_wm.paths import config_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", nargs="+", default=["real_twin", "worn_heavy"])
    ap.add_argument("--checkpoints", nargs="+", type=int, default=[10, 25, 50])
    ap.add_argument("--base", default=str(REPO / "models" / "track"))
    ap.add_argument("--real-per-round", type=int, default=5)
    ap.add_argument("--ratio", default=None)
    ap.add_argument("--exploration-std", type=float, default=None, help="ablation: 0 = no exploration")
    ap.add_argument("--eval-episodes", type=int, default=32)
    ap.add_argument("--joint-calibration", default=None, help="the driver's joint calibration on the profiles' arms")
    ap.add_argument("--seed", type=int, default=None, help="the run's seed (mixed.seed and adapt.seed)")
    ap.add_argument("--out", default=str(REPO / "out" / "bench_mixed"))
    ap.add_argument("--json", action="store_true", help="only the JSON line")
    args = ap.parse_args()

    cfg = dataclasses.replace(load_section(config_path("training.yaml"), "mixed", MixedConfig),
                              real_per_round=args.real_per_round)
    if args.ratio:
        cfg = dataclasses.replace(cfg, ratio=args.ratio)
    if args.exploration_std is not None:
        cfg = dataclasses.replace(cfg, exploration_std=args.exploration_std)
    acfg = load_section(config_path("training.yaml"), "adapt", AdaptConfig)
    if args.seed is not None:
        cfg, acfg = dataclasses.replace(cfg, seed=args.seed), dataclasses.replace(acfg, seed=args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = Path(args.base).resolve()
    n_eval, seed = args.eval_episodes, acfg.eval_seed
    result = {"base": str(base), "eval_episodes": n_eval, "eval_seed": seed, "ratio": cfg.ratio,
              "exploration_std": cfg.exploration_std,
              "real_per_round": cfg.real_per_round, "joint_calibration": args.joint_calibration, "seed": cfg.seed,
              "profiles": {}}
    jcal = args.joint_calibration
    t0 = time.perf_counter()
    result["nominal_reference"] = _stack_eval(base, "track", "nominal", n_eval, seed)
    for profile in args.profiles:
        run_dir = out / f"run_{profile}"
        started, cpu = time.perf_counter(), time.process_time()
        report = train_mixed("track", base, run_dir, profile, max(args.checkpoints), cfg, acfg, evaluate=False,
                             progress=False, command=" ".join(sys.argv), joint_calibration=jcal)
        rows = [{"real_episodes": 0, **_stack_eval(base, "track", profile, n_eval, seed, jcal)}]
        for n in sorted(args.checkpoints):
            at = [r for r in report["rounds"] if r["real_episodes_done"] <= n]
            if not at:
                continue
            rows.append({"real_episodes": at[-1]["real_episodes_done"], "set": at[-1]["set"],
                         **_stack_eval(Path(at[-1]["set"]), "track", profile, n_eval, seed, jcal)})
        result["profiles"][profile] = {"curve": rows, "summary": report["summary"], "timing": report["timing"],
                                       "calibration_source": report.get("calibration_source"),
                                       "rounds": [{k: r[k] for k in ("round", "real_episodes_done", "successes",
                                                                     "tracking_rms_m_median", "filter_intervention_rate",
                                                                     "ended_by_intervention", "ended_by_trust", "violations",
                                                                     "exploration_scale_mean", "world_model", "policy",
                                                                     "seconds", "trust_calibration")}
                                                  for r in report["rounds"]],
                                       "bench_wall_s": round(time.perf_counter() - started, 1),
                                       "bench_cpu_s": round(time.process_time() - cpu, 1)}
        if not args.json:
            _table(profile, result)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "learning_curve.json").write_text(json.dumps(result, indent=1))
    _png(result, out / "learning_curve.png")
    print(json.dumps(result))
    return 0


def _table(profile: str, result: dict) -> None:
    ref = result["nominal_reference"]
    p = result["profiles"][profile]
    print(f"\n{profile}: target = base set on nominal: success {100 * ref['success_rate']:.0f} %, "
          f"tracking RMS median {1e3 * ref['tracking_rms_m_median']:.2f} mm")
    print("| real episodes | success | RMS median / p90 (mm) | filter | violations |")
    print("|---|---|---|---|---|")
    for r in p["curve"]:
        print(f"| {r['real_episodes']} | {100 * r['success_rate']:.0f} % | {1e3 * r['tracking_rms_m_median']:.2f} / "
              f"{1e3 * r['tracking_rms_m_p90']:.2f} | {100 * r['intervention_rate']:.2f} % | {r['violations']} |")
    s, t = p["summary"], p["timing"]
    print(f"real episodes: interventions {s['interventions_per_100']} / trust drops {s['trust_drops_per_100']} per 100, "
          f"filter {100 * (s['filter_intervention_rate'] or 0):.1f} %, violations {s['violations']}; "
          f"train mixed {t['rounds_wall_s']:.0f} s wall / {t['rounds_cpu_s']:.0f} s CPU", flush=True)


def _png(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ref = result["nominal_reference"]
    for profile, p in result["profiles"].items():
        x = [r["real_episodes"] for r in p["curve"]]
        axes[0].plot(x, [100 * r["success_rate"] for r in p["curve"]], "o-", label=profile)
        axes[1].plot(x, [1e3 * r["tracking_rms_m_median"] for r in p["curve"]], "o-", label=profile)
    axes[0].axhline(100 * ref["success_rate"], color="g", ls="--", lw=1, label="base on nominal")
    axes[1].axhline(1e3 * ref["tracking_rms_m_median"], color="g", ls="--", lw=1, label="base on nominal")
    axes[0].set(xlabel="real episodes (MIXED)", ylabel="stack success (%)", ylim=(0, 105), title="success")
    axes[1].set(xlabel="real episodes (MIXED)", ylabel="tracking RMS median (mm)", title="tracking error")
    for ax in axes:
        ax.legend()
    fig.suptitle(f"train mixed: the stack on {result['eval_episodes']} new paths after N real episodes (ratio {result['ratio']})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
