"""Benchmark of the learning pipeline on CPU: collection throughput, and sample efficiency.

Sample efficiency: for each dataset size (default 10k / 30k / 100k simulated transitions) the
whole pipeline runs from scratch with config/training.yaml (collect -> train world model ->
train policy in imagination -> export) and the learned policy is evaluated on the same 200
nominal episodes. Prints a table; nothing here is pass/fail.

    python bench/bench_learning.py [--sizes 10000 30000 100000] [--episodes 200] [--iterations N]
    python bench/bench_learning.py --collect-only
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np


def collection_throughput(transitions: int) -> None:
    """Time `collect` for ``transitions`` transitions."""
    from robot_wm.core.task import load_task
    from robot_wm.learning.config import load_section
    from robot_wm.learning.data import CollectConfig, collect, load_randomization
    from robot_wm.paths import config_path

    path = config_path("training.yaml")
    cfg = replace(load_section(path, "collect", CollectConfig), transitions=transitions)
    start = time.perf_counter()
    data = collect(cfg, load_task(), load_randomization(path), progress=False)
    seconds = time.perf_counter() - start
    print(f"collect: {data.n_transitions} transitions (domain randomized, {cfg.n_envs} envs) in {seconds:.1f} s "
          f"= {data.n_transitions / seconds:,.0f} transitions/s")


def sample_efficiency(sizes: list[int], episodes: int, iterations: int | None, workdir: Path) -> None:
    """Run the pipeline per dataset size and print policy success vs transitions."""
    import torch

    from robot_wm import description
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.task import load_task
    from robot_wm.learning.config import load_section
    from robot_wm.learning.data import CollectConfig, collect, load_randomization
    from robot_wm.learning.evaluate import evaluate
    from robot_wm.learning.pipeline import WorldModelDynamics
    from robot_wm.learning.policy import PolicyConfig, export_policy, train_policy
    from robot_wm.learning.torch_kinematics import TorchToolFK
    from robot_wm.learning.world_model import WorldModelConfig
    from robot_wm.learning.world_model_training import train_world_model
    from robot_wm.paths import config_path

    torch.set_num_threads(2)
    path = config_path("training.yaml")
    task = load_task()
    urdf = description.expand()
    names = description.joint_limits(urdf).names
    rows = []
    for size in sizes:
        t0 = time.perf_counter()
        data = collect(replace(load_section(path, "collect", CollectConfig), transitions=size), task, load_randomization(path), progress=False)
        t1 = time.perf_counter()
        wm, _ = train_world_model(load_section(path, "world_model", WorldModelConfig), data, progress=False)
        t2 = time.perf_counter()
        pcfg = load_section(path, "policy", PolicyConfig)
        if iterations:
            pcfg = replace(pcfg, iterations=iterations)
        actor, _ = train_policy(pcfg, WorldModelDynamics(wm), TorchToolFK(urdf, names), data, task,
                                description.initial_positions(names), progress=False)
        t3 = time.perf_counter()
        onnx = export_policy(actor, workdir / f"policy_{size}.onnx", joint_names=names, task=task,
                             dataset_sha256=data.sha256, version=f"bench-{size}")
        report = evaluate(PolicyRunner(onnx, names, task.control_dt_s), "nominal", episodes, seed=0, task=task)
        rows.append((data.n_transitions, report.success_rate, float(np.median(report.final_error_m)), t1 - t0, t2 - t1, t3 - t2))
        print(f"  {data.n_transitions:>7} transitions: success {report.success_rate * 100:5.1f} %  "
              f"(collect {t1 - t0:.0f} s, world model {t2 - t1:.0f} s, policy {t3 - t2:.0f} s)", flush=True)
    print(f"sample efficiency (nominal, {episodes} episodes, seed 0, policy iterations {pcfg.iterations}):")
    print(f"  {'transitions':>11}  {'success':>8}  {'final err':>9}  {'collect':>7}  {'WM train':>8}  {'policy':>7}")
    for n, sr, err, tc, tw, tp in rows:
        print(f"  {n:>11}  {sr * 100:7.1f}%  {err * 1e3:7.1f}mm  {tc:6.0f}s  {tw:7.0f}s  {tp:6.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=None, help="policy iterations (default: the config's)")
    parser.add_argument("--collect-only", action="store_true")
    parser.add_argument("--collect-transitions", type=int, default=100_000)
    args = parser.parse_args(argv)
    collection_throughput(args.collect_transitions)
    if not args.collect_only:
        with tempfile.TemporaryDirectory() as tmp:
            sample_efficiency(args.sizes, args.episodes, args.iterations, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
