"""The partition plan: what :class:`~passes.partition.StagePartitioner` proposes and
:class:`~passes.anchors.AnchorInsertionPass` carries out (result types only; no algorithm here).

A stage of the plan is the manifest's :class:`~anpred.manifest.Stage` (one concept, one type): in a
plan its ``boundary`` lists the ONNX value names crossing the cut that closes it; the manifest built
from the plan (:func:`passes.anchors.build_manifest`) lists the anchors named for those values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from anpred.manifest import Stage

__all__ = ["Stage", "AnchorPlan", "Partition"]


@dataclass
class AnchorPlan:
    """A tensor to expose. ``order`` is its producer's topological position (-1 for a graph input)."""

    value: str
    kind: str  # "boundary" | "explicit" | "output"
    stage: int
    order: int
    producer: str
    op_type: str
    scope: str  # source module/layer whose output this tensor is, "" if none
    label: str  # scope if known, else the value name
    elem_type: int  # onnx.TensorProto data type (0 = unknown)
    shape: list[Any] | None  # ints / symbolic strings / None; None if rank unknown
    layout: str


@dataclass
class Partition:
    """A proposed partition: stages (contiguous, non-empty, covering all nodes; ``boundary`` as ONNX
    value names) and the anchors in topological order (original outputs last, in graph-output
    order)."""

    stages: list[Stage]
    anchors: list[AnchorPlan]
    options: dict[str, Any]
    framework: str  # "torch-dynamo" | "torch-script" | "tf2onnx" | "paddle" | "onnx"
    cost_unit: str  # "flops" | "nodes"
    total_cost: float
    num_nodes: int
    candidates: int = 0  # number of cut positions within max_cut_width
    node_order: list[int] = field(default_factory=list)  # file index of each topological position
    value_names: set[str] = field(default_factory=set)  # every value name of the partitioned graph

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("node_order")
        d.pop("value_names")
        return d
