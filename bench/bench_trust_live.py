"""Benchmark: the trust monitor on the live ROS graph in normal operation (false alarms per hour).

`bench/bench_trust.py` measures false alarms in library mode, where hours take minutes. The live
graph (`robot-wm up`: arm_sim, world_model, policy, safety_filter, trust_monitor and the task's
sequencer as separate processes, loopback DDS) has wider excursions of its signals — timer jitter
between processes — and is what a user runs. This runs it for ``--minutes`` of normal operation,
nothing injected, with the shipped calibration, and counts from its own TrustState stream:

* level drops: a TrustState below FULL after the monitor first said FULL (false alarms, per hour),
  with the reason of each drop;
* anomalies (the level the monitor gives two persistent signals: STOP) and HUMAN, which must not
  happen in normal operation;
* the share of the run at each level, and the monitor's compute per period as its /diagnostics
  report it (CPU time of its thread, p50/p99 µs over its last 2000 periods);
* the periods it did not judge because no command was sent (the filter's process
  stalled: docs/trust.md, Levels), as its /diagnostics report them.

Numbers, not pass/fail; the last line is one JSON object. Run it on an idle machine: a busy one
measures the machine, which is what ``--busy-cores N`` asks for on purpose (N busy-looping
processes beside the graph, as on a loaded CI machine; ended by their PIDs).

    python bench/bench_trust_live.py [--task track] [--profile nominal] [--minutes 60] [--busy-cores 1]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="track", choices=("reach", "track"))
    parser.add_argument("--profile", default="nominal")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--busy-cores", type=int, default=0, help="busy-looping processes beside the graph")
    args = parser.parse_args()
    if not 0 <= args.busy_cores <= 16:
        parser.error(f"--busy-cores {args.busy_cores}: expected 0..16")

    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node

    from robot_wm.graph import plan, policy_overrides
    from robot_wm.msg import TrustState
    from robot_wm.nodes.runner import SpinThread
    from robot_wm.process_group import ProcessGroup
    from robot_wm.rosenv import apply_loopback_dds, loopback_env

    domain = 160 + os.getpid() % 40  # its own DDS domain: never another run's graph
    apply_loopback_dds(domain_id=domain)
    overrides = {"profile": args.profile, **policy_overrides(args.task, "bench trust live")}
    specs = plan("mujoco", overrides=overrides, enable=True, task=args.task)
    states: list[tuple[float, int, str]] = []  # (header stamp, level, reason)
    diag: dict[str, str] = {}
    lock = threading.Lock()

    def on_trust(msg) -> None:
        with lock:
            states.append((msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec, int(msg.level), msg.reason))

    def on_diag(msg) -> None:
        for st in msg.status:
            if st.name == "robot_wm/trust_monitor":
                diag.update({kv.key: kv.value for kv in st.values})

    context = Context()
    rclpy.init(context=context)
    node = Node("bench_trust_live", context=context)
    node.create_subscription(TrustState, "/robot_wm/trust", on_trust, 100)
    node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = SpinThread(executor)
    print(f"[{args.task}/{args.profile}] {len(specs)} processes, {args.minutes:g} min of normal operation"
          f"{f', {args.busy_cores} busy cores' if args.busy_cores else ''}", flush=True)
    import subprocess

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy_cores)]
    try:
        with ProcessGroup(specs, loopback_env(domain_id=domain)) as group:
            deadline = time.monotonic() + 120.0
            while not any(lv == 0 for _, lv, _ in list(states)):  # the monitor earns FULL first
                if group.failed() or time.monotonic() > deadline:
                    raise RuntimeError("the trust monitor never said FULL: "
                                       + (states[-1][2] if states else "no TrustState received"))
                time.sleep(0.2)
            with lock:
                t_start = next(t for t, lv, _ in states if lv == 0)
            end = time.monotonic() + 60.0 * args.minutes
            next_note = time.monotonic() + 300.0
            while time.monotonic() < end:
                failed = group.failed()
                if failed:
                    raise RuntimeError(f"{', '.join(c.spec.name for c in failed)} exited during the run")
                if time.monotonic() >= next_note:
                    with lock:
                        n_drops = sum(1 for a, b in zip(states, states[1:]) if a[0] >= t_start and a[1] == 0 and b[1] != 0)
                    print(f"  {(time.monotonic() - end) / 60.0 + args.minutes:.0f} min: {n_drops} level drops so far", flush=True)
                    next_note += 300.0
                time.sleep(0.5)
            compute = dict(diag)
    finally:
        for proc in busy:  # ours, by PID
            proc.kill()
            proc.wait()
        spinner.stop()
        executor.remove_node(node)
        node.destroy_node()
        rclpy.shutdown(context=context)

    with lock:
        run = [s for s in states if s[0] >= t_start]
    hours = (run[-1][0] - run[0][0]) / 3600.0
    drops = [(b[0] - t_start, b[2]) for a, b in zip(run, run[1:]) if a[1] == 0 and b[1] != 0]
    levels = Counter(lv for _, lv, _ in run)
    names = {0: "FULL", 1: "CAUTIOUS", 2: "SLOW", 3: "STOP", 4: "HUMAN"}
    for t, reason in drops[:20]:
        print(f"  drop at {t:7.1f} s: {reason}")
    result = {
        "task": args.task, "profile": args.profile, "hours": hours, "trust_states": len(run),
        "level_drops": len(drops), "level_drops_per_hour": len(drops) / hours if hours > 0 else None,
        "stop_or_human_periods": sum(n for lv, n in levels.items() if lv >= 3),
        "level_share": {names[lv]: n / len(run) for lv, n in sorted(levels.items())},
        "monitor_cpu_us_p50": float(compute["compute_cpu_us_p50"]) if "compute_cpu_us_p50" in compute else None,
        "monitor_cpu_us_p99": float(compute["compute_cpu_us_p99"]) if "compute_cpu_us_p99" in compute else None,
        "busy_cores": args.busy_cores,
        **{key: int(compute[key]) if key in compute else None
           for key in ("periods_unjudged_command_gap",)},
        "drops": [{"t_s": t, "reason": r} for t, r in drops[:50]],
    }
    print(f"[{args.task}/{args.profile}] {hours * 60:.1f} min live: {len(drops)} level drops "
          f"({result['level_drops_per_hour']:.2f}/h), STOP/HUMAN periods {result['stop_or_human_periods']}, "
          f"FULL {100 * result['level_share'].get('FULL', 0.0):.1f} %; monitor CPU p50 {result['monitor_cpu_us_p50']} us, "
          f"p99 {result['monitor_cpu_us_p99']} us; {result['periods_unjudged_command_gap']} periods not judged "
          "(no command)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
