"""The ALIGN step: map every backend's anchor tensor onto the canonical ONNX representation.

The canonical representation of an anchor is the ONNX graph's: its shape, its layout, compared in
``float64``. Backends hand back their own (TensorFlow NHWC, a batch squeezed, a flattened view,
float16/bfloat16, quantized int8); the aligner reconciles them before the oracle judges, without ever
hiding a real difference. The package, one concern per module:

* :mod:`anpred.align.rules` -- the rule language (cast, dequantize, view, permute, reshape, segments,
  exclude): :func:`validate_rule`, :func:`apply_rule`, :func:`describe_rule`;
* :mod:`anpred.align.distance` -- :func:`normalized_error`, the one distance used to decide by data;
* :mod:`anpred.align.shapes` -- which rules fit a backend shape (shape inference);
* :mod:`anpred.align.segments` -- segment-order search by data (:func:`find_segment_permutation`);
* :mod:`anpred.align.backend_info` -- which backends run the ONNX graph, their captures and dtypes;
* :mod:`anpred.align.struct` -- the result types (:class:`AlignmentDecision`, :class:`AlignmentReport` ...);
* :mod:`anpred.align.aligner` -- :class:`Aligner`, which takes the decisions (order and policy in its
  module docstring).

This module re-exports the public names and holds no logic. See docs/alignment.md.
"""

from anpred.align.aligner import Aligner
from anpred.align.backend_info import (
    NATIVE_BACKENDS,
    NO_LAYOUT_REASONS,
    ONNX_FAMILIES,
    ONNX_GRAPH_BACKENDS,
    ONNX_LAYOUT_BACKENDS,
    WRONG_SHAPE_REASONS,
    anchor_capture,
    anchor_dtype,
    returns_onnx_layout,
)
from anpred.align.distance import normalized_error
from anpred.align.rules import (
    LAYOUT_PAIRS,
    AlignmentError,
    apply_rule,
    describe_rule,
    is_identity,
    layout_permutation,
    validate_rule,
)
from anpred.align.segments import SEGMENT_MAX_BLOCKS, SEGMENT_MIN_BLOCK_FRACTION, channel_axis, find_segment_permutation
from anpred.align.shapes import fit_rule, shape_candidates
from anpred.align.struct import SCHEMA, AlignedSample, AlignmentDecision, AlignmentReport, UnalignedEntry

__all__ = [
    "Aligner",
    "AlignedSample",
    "AlignmentDecision",
    "AlignmentError",
    "AlignmentReport",
    "UnalignedEntry",
    "SCHEMA",
    "ONNX_FAMILIES",
    "ONNX_GRAPH_BACKENDS",
    "ONNX_LAYOUT_BACKENDS",
    "NATIVE_BACKENDS",
    "WRONG_SHAPE_REASONS",
    "NO_LAYOUT_REASONS",
    "returns_onnx_layout",
    "LAYOUT_PAIRS",
    "SEGMENT_MAX_BLOCKS",
    "SEGMENT_MIN_BLOCK_FRACTION",
    "validate_rule",
    "is_identity",
    "describe_rule",
    "apply_rule",
    "layout_permutation",
    "normalized_error",
    "channel_axis",
    "find_segment_permutation",
    "fit_rule",
    "shape_candidates",
    "anchor_capture",
    "anchor_dtype",
]
