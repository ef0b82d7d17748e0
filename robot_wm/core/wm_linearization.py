"""The world model's linearization as one small ONNX graph: prediction, Jacobian and std in one call.

The safety filter needs, every period, the predicted next state at the nominal command ``f0``, its
Jacobian ``B = d next_state / d u`` with respect to the current command, and the predictive std.
Central finite differences need a batch of 1 + 2N rows through the whole ensemble (13 rows for 6
joints). Forward-mode differentiation needs the primal row plus N tangent rows, and less than that:
the command enters only the first layer, whose tangent is a constant (the first layer's weight rows
of the current command, divided by their feature std), so the first layer runs on one row and only
the later layers carry the N tangent rows beside the primal one.

This module reads an exported ensemble (``robot_wm.learning.world_model.export_world_model``: batched
weights ``hidden.i.weight`` [M, in, out], ``head.weight``, biases, log-variance bounds, feature and
delta normalization, optional ``variance_scale``, the architecture in the sidecar's ``config``) and
builds that graph (batch 1) with the ``onnx`` helper API, its layer weights handed to the session
from memory rather than written into it (``_Graph``: the hot swap builds it beside the control
thread, and protobuf copies hold the interpreter lock). The exported file itself is unchanged
(its hash, version and every calibration made for it stay valid). The builder reproduces the
exported graph's arithmetic; :func:`build_linearization` checks it against the model's own
session before it is used, and a model it does not recognize or does not reproduce is answered by
``None`` with the reason (the runner then falls back to finite differences).

Graph (SiLU layers, ``s = sigmoid(z)``, ``silu'(z) = s + silu(z) (1 - s)``)::

    x   = (features(q, qdot, actions) - feature_mean) / feature_std             [1, F]
    z1  = x @ W1 + b1                                   h1 = silu(z1)             [M, 1, H]
    T1  = silu'(z1) * C1      C1 = W1[current command rows] / feature_std        [M, N, H]
    [z_k ; T_k'] = [h_{k-1} ; T_{k-1}] @ W_k    (primal + tangents in one matmul: [M, 1 + N, H])
    h_k = silu(z_k + b_k),    T_k = silu'(z_k + b_k) * T_k'
    head: mean_n, logvar_n (soft-bounded) from the primal row; tangents of mean_n from the N rows
    next_state = state + mean_m(mean_n * delta_std + delta_mean)
    jacobian[i, j] = mean_m(T_head[m, j, i]) * delta_std[i]                      [2N, N]
    std = sqrt(variance_scale * (var_m(member means) + mean_m(exp(logvar_n) delta_std²)))
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from robot_wm.contracts import N_JOINTS, STATE_DIM, WM_ACTIONS, WM_Q, WM_QDOT, WM_QDOT_HISTORY

#: Outputs of the linearization graph (batch 1).
LIN_NEXT_STATE = "next_state"  # [2N]
LIN_JACOBIAN = "jacobian"  # [2N, N]: d next_state / d action_radps[:, -1]
LIN_STD = "std"  # [2N]: predictive std at the command fed
#: constants this large or larger are handed to the session from memory, not written into the graph
EXTERNAL_MIN_BYTES = 4096
_IN_MEMORY = "robot_wm_in_memory"  # the external data's "location": never a file, the session takes the arrays


@dataclass(frozen=True)
class EnsembleWeights:
    """An exported ensemble's parameters (float32 numpy), as the exported graph uses them."""

    hidden_w: tuple[np.ndarray, ...]  # [M, in, out] each
    hidden_b: tuple[np.ndarray, ...]  # [M, 1, out] each
    head_w: np.ndarray  # [M, H, 2 * STATE_DIM]
    head_b: np.ndarray  # [M, 1, 2 * STATE_DIM]
    max_logvar: np.ndarray  # [M, 1, STATE_DIM]
    min_logvar: np.ndarray  # [M, 1, STATE_DIM]
    feature_mean: np.ndarray  # [F]
    feature_std: np.ndarray  # [F]
    delta_mean: np.ndarray  # [STATE_DIM]
    delta_std: np.ndarray  # [STATE_DIM]
    variance_scale: np.ndarray | None  # [STATE_DIM] or None
    action_history: int  # H: commands in the input, the current one last
    qdot_history: int  # K: previous measured qdot vectors in the input
    q_features: str  # "raw" or "sincos"

    @property
    def members(self) -> int:
        return int(self.head_w.shape[0])

    @property
    def current_command_columns(self) -> slice:
        """Feature columns of the current command (the last row of ``action_radps``)."""
        q_width = 2 * N_JOINTS if self.q_features == "sincos" else N_JOINTS
        start = q_width + N_JOINTS + (self.action_history - 1) * N_JOINTS
        return slice(start, start + N_JOINTS)


