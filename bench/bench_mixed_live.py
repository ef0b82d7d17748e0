"""Benchmark of ``robot-wm train mixed`` on a running stack (issue #14): the live graph's real episodes.

Starts the graph of ``robot-wm up --task track --enable --profile P`` on the embedded arm (a ROS
domain, a state directory and a model registry of this run's own; the deployment phase set to
MIXED in its phase file, as an operator's ``robot-wm trust promote`` would), waits until it tracks,
runs ``robot-wm train mixed --profile P --real-episodes N`` against it (``config/training.yaml``
otherwise; ``--real-per-round``, ``--ratio``, ``--eval-episodes`` override it) and stops the graph.

Reported (a table, and ONE JSON object on the last line): per round the real episodes' success,
tracking error, early ends, filter share, violations and exploration scale, the policy update
accepted or not, the set swapped into the running nodes; in all, interventions and trust drops per
100 real episodes, the run's wall-clock and CPU time, and (with ``--eval-episodes`` > 0) the
library stack evaluation of the base and the final set on the profile and of the base on nominal.

Usage: python bench/bench_mixed_live.py [--profile real_twin] [--real-episodes 20] [--real-per-round 10]
       [--ratio 1:10] [--eval-episodes 32] [--out out/bench_mixed_live] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="real_twin")
    ap.add_argument("--real-episodes", type=int, default=20)
    ap.add_argument("--real-per-round", type=int, default=None)
    ap.add_argument("--ratio", default=None)
    ap.add_argument("--eval-episodes", type=int, default=None)
    ap.add_argument("--out", default="out/bench_mixed_live")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from robot_wm.core.safety import Phase
    from robot_wm.core.trust.phase import PhaseState, PhaseStore
    from robot_wm.graph import plan
    from robot_wm.process_group import ProcessGroup
    from robot_wm.rosenv import loopback_env

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="robot_wm_bench_mixed_live_"))
    PhaseStore(state / "phase" / "track.json").save(PhaseState(phase=Phase.MIXED))
    env = loopback_env(domain_id=150 + os.getpid() % 30)
    env.update(PYTHONUNBUFFERED="1", ROBOT_WM_STATE_DIR=str(state), ROBOT_WM_MODELS_DIR=str(state / "models"))
    specs = plan("mujoco", overrides={"profile": args.profile}, enable=True, task="track")
    group = ProcessGroup(specs, env)
    run_dir = out / "run"
    cmd = [sys.executable, "-m", "robot_wm.cli", "train", "mixed", "--profile", args.profile, "--out", str(run_dir),
           "--real-episodes", str(args.real_episodes), "--json", "--no-progress"]
    for flag, value in (("--real-per-round", args.real_per_round), ("--ratio", args.ratio),
                        ("--eval-episodes", args.eval_episodes)):
        if value is not None:
            cmd += [flag, str(value)]
    doc = {"benchmark": "mixed_live", "profile": args.profile, "real_episodes": args.real_episodes,
           "command": " ".join(cmd[1:]), "loadavg_start": os.getloadavg()}
    group.start()
    try:
        time.sleep(10.0)  # the graph comes up; train mixed itself waits for the trust monitor
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
        doc["wall_s"] = round(time.perf_counter() - t0, 1)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        doc["trainer_cpu_s"] = round((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), 1)
    finally:
        group.stop()
    (out / "train_mixed.stderr.log").write_text(proc.stderr)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        doc["error"] = f"train mixed exited {proc.returncode}"
        print(json.dumps(doc))
        return 1
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    doc["rounds"] = [{k: r.get(k) for k in ("round", "real_episodes_done", "successes", "real_episodes",
                                            "tracking_rms_m_median", "ended_by_intervention", "ended_by_trust",
                                            "filter_intervention_rate", "violations", "exploration_scale_mean")}
                     | {"policy_accepted": r["policy"]["accepted"], "set": (r.get("registry") or {}).get("version"),
                        "seconds": r["seconds"]} for r in report["rounds"]]
    doc["summary"], doc["stack"] = report.get("summary"), report.get("stack")
    doc["loadavg_end"] = os.getloadavg()
    if not args.json:
        for r in doc["rounds"]:
            rms = r["tracking_rms_m_median"]
            print(f"round {r['round']}: {r['successes']}/{r['real_episodes']} succeeded, RMS median "
                  f"{'-' if rms is None else f'{1e3 * rms:.1f} mm'}, ended {r['ended_by_intervention']} by intervention / "
                  f"{r['ended_by_trust']} by trust, filter {100 * (r['filter_intervention_rate'] or 0):.1f} %, violations "
                  f"{r['violations']}, exploration {r['exploration_scale_mean']}, policy "
                  f"{'accepted' if r['policy_accepted'] else 'kept'}, swapped in {r['set']}")
        for k, row in (doc["stack"] or {}).items():
            print(f"stack {k}: success {100 * row['success_rate']:.0f} %, RMS median "
                  f"{1e3 * (row.get('tracking_rms_m_median') or float('nan')):.2f} mm")
        print(f"wall {doc['wall_s']} s, trainer CPU {doc['trainer_cpu_s']} s")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
