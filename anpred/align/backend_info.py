"""What the alignment step reads about a backend: which graph it runs, its captures, the dtypes it returned.

* :data:`ONNX_FAMILIES`, :data:`ONNX_GRAPH_BACKENDS`, :data:`NATIVE_BACKENDS` -- which backends execute
  the anchored ONNX graph (canonical by construction) and which run a native graph of their own;
* :func:`anchor_capture` -- a backend's per-anchor capture record as an :class:`AnchorCapture`;
* :func:`anchor_dtype` -- the one answer to "in which dtype did this backend return this anchor".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anpred.align.rules import AlignmentError
from anpred.backends.base import AnchorCapture, BackendStatus

__all__ = ["ONNX_FAMILIES", "ONNX_GRAPH_BACKENDS", "NATIVE_BACKENDS", "anchor_capture", "anchor_dtype"]

#: families whose backends execute the ONNX graph itself: their tensors are canonical by definition.
ONNX_FAMILIES = frozenset({"onnxruntime", "openvino", "onnx-reference"})

#: backends that execute the anchored ONNX graph itself, directly or through a converter of that graph
#: (onnx2tf for ``tf``, onnx2torch for ``torch``): they compute the same tensor by construction, so a
#: channel/segment reordering there is a defect and is never searched for.
ONNX_GRAPH_BACKENDS = frozenset({"ort", "ort-noopt", "ort-fp16", "ort-int8", "openvino", "openvino-bf16",
                                 "onnx-reference", "onnx-reference-fp64", "torch", "tf",
                                 # population members: the shared converted model of the anchored graph
                                 "ort-int8-noopt", "openvino-int8", "onnx-reference-int8", "ort-fp16-noopt",
                                 "openvino-fp16", "onnx-reference-fp16", "torch-fp16"})
#: backends that run a separate native graph (a port may concatenate heads/channels in another order).
NATIVE_BACKENDS = frozenset({"torch-native", "tf-native"})


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
