"""Inputs and outputs of backends that compile or convert an ONNX graph into another runtime's own
model (``tvm``, ``mnn``): the graph's real inputs, their concrete shapes, and the dtype an anchor is
returned in; what their native library writes to stderr while loading (:func:`native_stderr`).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from anpred.errors import BackendError, InputError
from anpred.onnx_io import real_inputs
from anpred.tensorfile import c_contiguous

# the shape folding is a graph pass (passes.fold_shapes, shared with passes.bind_inputs), re-exported here
from passes.fold_shapes import FOLD_MAX_ELEMENTS, FOLD_ROUNDS, fold_shape_computations

__all__ = [
    "GraphInput",
    "graph_inputs",
    "concrete_shapes",
    "check_sample",
    "as_declared",
    "fold_shape_computations",
    "FOLD_MAX_ELEMENTS",
    "FOLD_ROUNDS",
    "native_stderr",
    "decisive_line",
]

_DECISIVE = re.compile(r"fail|error|invalid|cannot|can't|unsupported|not supported|unknown|mismatch", re.I)


@dataclass
class GraphInput:
    """A graph input that is not an initializer: ``name``, ``dims`` (ints; None where dynamic or
    unknown; None for the whole list when the rank is unknown) and ``dtype`` (numpy name, or ONNX's
    lower-case name for types numpy lacks)."""

    name: str
    dims: list[int | None] | None
    dtype: str

    @property
    def static(self) -> bool:
        return self.dims is not None and all(d is not None for d in self.dims)


def graph_inputs(model) -> list[GraphInput]:
    """The real inputs of ``model`` (an ``onnx.ModelProto``) in graph order: initializers listed as
    inputs (older exporters) are left out (:func:`anpred.onnx_io.real_inputs`)."""
    return [GraphInput(name, dims, dtype) for name, dtype, dims in real_inputs(model)]


def concrete_shapes(backend: str, inputs: list[GraphInput], given: dict | None) -> dict[str, list[int]]:
    """Every input's concrete shape: its static ONNX shape, else ``given[name]`` (the runner's
    ``options["input_shapes"]``, the run's shapes when all samples share them).

    Raises:
        BackendError: an input with dynamic dimensions has no given shape (naming it and its dims), or
            the given shape contradicts a static dimension or the rank.
    """
    given = given or {}
    out = {}
    for gi in inputs:
        if gi.name in given:
            shape = [int(d) for d in given[gi.name]]
            if gi.dims is not None and (
                len(shape) != len(gi.dims) or any(d is not None and d != s for d, s in zip(gi.dims, shape))
            ):
                raise BackendError(f"{backend}: input_shapes[{gi.name!r}] = {shape} does not fit the model's {gi.dims}")
            out[gi.name] = shape
        elif gi.static:
            out[gi.name] = [int(d) for d in gi.dims]
        else:
            raise BackendError(
                f"{backend}: input {gi.name!r} has dynamic dimensions {gi.dims}; this backend compiles "
                "for concrete shapes: pass options['input_shapes'] (the runner does when all samples "
                "share one shape)"
            )
    return out


def check_sample(
    backend: str, inputs: dict[str, np.ndarray], graph: list[GraphInput], shapes: dict[str, list[int]] | None
) -> list[np.ndarray]:
    """The sample's arrays in graph input order, each checked against the compiled shape (when
    ``shapes`` is given).

    Raises:
        InputError: an input is missing, or its shape differs from the one the model was compiled for.
    """
    args = []
    for gi in graph:
        if gi.name not in inputs:
            raise InputError(f"backend {backend}: missing input {gi.name!r}")
        x = c_contiguous(inputs[gi.name])
        want = (shapes or {}).get(gi.name)
        if want is not None and list(x.shape) != want:
            raise InputError(
                f"backend {backend}: input {gi.name!r} has shape {list(x.shape)}, but the model was "
                f"compiled for {want} (run samples of one shape)"
            )
        args.append(x)
    return args


def as_declared(y: np.ndarray, dtype: str) -> tuple[np.ndarray, str]:
    """``(array, note)``: ``y`` in the ONNX dtype ``dtype`` the graph declares for the anchor, when
    the cast keeps every value (an int32 result of an int64 tensor, 0/1 integers of a bool tensor, a
    float32 result of a float64 tensor is *not* cast: it would look more precise than it is); else ``y``
    unchanged. ``note`` says what was done ("" when nothing)."""
    if not dtype or dtype == y.dtype.name:
        return y, ""
    try:
        want = np.dtype(dtype)
    except TypeError:
        return y, f"returned as {y.dtype.name}; the graph declares {dtype}"
    if y.dtype.kind in "iub" and want.kind in "iub":
        z = y.astype(want)
        if np.array_equal(z.astype(y.dtype), y):
            return z, f"returned as {y.dtype.name}, cast to the declared {dtype} (every value kept)"
    if y.dtype.kind == "f" and want.kind == "f" and want.itemsize < y.dtype.itemsize:
        return y.astype(want), f"computed in {y.dtype.name}, rounded to the declared {dtype}"
    return y, f"returned as {y.dtype.name}; the graph declares {dtype}"


@contextlib.contextmanager
def native_stderr():
    """Capture what native code writes to file descriptor 2 during the block (a C library's
    ``fprintf(stderr, ...)``, which Python's ``sys.stderr`` never sees): yields a list that holds the
    captured lines after the block. The text is written on to the real stderr as well, so the worker
    log keeps it. Used to put a library's own reason into a status (ncnn's ``layer load_model 2 empty
    failed``)."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            os.write(2, text.encode())
            lines.extend(ln.strip() for ln in text.splitlines() if ln.strip())


def decisive_line(lines: list[str]) -> str:
    """The line of a native library's output that says what went wrong: the last one naming a failure
    or an error, else the last line; '' for none."""
    hits = [ln for ln in lines if _DECISIVE.search(ln)]
    return (hits or lines or [""])[-1][:300]
