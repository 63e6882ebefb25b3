"""What the alignment step reads about a backend: which graph it runs, its captures, the dtypes it returned.

* :data:`ONNX_FAMILIES`, :data:`ONNX_GRAPH_BACKENDS`, :data:`NATIVE_BACKENDS` -- which backends execute
  the anchored ONNX graph (canonical by construction) and which run a native graph of their own;
* :data:`ONNX_LAYOUT_BACKENDS`, :func:`returns_onnx_layout` -- which of them return every tensor in the
  ONNX layout by construction (aligned by identity, and the reference for everyone else's layout);
* :data:`WRONG_SHAPE_REASONS`, :data:`NO_LAYOUT_REASONS` -- how the unaligned reasons that are findings
  about the backend begin (read by :mod:`anpred.judge.deviations`);
* :func:`anchor_capture` -- a backend's per-anchor capture record as an :class:`AnchorCapture`;
* :func:`anchor_dtype` -- the one answer to "in which dtype did this backend return this anchor".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anpred.align.rules import AlignmentError
from anpred.backends.base import AnchorCapture, BackendStatus

__all__ = [
    "ONNX_FAMILIES",
    "ONNX_GRAPH_BACKENDS",
    "ONNX_LAYOUT_BACKENDS",
    "NATIVE_BACKENDS",
    "NO_LAYOUT_REASONS",
    "WRONG_SHAPE_REASONS",
    "anchor_capture",
    "anchor_dtype",
    "returns_onnx_layout",
]

#: families whose backends execute the ONNX graph itself: their tensors are canonical by definition.
ONNX_FAMILIES = frozenset({"onnxruntime", "openvino", "onnx-reference"})

#: backends that execute the anchored ONNX graph itself, directly or through a converter of that graph
#: (onnx2tf for ``tf``, onnx2torch for ``torch``): they compute the same tensor by construction, so a
#: channel/segment reordering there is a defect and is never searched for.
ONNX_GRAPH_BACKENDS = frozenset(
    {
        "ort",
        "ort-noopt",
        "ort-fp16",
        "ort-int8",
        "openvino",
        "openvino-bf16",
        "onnx-reference",
        "onnx-reference-fp64",
        "torch",
        "tf",
        # population members: the shared converted model of the anchored graph
        "ort-int8-noopt",
        "openvino-int8",
        "onnx-reference-int8",
        "ort-fp16-noopt",
        "openvino-fp16",
        "onnx-reference-fp16",
        "torch-fp16",
        # converters of the ONNX graph onto other runtimes
        "tvm",
        "mnn",
        "ncnn",
        "litert",
    }
)
#: backends that execute the ONNX graph *in the ONNX layout*: the runtimes of the graph itself (ONNX
#: Runtime, OpenVINO, the reference evaluator and its float64 copy) and the converters that keep the
#: graph's layout (onnx2torch's modules, TVM Relax from ONNX, MNN with ``--keepInputFormat`` and its
#: outputs converted back to NCHW, ncnn through pnnx with the ONNX shape restored). Their tensors are
#: canonical by definition: aligned by identity, never "ambiguous", and the reference every other
#: backend's layout is checked against. Not in it: ``tf`` and ``litert`` (onnx2tf: NHWC), the native
#: graphs.
ONNX_LAYOUT_BACKENDS = frozenset(
    {
        "ort",
        "ort-noopt",
        "ort-fp16",
        "ort-int8",
        "openvino",
        "openvino-bf16",
        "onnx-reference",
        "onnx-reference-fp64",
        "torch",
        "tvm",
        "mnn",
        "ncnn",
        "ort-int8-noopt",
        "openvino-int8",
        "onnx-reference-int8",
        "ort-fp16-noopt",
        "openvino-fp16",
        "onnx-reference-fp16",
        "torch-fp16",
    }
)
#: unaligned reasons that are a finding about the backend, not an alignment gap: the tensor has
#: another shape than the ONNX graph's (no rule maps it), or no layout of it matches the ONNX-layout
#: backends' consensus
WRONG_SHAPE_REASONS = ("no alignment fits:", "wrong shape:")
NO_LAYOUT_REASONS = ("layout ambiguous and no candidate matches the consensus",)
#: backends that run a separate native graph (a port may concatenate heads/channels in another order).
NATIVE_BACKENDS = frozenset({"torch-native", "tf-native"})


def returns_onnx_layout(b: str, st: BackendStatus | None) -> bool:
    """True when backend ``b`` returns its tensors in the ONNX layout by construction:
    :data:`ONNX_LAYOUT_BACKENDS`, or an unregistered backend of an ONNX runtime's family (``st``: its
    run status; ``ort-*`` / ``openvino-*`` names)."""
    if b in ONNX_LAYOUT_BACKENDS:
        return True
    if b in NATIVE_BACKENDS or b in ONNX_GRAPH_BACKENDS:
        return False
    return (st is not None and st.family in ONNX_FAMILIES) or b.startswith(("ort-", "openvino-"))


def anchor_capture(c: Any) -> AnchorCapture:
    """``c`` (a :class:`AnchorCapture`, its dict form from a run store, or None) as an
    :class:`AnchorCapture`; None gives an empty one (no status, no layout).

    Raises:
        AlignmentError: ``c`` is a dict with unknown or missing fields.
    """
    if c is None:
        return AnchorCapture(status="", layout=None)
    if isinstance(c, AnchorCapture):
        return c
    try:
        return AnchorCapture(**c)
    except TypeError as err:
        raise AlignmentError(f"malformed anchor capture {c!r}: {err}") from err


def anchor_dtype(x: np.ndarray, st: BackendStatus | None, anchor: str) -> str:
    """The dtype name backend status ``st`` reports for ``anchor`` (``st.dtypes``: as the backend
    returned it, e.g. ``bfloat16`` stored as 2-byte void), else the dtype of the array ``x``."""
    if st is not None and (st.dtypes or {}).get(anchor):
        return str(st.dtypes[anchor])
    return str(x.dtype)
