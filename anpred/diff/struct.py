"""Result types of the diff step: what a structural diff of two ONNX graphs and a numeric diff of two
run folders hold, apart from the algorithms that fill them (:mod:`anpred.diff.structural`,
:mod:`anpred.diff.runs`).

Graph diff (schema ``anpred.graphdiff/1``): :class:`GraphDiff` holds :class:`GraphInfo` per side, the
changed :class:`NodeMatch` pairs with their :class:`Change` s, :class:`NodeRef` s of nodes in one graph
only, :class:`Region` s of unmatched nodes, the :class:`AnchorMatch` correspondence and a
:class:`StageDiff` per ANPRED stage.

Run diff (schema ``anpred.rundiff/1``): :class:`RunDiff` holds one :class:`AnchorDiff` per paired
anchor, each with a :class:`CellDiff` per backend pair compared.

Every type converts with ``to_dict`` / ``from_dict`` (top-level types; the JSON written by
``anpred diff --json``) and prints with ``summary()``. The schema strings are part of the on-disk
contract and do not change with the module layout.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from anpred.errors import AnpredError

__all__ = [
    "GRAPH_SCHEMA",
    "RUN_SCHEMA",
    "STATS_STATISTIC",
    "Change",
    "NodeMatch",
    "NodeRef",
    "Region",
    "AnchorMatch",
    "GraphInfo",
    "StageDiff",
    "GraphDiff",
    "CellDiff",
    "AnchorDiff",
    "RunDiff",
]

#: schema of :meth:`GraphDiff.to_dict`
GRAPH_SCHEMA = "anpred.graphdiff/1"
#: schema of :meth:`RunDiff.to_dict`
RUN_SCHEMA = "anpred.rundiff/1"
#: the statistic of a stats-mode run diff (a lower bound of the nRMSE, see :mod:`anpred.diff.runs`)
STATS_STATISTIC = "nrmse_lb"


# ---------------------------------------------------------------------------------------------
# graph diff
# ---------------------------------------------------------------------------------------------
@dataclass
class Change:
    """One difference between two matched nodes.

    kind: ``renamed``, ``op_type``, ``domain``, ``attribute``, ``input_arity``, ``output_arity``,
        ``dtype``, ``shape``, ``initializer`` or ``rewired``.
    what: the attribute name, ``input[i]`` or ``output[j]`` the change is about ("" for the node).
    a, b: the values in A and B (JSON-friendly: str, number, list).
    max_abs_diff: for ``initializer`` and tensor attributes of equal shape: max |a - b| computed in
        float64 (None otherwise).
    """

    kind: str
    what: str = ""
    a: Any = None
    b: Any = None
    max_abs_diff: float | None = None

    def describe(self) -> str:
        s = f"{self.kind}{'(' + self.what + ')' if self.what else ''}: {self.a!r} -> {self.b!r}"
        if self.max_abs_diff is not None:
            s += f" (max |diff| {self.max_abs_diff:.3g})"
        return s


@dataclass
class NodeMatch:
    """A node of A paired with a node of B.

    a, b: node names (or ``#<index>`` for unnamed nodes); a_index, b_index: topological positions.
    how: the tier that paired them: ``name``, ``value``, ``structure``, ``propagation``, ``sequence``.
    stage: ANPRED stage index when known (from either graph's manifest), else None.
    """

    a: str
    b: str
    a_index: int
    b_index: int
    op_type: str
    how: str
    changes: list[Change] = field(default_factory=list)
    stage: int | None = None


@dataclass
class NodeRef:
    """A node that exists in one graph only (``side`` "a" or "b")."""

    side: str
    name: str
    index: int
    op_type: str
    domain: str = ""
    stage: int | None = None


@dataclass
class Region:
    """A group of unmatched nodes of A and B that replace each other (kinds: see :mod:`anpred.diff.regions`)."""

    kind: str
    label: str
    a_nodes: list[str]
    b_nodes: list[str]
    a_ops: list[str]
    b_ops: list[str]
    stage: int | None = None


@dataclass
class AnchorMatch:
    """Where an anchor of one graph is in the other.

    status: ``exact`` (same value), ``equivalent`` (same values after ``transform``, applied to the
        ``to`` graph's tensor to obtain the ``from`` graph's), ``unmapped`` (no counterpart).
    transform: ``{"dtype": "float16"}`` (the counterpart is held or computed in float16: an fp16
        conversion, possibly cast back to the anchor's dtype by an inserted Cast, so values are not
        bit-identical), ``{"permute": [0, 3, 1, 2]}`` (a Transpose to undo), ``{"quantized": true}``
        (behind QuantizeLinear/DequantizeLinear); None for exact.
    """

    anchor: str
    stage: int
    a_value: str | None
    b_value: str | None
    status: str
    transform: dict[str, Any] | None = None
    reason: str = ""


@dataclass
class GraphInfo:
    """Facts about one of the two graphs.

    path: the file (or the label given to :func:`anpred.diff.structural.diff_models`); num_nodes:
    top-level nodes (subgraph bodies not counted); op_counts: ``op_type`` (``op_type(domain)`` outside
    the default domain) -> count; opset: domain (``ai.onnx`` for the default one) -> imported
    version; producer: ``producer_name producer_version``; has_manifest: the graph carries an ANPRED
    anchor manifest in ``metadata_props``; num_stages: its number of stages (0 without a manifest).
    """

    path: str
    num_nodes: int
    op_counts: dict[str, int]
    opset: dict[str, int]
    producer: str
    has_manifest: bool
    num_stages: int = 0


@dataclass
class StageDiff:
    """Per ANPRED stage: how many nodes on each side, matched, changed, and the regions there."""

    index: int
    a_nodes: int = 0
    b_nodes: int = 0
    matched: int = 0
    changed: int = 0
    regions: list[int] = field(default_factory=list)  # indices into GraphDiff.regions
    a_ops: list[str] = field(default_factory=list)  # "op:name:status" strings for the HTML view
    b_ops: list[str] = field(default_factory=list)


@dataclass
class GraphDiff:
    """The structural diff of graph A and graph B (schema ``anpred.graphdiff/1``).

    ``changed`` holds only matched pairs with at least one change; ``match_counts`` counts pairs per
    tier. ``identical`` is true when nothing differs (names included).
    """

    a: GraphInfo
    b: GraphInfo
    matched: int
    match_counts: dict[str, int]
    changed: list[NodeMatch]
    only_a: list[NodeRef]
    only_b: list[NodeRef]
    regions: list[Region]
    anchors: list[AnchorMatch] = field(default_factory=list)
    stages: list[StageDiff] = field(default_factory=list)
    io: list[Change] = field(default_factory=list)  # graph input/output differences
    opset: list[Change] = field(default_factory=list)  # opset_import differences per domain
    seconds: float = 0.0
    schema: str = GRAPH_SCHEMA

    @property
    def identical(self) -> bool:
        return not (self.changed or self.only_a or self.only_b or self.regions or self.io or self.opset)

    def region_counts(self) -> dict[str, int]:
        return dict(Counter(r.kind for r in self.regions))

    def fusions(self) -> dict[str, int]:
        """Label -> count for fused/split/replaced/rewritten/folded regions."""
        return dict(
            Counter(
                r.label
                for r in self.regions
                if r.kind in ("fused", "split", "replaced", "rewritten", "folded", "unfolded")
            )
        )

    def insertions(self) -> dict[str, int]:
        """Op type -> count of inserted conversion nodes (Cast, Q/DQ, Transpose ...) in B."""
        c: Counter = Counter()
        for r in self.regions:
            if r.kind == "inserted":
                c.update(r.b_ops)
        return dict(c)

    def change_counts(self) -> dict[str, int]:
        return dict(Counter(ch.kind for m in self.changed for ch in m.changes))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GraphDiff":
        if d.get("schema") != GRAPH_SCHEMA:
            raise AnpredError(f"unsupported graph diff schema {d.get('schema')!r} (expected {GRAPH_SCHEMA!r})")
        try:
            return cls(
                a=GraphInfo(**d["a"]),
                b=GraphInfo(**d["b"]),
                matched=d["matched"],
                match_counts=d["match_counts"],
                changed=[NodeMatch(**{**m, "changes": [Change(**c) for c in m["changes"]]}) for m in d["changed"]],
                only_a=[NodeRef(**n) for n in d["only_a"]],
                only_b=[NodeRef(**n) for n in d["only_b"]],
                regions=[Region(**r) for r in d["regions"]],
                anchors=[AnchorMatch(**a) for a in d.get("anchors", [])],
                stages=[StageDiff(**s) for s in d.get("stages", [])],
                io=[Change(**c) for c in d.get("io", [])],
                opset=[Change(**c) for c in d.get("opset", [])],
                seconds=d.get("seconds", 0.0),
                schema=d["schema"],
            )
        except (KeyError, TypeError) as err:
            raise AnpredError(f"malformed graph diff: {err}") from err

    def summary(self, max_lines: int = 40) -> str:
        """A terminal summary (plain text, one fact per line)."""
        L = [f"A: {self.a.path} ({self.a.num_nodes} nodes)", f"B: {self.b.path} ({self.b.num_nodes} nodes)"]
        if self.identical:
            L.append("graphs are identical (same nodes, names, attributes, constants, types)")
            return "\n".join(L)
        how = ", ".join(f"{k} {v}" for k, v in self.match_counts.items() if v)
        L.append(
            f"matched {self.matched} node pairs ({how}); only in A: {len(self.only_a)}; only in B: "
            f"{len(self.only_b)}; changed pairs: {len(self.changed)}"
        )
        if self.opset:
            L.append("opset imports: " + ", ".join(f"{c.what} {c.a} -> {c.b}" for c in self.opset))
        for c in self.io:
            L.append(f"  graph io {c.describe()}")
        if self.change_counts():
            L.append("changes: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.change_counts().items())))
        if self.fusions():
            L.append("fused/split regions:")
            for lab, n in sorted(self.fusions().items(), key=lambda kv: -kv[1]):
                L.append(f"  {n:4d} x {lab}")
        if self.insertions():
            L.append("inserted in B: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.insertions().items())))
        rest = [r for r in self.regions if r.kind in ("removed", "added", "deleted")]
        for r in rest[:10]:
            L.append(f"  {r.kind}: {r.label}")
        shown = 0
        for m in self.changed:
            if shown >= max_lines // 2:
                L.append(f"  ... {len(self.changed) - shown} more changed pairs (see --json/--html)")
                break
            L.append(
                f"  {m.a} ~ {m.b} [{m.op_type}, {m.how}]: "
                + "; ".join(c.describe() for c in m.changes[:3])
                + (" ..." if len(m.changes) > 3 else "")
            )
            shown += 1
        if self.anchors:
            c = Counter(a.status for a in self.anchors)
            L.append("anchors: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
        return "\n".join(L)


# ---------------------------------------------------------------------------------------------
# run diff
# ---------------------------------------------------------------------------------------------
@dataclass
class CellDiff:
    """One (anchor, backend pair): run B's value against run A's, worst sample.

    backend: the pair's label (``ort``, or ``ort=ort-fp16`` for a cross pair). stats: in tensors
    mode :meth:`anpred.judge.ErrorStats.to_dict` of the worst sample; in stats mode both runs'
    summaries (``mean_a``, ``mean_b``, ``std_*``, ``rms_*``, ``min_*``, ``max_*``, ``nan``, ``inf``,
    ``nan_ref``, ``inf_ref``). value: the statistic of the worst sample; floor: the noise floor it is
    compared with; moved: ``value > floor`` (or more NaN/Inf in B than in A); samples: paired samples
    compared; worst_sample: its id in A.
    """

    backend: str
    value: float
    floor: float
    moved: bool
    samples: int
    worst_sample: str
    stats: dict[str, Any]


@dataclass
class AnchorDiff:
    """One anchor of run A paired with an anchor of run B.

    anchor, b_anchor: the names in A and B (equal unless paired through the structural
    correspondence); stage, order: A's manifest values. cells: one :class:`CellDiff` per backend pair
    compared. missing: backend pair label -> why this anchor was not compared for it (not captured,
    not aligned, shapes differ, ...).
    """

    anchor: str
    b_anchor: str
    stage: int
    order: int
    cells: list[CellDiff] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def moved(self) -> bool:
        return any(c.moved for c in self.cells)


@dataclass
class RunDiff:
    """Numeric diff of run B against run A (schema ``anpred.rundiff/1``).

    mode: ``tensors`` or ``stats`` (see :mod:`anpred.diff.runs`); statistic: ``nrmse`` ... or
    ``nrmse_lb``. backends: the column labels, one per backend pair; pairs: ``[[X in A, Y in B], ...]``
    in the same order. first_moved: ``{"anchor", "backend", "stage", "value", "floor", "statistic"}`` of
    the earliest moved cell, None when nothing moved. stage_deviation: per stage (string key), the
    largest statistic over its anchors and backend pairs. skipped_backends: backend -> why it was not
    compared. unpaired_anchors / unpaired_b: anchors of A without a counterpart in B, and of B without
    one in A. graph: the structural diff of the runs' models when both folders hold one.
    """

    run_a: str
    run_b: str
    statistic: str
    backends: list[str]
    samples: list[list[str]]  # [[sample id in A, sample id in B], ...]
    anchors: list[AnchorDiff]
    first_moved: dict[str, Any] | None
    first_moved_by_backend: dict[str, str]
    stage_deviation: dict[str, float]
    skipped_backends: dict[str, str] = field(default_factory=dict)
    unpaired_anchors: list[str] = field(default_factory=list)
    graph: Any = None  # GraphDiff | None
    mode: str = "tensors"
    pairs: list[list[str]] = field(default_factory=list)
    unpaired_b: list[str] = field(default_factory=list)
    schema: str = RUN_SCHEMA

    @property
    def moved(self) -> bool:
        return self.first_moved is not None

    @property
    def compared(self) -> int:
        """Number of (anchor, backend pair) cells actually compared."""
        return sum(len(a.cells) for a in self.anchors)

    def not_compared(self) -> list[tuple[str, str, str]]:
        """``(anchor, backend pair, reason)`` for every cell that was not compared."""
        return [(a.anchor, b, why) for a in self.anchors for b, why in a.missing.items()]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["graph"] = self.graph.to_dict() if self.graph is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunDiff":
        if d.get("schema") != RUN_SCHEMA:
            raise AnpredError(f"unsupported run diff schema {d.get('schema')!r} (expected {RUN_SCHEMA!r})")
        try:
            anchors = [AnchorDiff(**{**a, "cells": [CellDiff(**c) for c in a["cells"]]}) for a in d["anchors"]]
            return cls(
                **{**d, "anchors": anchors, "graph": GraphDiff.from_dict(d["graph"]) if d.get("graph") else None}
            )
        except (KeyError, TypeError) as err:
            raise AnpredError(f"malformed run diff: {err}") from err

    def summary(self, max_lines: int = 30) -> str:
        """A terminal summary: what was compared, the first moved anchor, per-stage deviation, and
        every anchor not compared (with its reason) and unpaired anchor, up to ``max_lines`` each."""
        total = len(self.anchors) * len(self.backends)
        how = (
            "per-sample summaries (lower bound of nRMSE, no tensors stored)"
            if self.mode == "stats"
            else "aligned tensors"
        )
        L = [
            f"A: {self.run_a}",
            f"B: {self.run_b}",
            f"{len(self.samples)} paired sample(s), backends: {', '.join(self.backends) or '(none)'}; "
            f"statistic {self.statistic} (B against A, {how}) vs the noise floor",
            f"compared {self.compared} of {total} (anchor, backend) cells; "
            f"{len(self.unpaired_anchors)} anchor(s) of A and {len(self.unpaired_b)} of B unpaired",
        ]
        for b, why in self.skipped_backends.items():
            L.append(f"  skipped {b}: {why}")
        if self.first_moved:
            f = self.first_moved
            L.append(
                f"first moved anchor: {f['anchor']} (stage {f['stage']}) on {f['backend']}: "
                f"{self.statistic} {f['value']:.3g} > floor {f['floor']:.3g}"
            )
            for b, a in self.first_moved_by_backend.items():
                L.append(f"  {b}: first moved at {a}")
        else:
            L.append(f"no compared anchor moved beyond the noise floor ({self.compared} cells)")
        L.append("stage  max " + self.statistic)
        for s, v in sorted(self.stage_deviation.items(), key=lambda kv: int(kv[0])):
            L.append(f"  {int(s):3d}  {v:.3g}")
        nc = self.not_compared()
        if nc:
            L.append(f"not compared ({len(nc)}):")
            L.extend(f"  {a} on {b}: {why}" for a, b, why in nc[:max_lines])
            if len(nc) > max_lines:
                L.append(f"  ... {len(nc) - max_lines} more (see --json/--html)")
        for side, lst in (("A", self.unpaired_anchors), ("B", self.unpaired_b)):
            if lst:
                L.append(
                    f"unpaired anchors of {side} (no counterpart in the other run): "
                    + ", ".join(lst[:max_lines])
                    + (" ..." if len(lst) > max_lines else "")
                )
        if self.graph is not None and not self.graph.identical:
            L.append("models differ structurally:")
            L.extend("  " + x for x in self.graph.summary(10).splitlines()[2:])
        return "\n".join(L)
