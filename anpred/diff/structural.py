"""Structural diff of two ONNX graphs and the correspondence of their anchors (the entry points).

:func:`diff_models` (two ``ModelProto`` s) and :func:`diff_files` (two ``.onnx`` files) return a
:class:`~anpred.diff.struct.GraphDiff`; :func:`anchor_correspondence` only its anchors. The steps,
each in its module:

1. index both graphs (:class:`anpred.diff.graphs.DiffGraph`, on ``passes.graph``'s index);
2. pair their nodes in tiers: names, Weisfeiler-Lehman structure, propagation across fused regions,
   sequence alignment (:class:`anpred.diff.matcher.Matcher`);
3. compare each matched pair, the graph inputs/outputs and the opset imports
   (:mod:`anpred.diff.changes`);
4. place every node in an ANPRED stage when a graph carries an anchor manifest
   (:mod:`anpred.diff.stages`);
5. group and classify the unmatched nodes (:mod:`anpred.diff.regions`);
6. find each anchor's counterpart (:mod:`anpred.diff.anchors`).

Why this and not a networkx graph-matching algorithm: exact (sub)graph isomorphism (VF2) fails as soon
as the graphs differ, and graph edit distance is exponential; the tiers are linear in the graph size
(what that costs on large graphs: ``docs/diff.md`` and ``benchmarks/bench_diff.py``).

Subgraphs (If/Loop/Scan bodies) are compared as whole attributes, not diffed inside.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from anpred.diff.anchors import anchor_map
from anpred.diff.changes import io_changes, node_changes, opset_changes
from anpred.diff.graphs import DiffGraph, op_label
from anpred.diff.matcher import Matcher
from anpred.diff.regions import find_regions
from anpred.diff.stages import spread_stages, stage_table
from anpred.diff.struct import AnchorMatch, Change, GraphDiff, GraphInfo, NodeMatch, NodeRef
from anpred.onnx_io import load_model

__all__ = ["diff_models", "diff_files", "anchor_correspondence", "graph_info"]


def graph_info(G: DiffGraph) -> GraphInfo:
    """The :class:`~anpred.diff.struct.GraphInfo` facts of one graph."""
    m = G.model
    return GraphInfo(
        path=G.path,
        num_nodes=len(G.nodes),
        op_counts=dict(Counter(op_label(G, i) for i in range(len(G.nodes)))),
        opset={(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        producer=f"{m.producer_name} {m.producer_version}".strip(),
        has_manifest=G.manifest is not None,
        num_stages=len(G.manifest.stages) if G.manifest is not None else 0,
    )


def diff_models(model_a, model_b, *, path_a: str = "A", path_b: str = "B") -> GraphDiff:
    """Structurally diff two ONNX ``ModelProto`` s (see the module docstring for the steps).

    Initializer values are compared only when their data is in memory (load external data first).
    Raises GraphError when a graph has a cycle or a value produced twice.
    """
    t0 = time.perf_counter()
    A, B = DiffGraph(model_a, path_a), DiffGraph(model_b, path_b)
    M = Matcher(A, B)
    M.run()
    changed: list[NodeMatch] = []
    changed_a: set[int] = set()
    changes_by_a: dict[int, list[Change]] = {}
    for a, b in M.a2b.items():
        ch = node_changes(M, a, b)
        if ch:
            changes_by_a[a] = ch
            changed_a.add(a)
    # "constants changed" hosts for folded-region detection (indices in A)
    hosts = {a for a, ch in changes_by_a.items() if any(c.kind == "initializer" for c in ch)}
    spread_stages(M)
    regions = find_regions(M, hosts)
    for a in sorted(changed_a):
        b = M.a2b[a]
        changed.append(
            NodeMatch(
                A.ids[a],
                B.ids[b],
                a,
                b,
                A.op[a],
                M.how[a],
                changes_by_a[a],
                A.stage[a] if A.stage[a] is not None else B.stage[b],
            )
        )
    only_a = [
        NodeRef("a", A.ids[i], i, A.op[i], A.nodes[i].domain, A.stage[i]) for i in range(len(A.nodes)) if i not in M.a2b
    ]
    only_b = [
        NodeRef("b", B.ids[j], j, B.op[j], B.nodes[j].domain, B.stage[j]) for j in range(len(B.nodes)) if j not in M.b2a
    ]
    counts = Counter(M.how.values())
    d = GraphDiff(
        a=graph_info(A),
        b=graph_info(B),
        matched=len(M.a2b),
        match_counts={k: counts.get(k, 0) for k in ("name", "value", "structure", "propagation", "sequence")},
        changed=changed,
        only_a=only_a,
        only_b=only_b,
        regions=regions,
        anchors=anchor_map(M),
        stages=stage_table(M, changed_a, regions),
        io=io_changes(A, B),
        opset=opset_changes(A, B),
    )
    d.seconds = time.perf_counter() - t0
    return d


def diff_files(path_a: str | Path, path_b: str | Path) -> GraphDiff:
    """Load two ``.onnx`` files (with their external weights) and diff them.

    Raises ModelLoadError for unreadable files, GraphError for cyclic graphs."""
    ma = load_model(path_a, load_external=True)
    mb = load_model(path_b, load_external=True)
    return diff_models(ma, mb, path_a=str(path_a), path_b=str(path_b))


def anchor_correspondence(model_a, model_b) -> list[AnchorMatch]:
    """Which anchors of A's manifest (else B's) exist in the other graph, and how (see AnchorMatch)."""
    return diff_models(model_a, model_b).anchors