def read_ensemble(onnx_path: Path, sidecar: dict[str, Any]) -> EnsembleWeights | str:
    """The ensemble's weights from an exported world model, or the reason they cannot be read."""
    import onnx
    from onnx import numpy_helper

    config = sidecar.get("config") or {}
    hidden_sizes = config.get("hidden_sizes")
    if not isinstance(hidden_sizes, list) or not hidden_sizes:
        return "the sidecar has no training config (hidden_sizes)"
    if config.get("q_features", "raw") not in ("raw", "sincos"):
        return f"q_features {config.get('q_features')!r} is not supported"
    try:
        graph = onnx.load(str(onnx_path)).graph
    except Exception as exc:  # noqa: BLE001 (onnx raises its own types for unreadable files)
        return f"the graph cannot be read: {type(exc).__name__}: {exc}"
    inits = [(i.name, numpy_helper.to_array(i).astype(np.float32)) for i in graph.initializer]
    named = dict(inits)
    n_layers = len(hidden_sizes)
    want = [f"hidden.{i}.weight" for i in range(n_layers)] + [
        "head.weight", "max_logvar", "min_logvar", "feature_mean", "feature_std", "delta_mean", "delta_std"]
    missing = [k for k in want if k not in named]
    if missing:
        return f"initializer(s) {', '.join(missing)} not in the graph"
    # the biases are traced as anonymous Add constants, in layer order (as robot_wm.learning.onnx_import reads them)
    anonymous = [a for n, a in inits if n not in want and n != "variance_scale"]
    widths = [int(named[f"hidden.{i}.weight"].shape[-1]) for i in range(n_layers)] + [int(named["head.weight"].shape[-1])]
    biases = []
    for width in widths:
        if not anonymous or anonymous[0].shape[-1] != width:
            return "the layer biases are not where an exported ensemble keeps them"
        biases.append(anonymous.pop(0))
    members = int(named["head.weight"].shape[0])
    try:
        biases = [b.reshape(members, 1, -1) for b in biases]
    except ValueError:
        return "the layer biases do not have one row per member"
    scale = named.get("variance_scale")
    return EnsembleWeights(
        hidden_w=tuple(named[f"hidden.{i}.weight"] for i in range(n_layers)), hidden_b=tuple(biases[:-1]),
        head_w=named["head.weight"], head_b=biases[-1], max_logvar=named["max_logvar"], min_logvar=named["min_logvar"],
        feature_mean=named["feature_mean"], feature_std=named["feature_std"], delta_mean=named["delta_mean"],
        delta_std=named["delta_std"], variance_scale=scale, action_history=int(config.get("action_history", 1)),
        qdot_history=int(config.get("qdot_history", 0)), q_features=str(config.get("q_features", "raw")),
    )


