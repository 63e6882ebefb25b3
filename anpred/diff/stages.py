"""ANPRED stages in a structural diff: every node placed in a stage, and the per-stage table.

A graph that carries an anchor manifest places its nodes by the anchor values
(:class:`anpred.diff.graphs.DiffGraph`); :func:`spread_stages` completes both graphs from the matches
and the dataflow neighbours, and :func:`stage_table` counts per stage.
"""

from __future__ import annotations

from anpred.diff.graphs import op_label
from anpred.diff.matcher import Matcher
from anpred.diff.struct import Region, StageDiff

__all__ = ["spread_stages", "stage_table"]


def spread_stages(M: Matcher) -> None:
    """Give every node a stage: from its own graph's manifest, else its match's, else its nearest
    consumer's (an inserted conversion belongs to the stage that uses it), else its nearest
    producer's (iterative sweeps in reverse and forward topological order)."""
    A, B = M.A, M.B
    if not any(s is not None for s in A.stage + B.stage):
        return
    for a, b in M.a2b.items():
        if A.stage[a] is None:
            A.stage[a] = B.stage[b]
        if B.stage[b] is None:
            B.stage[b] = A.stage[a]
    for G in (A, B):
        for _ in (1, 0):  # consumers first (reverse order), then producers (forward order)
            order = range(len(G.nodes)) if _ == 0 else range(len(G.nodes) - 1, -1, -1)
            for i in order:
                if G.stage[i] is not None:
                    continue
                nd = G.nodes[i]
                if _ == 0:
                    st = [G.stage[G.producer[v][0]] for v in nd.input if v in G.producer]
                else:
                    st = [G.stage[c] for o in nd.output for c, _k in G.consumers.get(o, ())]
                st = [s for s in st if s is not None]
                if st:
                    G.stage[i] = max(st) if _ == 0 else min(st)


def stage_table(M: Matcher, changed_a: set[int], regions: list[Region]) -> list[StageDiff]:
    """One :class:`~anpred.diff.struct.StageDiff` per stage (a single one with index -1 when no node
    has a stage): node counts, matched and changed counts (``changed_a``: positions in A of changed
    pairs), the node chips for the HTML view and the indices of ``regions`` placed there."""
    A, B = M.A, M.B
    idx = sorted({s for s in A.stage + B.stage if s is not None})
    if not idx:
        idx = [None]
    table = {s: StageDiff(index=-1 if s is None else s) for s in idx}
    changed_b = {M.a2b[a] for a in changed_a}
    for side, G, matched, changed in (("a", A, M.a2b, changed_a), ("b", B, M.b2a, changed_b)):
        for i in range(len(G.nodes)):
            st = table.get(G.stage[i], table[idx[0]])
            status = "changed" if i in changed else "same" if i in matched else "only"
            if side == "a":
                st.a_nodes += 1
                st.matched += i in matched
                st.changed += i in changed
                st.a_ops.append(f"{op_label(G, i)}:{G.ids[i]}:{status}")
            else:
                st.b_nodes += 1
                st.b_ops.append(f"{op_label(G, i)}:{G.ids[i]}:{status}")
    for k, r in enumerate(regions):
        table.get(r.stage, table[idx[0]]).regions.append(k)
    return list(table.values())
