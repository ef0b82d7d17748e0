"""Benchmark: what loading a world model off the control thread costs the control thread (issue #11).

The hot swap (``robot_wm/nodes/model_swap.py``) loads an announced world model on a thread of its own
while the control thread runs the periods. Both share the interpreter lock: whenever the loader holds
it, the control thread waits until the loader runs again and hands it back. This benchmark runs, in one
process, the control path's real period (``robot_wm.benchmarks.hotpath``: policy, the safety filter's
``SafetyController.step`` with the world model's linearization, the world_model node's prediction) at
100 Hz on the main thread, and a loader thread that loads the shipped world model as the filter does
(``load_runner``: checks, linearization graph, warm-up) again and again, with CPU hogs busy on every core.

Loader scheduling, one run each:

* ``none``: no loader (what the hogs alone cost);
* ``below`` (shipped until ``slack``): ``loader_scheduling()`` — just below the control thread (SCHED_FIFO one priority
  lower when the control thread is real-time, its nice value otherwise), lock handed back every 0.5 ms;
* ``nice10``: the loader at the normal scheduler and nice 10 (the first version): it holds the lock and
  then waits behind the hogs, and so does the control thread (priority inversion).
* ``two``: two loaders at once, as in the composed process where the safety filter (with the
  linearization) and the world_model node (without) load the same announced model, each ``below``;
* ``two_serial``: the same two taking turns (a process-wide lock around ``load_runner``): no better
  than ``two`` here (three runs of 20 s: 0-14 against 0-1 late periods), and shipped all the same
  since 2026-12-07 (``model_swap._LOADS_IN_TURN``): on the live stack, whose executor hands the
  interpreter lock over at every onnxruntime run and publish, ``bench_swap_storm.py`` measured 2 of
  118 swaps missing a period in turn against 6 of 116 side by side.
* ``slack`` (shipped): ``below``, and each step of the load (each session's creation,
  the linearization graph's parsing and building, each sample of its check, each warm-up run) starts
  within 1 ms after a period's end (``model_swap.PERIOD_ENDS``, which this loop marks as the nodes do);
* ``two_slack``: the two loads in turn, each step in the slack (the composed process now).

Reported per run: the lateness of each period's end against its deadline (its scheduled start + one
period), p50 / p99 / max in ms; late periods (ended after their deadline); and missed periods as
``bench_online.py`` counts them in the live commands: an interval of more than 1.5 periods between two
periods' ends (a period that ends early followed by one that ends just in time also counts).

Usage: python bench/bench_swap_load.py [--seconds 10] [--hogs 3] [--realtime-priority 50]
       [--variants none,below,nice10,two[,two_serial,slack,two_slack]] [--json]
(``--realtime-priority 0``: the control thread at the normal scheduler.)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PERIOD_S = 0.01


@contextmanager
def _old_loader_scheduling():
    """The first version: the loader thread at the normal scheduler and nice 10 (and the same 0.5 ms
    switch interval)."""
    tid = threading.get_native_id()
    if os.sched_getscheduler(tid) != os.SCHED_OTHER:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, tid, 10)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def run_once(variant: str, seconds: float, priority: int) -> dict:
    from robot_wm import description
    from robot_wm.benchmarks.hotpath import build_hot_path, enable_hot_path
    from robot_wm.core.policy_runner import make_obs
    from robot_wm.core.safety import JointSample, NominalSample, WrenchSample
    from robot_wm.nodes.model_swap import PERIOD_ENDS, PLACE_WORLD_MODEL, load_runner, loader_scheduling
    from robot_wm.paths import data_path

    hp = build_hot_path(PERIOD_S)
    home = description.initial_positions(hp.names)
    q, qd = home.copy(), np.zeros(len(hp.names))
    enable_hot_path(hp, q)
    if priority:  # as a node process does: after its objects exist (robot_wm.realtime freezes them for the GC)
        from robot_wm.realtime import apply_realtime

        applied, text = apply_realtime(priority)
        if not applied:
            return {"variant": variant, "error": text}
    goal = hp.task.sample_goals(np.random.default_rng(1), 1)[0]
    ft = hp.ctrl.config.ft_frame
    wm_path = data_path("models", "world_model.onnx")
    stop = threading.Event()
    loads = [0]

    turns = threading.Lock() if variant in ("two_serial", "two_slack") else contextlib.nullcontext()
    pace = PERIOD_ENDS.wait_for_slack if variant.endswith("slack") else None

    def loader(analytic: bool) -> None:
        with loader_scheduling() if variant != "nice10" else _old_loader_scheduling():
            while not stop.is_set():
                with turns:
                    load_runner(wm_path, hp.names, PERIOD_S, analytic, pace=pace)
                loads[0] += 1
                stop.wait(0.1)

    kinds = {"none": (), "below": (True,), "nice10": (True,), "two": (True, False), "two_serial": (True, False),
             "slack": (True,), "two_slack": (True, False)}
    threads = [threading.Thread(target=loader, args=(a,), daemon=True) for a in kinds[variant]]
    ends, starts = [], []
    try:
        for thread in threads:
            thread.start()
        n = int(seconds / PERIOD_S)
        t_next = time.perf_counter() + PERIOD_S
        sim_t = 0.0
        for _ in range(n):
            while (d := t_next - time.perf_counter()) > 0:
                time.sleep(d)
            starts.append(t_next)  # the period's scheduled start
            tool = hp.kin_policy.tool_position_m(q)
            action = hp.policy.act(make_obs(q, qd, tool, goal))
            sim_t += PERIOD_S
            out = hp.ctrl.step(sim_t, joint=JointSample(q, qd, sim_t - 0.5 * PERIOD_S),
                               nominal=NominalSample(action, sim_t), wrench=WrenchSample(np.zeros(3), sim_t, ft))
            hp.predictor.predict(q, qd, out.u_safe_radps)
            ends.append(time.perf_counter())
            PERIOD_ENDS.mark(PLACE_WORLD_MODEL)  # as the nodes do: a paced loader's long steps start now
            qd = np.asarray(out.u_safe_radps, dtype=float)
            q = q + qd * PERIOD_S
            if hp.ctrl.supervisor.latched and not np.any(qd):
                hp.ctrl.reset()
            t_next += PERIOD_S
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5.0)
    starts_a, ends_a = np.array(starts), np.array(ends)
    late_ms = (ends_a - (starts_a + PERIOD_S)) * 1e3  # against the period's deadline
    gaps = np.diff(ends_a)
    return {"variant": variant, "periods": len(ends_a), "loads": loads[0],
            "end_lateness_ms": {"p50": float(np.median(late_ms)), "p99": float(np.percentile(late_ms, 99)),
                                "max": float(late_ms.max())},
            "late_periods": int(np.sum(late_ms > 0.0)),
            "missed_periods": int(np.sum(gaps > 1.5 * PERIOD_S)),
            "missed_at_s": [round(float(x), 2) for x in (ends_a[1:][gaps > 1.5 * PERIOD_S] - starts_a[0])]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--hogs", type=int, default=3, help="busy-looping processes at nice 0")
    ap.add_argument("--realtime-priority", type=int, default=50, help="SCHED_FIFO priority of the control thread (0: normal)")
    ap.add_argument("--variants", default="none,below,nice10,two")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.child:  # one variant in a process of its own (scheduling and switch interval are per process)
        print(json.dumps(run_once(args.child, args.seconds, args.realtime_priority)))
        return 0
    results = []
    # the hogs are started here, at the normal scheduler (a child of the real-time process would inherit it)
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.hogs)]
    try:
        for variant in args.variants.split(","):
            out = subprocess.run([sys.executable, __file__, "--child", variant, "--seconds", str(args.seconds),
                                  "--realtime-priority", str(args.realtime_priority)],
                                 capture_output=True, text=True, check=True, timeout=120 + 3 * args.seconds)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    doc = {"benchmark": "swap_load", "seconds": args.seconds, "hogs": args.hogs, "cores": os.cpu_count(),
           "realtime_priority": args.realtime_priority, "results": results}
    if not args.json:
        print(f"control thread at {'SCHED_FIFO ' + str(args.realtime_priority) if args.realtime_priority else 'the normal scheduler'}, "
              f"100 Hz for {args.seconds:g} s, {args.hogs} CPU hogs on {os.cpu_count()} cores; the loader loads the "
              "world model (with its linearization) every 0.1 s")
        print(f"{'loader':10s} {'loads':>6s} {'end late p50':>13s} {'p99':>8s} {'max':>8s} {'late':>5s} "
              f"{'gaps > 1.5 periods':>19s}")
        for r in results:
            if "error" in r:
                print(f"{r['variant']:10s} {r['error']}")
                continue
            lat = r["end_lateness_ms"]
            print(f"{r['variant']:10s} {r['loads']:6d} {lat['p50']:10.2f} ms {lat['p99']:5.2f} ms {lat['max']:5.1f} ms "
                  f"{r['late_periods']:5d} {r['missed_periods']:8d} of {r['periods']}")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
