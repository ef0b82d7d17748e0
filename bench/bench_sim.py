"""Benchmark of robot_wm.sim: simulated seconds per wall second at 1 ms physics steps.

Runs, for the nominal and real_twin profiles:
  * raw ``mujoco.mj_step`` on the arm model (the floor);
  * one ArmSim commanded every 10 ms, stepped 1 ms per call (a ROS node at 1 kHz) and 10 ms per call;
  * VecArmSim with 1, 8 and 32 environments at a 10 ms control period.

Usage: python bench/bench_sim.py [--sim-seconds 2.0] [--threads N]
Prints numbers only; timings are never pass/fail.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Callable

import mujoco
import numpy as np

from robot_wm.sim import ArmSim, VecArmSim, build_model, load_profile


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _report(label: str, sim_s: float, wall_s: float, env_steps: int, n_envs: int = 1) -> None:
    print(
        f"  {label:<38} {sim_s / wall_s:8.1f} x real time"
        f"   {n_envs * sim_s / wall_s:8.1f} env-s/s   {wall_s / env_steps * 1e6:6.2f} us/env-step"
    )


def bench_profile(profile_name: str, sim_s: float, threads: int | None) -> None:
    """Run every benchmark for one profile and print the numbers."""
    print(f"profile {profile_name}:")
    profile = load_profile(profile_name)
    steps = int(round(sim_s / 0.001))
    rng = np.random.default_rng(0)
    commands = rng.uniform(-0.3, 0.3, (steps // 10 + 1, 6))

    arm = build_model(profile)
    data = mujoco.MjData(arm.model)
    data.qpos[arm.qpos_adr] = ArmSim(profile).true_joint_state().position_rad
    data.act[arm.int_act_adr] = data.qpos[arm.qpos_adr]
    mujoco.mj_forward(arm.model, data)
    wall = _timed(lambda: mujoco.mj_step(arm.model, data, nstep=steps))
    _report("mujoco.mj_step (floor)", sim_s, wall, steps)

    for per_call in (1, 10):
        sim = ArmSim(profile, seed=0)

        def run(sim: ArmSim = sim, per_call: int = per_call) -> None:
            for k in range(0, steps, per_call):
                if k % 10 == 0:
                    sim.set_command(commands[k // 10])
                sim.step(per_call)
                sim.joint_state()

        wall = _timed(run)
        _report(f"ArmSim, step({per_call}) + joint_state", sim_s, wall, steps)

    for n_envs in (1, 8, 32):
        vec = VecArmSim(n_envs, profile, seed=0, control_dt_s=0.01, n_threads=threads)
        vec.reset()
        actions = rng.uniform(-0.3, 0.3, (steps // 10, n_envs, 6))

        def run_vec(vec: VecArmSim = vec, actions: np.ndarray = actions) -> None:
            for a in actions:
                vec.step(a)

        wall = _timed(run_vec)
        n_threads = min(n_envs, os.cpu_count() or 1) if threads is None else threads
        _report(f"VecArmSim n_envs={n_envs:<3} threads={n_threads}", sim_s, wall, steps * n_envs, n_envs)


def main() -> None:
    """Parse arguments and run the benchmarks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim-seconds", type=float, default=2.0, help="simulated seconds per measurement")
    parser.add_argument("--threads", type=int, default=None, help="VecArmSim threads (default min(n_envs, CPUs))")
    args = parser.parse_args()
    print(f"robot_wm.sim benchmark: {args.sim_seconds:g} simulated s per row, 1 ms physics, {os.cpu_count()} CPUs")
    for name in ("nominal", "real_twin"):
        bench_profile(name, args.sim_seconds, args.threads)


if __name__ == "__main__":
    main()
