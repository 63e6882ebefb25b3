"""Regions of a structural diff: the unmatched nodes of A and B grouped and classified.

Unmatched nodes are grouped into regions (connected unmatched nodes of A and of B that share a
boundary edge between matched nodes) and classified: ``fused`` (n A nodes -> 1 B node), ``split``
(1 -> n), ``replaced`` (1 -> 1 of another type), ``rewritten`` (n -> m), ``inserted``/``removed``
(only Cast/Q/DQ/Transpose/Identity/layout reorders on one side), ``folded``/``unfolded`` (a node
absorbed into a matched neighbour whose constants changed, e.g. BatchNormalization folded into Conv),
``added``/``deleted`` (anything else on one side only).
"""

from __future__ import annotations

from collections import defaultdict

from anpred.diff.graphs import TRANSPARENT_OPS, op_label
from anpred.diff.matcher import Matcher
from anpred.diff.struct import Region

__all__ = ["find_regions", "classify"]


def find_regions(M: Matcher, changed_idx: set[int]) -> list[Region]:
    """Group the nodes ``M`` left unmatched into classified regions (see the module docstring),
    sorted by stage then label. ``changed_idx``: positions in A of matched nodes whose constants
    changed (hosts a node may have been folded into)."""
    A, B = M.A, M.B
    # union-find over ("a", i) / ("b", j) unmatched nodes
    parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(x):
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def union(x, y):
        rx, ry = find(x), find(y)
        if rx != ry:
            parent[ry] = rx

    # boundary edge key -> unmatched nodes of each side touching it; a key seen from both sides
    # joins those nodes into one region (same-side joins come from adjacency)
    touch: dict[tuple, tuple[list, list]] = defaultdict(lambda: ([], []))
    for side, G, matched, to_pair in (("a", A, M.a2b, lambda i: i), ("b", B, M.b2a, lambda j: M.b2a[j])):
        for i in range(len(G.nodes)):
            if i in matched:
                continue
            parent[(side, i)] = parent.get((side, i), (side, i))
    for side, G, matched, to_pair in (("a", A, M.a2b, lambda i: i), ("b", B, M.b2a, lambda j: M.b2a[j])):
        s = 0 if side == "a" else 1
        for i in range(len(G.nodes)):
            if i in matched:
                continue
            nd = G.nodes[i]
            for v in nd.input:
                if not v:
                    continue
                p = G.producer.get(v)
                if p is None:
                    if v in G.inputs:
                        touch[("gin", G.inputs.index(v))][s].append((side, i))
                elif p[0] not in matched:
                    union((side, i), (side, p[0]))
                else:
                    touch[("out", to_pair(p[0]), p[1])][s].append((side, i))
            for o in nd.output:
                for c, k in G.consumers.get(o, ()):
                    if c in matched:
                        touch[("in", to_pair(c), k)][s].append((side, i))
                if o in G.outputs:
                    touch[("gout", G.outputs.index(o))][s].append((side, i))
    for la, lb in touch.values():
        if la and lb:
            for x in la[1:] + lb:
                union(la[0], x)
    groups: dict[tuple, list[tuple[str, int]]] = defaultdict(list)
    for x in parent:
        groups[find(x)].append(x)
    regions = []
    for members in groups.values():
        ai = sorted(i for s, i in members if s == "a")
        bi = sorted(i for s, i in members if s == "b")
        regions.append(classify(M, ai, bi, changed_idx))
    regions.sort(key=lambda r: (r.stage if r.stage is not None else -1, r.label))
    return regions


def classify(M: Matcher, ai: list[int], bi: list[int], changed_idx: set[int]) -> Region:
    """The region of unmatched nodes ``ai`` (positions in A) and ``bi`` (in B): its kind, label and
    stage (the smallest stage of its nodes)."""
    A, B = M.A, M.B
    a_ops = [op_label(A, i) for i in ai]
    b_ops = [op_label(B, j) for j in bi]
    la, lb = "+".join(a_ops), "+".join(b_ops)
    if ai and bi:
        kind = (
            "fused"
            if len(bi) == 1 and len(ai) > 1
            else "split"
            if len(ai) == 1 and len(bi) > 1
            else "replaced"
            if len(ai) == 1
            else "rewritten"
        )
        label = f"{la} -> {lb}"
    else:
        side, G, idx, ops = ("a", A, ai, a_ops) if ai else ("b", B, bi, b_ops)
        transparent = all(G.op[i] in TRANSPARENT_OPS for i in idx)
        kind = ("removed" if side == "a" else "inserted") if transparent else ("deleted" if side == "a" else "added")
        label = "+".join(ops) + (" removed from A" if side == "a" else " inserted in B")
        if not transparent:
            # absorbed into a matched neighbour whose constants changed (e.g. BN folded into Conv)
            matched = M.a2b if side == "a" else M.b2a
            for i in idx:
                for v in G.nodes[i].input:
                    p = G.producer.get(v)
                    if p and p[0] in matched:
                        host = p[0] if side == "a" else matched[p[0]]
                        if host in changed_idx:
                            kind = "folded" if side == "a" else "unfolded"
                            label = f"{'+'.join(ops)} {'folded into' if side == 'a' else 'unfolded from'} {A.op[host]}"
                if kind in ("folded", "unfolded"):
                    break
            if kind not in ("folded", "unfolded"):
                label = ("+".join(ops)) + (" only in A" if side == "a" else " only in B")
    stages = [A.stage[i] for i in ai if A.stage[i] is not None] + [B.stage[j] for j in bi if B.stage[j] is not None]
    return Region(
        kind, label, [A.ids[i] for i in ai], [B.ids[j] for j in bi], a_ops, b_ops, min(stages) if stages else None
    )
