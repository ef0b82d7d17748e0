"""Benchmark of the control path (issue #4): stage compute, end-to-end latency, vs a typical build, memory.

Four parts, each printed as a table (``--json`` gives the same numbers as one JSON document):

1. **Stages, in process** (``robot_wm.core`` objects, no ROS): a closed loop at 100 Hz on a
   kinematic arm (q += u dt) that does exactly what the policy and safety_filter nodes compute
   each period: tool FK (pinocchio) + ``PolicyRunner.act`` (ONNX); ``WorldModelRunner.linearize``
   (batch 13) + ``predict`` (batch 1), the F/T frame pose, ``SafetyController.step`` (CBF-QP:
   kinematics, assembly, OSQP). The nominal command is the policy's, interleaved every 150
   periods with the adversarial segments of bench_safety_filter.py (full speed into the joint
   limits, DLS down into the table / into the keep-out box) so that the QP is active in a fair
   share of periods. p50 / p99 / max in µs per stage, over all periods (QP rows: periods that
   solved a QP). Ours = the shipped models/*.onnx.

2. **End to end under ROS** (loopback DDS, a ROS domain of its own), at control rates 100, 250,
   500 and 1000 Hz (``control_period_s`` on policy, world_model, safety_filter, set through
   ``robot_wm.graph.plan(overrides=...)``, which reaches every hosted node of the composed process
   too; arm_sim's ``publish_rate_hz`` stays 500 unless the control rate is above it, then it is
   raised to the control rate, at most 1000 Hz), in four modes: ``separate`` (arm_sim,
   safety_filter, world_model, policy, goal_sequencer each in its own process, as ``robot-wm
   up``) and ``composed`` (``robot-wm up --composed``: safety_filter + world_model + policy in one
   process), both on the shipped executor (robot_wm.nodes.runner.make_executor: rclpy's
   EventsExecutor), and ``separate_single`` / ``composed_single``: the same stacks with
   ``ROBOT_WM_EXECUTOR=single`` in the environment of every node process, i.e. on rclpy's
   SingleThreadedExecutor, the typical rclpy set-up (the baseline of the "ours vs typical
   executor" rows). Default: separate and composed at every rate, the *_single baselines at the
   lowest rate (100 Hz); ``--full`` or ``--modes``: every mode at every rate. Runs go rate by
   rate, so that each mode and its baseline run back to back.
   The processes come from ``robot_wm.graph.plan`` and are owned by a
   ``robot_wm.process_group.ProcessGroup`` (SIGINT, then SIGKILL after the grace period, in a
   ``finally``). Two measurements per configuration:

   * **in the chain** (default): the safety_filter process (or the composed one) is started
     through this script (``--child``), which sets the node's supported timing hook
     (``SafetyFilterNode.period_hook``) to record wall-clock ``time.time_ns()``: the ``header.stamp`` of
     the JointState each control step consumed (arm_sim stamps it right before publishing; the
     control nodes take the newest one, depth-1 QoS), when the step began, and when the command
     was handed to ``publish()``. The executor is the runner's own choice (``make_executor``,
     from ``ROBOT_WM_EXECUTOR``); the child only notes which class it built. Reported: **latency
     = command publish call − consumed JointState stamp** (= DDS delivery of the state + wait for
     the control timer + compute), its parts, and missed periods = intervals between
     consecutive command publishes > 1.5 periods (every period is recorded in the process, so
     this is independent of what an observer receives). ``--no-instrument`` starts the node
     modules unwrapped (``command_for(spec)`` exactly).
   * **external**: this process subscribes to /joint_states and
     /forward_velocity_controller/commands with ``(msg, MessageInfo)`` callbacks. Latency = the
     command's DDS ``source_timestamp`` − the ``header.stamp`` of the newest JointState whose
     ``source_timestamp`` precedes it (the freshest state that existed when the command went
     out; the filter may have used an older one if delivery lagged, so this can read lower than
     the in-chain number, and higher if this observer dropped states). Missed periods here use
     the commands' source timestamps as received (an observer drop also counts).

   The "ours vs typical executor" rows at the end compare each mode with its *_single baseline
   at the same rate (ratio = typical / ours: > 1 = the EventsExecutor is faster / cheaper).

   1 kHz: the control nodes accept ``control_period_s`` in [0.001, 0.1] s, so 1 kHz is
   attempted; the table shows the command rate actually achieved and the missed periods. The
   filter's ``stale_limit_periods`` (config/safety.yaml) counts control periods, so at 1 kHz an
   input older than a few ms is a controlled stop: the per-configuration line of filter states
   (OK / FILTERING / STOPPING / STOPPED / FAULT) shows how much of the window that was. A
   control process that refuses its configuration (exit 2, "configuration error") is reported
   as ``refused`` with its message; arm_sim is still measured.

3. **Ours vs a typical implementation**, one table of p50 (p99) times and ratios on the same
   inputs: torch eager networks (the training modules, ``no_grad``, 1 thread, the checkpoint in
   runs/ that the shipped ONNX was exported from when present, else the same architecture
   untrained: latency only) vs onnxruntime; the QP as cvxpy code is usually written (a new
   ``cp.Problem`` per period, bench_safety_filter.cvxpy_solve) vs the warm OSQP update+solve;
   the whole filter step with both swapped in (typical = measured torch + cvxpy times + the
   filter's own non-QP time of that period); and rclpy executors: a timer -> publish ->
   subscription hop between two nodes of one process at 500 Hz, ours = the EventsExecutor (what
   robot_wm's runner uses by default, the composed process included) vs typical = the
   SingleThreadedExecutor (``ROBOT_WM_EXECUTOR=single``), both built by ``make_executor``.

4. **Memory per process** after warm-up (end of each configuration's window): RSS, PSS and USS
   (psutil when installed, else /proc/<pid>/smaps_rollup), for every process of each stack
   (printed for its first rate, every rate in the JSON), with each process's CPU use in the
   window (/proc/<pid>/stat) and that of this script's observer.

Usage: python bench/bench_control_path.py [--quick | --full] [--json [PATH]] [--rates 100,250,500,1000]
       [--modes separate,composed,separate_single,composed_single] [--parts stages,typical,executor,e2e]
       [--seconds S] [--periods N] [--no-instrument] [--logs DIR]
Default (``make bench``): 5 s per configuration after 1.5 s warm-up, separate + composed at every
rate and both *_single baselines at 100 Hz (10 configurations, about 2.5-3 min on 2 cores);
--quick: 3 s per configuration, the same 10 configurations, fewer samples (about 2 min); --full:
10 s per configuration, every mode at every rate, more samples (about 6 min). --logs DIR keeps the
node logs and filter records. Prints numbers only; timings are never pass/fail.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

DT = 0.01  # the in-process loop's period: the models' control_dt_s (= bench_safety_filter.DT)

RATES_HZ = (100, 250, 500, 1000)
PARTS = ("stages", "typical", "executor", "e2e")
# the end-to-end engine (robot-wm bench e2e): modes, the stack's processes, the observer, one configuration
from robot_wm.benchmarks.e2e import (  # noqa: E402
    BASELINE_MODES,
    MAIN_MODES,
    EXECUTOR_CLASS,
    MODES,
    Recorder,
    _child,
    _jsonable,
    run_config,
)

PRESETS = {  # per-configuration seconds, warm-up, in-process periods, cvxpy samples, executor seconds
    "quick": dict(seconds=3.0, warmup=1.0, periods=800, cvxpy_samples=60, executor_seconds=1.0),
    "default": dict(seconds=5.0, warmup=1.5, periods=2000, cvxpy_samples=150, executor_seconds=1.5),
    "full": dict(seconds=10.0, warmup=3.0, periods=6000, cvxpy_samples=300, executor_seconds=3.0),
}


# ----------------------------------------------------------------------------------------- helpers
from robot_wm.benchmarks.hotpath import stats_us  # noqa: E402  (p50/p99/max/mean µs of ns durations)


def _fmt(s: dict[str, float], scale: float = 1.0, unit: str = "µs", width: int = 8, digits: int = 1) -> str:
    if not s or not s.get("n"):
        return "(none)"
    f = f"{{:{width}.{digits}f}}"
    return (f"p50 {f.format(s['p50_us'] * scale)} p99 {f.format(s['p99_us'] * scale)} "
            f"max {f.format(s['max_us'] * scale)} {unit}  (n={s['n']})")


class Out:
    """Human-readable lines: stdout, or stderr when the JSON document goes to stdout."""

    def __init__(self, to_stderr: bool) -> None:
        self.stream = sys.stderr if to_stderr else sys.stdout

    def __call__(self, *lines: str) -> None:
        for line in lines:
            print(line, file=self.stream, flush=True)


# ------------------------------------------------------------------------- part 1: stages in process
# the closed loop and its stages are robot-wm bench hotpath's (one definition of what a period computes)
from robot_wm.benchmarks.hotpath import (  # noqa: E402
    STAGE_LABELS,
    HotPath,
    build_hot_path,
    stage_timings,
)


def print_stages(say: Out, res: dict[str, Any]) -> None:
    say(f"\n== 1. stages in process ({res['periods']} periods at {1 / DT:.0f} Hz, QP solved in "
        f"{res['qp_periods']}; states {res['states']})")
    say(f"  {'stage':<30} {'what':<44} {'p50 µs':>9} {'p99 µs':>9} {'max µs':>9} {'n':>6}")
    for key, label in STAGE_LABELS.items():
        s = res["stages"][key]
        say(f"  {key:<30} {label:<44} {s['p50_us']:9.1f} {s['p99_us']:9.1f} {s['max_us']:9.1f} {s['n']:6d}")


# ------------------------------------------------------------------ part 3: vs a typical implementation
def torch_modules(hp: HotPath, wm_pt: Path | None, policy_pt: Path | None):
    """The torch world model and actor: from the checkpoints when given and present, else untrained."""
    from robot_wm.learning.config import load_section
    from robot_wm.learning.pipeline import load_policy_checkpoint
    from robot_wm.learning.policy import Actor, ObsNormalizer, PolicyConfig
    from robot_wm.learning.world_model import WorldModel, WorldModelConfig, load_checkpoint
    from robot_wm.contracts import OBS_DIM
    from robot_wm.paths import config_path

    if wm_pt and wm_pt.is_file():
        wm, _ = load_checkpoint(wm_pt)
        wm_src = str(wm_pt)
    else:
        wm = WorldModel(load_section(config_path("training.yaml"), "world_model", WorldModelConfig), hp.names,
                        hp.task.control_dt_s)
        wm_src = "untrained, same architecture"
    if policy_pt and policy_pt.is_file():
        actor, _ = load_policy_checkpoint(policy_pt)
        pol_src = str(policy_pt)
    else:
        cfg = load_section(config_path("training.yaml"), "policy", PolicyConfig)
        actor = Actor(ObsNormalizer(np.zeros(OBS_DIM), np.ones(OBS_DIM)), np.asarray(hp.task.action_limit_radps),
                      cfg.hidden)
        pol_src = "untrained, same architecture"
    return wm.eval(), wm_src, actor.eval(), pol_src


def _torch_calls(torch, wm, actor, eps: float):
    """Typical torch eager versions of the runner calls (same algorithm: central differences, batch 13)."""
    n = 6
    delta = np.vstack([np.zeros(n), eps * np.eye(n), -eps * np.eye(n)])

    def act(obs):
        with torch.no_grad():
            return actor(torch.as_tensor(obs, dtype=torch.float32)[None])[0].numpy().astype(np.float64)

    def linearize(q, qd, hist, a):
        acts = a[None] + delta
        window = np.concatenate([np.repeat(hist[None], len(acts), 0), acts[:, None, :]], axis=1)
        with torch.no_grad():
            out = wm(torch.as_tensor(np.repeat(q[None], len(acts), 0), dtype=torch.float32),
                     torch.as_tensor(np.repeat(qd[None], len(acts), 0), dtype=torch.float32),
                     torch.as_tensor(window, dtype=torch.float32))
        x = torch.cat([out[0], out[1]], dim=-1).double().numpy()
        return x[0], (x[1:1 + n] - x[1 + n:]).T / (2 * eps)

    def predict(q, qd, hist, a):
        window = np.concatenate([hist, a[None]], axis=0)[None]
        with torch.no_grad():
            out = wm(torch.as_tensor(q[None], dtype=torch.float32), torch.as_tensor(qd[None], dtype=torch.float32),
                     torch.as_tensor(window, dtype=torch.float32))
        return np.sqrt(out[2][0].double().numpy() + out[3][0].double().numpy())

    return act, linearize, predict


def typical_comparison(hp: HotPath, samples: list[dict[str, Any]], cvxpy_samples: int, wm_pt: Path | None,
                       policy_pt: Path | None, seed: int = 0) -> dict[str, Any]:
    """Ours vs typical on the same recorded periods; returns rows of p50/p99 and ratios."""
    import torch
    from bench_safety_filter import cvxpy_solve  # the cvxpy formulation of the same QP

    torch.set_num_threads(1)
    wm_t, wm_src, actor_t, pol_src = torch_modules(hp, wm_pt, policy_pt)
    act_t, lin_t, pred_t = _torch_calls(torch, wm_t, actor_t, hp.wm.fd_step_radps)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(samples), size=min(len(samples), max(200, cvxpy_samples)), replace=False)
    pc = time.perf_counter_ns
    for s in (samples[k] for k in pick[:30]):  # warm-up of both
        hp.policy.act(s["obs"]), act_t(s["obs"]), lin_t(s["q"], s["qd"], s["hist"], s["nominal"])
        pred_t(s["q"], s["qd"], s["hist"], s["nominal"])
    ours = {"act": [], "lin": [], "pred": []}
    typ = {"act": [], "lin": [], "pred": []}
    d_act, d_f0 = [], []
    hist_saved = hp.wm.action_history
    for k in pick:  # interleaved, same inputs, same conditions
        s = samples[k]
        hp.wm.reset(action_history=s["hist"])
        t0 = pc(); a = hp.policy.act(s["obs"]); t1 = pc()  # noqa: E702
        a_t = act_t(s["obs"]); t2 = pc()  # noqa: E702
        f0, _ = hp.wm.linearize(s["q"], s["qd"], s["nominal"]); t3 = pc()  # noqa: E702
        f0_t, _ = lin_t(s["q"], s["qd"], s["hist"], s["nominal"]); t4 = pc()  # noqa: E702
        hp.wm.predict(s["q"], s["qd"], s["nominal"], commit=False); t5 = pc()  # noqa: E702
        pred_t(s["q"], s["qd"], s["hist"], s["nominal"]); t6 = pc()  # noqa: E702
        ours["act"].append(t1 - t0), typ["act"].append(t2 - t1)
        ours["lin"].append(t3 - t2), typ["lin"].append(t4 - t3)
        ours["pred"].append(t5 - t4), typ["pred"].append(t6 - t5)
        lim = hp.policy.action_limit_radps  # the runner clips to it; compare like with like
        d_act.append(float(np.max(np.abs(np.clip(a_t, -lim, lim) - a))))
        d_f0.append(float(np.max(np.abs(f0_t - f0))))
    hp.wm.reset(action_history=hist_saved)

    rows = [
        _row("policy inference", "ORT PolicyRunner.act", "torch eager Actor", ours["act"], typ["act"]),
        _row("world model linearize (13)", "ORT batch 13", "torch eager batch 13", ours["lin"], typ["lin"]),
        _row("world model predict (1)", "ORT batch 1", "torch eager batch 1", ours["pred"], typ["pred"]),
    ]
    qp_samples = [s for s in samples if s["snap"] is not None]
    cvx: dict[str, Any] = {}
    try:
        import cvxpy as cp
    except ImportError:
        cvx = {"skipped": "cvxpy not installed (requirements-test.txt)"}
    if qp_samples and not cvx:
        sel = rng.choice(len(qp_samples), size=min(cvxpy_samples, len(qp_samples)), replace=False)
        cvx_ns, ours_qp, ours_whole, typ_whole, diffs, solvers = [], [], [], [], [], set()
        failures = 0
        for j, k in enumerate(sel):
            s = qp_samples[k]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Solution may be inaccurate": counted below instead
                x, wall, name = cvxpy_solve(cp, hp.filt, s["snap"])
            if j < 3:
                continue  # cvxpy's first calls compile its canonicalization: warm-up
            solvers.add(name)
            if np.all(np.isfinite(x)):
                diffs.append(float(np.max(np.abs(x - s["snap"][1]))))
            else:
                failures += 1
            t_cvx = int(wall * 1e9)
            cvx_ns.append(t_cvx)
            ours_qp.append(s["t_qp"])
            t0 = pc(); lin_t(s["q"], s["qd"], s["hist"], s["nominal"]); t1 = pc()  # noqa: E702
            pred_t(s["q"], s["qd"], s["hist"], s["nominal"]); t2 = pc()  # noqa: E702
            ours_whole.append(s["t_step"])  # SafetyController.step: linearize_with_std (one inference) + F/T + QP
            # the same step with torch networks (mean + slope, then a second inference for σ) and cvxpy
            typ_whole.append((s["t_step"] - s["t_lin"] - s["t_qp"]) + (t1 - t0) + (t2 - t1) + t_cvx)
        rows.append(_row("QP solve", "OSQP warm update+solve", "cvxpy new Problem/period", ours_qp, cvx_ns))
        rows.append(_row("whole filter step (QP periods)", "ORT + OSQP", "torch + cvxpy", ours_whole, typ_whole))
        cvx = {"solvers": sorted(solvers), "samples": len(cvx_ns), "no_solution": failures,
               "agreement_max_abs_radps": float(np.max(diffs)) if diffs else math.nan,
               "agreement_median_abs_radps": float(np.median(diffs)) if diffs else math.nan}
    elif not qp_samples and not cvx:
        cvx = {"skipped": "no QP period in the stream"}
    return {"rows": rows, "torch": {"version": torch.__version__, "threads": 1, "world_model": wm_src,
                                    "policy": pol_src},
            "parity": {"policy_max_abs_radps": float(np.max(d_act)), "world_model_f0_max_abs": float(np.max(d_f0)),
                       "note": "torch vs the shipped ONNX, same inputs (meaningful for trained checkpoints only)"},
            "cvxpy": cvx}


def _row(name: str, ours_label: str, typical_label: str, ours_ns, typ_ns) -> dict[str, Any]:
    o, t = stats_us(ours_ns), stats_us(typ_ns)
    return {"name": name, "ours": ours_label, "typical": typical_label, "ours_us": o, "typical_us": t,
            "ratio_p50": t["p50_us"] / o["p50_us"], "ratio_p99": t["p99_us"] / o["p99_us"]}


# -------------------------------------------------------------- part 3b: executor timer/pub/sub overhead
def executor_hop(kind: str, seconds: float, period_s: float = 0.002) -> dict[str, Any]:
    """Timer -> publish -> subscription between two nodes spun by ONE executor of kind ``kind``.

    ``kind``: "EventsExecutor" (robot_wm's default) or "SingleThreadedExecutor", built by
    ``robot_wm.nodes.runner.make_executor`` as the node processes build theirs. Returns hop
    latency (publish call -> subscription callback), timer lateness vs its nominal
    schedule and the process CPU time per period (executor + rclpy overhead; the callbacks do
    almost nothing).
    """
    import rclpy
    from rclpy.context import Context
    from rclpy.node import Node
    from rclpy.signals import SignalHandlerOptions
    from std_msgs.msg import Float64MultiArray

    from robot_wm.nodes.runner import make_executor

    ctx = Context()
    rclpy.init(context=ctx, signal_handler_options=SignalHandlerOptions.NO)
    nodes, executor = [], None
    try:
        a, b = Node("bench_cp_ping", context=ctx), Node("bench_cp_pong", context=ctx)
        nodes = [a, b]
        pub = a.create_publisher(Float64MultiArray, "/bench_control_path/ping", 10)
        fires, hops = [], []

        def on_timer() -> None:
            now = time.perf_counter_ns()
            fires.append(now)
            pub.publish(Float64MultiArray(data=[float(now)]))

        b.create_subscription(Float64MultiArray, "/bench_control_path/ping",
                              lambda m: hops.append(time.perf_counter_ns() - int(m.data[0])), 10)
        a.create_timer(period_s, on_timer)
        executor = make_executor(ctx, {v: k for k, v in EXECUTOR_CLASS.items()}[kind])
        assert type(executor).__name__ == kind, (kind, type(executor).__name__)
        for n in nodes:
            executor.add_node(n)
        warm_end = time.monotonic() + 0.5
        while time.monotonic() < warm_end:  # discovery + warm-up
            executor.spin_once(timeout_sec=0.05)
        n_fire0, n_hop0 = len(fires), len(hops)
        cpu0, wall0 = time.process_time(), time.monotonic()
        end = wall0 + seconds
        while time.monotonic() < end:
            executor.spin_once(timeout_sec=0.05)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        f = np.asarray(fires[n_fire0:], dtype=float)
        late = np.diff(f) - period_s * 1e9 if f.size > 1 else np.array([])
        periods = max(1, len(fires) - n_fire0)
        return {"hop": stats_us(hops[n_hop0:]), "timer_interval_error": stats_us(np.abs(late)),
                "cpu_us_per_period": 1e6 * cpu / periods, "rate_hz": periods / wall, "period_s": period_s}
    finally:
        for n in nodes:
            if executor is not None:
                executor.remove_node(n)
            n.destroy_node()
        if executor is not None:
            executor.shutdown(timeout_sec=1.0)
        if ctx.ok():
            rclpy.shutdown(context=ctx)


# ---------------------------------------------------------------------- part 2 + 4: the stack under ROS
# the end-to-end engine is robot-wm bench e2e's (robot_wm.benchmarks.e2e)
def config_plan(modes: list[str], rates: list[float], every_rate: bool) -> list[tuple[str, float]]:
    """(mode, rate) configurations in run order: rate by rate, so a mode and its baseline run back to back.

    ``every_rate``: every mode at every rate; otherwise the *_single baselines only at the lowest rate.
    """
    low = min(rates) if rates else None
    return [(m, r) for r in rates for m in modes if every_rate or m not in BASELINE_MODES or r == low]


def print_e2e(say: Out, results: list[dict[str, Any]]) -> None:
    say("\n== 2. end to end (ms): in-chain = command publish call - header.stamp of the JointState the filter used; "
        "external = command source_timestamp - stamp of the newest JointState sent before it; "
        "missed = command intervals > 1.5 periods")
    say(f"  {'mode':<16}{'rate':>5} {'status':<7} {'cmd Hz':>7} {'missed (in-chain)':>19} "
        f"{'in-chain p50/p99/max':>23} {'compute p50/p99':>16}  {'external p50/p99/max':>23} {'missed(obs)':>11} "
        f"{'js Hz':>6}")
    results = sorted(results, key=lambda r: (MODES.index(r["mode"]) if r["mode"] in MODES else 99, r["rate_hz"]))
    for r in results:
        js = r.get("joint_states", {})
        head = f"  {r['mode']:<16}{r['rate_hz']:>5.0f} {r['status']:<7}"
        if r["status"] != "ok":
            say(f"{head} {r.get('error', '')[:220]}; /joint_states {js.get('rate_hz', math.nan):.0f} Hz")
            continue
        ic, ext, obs = r.get("in_chain", {}), r.get("latency_external", {}), r.get("commands_observed", {})
        lat, comp, pubs = ic.get("latency"), ic.get("compute"), ic.get("publishes") or obs

        def ms3(x):
            if not x or not x.get("n"):
                return "-"
            return f"{x['p50_us'] / 1e3:6.2f}/{x['p99_us'] / 1e3:6.2f}/{x['max_us'] / 1e3:7.1f}"

        comp_s = f"{comp['p50_us'] / 1e3:6.2f}/{comp['p99_us'] / 1e3:6.2f}" if comp and comp.get("n") else "-"
        miss_s = f"{pubs['missed']}/{pubs['n'] - 1} ({pubs['missed_pct']:.0f}%)" if pubs.get("n") else "-"
        if pubs is obs and obs.get("n"):
            miss_s = "obs: " + miss_s  # --no-instrument: only the observer's count
        obs_s = f"{obs['missed_pct']:.0f}%" if obs.get("n") else "-"
        say(f"{head} {pubs.get('rate_hz', math.nan):7.1f} {miss_s:>19} {ms3(lat):>23} {comp_s:>16}  {ms3(ext):>23} "
            f"{obs_s:>11} {js.get('rate_hz', math.nan):6.0f}")
    for r in results:
        if r["status"] == "ok" and "states" in r.get("in_chain", {}):
            ic = r["in_chain"]
            built = f"; executor {r['executor_built']}" if r.get("executor_built") else ""
            say(f"  {r['mode']} {r['rate_hz']:.0f} Hz: state delivery p50 "
                f"{ic['state_delivery']['p50_us'] / 1e3:.2f} ms, "
                f"state age at step start p50 {ic['state_age_at_step']['p50_us'] / 1e3:.2f} ms; same state twice in a "
                f"row {ic['same_state_reused']}; filter states {ic['states']}; up after {r['startup_s']:.1f} s{built}"
                + (f"; NOTE {r['note']}" if r.get("note") else ""))


def executor_comparison(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours (EventsExecutor) vs typical (SingleThreadedExecutor): each mode vs its *_single run at the same rate.

    Ratios are typical / ours (> 1: ours lower latency / less CPU); achieved rates and missed % as measured.
    """
    by = {(r["mode"], r["rate_hz"]): r for r in results if r["status"] == "ok"}
    rows = []
    for (mode, rate), ours in by.items():
        typ = by.get((f"{mode}_single", rate))
        if mode not in MAIN_MODES or typ is None:
            continue
        row: dict[str, Any] = {"mode": mode, "rate_hz": rate, "ours": ours["executor"], "typical": typ["executor"]}
        for key, pick in (("in_chain_latency", lambda r: r.get("in_chain", {}).get("latency")),
                          ("external_latency", lambda r: r.get("latency_external"))):
            o, t = pick(ours), pick(typ)
            if o and t and o.get("n") and t.get("n"):
                row[key] = {"ours": o, "typical": t, "ratio_p50": t["p50_us"] / o["p50_us"],
                            "ratio_p99": t["p99_us"] / o["p99_us"]}
        for key in ("control_cpu_pct", "stack_cpu_pct"):
            o, t = ours.get(key), typ.get(key)
            if o and t:
                row[key] = {"ours": o, "typical": t, "ratio": t / o}
        per_cmd = {}
        for name, r in (("ours", ours), ("typical", typ)):
            pubs = r.get("in_chain", {}).get("publishes") or r.get("commands_observed") or {}
            row[f"{name}_cmd_hz"], row[f"{name}_missed_pct"] = pubs.get("rate_hz"), pubs.get("missed_pct")
            hz, cpu = pubs.get("rate_hz"), r.get("control_cpu_pct")
            if hz and cpu and math.isfinite(hz) and hz > 0:
                per_cmd[name] = 10.0 * cpu / hz  # CPU ms of policy+world_model+filter per command published
        if len(per_cmd) == 2:  # fair when a starved run publishes fewer commands (its CPU % then drops too)
            row["control_cpu_ms_per_command"] = {**per_cmd, "ratio": per_cmd["typical"] / per_cmd["ours"]}
        rows.append(row)
    return sorted(rows, key=lambda x: (x["rate_hz"], MODES.index(x["mode"])))


def print_executor_comparison(say: Out, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    say("\n  ours vs typical executor, same stack and rate: ours = EventsExecutor (robot_wm's default), typical = "
        "SingleThreadedExecutor (ROBOT_WM_EXECUTOR=single); ratio = typical / ours (> 1 = ours faster / cheaper); "
        "CPU ms/command = CPU of policy + world_model + safety_filter in the window / commands published; the two "
        "runs are back to back, not simultaneous, so load changes between them show up here")
    say(f"  {'mode':<10}{'rate':>5}  {'in-chain p50 ours/typ':>22} {'ratio':>6}  {'p99 ours/typ':>15} {'ratio':>6}  "
        f"{'CPU ms/command ours/typ':>23} {'ratio':>6}  {'cmd Hz ours/typ':>16}  {'missed % ours/typ':>17}")
    nan = {"ours": {"p50_us": math.nan, "p99_us": math.nan}, "typical": {"p50_us": math.nan, "p99_us": math.nan},
           "ratio_p50": math.nan, "ratio_p99": math.nan}
    for r in rows:
        lat = r.get("in_chain_latency") or r.get("external_latency") or nan
        cpu = r.get("control_cpu_ms_per_command") or {"ours": math.nan, "typical": math.nan, "ratio": math.nan}

        def f(x):
            return math.nan if x is None else x

        say(f"  {r['mode']:<10}{r['rate_hz']:>5.0f}  "
            f"{lat['ours']['p50_us'] / 1e3:9.2f}/{lat['typical']['p50_us'] / 1e3:6.2f} ms {lat['ratio_p50']:5.2f}x  "
            f"{lat['ours']['p99_us'] / 1e3:6.1f}/{lat['typical']['p99_us'] / 1e3:6.1f} ms {lat['ratio_p99']:5.2f}x  "
            f"{cpu['ours']:12.2f}/{cpu['typical']:5.2f} ms  {cpu['ratio']:5.2f}x  "
            f"{f(r['ours_cmd_hz']):7.1f}/{f(r['typical_cmd_hz']):6.1f}  "
            f"{f(r['ours_missed_pct']):8.0f}/{f(r['typical_missed_pct']):5.0f} %"
            + ("" if r.get("in_chain_latency") else "  (external latency: no in-chain records)"))


def print_memory(say: Out, results: list[dict[str, Any]]) -> None:
    say("\n== 4. memory per process after warm-up (MiB; RSS counts shared libraries in every process, "
        "PSS shares them out, USS = private) and CPU use during the window (% of one core)")
    seen = set()
    for r in results:
        if not r.get("memory") or r["mode"] in seen or r["status"] != "ok":
            continue
        seen.add(r["mode"])
        src = next(iter(r["memory"].values()))["source"]
        say(f"  {r['mode']} stack at {r['rate_hz']:.0f} Hz ({src}):")
        tot = np.zeros(3)
        cpu = r.get("cpu_pct", {})
        for name, m in r["memory"].items():
            tot += [m["rss_mib"], m["pss_mib"], m["uss_mib"]]
            say(f"    {name:<16} RSS {m['rss_mib']:7.1f}  PSS {m['pss_mib']:7.1f}  USS {m['uss_mib']:7.1f}"
                f"   CPU {cpu.get(name, math.nan):5.0f} %")
        say(f"    {'total':<16} RSS {tot[0]:7.1f}  PSS {tot[1]:7.1f}  USS {tot[2]:7.1f}"
            f"   (this benchmark's observer: CPU {cpu.get('bench observer (this process)', math.nan):.0f} %)")


def print_typical(say: Out, typ: dict[str, Any] | None, execs: dict[str, Any] | None) -> None:
    say("\n== 3. this hot path vs a typical implementation (same inputs; µs; ratio = typical / ours)")
    if typ:
        say(f"  torch {typ['torch']['version']} eager, 1 thread; world model: {typ['torch']['world_model']}; "
            f"policy: {typ['torch']['policy']}")
        say(f"  {'step':<32} {'ours':<24} {'typical':<26} {'ours p50':>9} {'typ p50':>9} {'ratio':>6}   "
            f"{'ours p99':>9} {'typ p99':>9} {'ratio':>6}")
        for r in typ["rows"]:
            o, t = r["ours_us"], r["typical_us"]
            say(f"  {r['name']:<32} {r['ours']:<24} {r['typical']:<26} {o['p50_us']:9.1f} {t['p50_us']:9.1f} "
                f"{r['ratio_p50']:5.1f}x   {o['p99_us']:9.1f} {t['p99_us']:9.1f} {r['ratio_p99']:5.1f}x")
    if execs and "SingleThreadedExecutor" in execs and "EventsExecutor" in execs:
        o, t = execs["EventsExecutor"], execs["SingleThreadedExecutor"]  # ours = robot_wm's default
        say(f"  {'executor hop timer->pub->sub':<32} {'EventsExecutor':<24} {'SingleThreadedExecutor':<26} "
            f"{o['hop']['p50_us']:9.1f} {t['hop']['p50_us']:9.1f} {t['hop']['p50_us'] / o['hop']['p50_us']:5.2f}x   "
            f"{o['hop']['p99_us']:9.1f} {t['hop']['p99_us']:9.1f} {t['hop']['p99_us'] / o['hop']['p99_us']:5.2f}x")
        say(f"  {'executor CPU per 500 Hz period':<32} {'EventsExecutor':<24} {'SingleThreadedExecutor':<26} "
            f"{o['cpu_us_per_period']:9.1f} {t['cpu_us_per_period']:9.1f} "
            f"{t['cpu_us_per_period'] / o['cpu_us_per_period']:5.2f}x")
        say("  (executor rows: robot_wm's runner uses rclpy's EventsExecutor by default, the composed process included,"
            " so 'ours' = EventsExecutor and 'typical' = SingleThreadedExecutor (ROBOT_WM_EXECUTOR=single);"
            " ratio > 1 = ours faster, as in the other rows)")
    if typ:
        p, c = typ["parity"], typ["cvxpy"]
        say(f"  parity torch vs shipped ONNX: policy max |Δ| {p['policy_max_abs_radps']:.2e} rad/s, world-model f0 "
            f"max |Δ| {p['world_model_f0_max_abs']:.2e}; cvxpy: {c}")
        say("  whole filter step: ours = linearize_with_std (one ORT call: mean, slope and std) + the filter's own"
            " time; typical = torch linearize + predict (measured) + the filter's own non-QP time of that"
            " period + cvxpy build+solve of that period's QP")


# ------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help="short run: 3 s per configuration, fewer samples")
    preset.add_argument("--full", action="store_true",
                        help="long run: 10 s per configuration, every mode at every rate, more samples")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH",
                        help="write the numbers as JSON to PATH ('-' or no value: stdout, the tables go to stderr)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    parser.add_argument("--rates", default=",".join(str(r) for r in RATES_HZ), help="control rates, Hz")
    parser.add_argument("--modes", help=f"comma list of {', '.join(MODES)}; given (or --full): every mode at every "
                        "rate; default: separate,composed at every rate + the *_single baselines at the lowest rate")
    parser.add_argument("--seconds", type=float, help="measurement window per configuration, s")
    parser.add_argument("--warmup", type=float, help="wait after the first command before measuring, s")
    parser.add_argument("--periods", type=int, help="in-process closed-loop periods")
    parser.add_argument("--cvxpy-samples", type=int, help="QP periods solved with cvxpy")
    parser.add_argument("--executor-seconds", type=float, help="seconds per executor in the hop benchmark")
    parser.add_argument("--no-instrument", action="store_true",
                        help="start the filter modules unwrapped: external latency only, no in-chain numbers")
    parser.add_argument("--world-model-pt", type=Path, default=ROOT / "runs" / "world_model" / "world_model.pt",
                        help="torch checkpoint for the typical world model (missing: untrained, same architecture)")
    parser.add_argument("--policy-pt", type=Path, default=ROOT / "runs" / "policy" / "policy.pt",
                        help="torch checkpoint for the typical policy (missing: untrained, same architecture)")
    parser.add_argument("--logs", type=Path, help="keep the node logs and filter records in this folder")
    parser.add_argument("--domain-id", type=int, default=150 + os.getpid() % 50, help="ROS domain of this run")
    args = parser.parse_args(argv)
    preset_name = "quick" if args.quick else "full" if args.full else "default"
    for key, value in PRESETS[preset_name].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.preset = preset_name
    args.parts = [p for p in args.parts.split(",") if p]
    args.rates = [float(r) for r in args.rates.split(",") if r]
    every_rate = args.full or args.modes is not None
    args.modes = [m for m in (args.modes or ",".join(MODES)).split(",") if m]
    for name, given, allowed in (("parts", args.parts, PARTS), ("modes", args.modes, MODES)):
        if set(given) - set(allowed):
            if name == "modes" and "composed_events" in given:
                parser.error("--modes: composed_events is gone: the runner uses the EventsExecutor by default now "
                             "(composed); composed_single is the SingleThreadedExecutor baseline")
            parser.error(f"--{name}: unknown {sorted(set(given) - set(allowed))}; allowed {list(allowed)}")
    if not args.rates or any(not (r > 0) for r in args.rates):
        parser.error(f"--rates: expected positive control rates in Hz, got {args.rates}")
    args.configs = config_plan(args.modes, args.rates, every_rate)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    args = parse_args(argv)
    say = Out(to_stderr=args.json == "-")
    t_begin = time.monotonic()
    result: dict[str, Any] = {"meta": {
        "preset": args.preset, "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
        "python": platform.python_version(), "machine": platform.machine(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }}
    say(f"bench_control_path ({args.preset}): {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start "
        "(shared machines give noisy numbers)")
    hp, samples = None, []
    if "stages" in args.parts or "typical" in args.parts:
        hp = build_hot_path()
        res, samples = stage_timings(args.periods, hot=hp, keep_samples="typical" in args.parts)
        result["stages"] = res
        print_stages(say, res)
    if "typical" in args.parts:
        result["typical"] = typical_comparison(hp, samples, args.cvxpy_samples, args.world_model_pt, args.policy_pt)
    if "executor" in args.parts or "e2e" in args.parts:
        from robot_wm.rosenv import apply_loopback_dds

        apply_loopback_dds(domain_id=args.domain_id)  # loopback-only DDS, a domain of this run's own
    if "executor" in args.parts:
        result["executor"] = {k: executor_hop(k, args.executor_seconds)
                              for k in ("SingleThreadedExecutor", "EventsExecutor")}
    if "typical" in args.parts or "executor" in args.parts:
        print_typical(say, result.get("typical"), result.get("executor"))
    if "e2e" in args.parts:
        import rclpy
        from rclpy.context import Context
        from rclpy.signals import SignalHandlerOptions

        from robot_wm.rosenv import loopback_env

        env = loopback_env(domain_id=args.domain_id)
        env["PYTHONUNBUFFERED"] = "1"
        ctx = Context()
        rclpy.init(context=ctx, signal_handler_options=SignalHandlerOptions.NO)
        recorder = Recorder(ctx)
        e2e: list[dict[str, Any]] = []
        result["e2e"] = e2e
        say(f"\n(end to end: domain {args.domain_id}, {args.seconds:.0f} s per configuration after {args.warmup:.1f} s "
            f"warm-up, {len(args.configs)} configurations, run in this order: "
            f"{', '.join(f'{m} {r:.0f}' for m, r in args.configs)})")
        try:
            with tempfile.TemporaryDirectory(prefix="bench_control_path_") as tmp:
                workdir = args.logs or Path(tmp)
                workdir.mkdir(parents=True, exist_ok=True)
                for mode, rate in args.configs:
                    r = run_config(mode, rate, args.seconds, args.warmup, recorder, env, workdir,
                                   not args.no_instrument)
                    e2e.append(r)
                    say(f"  {mode:<16} {rate:6.0f} Hz: {r['status']}"
                        + (f" ({r['error'][:160]})" if r.get("error") else "")
                        + f"  [{r['wall_s']:.0f} s]")
        finally:
            recorder.close()
            rclpy.shutdown(context=ctx)
        print_e2e(say, e2e)
        result["e2e_executor_comparison"] = executor_comparison(e2e)
        print_executor_comparison(say, result["e2e_executor_comparison"])
        print_memory(say, e2e)
    result["meta"]["loadavg_end"] = os.getloadavg()
    result["meta"]["wall_s"] = time.monotonic() - t_begin
    say(f"\n(total {result['meta']['wall_s']:.0f} s; load average {os.getloadavg()[0]:.2f} at the end)")
    if args.json:
        text = json.dumps(_jsonable(result), indent=1, allow_nan=False)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
