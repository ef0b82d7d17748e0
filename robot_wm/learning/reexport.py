"""Re-export a shipped policy from its own weights with the current export code (issue #13).

The exported graph's form changes without retraining (``export_form``: the tool kinematics in a
few nodes, once per forward); the weights do not. ``reexport_policy`` rebuilds the torch actor
from the graph (``policy_from_onnx``), exports it again, holds the new graph to the old one on
observations the task produces (``parity_observations``), and replaces the file only then. The
sidecar keeps its content (metrics, config, normalization, training command and data hash,
lineage); its version and SHA-256 name the new file, and a ``reexport`` block says what was done
and how far the two graphs differ::

    python -m robot_wm.learning.reexport         # the five shipped sets
    python -m robot_wm.learning.reexport models/track:track

Exporting the same weights again is deterministic (re-exported with the code before this
change, every shipped policy came out bit-identical), so the result is also what
``robot-wm export`` now writes for the same training run.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

#: the shipped model sets and their tasks, parents before the sets adapted from them
SHIPPED = (("models", "reach"), ("models/track", "track"), ("models/reach_sim_only", "reach"),
           ("models/track_sim_only", "track"), ("models/track_adapted_real_twin", "track"))
TOLERANCE_RADPS = 1e-5


def parity_observations(task_name: str, runner, seed: int = 0, n_random: int = 12_000,
                        n_episodes: int = 8) -> np.ndarray:
    """Observations of ``task_name`` to compare two graphs on: ``n_random`` random ones (the task's
    episodes at random times, joints 0.05 or 0.5 rad (normal) or up to pi (uniform) from their
    start posture; the targets the task draws) and the closed-loop ones of ``runner`` (a
    ``PolicyRunner``) driving the simulator through ``n_episodes`` episodes on the nominal and
    real_twin profiles (the tool position measured as the robot measures it)."""
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.core.tasks import get_task
    from robot_wm.sim import VecArmSim

    task = get_task(task_name)
    urdf = description.expand()
    names = description.joint_limits(urdf).names
    kin = Kinematics(urdf, names)
    home = description.initial_positions(names)
    rng = np.random.default_rng(seed)
    eps = task.episodes(n_random, seed, home)
    rows = []
    for i in range(n_random):
        spread = rng.choice([0.05, 0.5, np.pi])
        offset = rng.uniform(-spread, spread, len(names)) if spread == np.pi else rng.normal(0.0, spread, len(names))
        q = eps.q0_rad[i] + offset
        qdot = rng.normal(0.0, 0.5, len(names))
        rows.append(task.observation(eps, i, rng.uniform(0.0, task.episode_s), q, qdot, kin.tool_position_m(q)))
    for k, profile in enumerate(("nominal", "real_twin")):
        eps = task.episodes(n_episodes, seed + 1 + k, home)
        env = VecArmSim(n_episodes, profile, seed=seed + 1 + k, control_dt_s=task.control_dt_s, n_threads=1)
        o = env.reset(q0_rad=eps.q0_rad)
        for step in range(task.episode_steps):
            obs = np.stack([task.observation(eps, i, step * task.control_dt_s, o.q_rad[i], o.qdot_radps[i],
                                             kin.tool_position_m(o.q_rad[i])) for i in range(n_episodes)])
            rows.extend(obs)
            o = env.step(runner.act(obs))
    return np.asarray(rows, dtype=np.float32)


def deviations_radps(old_onnx: Path, new_onnx: Path, obs: np.ndarray) -> dict[str, float]:
    """The largest |new - old| over the actions of ``obs``: evaluated as one batch (``batched``)
    and row by row as the policy node runs them (``row_by_row``), and, for scale, the old graph's
    own spread between the two (``previous_row_vs_batched``: onnxruntime's kernels round
    differently for one row, and the damped least squares amplifies last-bit differences of the
    Jacobian at near-singular postures)."""
    from robot_wm.core.onnx_model import make_session

    old, new = make_session(old_onnx), make_session(new_onnx)
    old_batch, new_batch = old.run(None, {"obs": obs})[0], new.run(None, {"obs": obs})[0]
    old_rows = np.concatenate([old.run(None, {"obs": row[None]})[0] for row in obs])
    new_rows = np.concatenate([new.run(None, {"obs": row[None]})[0] for row in obs])
    return {"batched": float(np.max(np.abs(new_batch - old_batch))),
            "row_by_row": float(np.max(np.abs(new_rows - old_rows))),
            "previous_row_vs_batched": float(np.max(np.abs(old_rows - old_batch)))}


def reexport_policy(onnx_path: Path, task_name: str, renamed: dict[str, str] | None = None,
                    tolerance_radps: float = TOLERANCE_RADPS, seed: int = 0) -> dict[str, Any]:
    """Re-export ``onnx_path`` (a policy and its sidecar) in place from its own weights (module
    docstring); returns what was done. ``renamed``: earlier re-exports, old version -> new, to
    point a lineage's ``parent_version`` at its parent's new name (the old one stays: history).

    Raises:
        ValueError: the new graph differs from the old one by more than ``tolerance_radps`` (on
            the batch; row by row the gate is that plus the old graph's own spread between the
            two); the file is then left as it was.
    """
    from robot_wm.core.onnx_model import read_sidecar, sha256_file, sidecar_path
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.onnx_import import policy_from_onnx
    from robot_wm.learning.policy import export_policy

    onnx_path = Path(onnx_path)
    old_side = read_sidecar(onnx_path)
    old_version, old_sha = old_side["version"], old_side["sha256"]
    if not old_version.endswith("-" + old_sha[:8]):
        raise ValueError(f"{onnx_path}: version {old_version!r} does not end with its file's SHA-256 prefix")
    actor, cfg, _ = policy_from_onnx(onnx_path, task_name)
    with tempfile.TemporaryDirectory() as tmp:
        new_path = export_policy(actor, Path(tmp) / onnx_path.name, joint_names=old_side["joint_names"],
                                 task=get_task(task_name).spec, dataset_sha256=old_side["training_data_sha256"],
                                 version=old_version[:-8] + "{onnx_sha8}", config=cfg,
                                 training_command=old_side["training_command"])
        new_sha = sha256_file(new_path)
        if new_sha == old_sha:
            return {"path": str(onnx_path), "version": old_version, "unchanged": True}
        runner = PolicyRunner(onnx_path, old_side["joint_names"], old_side["dt_s"], task=task_name)
        obs = parity_observations(task_name, runner, seed=seed)
        dev = deviations_radps(onnx_path, new_path, obs)
        row_tolerance = tolerance_radps + dev["previous_row_vs_batched"]
        if not (dev["batched"] <= tolerance_radps and dev["row_by_row"] <= row_tolerance):
            raise ValueError(f"{onnx_path}: the re-exported graph differs from it by {dev['batched']:.2e} rad/s "
                             f"({dev['row_by_row']:.2e} row by row; tolerance {tolerance_radps:g}): left as it was")
        written = json.loads(sidecar_path(new_path).read_text())
        side = json.loads(sidecar_path(onnx_path).read_text())  # as stored (key order), not as checked
        for key in ("version", "sha256", "inputs", "outputs", "opset", "versions"):
            side[key] = written[key]
        side["reexport"] = {
            "note": ("re-exported from the same weights for a smaller graph (the tool kinematics computed "
                     "once per forward, batched over the joints: robot_wm.learning.torch_kinematics.ExportToolFK); "
                     "metrics and lineage are those of the previous graph. Deviations: new vs previous graph on "
                     "random and closed-loop observations (robot_wm.learning.reexport), batched and row by row; "
                     "row by row both graphs round differently than batched, the previous one by up to "
                     "previous_graph_row_vs_batched_radps (near-singular postures)"),
            "previous_version": old_version,
            "previous_sha256": old_sha,
            "max_abs_deviation_radps": float(f"{dev['batched']:.3g}"),
            "max_abs_deviation_row_by_row_radps": float(f"{dev['row_by_row']:.3g}"),
            "previous_graph_row_vs_batched_radps": float(f"{dev['previous_row_vs_batched']:.3g}"),
            "parity_observations": int(len(obs)),
        }
        parent = (side.get("lineage") or {}).get("parent_version")
        if parent is not None and parent in (renamed or {}):
            side["lineage"]["parent_reexported_as"] = renamed[parent]
        shutil.copyfile(new_path, onnx_path)
    sidecar_path(onnx_path).write_text(json.dumps(side, indent=2) + "\n")
    PolicyRunner(onnx_path, side["joint_names"], side["dt_s"], task=task_name)  # loads through its sidecar
    return {"path": str(onnx_path), "version": side["version"], "previous_version": old_version,
            "deviations_radps": dev, "parity_observations": int(len(obs)), "unchanged": False}


def main(argv: list[str] | None = None) -> int:
    """Re-export the given model sets' policies (``DIR:TASK``; default the shipped sets)."""
    from robot_wm.paths import data_path

    parser = argparse.ArgumentParser(prog="python -m robot_wm.learning.reexport", description=__doc__.splitlines()[0])
    parser.add_argument("sets", nargs="*", metavar="DIR:TASK",
                        help="model set directory and its policy's task (default: the shipped sets)")
    args = parser.parse_args(argv)
    sets = [tuple(s.rsplit(":", 1)) for s in args.sets] or [(str(data_path(*d.split("/"))), t) for d, t in SHIPPED]
    renamed: dict[str, str] = {}
    for directory, task in sets:
        result = reexport_policy(Path(directory) / "policy.onnx", task, renamed)
        if result["unchanged"]:
            print(f"{directory}: {result['version']} unchanged (the export is already this graph)")
            continue
        renamed[result["previous_version"]] = result["version"]
        dev = result["deviations_radps"]
        print(f"{directory}: {result['previous_version']} -> {result['version']}: max |new - old| on "
              f"{result['parity_observations']} observations {dev['batched']:.2e} rad/s batched, "
              f"{dev['row_by_row']:.2e} row by row (the old graph's own row-vs-batch spread "
              f"{dev['previous_row_vs_batched']:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
