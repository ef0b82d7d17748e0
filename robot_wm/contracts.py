"""The contracts every layer shares, defined once: the arm's joints, the state and observation
layouts, and the names and shapes of the exported models' inputs and outputs.

Base layer (numpy only): ``core``, ``sim``, ``learning``, the nodes and the CLI import these;
nothing here imports them. Code that has the robot's joint names at hand (a runner, a node, a
dataset) sizes its arrays from them; code that needs the count before any description is read
(layouts, model signatures, profile schemas) uses ``N_JOINTS``.

``JOINT_NAMES`` is the joint order of urdf/robot_wm_arm.urdf.xacro and of ``joint_names`` in
config/robot.yaml; test_description checks that all three agree, and the simulator and the model
loader refuse a description or a model whose order differs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The actuated joints, in the order of every joint array robot_wm publishes, accepts or learns from.
JOINT_NAMES = (
    "shoulder_pan_joint",
    "shoulder_lift_joint",
    "elbow_joint",
    "wrist_1_joint",
    "wrist_2_joint",
    "wrist_3_joint",
)
N_JOINTS = len(JOINT_NAMES)

#: The joint state as one vector (world-model state, its variances): positions, then velocities.
STATE_LAYOUT = {"q_rad": slice(0, N_JOINTS), "qdot_radps": slice(N_JOINTS, 2 * N_JOINTS)}
STATE_DIM = 2 * N_JOINTS

#: The policy's observation: joint state, tool position and goal (base frame), raw units.
OBS_LAYOUT = {
    "q_rad": slice(0, N_JOINTS),
    "qdot_radps": slice(N_JOINTS, 2 * N_JOINTS),
    "tool_m": slice(2 * N_JOINTS, 2 * N_JOINTS + 3),
    "goal_m": slice(2 * N_JOINTS + 3, 2 * N_JOINTS + 6),
}
OBS_DIM = 2 * N_JOINTS + 6


def track_obs_layout(n_preview: int) -> dict[str, slice]:
    """The tracking policy's observation: joint state, tool position, and ``n_preview`` reference
    positions ahead of now (base frame, raw units; robot_wm.core.track)."""
    base = 2 * N_JOINTS + 3
    return {"q_rad": OBS_LAYOUT["q_rad"], "qdot_radps": OBS_LAYOUT["qdot_radps"], "tool_m": OBS_LAYOUT["tool_m"],
            "preview_m": slice(base, base + 3 * int(n_preview))}


def layout_width(layout: dict[str, slice]) -> int:
    """The observation width a layout describes."""
    return max(s.stop for s in layout.values())


def target_slices(layout: dict[str, slice]) -> list[slice]:
    """The 3-vector blocks of a layout that are target positions (the goal, or each preview point)."""
    if "goal_m" in layout:
        return [layout["goal_m"]]
    block = layout["preview_m"]
    return [slice(k, k + 3) for k in range(block.start, block.stop, 3)]


def layout_json(layout: dict[str, slice]) -> dict[str, list[int]]:
    """Return a layout as sidecars store it: ``{block: [start, stop]}``."""
    return {name: [s.start, s.stop] for name, s in layout.items()}


def join_obs(q_rad, qdot_radps, tool_m, goal_m, xp=np):
    """Concatenate observation blocks in OBS_LAYOUT order along the last axis.

    Args:
        q_rad, qdot_radps, tool_m, goal_m: arrays with equal leading dimensions.
        xp: the array module (numpy, or torch for the trainer's tensors).
    """
    blocks = {"q_rad": q_rad, "qdot_radps": qdot_radps, "tool_m": tool_m, "goal_m": goal_m}
    return xp.concatenate([blocks[name] for name in OBS_LAYOUT], axis=-1)


# ------------------------------------------------------------------------ exported models' I/O
BATCH = "batch"  # the dynamic first dimension of every graph input and output

POLICY_KIND = "policy"
POLICY_OBS = "obs"
POLICY_ACTION = "action_radps"

WORLD_MODEL_KIND = "world_model"
WM_Q = "q_rad"
WM_QDOT = "qdot_radps"
WM_ACTIONS = "action_radps"
WM_QDOT_HISTORY = "qdot_history_radps"
WM_NEXT_Q = "next_q_rad"
WM_NEXT_QDOT = "next_qdot_radps"
WM_EPISTEMIC_VAR = "epistemic_var"
WM_ALEATORIC_VAR = "aleatoric_var"


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: its name and shape (``BATCH`` for the dynamic batch dimension)."""

    name: str
    shape: tuple[int | str, ...]

    def as_json(self) -> dict:
        """As the sidecar lists it (without the dtype)."""
        return {"name": self.name, "shape": list(self.shape)}


@dataclass(frozen=True)
class Signature:
    """The inputs and outputs of an exported graph, in graph order."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


def policy_signature(obs_dim: int = OBS_DIM) -> Signature:
    """The policy graph: raw observations in (``obs_dim`` wide: the task's layout), rad/s out."""
    return Signature(inputs=(TensorSpec(POLICY_OBS, (BATCH, int(obs_dim))),),
                     outputs=(TensorSpec(POLICY_ACTION, (BATCH, N_JOINTS)),))


def world_model_signature(action_history: int, qdot_history: int = 0) -> Signature:
    """The world-model graph for ``action_history`` commands (H) and ``qdot_history`` previous qdot (K).

    Inputs: the measured state now, the last H commands (oldest first, the current one last) and,
    when K > 0, the K previous measured qdot. Outputs: the ensemble-mean next state and its
    epistemic and aleatoric variances in STATE_LAYOUT order.
    """
    inputs = [TensorSpec(WM_Q, (BATCH, N_JOINTS)), TensorSpec(WM_QDOT, (BATCH, N_JOINTS)),
              TensorSpec(WM_ACTIONS, (BATCH, int(action_history), N_JOINTS))]
    if qdot_history:
        inputs.append(TensorSpec(WM_QDOT_HISTORY, (BATCH, int(qdot_history), N_JOINTS)))
    outputs = (TensorSpec(WM_NEXT_Q, (BATCH, N_JOINTS)), TensorSpec(WM_NEXT_QDOT, (BATCH, N_JOINTS)),
               TensorSpec(WM_EPISTEMIC_VAR, (BATCH, STATE_DIM)), TensorSpec(WM_ALEATORIC_VAR, (BATCH, STATE_DIM)))
    return Signature(tuple(inputs), outputs)


def signature_differences(inputs: list[dict], outputs: list[dict], expected: Signature) -> list[str]:
    """Compare a sidecar's ``inputs``/``outputs`` (``[{"name", "shape"}, ...]``) with ``expected``.

    Returns:
        One line per difference (empty when they agree).
    """
    problems = []
    for kind, declared, specs in (("inputs", inputs, expected.inputs), ("outputs", outputs, expected.outputs)):
        got = [(d.get("name"), list(d.get("shape", []))) for d in declared]
        want = [(t.name, list(t.shape)) for t in specs]
        if got != want:
            problems.append(f"{kind} {got}, expected {want}")
    return problems
