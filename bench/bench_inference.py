"""Benchmark of the hot-path networks: single-thread onnxruntime vs the same torch module (eager).

For each network, latency p50/p99 (µs) of one call at each batch size that the hot path uses,
measured in the same run for onnxruntime (the deployed path: one intra-op thread) and torch eager
(``torch.set_num_threads(1)``, ``no_grad``), and their ratio. Networks:

  * policy: the actor at batch 1 (one action per period), plus ``PolicyRunner.act`` (checks included);
  * world_model: the ensemble at batch 1 (one prediction per period) and at batch 13 (the central
    finite-difference batch of ``WorldModelRunner.linearize``), plus the runner's own ``predict``
    and ``linearize`` (input checks and history included);

and, separately, the world-model training time on CPU for ``--train-transitions`` transitions.
Add a network by appending a ``Network`` to ``networks()``.

Usage: python bench/bench_inference.py [--world-model runs/world_model/world_model.pt] [--policy runs/policy/policy.pt]
       [--iterations 2000] [--train-transitions 100000] [--train-epochs 2] [--data data.npz] [--no-train]
Prints numbers only; timings are never pass/fail.
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch


@dataclass
class Network:
    """One network to time: its torch module, its exported ONNX file and an input factory."""

    name: str
    module: torch.nn.Module
    onnx_path: Path
    make_inputs: Callable[[int], dict[str, np.ndarray]]  # batch -> named float32 inputs
    batches: tuple[int, ...]
    extra: dict[str, Callable[[], object]] = dataclasses.field(default_factory=dict)  # label -> call to time


def _percentiles(fn: Callable[[], object], iterations: int) -> tuple[float, float]:
    for _ in range(min(200, iterations)):  # warm-up
        fn()
    times = np.empty(iterations)
    for i in range(iterations):
        start = time.perf_counter_ns()
        fn()
        times[i] = time.perf_counter_ns() - start
    return float(np.percentile(times, 50) / 1e3), float(np.percentile(times, 99) / 1e3)


def bench_network(net: Network, iterations: int) -> None:
    """Print ORT vs torch latency for every batch size of ``net``."""
    from robot_wm.core.onnx_model import make_session

    session = make_session(net.onnx_path)
    names = [o.name for o in session.get_outputs()]
    module = net.module.eval()
    print(f"{net.name}  ({net.onnx_path.stat().st_size / 1e3:.0f} kB onnx)")
    print(f"  {'batch':>5}  {'ORT p50':>9} {'ORT p99':>9}  {'torch p50':>9} {'torch p99':>9}  {'torch/ORT p50':>13}")
    for b in net.batches:
        feeds = net.make_inputs(b)
        tensors = tuple(torch.from_numpy(v) for v in feeds.values())
        ort50, ort99 = _percentiles(lambda: session.run(names, feeds), iterations)
        with torch.no_grad():
            t50, t99 = _percentiles(lambda: module(*tensors), iterations)
        print(f"  {b:>5}  {ort50:8.1f}µ {ort99:8.1f}µ  {t50:8.1f}µ {t99:8.1f}µ  {t50 / ort50:12.2f}x")
    for label, call in net.extra.items():
        p50, p99 = _percentiles(call, iterations)
        print(f"  {label:<40} p50 {p50:8.1f}µs  p99 {p99:8.1f}µs")


def world_model_network(checkpoint: Path | None, workdir: Path) -> Network:
    """The world-model ensemble (trained checkpoint, or the configured architecture untrained)."""
    from robot_wm import description
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.learning.config import load_section
    from robot_wm.learning.world_model import WorldModel, WorldModelConfig, export_world_model, load_checkpoint
    from robot_wm.paths import config_path

    names = description.joint_limits(description.expand()).names
    if checkpoint:
        model, _ = load_checkpoint(checkpoint)
    else:
        model = WorldModel(load_section(config_path("training.yaml"), "world_model", WorldModelConfig), names, 0.01)
    path = export_world_model(model.eval(), workdir / "world_model.onnx", dataset_sha256="bench")
    h = model.action_history
    rng = np.random.default_rng(0)
    home = description.initial_positions(names)

    def inputs(b: int) -> dict[str, np.ndarray]:
        return {"q_rad": (home + 0.3 * rng.standard_normal((b, 6))).astype(np.float32),
                "qdot_radps": (0.5 * rng.standard_normal((b, 6))).astype(np.float32),
                "action_radps": (0.5 * rng.standard_normal((b, h, 6))).astype(np.float32)}

    runner = WorldModelRunner(path, names, model.dt_s)
    q, qd, a = home, np.full(6, 0.1), np.full(6, 0.2)
    print(f"world model: {model.members} members, hidden {list(model.config.hidden_sizes)}, action history {h}"
          f"{' (trained: ' + str(checkpoint) + ')' if checkpoint else ' (untrained weights: latency only)'}")
    return Network("world_model", model, path, inputs, (1, 13), extra={
        "WorldModelRunner.predict (batch 1)": lambda: runner.predict(q, qd, a, commit=False),
        "WorldModelRunner.linearize (batch 13)": lambda: runner.linearize(q, qd, a),
    })


def policy_network(checkpoint: Path | None, workdir: Path) -> Network:
    """The policy actor (trained checkpoint, or the configured architecture untrained)."""
    from robot_wm import description
    from robot_wm.core.policy_runner import PolicyRunner, make_obs
    from robot_wm.contracts import OBS_DIM
    from robot_wm.core.task import load_task
    from robot_wm.learning.config import load_section
    from robot_wm.learning.pipeline import load_policy_checkpoint
    from robot_wm.learning.policy import Actor, ObsNormalizer, PolicyConfig, export_policy
    from robot_wm.paths import config_path

    task = load_task()
    names = description.joint_limits(description.expand()).names
    if checkpoint:
        actor, _ = load_policy_checkpoint(checkpoint)
    else:
        cfg = load_section(config_path("training.yaml"), "policy", PolicyConfig)
        actor = Actor(ObsNormalizer(np.zeros(OBS_DIM), np.ones(OBS_DIM)), np.asarray(task.action_limit_radps), cfg.hidden)
    path = export_policy(actor.eval(), workdir / "policy.onnx", joint_names=names, task=task, dataset_sha256="bench", version="bench")
    rng = np.random.default_rng(1)
    home = description.initial_positions(names)

    def inputs(b: int) -> dict[str, np.ndarray]:
        q = home + 0.2 * rng.standard_normal((b, 6))
        obs = np.concatenate([q, 0.3 * rng.standard_normal((b, 6)), rng.uniform(-0.5, 0.5, (b, 3)),
                              task.sample_goals(rng, b)], axis=1)
        return {"obs": obs.astype(np.float32)}

    runner = PolicyRunner(path, names, task.control_dt_s)
    obs1 = make_obs(home, np.zeros(6), np.array([-0.49, -0.13, 0.49]), np.array([-0.4, 0.0, 0.3]))
    print(f"policy: hidden {actor.net[0].out_features}"
          f"{' (trained: ' + str(checkpoint) + ')' if checkpoint else ' (untrained weights: latency only)'}")
    return Network("policy", actor, path, inputs, (1,), extra={"PolicyRunner.act (batch 1)": lambda: runner.act(obs1)})


def networks(args: argparse.Namespace, workdir: Path) -> list[Network]:
    """Every network to time."""
    return [policy_network(args.policy, workdir), world_model_network(args.world_model, workdir)]


def bench_training(args: argparse.Namespace) -> None:
    """Time world-model training on CPU for ``--train-transitions`` transitions."""
    from robot_wm.core.task import load_task
    from robot_wm.learning.config import load_section
    from robot_wm.learning.data import CollectConfig, Dataset, collect, load_randomization
    from robot_wm.learning.world_model import WorldModelConfig
    from robot_wm.learning.world_model_training import train_world_model
    from robot_wm.paths import config_path

    if args.data:
        data = Dataset.load(args.data)
    else:
        start = time.perf_counter()
        data = collect(CollectConfig(transitions=args.train_transitions, seed=0), load_task(),
                       load_randomization(config_path("training.yaml")), progress=False)
        print(f"collected {data.n_transitions} transitions in {time.perf_counter() - start:.1f} s")
    configured = load_section(config_path("training.yaml"), "world_model", WorldModelConfig)
    cfg = configured
    if args.train_epochs:  # time exactly this many epochs (no early stop)
        patience = max(configured.patience, args.train_epochs)
        cfg = dataclasses.replace(configured, epochs=args.train_epochs, patience=patience)
    _, report = train_world_model(cfg, data, progress=False)
    per_epoch = report.seconds / report.epochs_run
    threads = cfg.num_threads or torch.get_num_threads()
    print(f"world-model training, {threads} torch threads: {data.n_transitions} transitions"
          f" ({report.n_train} train), {report.epochs_run} epochs in {report.seconds:.1f} s = {per_epoch:.1f} s/epoch"
          f" (config: up to {configured.epochs} epochs = {per_epoch * configured.epochs / 60:.1f} min at most)")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-model", type=Path,
                        help="world-model checkpoint (.pt); default: untrained, same architecture")
    parser.add_argument("--policy", type=Path, help="policy checkpoint (.pt); default: untrained, same architecture")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--train-transitions", type=int, default=100_000)
    parser.add_argument("--train-epochs", type=int, default=2, help="epochs to time (0: the config's full run)")
    parser.add_argument("--data", type=Path, help="dataset .npz for the training benchmark (default: collect)")
    parser.add_argument("--no-train", action="store_true", help="skip the training benchmark")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    print(f"torch {torch.__version__} eager, 1 thread; onnxruntime single-thread session (robot_wm.core.onnx_model)")
    with tempfile.TemporaryDirectory() as tmp:
        for net in networks(args, Path(tmp)):
            bench_network(net, args.iterations)
    if not args.no_train:
        bench_training(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
