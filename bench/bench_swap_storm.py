"""Benchmark: missed control periods during many hot swaps of the world model on the live stack (issue #11).

``bench_online.py`` swaps what the learner accepts: a few models per run, and a miss near a swap is
rare, so one run cannot say whether a change to the swap path helped. This one swaps on purpose and
often. It registers two model sets that differ only in their world model's version (the shipped
weights, the second file re-stamped: a new SHA-256, version and trust calibration), brings up the
graph of ``robot-wm up --composed --enable`` on the embedded arm (``--profile``, the reaching task,
``--realtime-priority`` as for ``robot-wm up``; a ROS domain, a state directory and a registry of its
own), and every ``--every`` seconds activates the other set and announces it on
``/robot_wm/model_update``, as the learner and ``robot-wm models activate`` do: the world_model node,
the safety filter and the trust monitor take it in. The models predict alike, so nothing but the
swap's own work differs from a run without swaps.

Reported (a table, then ONE JSON object on the last line): swaps, missed control periods (command
intervals > 1.5 periods, by the commands' DDS source times) within 1 s after an announcement and
elsewhere, each miss (near a swap or not) with its time from the last announcement (ms) and its
interval, the trust levels seen, goals reached, and the load average.

Usage: python bench/bench_swap_storm.py [--seconds 120] [--every 2] [--profile real_twin]
       [--realtime-priority 50] [--out out/bench_swap_storm] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PERIOD_S = 0.01


def twin_sets(work: Path, profile: str) -> tuple[Path, Path]:
    """Two set directories for the reaching task: the shipped models, and the same with the world
    model re-stamped (its ONNX ``doc_string`` names the twin: another SHA-256; the sidecar's version and
    hash and the trust calibration follow)."""
    import onnx

    from robot_wm.core.onnx_model import sha256_file
    from robot_wm.paths import data_path

    models = data_path("models")
    sets = []
    for tag in ("a", "b"):
        d = work / f"set_{tag}"
        (d / "trust").mkdir(parents=True)
        for name in ("world_model.onnx", "world_model.json", "policy.onnx", "policy.json"):
            shutil.copy(models / name, d / name)
        calibration = json.loads((models / "trust" / f"{profile}.json").read_text())
        if tag == "b":
            graph = onnx.load(str(d / "world_model.onnx"))
            graph.doc_string = "bench_swap_storm twin"
            onnx.save(graph, str(d / "world_model.onnx"))
            side = json.loads((d / "world_model.json").read_text())
            side["sha256"] = sha256_file(d / "world_model.onnx")
            side["version"] = f"{side['version']}-storm-{side['sha256'][:8]}"
            (d / "world_model.json").write_text(json.dumps(side, indent=1))
            calibration["model_version"] = side["version"]
        (d / "trust" / f"{profile}.json").write_text(json.dumps(calibration, indent=1))
        sets.append(d)
    return sets[0], sets[1]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import rclpy
    from rclpy.context import Context
    from rclpy.signals import SignalHandlerOptions

    from bench_online import Observer, _start_logged, isolated_run
    from robot_wm.graph import plan
    from robot_wm.msg import ModelUpdate
    from robot_wm.nodes.model_swap import UPDATE_QOS, UPDATE_TOPIC
    from robot_wm.nodes.trust_swap import announce
    from robot_wm.process_group import ProcessGroup
    from robot_wm.registry import Registry

    state, env = isolated_run("robot_wm_bench_storm_", 150)
    set_a, set_b = twin_sets(state / "sets", args.profile)
    reg = Registry()
    versions = [reg.add(d, "reach", parent=None, lineage={}, activate=(i == 0)).version for i, d in enumerate((set_a, set_b))]
    overrides: dict[str, Any] = {"profile": args.profile}
    if args.realtime_priority:
        overrides["realtime_priority"] = args.realtime_priority
    specs = plan("mujoco", overrides=overrides, composed=True, enable=True)
    ctx = Context()
    rclpy.init(context=ctx, signal_handler_options=SignalHandlerOptions.NO)
    obs = Observer(ctx)
    publisher = obs.node.create_publisher(ModelUpdate, UPDATE_TOPIC, UPDATE_QOS)
    logs = Path(args.out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    group = ProcessGroup(specs, env)
    doc: dict[str, Any] = {"benchmark": "swap_storm", "profile": args.profile, "seconds": args.seconds, "every_s": args.every,
                           "realtime_priority": args.realtime_priority, "loadavg_start": os.getloadavg()}
    try:
        _start_logged(group, logs)
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline and not obs.moving and not group.failed():
            time.sleep(0.1)
        if not obs.moving:
            raise RuntimeError(f"the stack never moved; logs in {logs}")
        time.sleep(5.0)  # past the start-up
        t0 = time.time()
        k = 0
        while time.time() - t0 < args.seconds:
            k += 1
            reg.activate("reach", versions[k % 2])
            announce(obs.node, publisher, "reach", "activate", f"bench_swap_storm swap {k}")
            time.sleep(args.every)
        time.sleep(1.5)  # the last swap's second
        t_end = time.time()
    finally:
        commands = np.array(sorted(obs.commands), dtype=float) * 1e-9
        updates, episodes, levels = list(obs.updates), list(obs.episodes), list(obs.trust_levels)
        obs.close()
        group.stop()
        rclpy.shutdown(context=ctx)
    commands = commands[(commands >= t0) & (commands <= t_end)]
    moments = np.array(sorted(tw for tw, u in updates if u.model_kind == "world_model" and u.action == "activate"
                              and t0 <= tw <= t_end))
    gaps, mid = np.diff(commands), commands[1:]
    since = np.full(len(mid), np.inf)
    for m in moments:
        after = (mid >= m) & (mid - m < since)
        since[after] = mid[after] - m
    near = since <= 1.0
    miss = gaps > 1.5 * PERIOD_S
    doc.update({
        "swaps": int(len(moments)),
        "missed_within_1s_after_swaps": {"missed": int(np.sum(miss & near)), "periods": int(np.sum(near))},
        "missed_elsewhere": {"missed": int(np.sum(miss & ~near)), "periods": int(np.sum(~near))},
        "missed_near_swaps": [{"after_announcement_ms": round(float(since[i]) * 1e3, 1), "at_wall_s": round(float(mid[i]), 4),
                               "interval_ms": round(float(gaps[i]) * 1e3, 1)} for i in np.flatnonzero(miss & near)],
        "missed_elsewhere_intervals_ms": [round(float(gaps[i]) * 1e3, 1) for i in np.flatnonzero(miss & ~near)][:50],
        "missed_elsewhere_at": [{"after_announcement_ms": round(float(since[i]) * 1e3, 1) if np.isfinite(since[i]) else None,
                              "at_wall_s": round(float(mid[i]), 4), "interval_ms": round(float(gaps[i]) * 1e3, 1)}
                             for i in np.flatnonzero(miss & ~near)][:50],
        "interval_p99_ms": round(float(np.percentile(gaps, 99)) * 1e3, 2) if len(gaps) else None,
        "interval_max_ms": round(float(gaps.max()) * 1e3, 2) if len(gaps) else None,
        "trust_levels_seen": sorted({int(level) for ts, level in levels if t0 <= ts <= t_end}
                                    | {int(level) for ts, level in [lv for lv in levels if lv[0] < t0][-1:]}),
        "goals": [sum(1 for tw, ok in episodes if t0 <= tw <= t_end and ok), sum(1 for tw, _ in episodes if t0 <= tw <= t_end)],
        "loadavg_end": os.getloadavg(),
    })
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="how long to swap")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between two swaps")
    ap.add_argument("--profile", default="real_twin")
    ap.add_argument("--realtime-priority", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "out" / "bench_swap_storm"))
    ap.add_argument("--json", action="store_true", help="only the JSON on stdout")
    args = ap.parse_args()
    if args.every < 1.5:
        ap.error("--every must be at least 1.5 s (each swap's second is counted apart)")
    doc = run(args)
    if not args.json:
        near, other = doc["missed_within_1s_after_swaps"], doc["missed_elsewhere"]
        print(f"{doc['swaps']} swaps in {args.seconds:g} s ({args.profile}, composed, real-time priority "
              f"{args.realtime_priority or 'off'})")
        print(f"missed periods within 1 s after a swap: {near['missed']} of {near['periods']}; "
              f"elsewhere: {other['missed']} of {other['periods']}")
        for m in doc["missed_near_swaps"]:
            print(f"  {m['after_announcement_ms']:7.1f} ms after an announcement: a {m['interval_ms']} ms interval")
        for m in doc["missed_elsewhere_at"]:
            print(f"  elsewhere, {m['after_announcement_ms']} ms after an announcement: a {m['interval_ms']} ms interval")
        print(f"command interval p99 {doc['interval_p99_ms']} ms, max {doc['interval_max_ms']} ms; trust levels seen "
              f"{doc['trust_levels_seen']}; goals {doc['goals'][0]} of {doc['goals'][1]}")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
