"""`robot-wm demo`: the embedded arm under ROS 2, driven through the real topic contract.

The arm runs in its own process (exactly as `robot-wm up` starts it); this process publishes a
scripted joint-velocity sequence on /forward_velocity_controller/commands, shows a live status
line from /joint_states and ends with a summary measured on what the arm actually did.
"""
from __future__ import annotations

import bisect
import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from robot_wm.graph import plan
from robot_wm.rosenv import loopback_env
from robot_wm.process_group import ProcessGroup

_SETTLE_S = 0.25  # ignore the first part of each segment when judging tracking (acceleration)
TRACKING_TOLERANCE_RADPS = 0.05
STOP_TOLERANCE_RADPS = 0.01


@dataclass
class DemoSummary:
    """What the demo measured on /joint_states."""

    profile: str
    joint_states_received: int
    joint_states_period_ms_p50: float
    joint_states_period_ms_p99: float
    joint_states_period_ms_max: float
    tracking_error_radps: dict[str, float]
    worst_tracking_error_radps: float
    stop_after_timeout_s: float | None
    passed: bool


def summarize(recording, script, t0_s: float, profile: str, command_timeout_s: float = 0.05) -> DemoSummary:
    """Compute rate, tracking and timeout figures from a ScriptedCommander recording."""
    t = np.array(recording.t_s)
    v = np.array(recording.v_radps)
    periods_ms = np.diff(t) * 1e3 if len(t) > 1 else np.array([np.nan])
    errors: dict[str, float] = {}
    start = t0_s
    last_command_end = None
    for seg in script:
        end = start + seg.duration_s
        if seg.velocity_radps is not None:
            window = (t >= start + _SETTLE_S) & (t < end)
            if window.any():
                err = np.abs(v[window] - np.array(seg.velocity_radps)).max(axis=1)
                errors[seg.name] = float(np.median(err))
            last_command_end = end
        start = end
    stop_s = None
    if last_command_end is not None:
        after = t >= last_command_end
        resting = after & (np.abs(v).max(axis=1) < STOP_TOLERANCE_RADPS) if len(v) else after
        if resting.any():
            # the command timeout is measured from the last command the arm received
            stop_s = float(t[resting][0] - last_command_end)
    worst = max(errors.values()) if errors else float("nan")
    passed = bool(errors) and worst < TRACKING_TOLERANCE_RADPS and stop_s is not None and stop_s < 0.5
    return DemoSummary(
        profile=profile,
        joint_states_received=len(t),
        joint_states_period_ms_p50=float(np.percentile(periods_ms, 50)),
        joint_states_period_ms_p99=float(np.percentile(periods_ms, 99)),
        joint_states_period_ms_max=float(np.max(periods_ms)),
        tracking_error_radps=errors,
        worst_tracking_error_radps=float(worst),
        stop_after_timeout_s=stop_s,
        passed=passed,
    )


def _status_line(node, kin, now_s: float) -> str:
    snap = node.snapshot()
    seg_i = node.segment_index(now_s)
    seg = node.script[seg_i].name if seg_i < len(node.script) else "done"
    if snap is None:
        return f"t={now_s - node.t0_s:5.1f}s  {seg:<24} waiting for /joint_states"
    times = node.recording.t_s
    rate_hz = len(times) - bisect.bisect_left(times, now_s - 1.0)  # messages in the last second
    q, v = snap[1], snap[2]
    tool = kin.tool_position_m(q)
    return (
        f"t={now_s - node.t0_s:5.1f}s  {seg:<24} js={rate_hz:4d}Hz  "
        f"|v|max={np.abs(v).max():.3f}rad/s  tool=({tool[0]:+.3f},{tool[1]:+.3f},{tool[2]:+.3f})m"
    )


def run_demo(profile: str = "nominal", out_dir: Path | None = None, live: bool | None = None) -> int:
    """Run the demo; return 0 when the arm tracked the script and stopped on timeout, else 1."""
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.nodes.scripted_commander import ScriptedCommander, default_script

    live = sys.stdout.isatty() if live is None else live
    env = loopback_env()
    os.environ.update(env)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    urdf = description.expand()
    kin = Kinematics(urdf, description.joint_limits(urdf).names)
    script = default_script()
    # this demo drives the arm itself: the control stack (whose safety filter would own the command topic) stays off
    specs = plan("mujoco", overrides={"profile": profile}, stack=False)
    print(f"robot_wm demo: embedded MuJoCo arm (profile {profile}) in its own process, scripted velocity commands over ROS 2")
    context = Context()
    rclpy.init(context=context, signal_handler_options=SignalHandlerOptions.NO)
    group = ProcessGroup(specs, env)
    executor = SingleThreadedExecutor(context=context)
    node = ScriptedCommander(script, context=context)
    executor.add_node(node)
    spin = threading.Thread(target=lambda: _spin(executor, context, stop), daemon=True)
    code = 1
    try:
        group.start()
        spin.start()
        deadline = time.monotonic() + 30.0
        while not node.has_state():
            if stop.is_set() or group.failed() or time.monotonic() > deadline:
                print("the embedded arm did not publish /joint_states (see its log above)", file=sys.stderr)
                return 1
            time.sleep(0.05)
        node.start()
        last_print = 0.0
        while not node.done.is_set() and not stop.is_set():
            if group.failed():
                print(f"\nnode process exited: {[c.spec.name for c in group.failed()]}", file=sys.stderr)
                return 1
            now = time.monotonic()
            if live:
                print("\r" + _status_line(node, kin, now), end="", flush=True)
            elif now - last_print >= 1.0:
                print(_status_line(node, kin, now), flush=True)
                last_print = now
            time.sleep(0.1)
        if live:
            print()
        if stop.is_set():
            print("interrupted")
            return 130
        summary = summarize(node.recording, script, node.t0_s, profile)
        _print_summary(summary)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "demo_summary.json").write_text(json.dumps(asdict(summary), indent=2))
            print(f"summary written to {out_dir / 'demo_summary.json'}")
        code = 0 if summary.passed else 1
    finally:
        stop.set()
        codes = group.stop()
        spin.join(timeout=2.0)
        executor.remove_node(node)
        node.destroy_node()
        executor.shutdown(timeout_sec=1.0)
        if context.ok():
            rclpy.shutdown(context=context)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        bad = {k: v for k, v in codes.items() if v not in (0, None)}
        if bad:
            print(f"node processes exited with {bad}", file=sys.stderr)
    return code


def _spin(executor, context, stop: threading.Event) -> None:
    while context.ok() and not stop.is_set():
        executor.spin_once(timeout_sec=0.05)


def _print_summary(s: DemoSummary) -> None:
    print("---- summary (measured on /joint_states) ----")
    print(f"joint states: {s.joint_states_received} received, period p50 {s.joint_states_period_ms_p50:.2f} ms, "
          f"p99 {s.joint_states_period_ms_p99:.2f} ms, max {s.joint_states_period_ms_max:.2f} ms")
    for name, err in s.tracking_error_radps.items():
        print(f"  tracking {name:<24} median max-joint error {err:.4f} rad/s")
    stop = "never" if s.stop_after_timeout_s is None else f"{s.stop_after_timeout_s * 1e3:.0f} ms"
    print(f"commands stopped -> arm at rest (|v| < {STOP_TOLERANCE_RADPS} rad/s) after {stop}")
    print("PASS" if s.passed else f"FAIL (tracking tolerance {TRACKING_TOLERANCE_RADPS} rad/s, rest within 0.5 s)")
