"""ONNX graph passes and the analyses they are given: small, each does one thing.

Layout: :mod:`passes.base` (pass infrastructure, declared contracts enforced), :mod:`passes.graph`
(the one graph index), :mod:`passes.anchor_nodes` (the instrumentation's marks in a graph),
:mod:`passes.exporter` (the one exporter detector), the stage partition analysis
(:mod:`passes.partition` with :mod:`passes.plan`, :mod:`passes.cuts`, :mod:`passes.cost`,
:mod:`passes.shapes`, :mod:`passes.scopes`), the rewriting passes :mod:`passes.anchors` and
:mod:`passes.faults`, the converter pre-passes :mod:`passes.recurrent` (LSTM/GRU/RNN unrolled) and
:mod:`passes.control_flow` (If/Loop inlined), the float64 widening :mod:`passes.float64` (the copy
``onnx-reference-fp64`` runs), and :mod:`passes.synthetic` (test graphs).
"""

from passes.anchor_nodes import ANCHOR_NODE_PREFIX, is_anchor_node, strip_anchor_nodes
from passes.anchors import AnchorInsertionPass, build_manifest
from passes.base import GraphPass, PassError, PassManager, PassResult, gc_paused, model_digest
from passes.control_flow import ControlFlowInlinePass
from passes.cuts import CutPolicy
from passes.exporter import detect_exporter
from passes.float64 import Float64Pass
from passes.graph import GraphIndex, build_index
from passes.partition import StagePartitioner
from passes.plan import AnchorPlan, Partition, Stage
from passes.recurrent import RecurrentUnrollPass

__all__ = [
    "GraphPass",
    "PassError",
    "PassManager",
    "PassResult",
    "gc_paused",
    "model_digest",
    "GraphIndex",
    "build_index",
    "ANCHOR_NODE_PREFIX",
    "is_anchor_node",
    "strip_anchor_nodes",
    "detect_exporter",
    "StagePartitioner",
    "CutPolicy",
    "Partition",
    "AnchorPlan",
    "Stage",
    "AnchorInsertionPass",
    "build_manifest",
    "RecurrentUnrollPass",
    "ControlFlowInlinePass",
    "Float64Pass",
]
