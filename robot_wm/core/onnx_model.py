"""ONNX models with JSON sidecars: validated loading and single-thread onnxruntime inference.

Every shipped model ``X.onnx`` has a sidecar ``X.json`` that says what the graph is: kind,
version, input/output names and shapes, joint order, control period, normalization, action
limits, opset, library versions, training-data hash, training command and the SHA-256 of the
.onnx file. ``load_model`` refuses a model whose file hash, kind, joint order, period or graph
signature does not match, with an error that says what differs.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from robot_wm.contracts import Signature, signature_differences

SIDECAR_FORMAT = "robot_wm-model/1"
REQUIRED_KEYS = (
    "format", "model_kind", "version", "onnx_file", "sha256", "inputs", "outputs",
    "joint_names", "dt_s", "opset", "versions", "training_data_sha256", "training_command",
)


class ModelError(ValueError):
    """A model or its sidecar is missing, corrupted or does not match what the caller expects."""


def sha256_file(path: Path) -> str:
    """Return the hex SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sidecar_path(onnx_path: Path) -> Path:
    """Return the sidecar path of an .onnx file (same name, .json)."""
    return Path(onnx_path).with_suffix(".json")


def read_sidecar(onnx_path: Path, sha256: str | None = None) -> dict[str, Any]:
    """Read and check the sidecar of ``onnx_path`` (presence, required keys, file hash; ``sha256``: the
    file's, when the caller has just computed it)."""
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise ModelError(f"model file not found: {onnx_path}")
    side = sidecar_path(onnx_path)
    if not side.is_file():
        raise ModelError(f"{onnx_path.name}: sidecar {side} not found (every model needs its JSON sidecar)")
    try:
        meta = json.loads(side.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{side}: not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise ModelError(f"{side}: expected a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise ModelError(f"{side}: missing keys {missing}")
    if meta["format"] != SIDECAR_FORMAT:
        raise ModelError(f"{side}: format {meta['format']!r}, expected {SIDECAR_FORMAT!r}")
    if meta["onnx_file"] != onnx_path.name:
        raise ModelError(f"{side}: describes {meta['onnx_file']!r}, not {onnx_path.name!r}")
    actual = sha256 if sha256 is not None else sha256_file(onnx_path)
    if actual != meta["sha256"]:
        raise ModelError(
            f"{onnx_path.name}: SHA-256 {actual[:16]}... does not match the sidecar's {str(meta['sha256'])[:16]}... "
            "(the file was modified or belongs to another sidecar)"
        )
    return meta


def session_options():
    """Single-thread, sequential onnxruntime session options (the best p99 on a loaded 2-core machine)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


def make_session(onnx_path: Path):
    """Return a single-thread, sequential onnxruntime session (the best p99 on a loaded 2-core machine)."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(onnx_path), sess_options=session_options(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise ModelError(f"{onnx_path}: onnxruntime cannot load it: {exc}") from exc


@dataclass
class OnnxModel:
    """A loaded, validated model: ``run`` feeds named float32 arrays and returns the named outputs."""

    path: Path
    meta: dict[str, Any]
    session: Any

    @property
    def version(self) -> str:
        return str(self.meta["version"])

    def run(self, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        """Run the graph; inputs by name (cast to float32), outputs as a name -> array dict."""
        feeds = {name: np.asarray(value, dtype=np.float32) for name, value in inputs.items()}
        names = [o["name"] for o in self.meta["outputs"]]
        return dict(zip(names, self.session.run(names, feeds)))


def _check_signature(kind: str, declared: list[dict], actual: list, path: Path) -> None:
    declared_names = [d["name"] for d in declared]
    actual_names = [a.name for a in actual]
    if declared_names != actual_names:
        raise ModelError(f"{path.name}: graph {kind} are {actual_names}, the sidecar says {declared_names}")
    for d, a in zip(declared, actual):
        want = [s if isinstance(s, int) else None for s in d["shape"]]
        got = [s if isinstance(s, int) else None for s in a.shape]
        if want != got:
            raise ModelError(f"{path.name}: {kind[:-1]} {a.name!r} has shape {a.shape}, the sidecar says {d['shape']}")


def check_contract(model: OnnxModel, expected: Signature) -> None:
    """Refuse a model whose sidecar signature is not the contract's (robot_wm.contracts).

    Raises:
        ModelError: naming the inputs or outputs that differ.
    """
    problems = signature_differences(model.meta["inputs"], model.meta["outputs"], expected)
    if problems:
        raise ModelError(f"{model.path.name}: not a {model.meta['model_kind']} graph of this arm: {'; '.join(problems)}")


def load_model(
    onnx_path: Path,
    kind: str,
    joint_names: tuple[str, ...] | list[str] | None = None,
    dt_s: float | None = None,
    pace: Callable[[], object] | None = None,
) -> OnnxModel:
    """Load ``onnx_path`` after validating its sidecar against what the caller needs.

    Args:
        onnx_path: the .onnx file (its sidecar is the .json next to it).
        kind: expected ``model_kind`` ("policy", "world_model").
        joint_names: expected joint order, or None to skip the check.
        dt_s: expected control period, or None to skip the check.
        pace: called just before the session is created, a call that holds the interpreter lock for
            milliseconds (a hot swap's loader waits there for the slack after a control period).
    Returns:
        The validated model with a single-thread session.
    Raises:
        ModelError: naming what is missing or differs.
    """
    onnx_path = Path(onnx_path)
    meta = read_sidecar(onnx_path)
    if meta["model_kind"] != kind:
        raise ModelError(f"{onnx_path.name}: is a {meta['model_kind']!r} model, expected {kind!r}")
    if joint_names is not None and list(meta["joint_names"]) != list(joint_names):
        raise ModelError(f"{onnx_path.name}: joint order {meta['joint_names']} differs from the robot's {list(joint_names)}")
    if dt_s is not None and not np.isclose(float(meta["dt_s"]), dt_s):
        raise ModelError(f"{onnx_path.name}: trained for dt_s={meta['dt_s']}, the controller runs at dt_s={dt_s}")
    if pace is not None:
        pace()
    session = make_session(onnx_path)
    _check_signature("inputs", meta["inputs"], session.get_inputs(), onnx_path)
    _check_signature("outputs", meta["outputs"], session.get_outputs(), onnx_path)
    return OnnxModel(onnx_path, meta, session)
