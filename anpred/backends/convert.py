"""Shared helpers of the converter backends (``torch`` via onnx2torch, ``tf`` via onnx2tf).

- :func:`fold_identity_initializers`: replace ``Identity(initializer)`` nodes by the initializer
  itself (TorchScript exports of YOLO put weights behind Identity nodes; onnx2torch then fails with
  a ``KeyError`` on a ``.bias``).
- :func:`onnx2tf_calibration_file`: the local calibration array onnx2tf would otherwise download.

The converters onnx2torch lacks for newer operator versions are in
:mod:`anpred.backends.onnx2torch_compat`; the float64 copy of a model (``onnx-reference-fp64``) is
the graph pass :mod:`passes.float64`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from anpred.errors import BackendError

__all__ = [
    "ONNX2TF_CALIBRATION_NAME",
    "fold_identity_initializers",
    "fold_constant_nodes",
    "model_opset",
    "since_version",
    "onnx2tf_calibration_file",
    "working_directory",
]

ONNX2TF_CALIBRATION_NAME = "calibration_image_sample_data_20x128x128x3_float32.npy"


# ---- generic ONNX graph clean-ups ------------------------------------------------------------
def fold_identity_initializers(model) -> int:
    """Fold every ``Identity`` node whose input is an initializer into a copy of that initializer
    named after the node's output, in place. Returns the number of nodes folded.

    Graph outputs produced by such an Identity are kept (an Identity whose output is a graph output
    is left alone, so output names do not change).
    """
    import onnx

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    keep, folded = [], 0
    for node in graph.node:
        if (
            node.op_type == "Identity"
            and node.domain in ("", "ai.onnx")
            and node.input[0] in inits
            and node.output[0] not in outputs
        ):
            t = onnx.TensorProto()
            t.CopyFrom(inits[node.input[0]])
            t.name = node.output[0]
            graph.initializer.append(t)
            inits[t.name] = t
            folded += 1
        else:
            keep.append(node)
    if folded:
        del graph.node[:]
        graph.node.extend(keep)
    return folded


def fold_constant_nodes(model) -> int:
    """:func:`passes.fold_shapes.fold_constant_nodes` (a graph pass: also used by passes.bind_inputs)."""
    from passes.fold_shapes import fold_constant_nodes as fold

    return fold(model)


def model_opset(model, domain: str = "") -> int:
    """The opset version a model imports for ``domain`` ("" = default ONNX domain)."""
    for imp in model.opset_import:
        if imp.domain in (domain, "ai.onnx" if domain == "" else domain):
            return int(imp.version)
    raise BackendError(f"the model imports no opset for domain {domain!r}")


def since_version(op_type: str, opset: int, domain: str = "") -> int | None:
    """The ``since_version`` of ``op_type``'s schema in force at ``opset`` (None: unknown op)."""
    from onnx import defs

    try:
        return defs.get_schema(op_type, max_inclusive_version=opset, domain=domain).since_version
    except Exception:  # onnx raises SchemaError (a RuntimeError subclass) for unknown ops
        return None


# ---- onnx2tf ---------------------------------------------------------------------------------
def onnx2tf_calibration_file(folder: Path) -> Path:
    """Write (if absent) the array onnx2tf downloads for 4-D 3-channel inputs with batch <= 20:
    ``calibration_image_sample_data_20x128x128x3_float32.npy``, shape (20, 128, 128, 3), float32,
    uniform [0, 1) from ``numpy.random.default_rng(0)`` (deterministic, so cached conversions stay
    valid). onnx2tf only uses it as test data while converting."""
    path = Path(folder) / ONNX2TF_CALIBRATION_NAME
    if not path.is_file():
        data = np.random.default_rng(0).random((20, 128, 128, 3), dtype=np.float32)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, data)
        os.replace(tmp, path)
    return path


@contextlib.contextmanager
def working_directory(path: Path):
    """Temporarily change the working directory (onnx2tf reads its calibration file from it)."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)
