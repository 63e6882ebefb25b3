"""A departure that is a neighbouring node's value: the backend returned, for an anchor, the tensor of
another node near it.

A converter that fuses an operator into the one before it (MNN 3.6.1 fuses a ``Relu``/``Tanh`` into the
``MatMul``/``Gemm`` it follows) may return, for a declared intermediate output, the value *after* the
fused operator: the flag is right, but no operator of the stage replayed alone departs (the fused
operator is past the stage's exit), so the drill-down finds no culprit. :func:`neighbour_match` names
what the backend returned instead: it computes, from the consensus entry tensors, the values of the
operators within ``radius`` dataflow edges of the anchor's producer (downstream and upstream), on the
backend's peers (one sub-run, the consensus of their results), and compares the backend's own tensor
at the anchor with each of them. A neighbour *matches* when the backend's tensor is as close to it as
a consistent backend must be to the consensus at that anchor (the primary statistic at most the cell's
threshold, which the oracle measured on this run: ``max(origin_k x peers' median, floor)``) while it
departs from the anchor's consensus. The closest match is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Replayed", "neighbour_nodes", "neighbour_match"]


def neighbour_nodes(model, value: str, radius: int) -> list[tuple[Any, int, str]]:
    """The data operators of ``model`` within ``radius`` undirected dataflow edges of the producer of
    ``value`` (the instrumentation's anchor Identities and constant operators left out), as
    ``[(node, distance, "downstream" | "upstream" | "beside")]`` in graph order; the producer itself
    is not listed. "downstream": a descendant of the producer; "upstream": an ancestor; "beside": a
    node reached through both (a sibling)."""
    from passes.anchor_nodes import is_anchor_node

    inits = {t.name for t in model.graph.initializer}
    live = {i.name for i in model.graph.input if i.name not in inits}
    nodes = []
    for n in model.graph.node:
        if is_anchor_node(n) or not any(x in live for x in n.input if x):
            continue
        nodes.append(n)
        live.update(v for v in n.output if v)
    prod = {v: i for i, n in enumerate(nodes) for v in n.output if v}
    cons: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for x in n.input:
            if x in live:
                cons.setdefault(x, []).append(i)
    if value not in prod:
        return []
    start = prod[value]

    def walk(step) -> dict[int, int]:
        dist = {start: 0}
        frontier = [start]
        while frontier:
            nxt = []
            for i in frontier:
                for j in step(i):
                    if j not in dist:
                        dist[j] = dist[i] + 1
                        nxt.append(j)
            frontier = nxt
        return dist

    def up(i):
        return [prod[x] for x in nodes[i].input if x in prod]

    def down(i):
        return [j for v in nodes[i].output if v for j in cons.get(v, [])]

    below, above = walk(down), walk(up)
    both = walk(lambda i: up(i) + down(i))
    out = []
    for i, d in sorted(both.items()):
        if i == start or d > radius:
            continue
        side = "downstream" if i in below else "upstream" if i in above else "beside"
        out.append((nodes[i], d, side))
    return out


def _reached(model, outputs: list[str], given: set[str]) -> list[str]:
    """The values of ``given`` reached walking back from ``outputs`` without crossing ``given``."""
    prod = {v: n for n in model.graph.node for v in n.output if v}
    seen: set[str] = set()
    out = []
    todo = list(outputs)
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in given:
            out.append(v)
            continue
        n = prod.get(v)
        if n is not None:
            todo.extend(x for x in n.input if x)
    return sorted(out)


@dataclass
class Replayed:
    """What :func:`neighbour_match` needs of the drill: the sub-run ``runner``
    (:class:`anpred.drill.runner.SubRunner`), the run's anchored ``model`` (with its weights), the judged
    run ``run_dir`` and its ``report`` (:class:`anpred.judge.CheckReport`), per sample of ``samples`` the
    consensus ``feeds`` (ONNX value -> array: graph inputs and stage entries), the replayed ``peers``."""

    runner: Any
    model: Any
    run_dir: Path
    report: Any
    feeds: list[dict[str, np.ndarray]]
    samples: list[str]
    peers: list[str]


def neighbour_match(data: Replayed, backend: str, anchors: list[str], radius: int) -> dict[str, Any] | None:
    """The neighbour whose value ``backend`` returned at one of ``anchors`` (module docstring), or None.

    Args:
        data: the drill's run, model, consensus feeds and peers (:class:`Replayed`; the backend is left
            out of the sub-run).
        backend: the flagged backend; ``anchors``: the anchors where it departs first (origin first).
        radius: dataflow edges around each anchor's producer.

    Returns:
        ``{"anchor", "value", "node", "op_type", "side", "distance", "producer", "producer_op",
        "statistic", "to_neighbour", "to_consensus", "threshold", "samples"}``: the primary statistic of
        the backend's tensor against the neighbour (worst sample) and against the consensus (the
        cell's pooled value), the cell's threshold.
    """
    from anpred.drill.feed import backend_samples, consensus_samples
    from anpred.drill.graphs import ancestors_of, extract, producers
    from anpred.errors import AnpredError
    from anpred.judge.stats import error_stats

    from anpred.run import RunStore

    runner, model, run_dir, report = data.runner, data.model, data.run_dir, data.report
    feeds, samples, peers = data.feeds, data.samples, data.peers
    by_name = {a.name: a for a in RunStore.open(run_dir).manifest.anchors}
    prod = producers(model)
    stat = (report.config or {}).get("primary", "nrmse")
    others = [b for b in peers if b != backend]
    if not others:
        return None
    best = None
    for a in anchors:
        cell = report.cell(a, backend)
        if cell is None or a not in by_name or by_name[a].value not in prod:
            continue
        x_val = by_name[a].value
        near = neighbour_nodes(model, x_val, radius)
        outs = list(dict.fromkeys(v for n, _, _ in near for v in n.output if v))
        if not outs:
            continue
        # computed from the consensus at the anchor and above it (never fed a neighbour's own value)
        upper = ancestors_of(model, x_val) | {x_val} | {i.name for i in model.graph.input}
        given = {v for v in feeds[0] if v in upper}
        ins = _reached(model, outs, given)
        try:
            sub = extract(model, {v: feeds[0][v] for v in ins}, outs)
        except AnpredError:  # a neighbour the consensus feeds cannot compute: not compared
            continue
        if not len(sub.graph.node):
            continue
        sub_dir, rep = runner.run(
            f"neighbours-{backend}-{a.replace('/', '_')}", {None: sub}, [{v: f[v] for v in ins} for f in feeds], others
        )
        run_anchor = {a2["value"]: a2["name"] for a2 in rep.anchors if a2.get("value")}
        got = dict(consensus_samples(sub_dir, [run_anchor[v] for v in outs if v in run_anchor]))
        cons = [got[k] for k in sorted(got)]  # in the order of ``feeds`` (inputs 0000.npz, 0001.npz, ...)
        mine = dict(backend_samples(run_dir, backend, [a], samples))
        for n, d, side in near:
            for v in n.output:
                if v not in run_anchor:
                    continue
                worst = -1.0
                for i, sid in enumerate(samples):
                    c = cons[i].get(run_anchor[v]) if i < len(cons) else None
                    xb = mine.get(sid, {}).get(a)
                    if c is None or xb is None or c.shape != xb.shape:
                        worst = None
                        break
                    worst = max(worst, float(getattr(error_stats(xb, c), stat)))
                if worst is None or worst < 0 or not (worst <= cell.threshold < cell.primary):
                    continue
                if best is None or worst < best["to_neighbour"]:
                    p = prod[x_val]
                    best = {
                        "anchor": a,
                        "value": v,
                        "node": n.name,
                        "op_type": n.op_type,
                        "side": side,
                        "distance": d,
                        "producer": p.name,
                        "producer_op": p.op_type,
                        "statistic": stat,
                        "to_neighbour": worst,
                        "to_consensus": float(cell.primary),
                        "threshold": float(cell.threshold),
                        "samples": len(samples),
                    }
        if best is not None:
            return best
    return best
