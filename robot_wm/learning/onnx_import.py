"""Torch models rebuilt from their exported ONNX graphs, so that ``robot-wm adapt`` fine-tunes
exactly what runs on the robot (the shipped sets carry no torch checkpoints).

``world_model_from_onnx`` and ``policy_from_onnx`` read the graph's initializers into a freshly
built ``WorldModel`` / ``Actor`` (architecture from the sidecar's training config; what the graph
does not name — the traced bias constants, the URDF-derived buffers — by shape and by rebuilding)
and check the result against onnxruntime on random inputs: a mismatch is an ``AdaptError``, never
a silent start from the wrong weights.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from robot_wm.learning.world_model import WorldModel, WorldModelConfig


class AdaptError(ValueError):
    """Adaptation cannot run on these inputs (too few demos, a base set that does not load, ...)."""


def _initializers(path: Path) -> list[tuple[str, np.ndarray]]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    return [(i.name, numpy_helper.to_array(i)) for i in model.graph.initializer]


def world_model_from_onnx(path: Path) -> WorldModel:
    """Rebuild the torch ensemble a world_model.onnx was exported from (weights, normalization,
    variance scale), checked against the ONNX graph on random inputs."""
    from robot_wm.core.onnx_model import read_sidecar

    path = Path(path)
    side = read_sidecar(path)
    raw = dict(side.get("config") or {})
    if not raw:
        raise AdaptError(f"{path}: the sidecar has no training config: cannot rebuild the ensemble to fine-tune it")
    raw["hidden_sizes"] = tuple(raw["hidden_sizes"])
    model = WorldModel(WorldModelConfig(**raw), side["joint_names"], float(side["dt_s"]))
    inits = _initializers(path)
    named = dict(inits)
    state = model.state_dict()
    if "variance_scale" in named:
        model.set_variance_scale(torch.as_tensor(np.array(named["variance_scale"])))
        state = model.state_dict()
    anonymous = [a for n, a in inits if n not in state]
    biases = [k for k in state if k.endswith(".bias")]  # hidden.0 .. head, in order (traced as Add constants)
    new_state = {}
    for key, value in state.items():
        if key in named:
            new_state[key] = torch.as_tensor(np.array(named[key])).reshape(value.shape)
        elif key in biases and anonymous and anonymous[0].size == value.numel():
            new_state[key] = torch.as_tensor(np.array(anonymous.pop(0))).reshape(value.shape)
        else:
            raise AdaptError(f"{path}: parameter {key} {tuple(value.shape)} not found in the ONNX graph")
    model.load_state_dict(new_state)
    model.eval()
    _check_world_model_parity(model, path)
    return model


def _check_world_model_parity(model: WorldModel, path: Path, tol: float = 5e-4) -> None:
    """The rebuilt model against the graph on random inputs. ``tol``: float32 round-off of a graph
    that was itself exported from a fine-tuned, variance-scaled model reaches ~1e-4 relative on
    near-zero outputs; weights that are not the graph's differ by orders of magnitude more."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    b, h = 16, model.action_history
    q = rng.uniform(-1, 1, (b, 6)).astype(np.float32)
    qd = rng.uniform(-1, 1, (b, 6)).astype(np.float32)
    a = rng.uniform(-1, 1, (b, h, 6)).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"q_rad": q, "qdot_radps": qd, "action_radps": a})
    with torch.no_grad():
        want = [x.numpy() for x in model(torch.from_numpy(q), torch.from_numpy(qd), torch.from_numpy(a))]
    for name, g, w in zip(("next_q_rad", "next_qdot_radps", "epistemic_var", "aleatoric_var"), got, want):
        err = float(np.max(np.abs(g - w) / (np.abs(w) + 1e-3)))
        if err > tol:
            raise AdaptError(f"{path}: the rebuilt ensemble differs from the ONNX graph in {name} (relative {err:.2e})")


def policy_from_onnx(path: Path, task_name: str):
    """Rebuild the policy's Actor (prior, cap, normalization inside) from its ONNX graph, checked."""
    import onnxruntime as ort

    from robot_wm import description
    from robot_wm.core.onnx_model import read_sidecar
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.policy import PolicyConfig, build_actor
    from robot_wm.learning.torch_kinematics import TorchToolFK

    path = Path(path)
    side = read_sidecar(path)
    if side.get("task") != task_name:
        raise AdaptError(f"{path}: a policy for task {side.get('task')!r}, not {task_name!r}")
    if not side.get("config"):
        raise AdaptError(f"{path}: the sidecar has no training config: cannot rebuild the actor to fine-tune it")
    task = get_task(task_name).spec
    urdf = description.expand()
    names = description.joint_limits(urdf).names
    layout = {k: slice(*v) for k, v in side["obs_layout"].items()}
    norm = side["normalization"]
    cfg = PolicyConfig(**side["config"])
    actor = build_actor(cfg, task, np.array(norm["obs_mean"]), np.array(norm["obs_std"]), layout,
                        TorchToolFK(urdf, names), side["action_limit_radps"])
    named = dict(_initializers(path))
    state = actor.state_dict()
    learned = [k for k in state if k.startswith("net.") or k.startswith("norm.")]
    missing = [k for k in learned if k not in named]
    if missing:
        raise AdaptError(f"{path}: actor parameter(s) {', '.join(missing)} not in the ONNX graph")
    state.update({k: torch.as_tensor(np.array(named[k])).reshape(state[k].shape) for k in learned})
    actor.load_state_dict(state)
    actor.eval()
    rng = np.random.default_rng(0)
    width = actor.norm.mean.numel()
    obs = np.concatenate([rng.uniform(-1, 1, (8, 12)), rng.uniform(0.2, 0.5, (8, width - 12))], 1).astype(np.float32)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"obs": obs})[0]
    with torch.no_grad():
        want = actor(torch.from_numpy(obs)).numpy()
    if float(np.max(np.abs(got - want))) > 1e-4:
        raise AdaptError(f"{path}: the rebuilt actor differs from the ONNX graph by {np.max(np.abs(got - want)):.2e} rad/s")
    return actor, cfg, side
