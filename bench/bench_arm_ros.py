"""Benchmark: the embedded arm under ROS 2 (separate process, loopback DDS).

Prints the /joint_states receive period p50/p99/max at the configured rate (default 500 Hz) and
the command-to-motion latency: time from publishing a velocity step to the first /joint_states
whose measured velocity shows it. Numbers, not pass/fail.

    python bench/bench_arm_ros.py [--seconds 10] [--steps 20] [--profile nominal]
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "test"))  # the test-side ROS client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to record /joint_states")
    parser.add_argument("--steps", type=int, default=20, help="velocity steps for the latency measurement")
    parser.add_argument("--profile", default="nominal")
    args = parser.parse_args()

    import rclpy
    from rclpy.context import Context

    from robot_wm.graph import plan
    from robot_wm.rosenv import loopback_env
    from robot_wm.process_group import command_for
    from rosclient import ArmClient

    env = loopback_env(domain_id=150 + os.getpid() % 50)
    os.environ.update(env)
    spec = next(s for s in plan("mujoco", overrides={"profile": args.profile}) if s.name == "arm_sim")
    arm = subprocess.Popen(command_for(spec), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    context = Context()
    rclpy.init(context=context)
    client = ArmClient(context, "bench_client")
    try:
        if not client.wait_for_state(60.0):
            raise SystemExit("arm_sim published no /joint_states")
        time.sleep(1.0)
        t0 = time.monotonic()
        time.sleep(args.seconds)
        t = np.array([s[0] for s in client.states_since(t0)])
        periods_ms = np.diff(t) * 1e3
        print(f"/joint_states at 500 Hz over {args.seconds:.0f} s: {len(t)} messages ({len(t) / args.seconds:.1f} Hz), "
              f"period p50 {np.percentile(periods_ms, 50):.3f} ms, p99 {np.percentile(periods_ms, 99):.3f} ms, "
              f"max {periods_ms.max():.3f} ms")

        latencies_ms = []
        threshold = 0.02  # rad/s: well above sensor noise, well below the 0.5 rad/s step
        for _ in range(args.steps):
            client.command_for([0.0] * 6, 0.3)
            time.sleep(0.4)  # let the arm settle at rest after the timeout
            sign = 1.0 if client.latest()[1][0] < 0.5 else -1.0
            t_cmd = time.monotonic()
            client.command_for([0.5 * sign, 0, 0, 0, 0, 0], 0.15, rate_hz=200.0)
            moved = [s for s in client.states_since(t_cmd) if abs(s[2][0]) > threshold]
            if moved:
                latencies_ms.append((moved[0][0] - t_cmd) * 1e3)
        lat = np.array(latencies_ms)
        print(f"command-to-motion latency over {len(lat)} steps (|v| > {threshold} rad/s on /joint_states): "
              f"p50 {np.percentile(lat, 50):.2f} ms, p99 {np.percentile(lat, 99):.2f} ms, max {lat.max():.2f} ms")
    finally:
        client.close()
        rclpy.shutdown(context=context)
        arm.send_signal(signal.SIGINT)
        try:
            arm.wait(timeout=3.0)
        except subprocess.TimeoutExpired:
            arm.kill()


if __name__ == "__main__":
    main()
