"""Export torch networks to ONNX with the JSON sidecar robot_wm.core.onnx_model validates.

The graphs' input and output names and shapes are the contracts' (``robot_wm.contracts``
``policy_signature`` / ``world_model_signature``): the example inputs are built from them and the
sidecar is refused if the exported graph does not match them.
"""
from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import torch

from robot_wm.contracts import BATCH, Signature, signature_differences
from robot_wm.core.onnx_model import SIDECAR_FORMAT, sha256_file, sidecar_path
from robot_wm.learning.provenance import command_line

OPSET = 18


def example_inputs(signature: Signature, batch: int) -> tuple[torch.Tensor, ...]:
    """Zero tensors shaped like ``signature``'s inputs, with ``batch`` rows (the export's example)."""
    return tuple(torch.zeros(*(batch if d == BATCH else d for d in t.shape)) for t in signature.inputs)


def export_onnx(
    module: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    path: Path,
    input_names: list[str],
    output_names: list[str],
) -> Path:
    """Export ``module`` to one self-contained .onnx file with a dynamic batch dimension."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    module = module.eval()
    dynamic = {name: {0: "batch"} for name in input_names + output_names}
    with torch.no_grad():
        torch.onnx.export(
            module, example_inputs, str(path), input_names=input_names, output_names=output_names,
            dynamic_axes=dynamic, opset_version=OPSET, dynamo=False, external_data=False,
        )
    return path


def write_sidecar(
    onnx_path: Path,
    *,
    model_kind: str,
    version: str,
    joint_names: tuple[str, ...] | list[str],
    dt_s: float,
    training_data_sha256: str,
    training_command: str | None = None,
    extra: dict[str, Any] | None = None,
    signature: Signature | None = None,
) -> Path:
    """Write ``<model>.json`` next to ``onnx_path`` describing the graph and its provenance.

    Inputs/outputs (names, shapes) are read from the exported graph through onnxruntime, so the
    sidecar cannot disagree with the file it describes. ``version`` may contain ``{onnx_sha8}``,
    replaced by the first 8 hex digits of the file's SHA-256: two different graphs then never
    share a version (the data hash and seed alone do not change with the training recipe).

    Raises:
        ValueError: the graph does not have ``signature`` (the contract), when one is given.
    """
    import onnx
    import onnxruntime

    from robot_wm.core.onnx_model import make_session

    onnx_path = Path(onnx_path)
    session = make_session(onnx_path)  # the signature as the runtime (and load_model) will see it

    def describe(values) -> list[dict[str, Any]]:
        return [{"name": v.name, "shape": [d if isinstance(d, int) else BATCH for d in v.shape], "dtype": "float32"}
                for v in values]

    from robot_wm import __version__

    inputs, outputs = describe(session.get_inputs()), describe(session.get_outputs())
    if signature is not None:
        problems = signature_differences(inputs, outputs, signature)
        if problems:
            raise ValueError(f"{onnx_path.name}: the exported graph breaks its contract: {'; '.join(problems)}")
    sha = sha256_file(onnx_path)
    meta = {
        "format": SIDECAR_FORMAT,
        "model_kind": model_kind,
        "version": version.replace("{onnx_sha8}", sha[:8]),
        "onnx_file": onnx_path.name,
        "sha256": sha,
        "inputs": inputs,
        "outputs": outputs,
        "joint_names": list(joint_names),
        "dt_s": float(dt_s),
        "opset": OPSET,
        "versions": {"robot_wm": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
                     "onnxruntime": onnxruntime.__version__, "python": platform.python_version()},
        "training_data_sha256": training_data_sha256,
        "training_command": training_command or command_line(),
    }
    meta.update(extra or {})
    path = sidecar_path(onnx_path)
    path.write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n")
    return path