class _Graph:
    """A tiny builder over onnx.helper: constants, nodes and fresh names.

    Constants of ``EXTERNAL_MIN_BYTES`` or more (the layer weights: 1.8 MB of the shipped ensemble's
    1.86) are not copied into the graph: the graph names them as external data and keeps the arrays in
    ``external``, which the session takes from memory (``Linearizer``). Copying them into protobuf
    messages, serializing and parsing them again are single C++ calls that hold the interpreter lock
    (4.4 ms at a time measured, first builds in a process fault fresh pages in), and the hot swap
    builds this graph on a loader thread beside the control thread."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.external: dict[str, np.ndarray] = {}
        self._count = 0

    def const(self, name: str, value) -> str:
        arr = np.asarray(value)
        arr = arr.astype(np.int64 if arr.dtype.kind in "iu" else np.float32)
        if arr.nbytes < EXTERNAL_MIN_BYTES:
            self.inits.append(self.numpy_helper.from_array(arr, name))
            return name
        from onnx import TensorProto

        tensor = TensorProto(name=name, data_type=self.helper.np_dtype_to_tensor_dtype(arr.dtype), dims=arr.shape,
                             data_location=TensorProto.EXTERNAL)
        for key, value in (("location", _IN_MEMORY), ("offset", "0"), ("length", str(arr.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.inits.append(tensor)
        self.external[name] = np.ascontiguousarray(arr)
        return name

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        self._count += 1
        out = f"{op_type.lower()}_{self._count}"
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def split2(self, x: str, sizes: str, axis: int = 1) -> tuple[str, str]:
        """Split ``x`` in two along ``axis`` (``sizes``: a constant with the two lengths)."""
        self._count += 1
        a, b = f"split_{self._count}_a", f"split_{self._count}_b"
        self.nodes.append(self.helper.make_node("Split", [x, sizes], [a, b], axis=axis))
        return a, b

    def silu_and_slope(self, z: str) -> tuple[str, str]:
        """silu(z) and its derivative s + silu(z) (1 - s), s = sigmoid(z)."""
        s = self.op("Sigmoid", z)
        h = self.op("Mul", z, s)
        return h, self.op("Add", s, self.op("Mul", h, self.op("Sub", "one", s)))


def linearization_graph(w: EnsembleWeights) -> tuple[bytes, dict[str, np.ndarray]]:
    """The batch-1 ONNX graph of :data:`LIN_NEXT_STATE`, :data:`LIN_JACOBIAN`, :data:`LIN_STD`:
    (the serialized graph, its large constants by name, which the graph names as external data)."""
    from onnx import TensorProto, helper

    n, h, k = N_JOINTS, w.action_history, w.qdot_history
    g = _Graph()
    g.const("one", np.ones(1))
    inputs = [helper.make_tensor_value_info(WM_Q, TensorProto.FLOAT, [1, n]),
              helper.make_tensor_value_info(WM_QDOT, TensorProto.FLOAT, [1, n]),
              helper.make_tensor_value_info(WM_ACTIONS, TensorProto.FLOAT, [1, h, n])]
    if k:
        inputs.append(helper.make_tensor_value_info(WM_QDOT_HISTORY, TensorProto.FLOAT, [1, k, n]))
    flat = g.const("flat_shape", [1, -1])
    q_feat = (g.op("Concat", g.op("Sin", WM_Q), g.op("Cos", WM_Q), axis=-1) if w.q_features == "sincos" else WM_Q)
    parts = [q_feat, WM_QDOT, g.op("Reshape", WM_ACTIONS, flat)]
    if k:
        parts.append(g.op("Reshape", WM_QDOT_HISTORY, flat))
    feats = g.op("Concat", *parts, axis=-1)
    x = g.op("Mul", g.op("Sub", feats, g.const("feature_mean", w.feature_mean)),
             g.const("inv_feature_std", 1.0 / w.feature_std))  # [1, F]
    # layer 1: primal row only; its tangent is a constant times silu'(z1)
    cols = w.current_command_columns
    c1 = w.hidden_w[0][:, cols, :] / w.feature_std[cols][None, :, None]  # [M, N, H1]
    z = g.op("Add", g.op("MatMul", x, g.const("w0", w.hidden_w[0])), g.const("b0", w.hidden_b[0]))  # [M, 1, H1]
    act, slope = g.silu_and_slope(z)
    tangent = g.op("Mul", slope, g.const("c0", c1))  # [M, N, H1]
    split = g.const("split_1_n", [1, n])
    for i in range(1, len(w.hidden_w)):
        both = g.op("MatMul", g.op("Concat", act, tangent, axis=1), g.const(f"w{i}", w.hidden_w[i]))  # [M, 1+N, Hi]
        z_row, t_rows = g.split2(both, split)
        act, slope = g.silu_and_slope(g.op("Add", z_row, g.const(f"b{i}", w.hidden_b[i])))
        tangent = g.op("Mul", slope, t_rows)
    out = g.op("MatMul", g.op("Concat", act, tangent, axis=1), g.const("w_head", w.head_w))  # [M, 1+N, 4N]
    sd = STATE_DIM
    head_row = g.op("Add", g.op("Slice", out, g.const("s0", [0]), g.const("s1", [1]), g.const("ax1", [1])),
                    g.const("b_head", w.head_b))  # [M, 1, 2 sd]
    mean_n = g.op("Slice", head_row, g.const("m0", [0]), g.const("m1", [sd]), g.const("ax2", [2]))
    logvar = g.op("Slice", head_row, g.const("v0", [sd]), g.const("v1", [2 * sd]), "ax2")
    hi, lo = g.const("max_logvar", w.max_logvar), g.const("min_logvar", w.min_logvar)
    logvar = g.op("Sub", hi, g.op("Softplus", g.op("Sub", hi, logvar)))
    logvar = g.op("Add", lo, g.op("Softplus", g.op("Sub", logvar, lo)))
    delta_std = g.const("delta_std", w.delta_std)
    state = g.op("Concat", WM_Q, WM_QDOT, axis=-1)  # [1, sd]
    member_next = g.op("Add", g.op("Add", state, g.op("Mul", mean_n, delta_std)), g.const("delta_mean", w.delta_mean))
    axes0 = g.const("axes0", [0])
    next_state = g.op("ReduceMean", member_next, axes0, keepdims=0)  # [1, sd]
    centered = g.op("Sub", member_next, next_state)
    epistemic = g.op("ReduceMean", g.op("Mul", centered, centered), axes0, keepdims=0)
    aleatoric = g.op("ReduceMean", g.op("Mul", g.op("Exp", logvar), g.const("delta_var", w.delta_std ** 2)), axes0,
                     keepdims=0)
    var = g.op("Add", epistemic, aleatoric)
    if w.variance_scale is not None:
        var = g.op("Mul", var, g.const("variance_scale", w.variance_scale))
    t_head = g.op("Slice", out, g.const("t0", [1, 0]), g.const("t1", [1 + n, sd]), g.const("ax12", [1, 2]))  # [M, N, sd]
    jac_t = g.op("Mul", g.op("ReduceMean", t_head, axes0, keepdims=0), delta_std)  # [N, sd]
    vec = g.const("vec_shape", [sd])
    g.nodes.append(helper.make_node("Reshape", [next_state, vec], [LIN_NEXT_STATE]))
    g.nodes.append(helper.make_node("Transpose", [jac_t], [LIN_JACOBIAN], perm=[1, 0]))
    g.nodes.append(helper.make_node("Reshape", [g.op("Sqrt", var), vec], [LIN_STD]))
    outputs = [helper.make_tensor_value_info(LIN_NEXT_STATE, TensorProto.FLOAT, [sd]),
               helper.make_tensor_value_info(LIN_JACOBIAN, TensorProto.FLOAT, [sd, n]),
               helper.make_tensor_value_info(LIN_STD, TensorProto.FLOAT, [sd])]
    graph = helper.make_graph(g.nodes, "world_model_linearization", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="robot_wm")
    return model.SerializeToString(), g.external


class Linearizer:
    """The linearization graph of one exported world model in a single-thread onnxruntime session.

    Build it with :func:`build_linearizer`; ``run`` takes float32 feeds of batch 1 (the names of
    the exported graph's inputs) and returns (next_state, jacobian, std) as float64 arrays.
    """

    def __init__(self, graph: bytes, external: dict[str, np.ndarray]) -> None:
        from robot_wm.core.onnx_model import session_options

        import onnxruntime as ort

        options = session_options()
        # onnxruntime's C API asks that these outlive the session (this version copies them at creation);
        # each OrtValue holds its array
        self._external = [ort.OrtValue.ortvalue_from_numpy(a) for a in external.values()]
        options.add_external_initializers(list(external), self._external)
        self.session = ort.InferenceSession(graph, sess_options=options, providers=["CPUExecutionProvider"])
        self._outputs = [LIN_NEXT_STATE, LIN_JACOBIAN, LIN_STD]

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        f0, jac, std = self.session.run(self._outputs, feeds)
        return f0.astype(np.float64), jac.astype(np.float64), std.astype(np.float64)


#: Parity the linearization graph must reach against the exported graph before it is used:
#: prediction and std (relative, float32 arithmetic in another order) and the Jacobian against
#: central differences of the exported graph (their truncation error is O(eps²)).
PARITY_RTOL = 1e-4
JACOBIAN_TOL = 2e-3  # of the Jacobian's largest entry


def build_linearizer(onnx_path: Path, sidecar: dict[str, Any], run_exported, *, seed: int = 0,
                     samples: int = 4, fd_step_radps: float = 1e-2,
                     pace: Callable[[], object] | None = None) -> tuple[Linearizer | None, str]:
    """The linearizer of an exported world model, checked against that model; or (None, why not).

    Args:
        onnx_path, sidecar: the exported model and its (validated) sidecar.
        run_exported: ``feeds -> {output name: array}`` of the exported graph (``OnnxModel.run``).
        seed, samples: random batch-1 inputs of the parity check.
        fd_step_radps: the central-difference step the Jacobian is compared with.
        pace: called before each step of about a millisecond or more (parsing the exported graph,
            building the new one, creating its session, each sample of the check): a hot swap's loader
            waits there for the slack after a control period.
    """
    pace = pace or (lambda: None)
    pace()
    weights = read_ensemble(onnx_path, sidecar)
    if isinstance(weights, str):
        return None, weights
    try:
        pace()
        graph, external = linearization_graph(weights)
        pace()
        lin = Linearizer(graph, external)
    except Exception as exc:  # noqa: BLE001 (onnx/onnxruntime raise their own types)
        return None, f"the linearization graph does not build: {type(exc).__name__}: {exc}"
    rng = np.random.default_rng(seed)
    h, k, n = weights.action_history, weights.qdot_history, N_JOINTS
    eye = np.vstack([np.zeros(n), fd_step_radps * np.eye(n), -fd_step_radps * np.eye(n)])
    for _ in range(samples):
        pace()
        feeds = {WM_Q: rng.uniform(-2.0, 2.0, (1, n)), WM_QDOT: rng.uniform(-1.0, 1.0, (1, n)),
                 WM_ACTIONS: rng.uniform(-1.0, 1.0, (1, h, n))}
        if k:
            feeds[WM_QDOT_HISTORY] = rng.uniform(-1.0, 1.0, (1, k, n))
        feeds = {key: v.astype(np.float32) for key, v in feeds.items()}
        try:
            f0, jac, std = lin.run(feeds)
        except Exception as exc:  # noqa: BLE001
            return None, f"the linearization graph does not run: {type(exc).__name__}: {exc}"
        batch = {key: np.repeat(v, len(eye), 0) for key, v in feeds.items()}
        batch[WM_ACTIONS] = batch[WM_ACTIONS].copy()
        batch[WM_ACTIONS][:, -1] += eye.astype(np.float32)
        ref = run_exported(batch)
        x = np.concatenate([ref["next_q_rad"], ref["next_qdot_radps"]], -1).astype(np.float64)
        std_ref = np.sqrt(ref["epistemic_var"][0] + ref["aleatoric_var"][0]).astype(np.float64)
        jac_fd = (x[1:1 + n] - x[1 + n:]).T / (2 * fd_step_radps)
        checks = (("prediction", np.max(np.abs(f0 - x[0]) / (np.abs(x[0]) + 1e-3)), PARITY_RTOL),
                  ("std", np.max(np.abs(std - std_ref) / (std_ref + 1e-6)), PARITY_RTOL),
                  ("jacobian", np.max(np.abs(jac - jac_fd)) / max(np.max(np.abs(jac_fd)), 1e-6), JACOBIAN_TOL))
        for what, err, tol in checks:
            if not err <= tol:
                return None, f"the linearization graph's {what} differs from the exported graph's by {err:.2e} (> {tol:g})"
    return lin, ""
