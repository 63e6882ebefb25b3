"""The diff step: a structural diff of two ONNX graphs and a numeric diff of two run folders.

Modules: :mod:`~anpred.diff.struct` (result types and their JSON schemas ``anpred.graphdiff/1`` and
``anpred.rundiff/1``), :mod:`~anpred.diff.graphs` (one graph indexed for the diff, on
``passes.graph``'s index), :mod:`~anpred.diff.matcher` (which node is which),
:mod:`~anpred.diff.changes` (what differs in matched pairs and at the graph boundary),
:mod:`~anpred.diff.stages`, :mod:`~anpred.diff.regions` (unmatched nodes grouped and classified),
:mod:`~anpred.diff.anchors` (anchor correspondence), :mod:`~anpred.diff.structural` (graph diff entry
points) and :mod:`~anpred.diff.runs` (run diff).
"""

from anpred.diff.runs import diff_runs
from anpred.diff.struct import (
    GRAPH_SCHEMA,
    RUN_SCHEMA,
    STATS_STATISTIC,
    AnchorDiff,
    AnchorMatch,
    CellDiff,
    Change,
    GraphDiff,
    GraphInfo,
    NodeMatch,
    NodeRef,
    Region,
    RunDiff,
    StageDiff,
)
from anpred.diff.structural import anchor_correspondence, diff_files, diff_models

__all__ = [
    "GRAPH_SCHEMA",
    "RUN_SCHEMA",
    "STATS_STATISTIC",
    "AnchorDiff",
    "AnchorMatch",
    "CellDiff",
    "Change",
    "GraphDiff",
    "GraphInfo",
    "NodeMatch",
    "NodeRef",
    "Region",
    "RunDiff",
    "StageDiff",
    "diff_models",
    "diff_files",
    "anchor_correspondence",
    "diff_runs",
]
