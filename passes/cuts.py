"""Cut candidates and the choice among them: the algorithms of the stage partition.

:func:`sweep_cuts` lists every admissible cut by one linear sweep of the topological order;
:func:`choose_cuts` picks ``K - 1`` of them (exact dynamic programming, or target matching for many
cuts); :class:`CutPolicy` is the policy the partitioner is given: the penalty of a cut and the
choice (torch.fx's partitioner: the policy is injected, the proposal is apart from the rewrite).
"""

from __future__ import annotations

from dataclasses import dataclass

from passes.graph import GraphIndex

__all__ = ["SCOPE_PENALTY", "CutPolicy", "sweep_cuts", "choose_cuts", "match_targets"]

SCOPE_PENALTY = 1.0  # a boundary tensor that is not the output of a whole source module (see docs)
_DP_BINS = 16  # candidate bins per stage for the exact dynamic programme
_DP_MAX = 512  # most candidates the exact dynamic programme considers
_DP_MAX_CUTS = 128  # above this many cuts, the linear target-matching programme is used


def sweep_cuts(index: GraphIndex, max_width: int) -> list[tuple[int, tuple[str, ...]]]:
    """All admissible cuts, by one linear sweep over the topological order.

    Returns ``[(pos, cut)]``: ``cut`` is the set of data tensors (unordered tuple) produced at or
    before ``pos`` that a live node after ``pos`` reads, excluding graph inputs and graph outputs;
    listed when ``pos`` is a live node, not the last one, one of its outputs is in the cut, and
    ``1 <= len(cut) <= max_width``. O(nodes + edges).
    """
    n = len(index.nodes)
    out_set = set(index.graph_outputs)
    live = index.live
    if all(live):  # the usual case: the last consumer is live
        last_use = {v: cs[-1] for v, cs in index.consumers.items()}
    else:
        last_use = {}
        for v, cs in index.consumers.items():
            for c in reversed(cs):
                if live[c]:
                    last_use[v] = c
                    break
    expire: dict[int, list[str]] = {}
    crossing: set[str] = set()
    cands: list[tuple[int, tuple[str, ...]]] = []
    outputs, data_node = index.outputs, index.data_node
    lu_get = last_use.get
    for p in range(n):
        opened = False
        if data_node[p]:
            for v in outputs[p]:
                lu = lu_get(v)
                if lu is not None and lu > p and v not in out_set:
                    crossing.add(v)
                    e = expire.get(lu)
                    if e is None:
                        expire[lu] = [v]
                    else:
                        e.append(v)
                    opened = True
        e = expire.pop(p, None)
        if e:
            crossing.difference_update(e)
        if opened and live[p] and p < n - 1 and len(crossing) <= max_width:
            cands.append((p, tuple(crossing)))
    return cands


@dataclass(frozen=True)
class CutPolicy:
    """How the partitioner scores and picks cuts (the policy it is given; the defaults are the
    documented ones, docs/instrument.md).

    The penalty of a cut of ``w`` tensors is ``width * (w - 1)``, plus, when the graph carries source
    scopes, the mean over its tensors of ``scope`` (the tensor is no whole module's output) or
    ``nesting * (depth - 1)`` (the output of a module ``depth`` levels down), plus ``nonfloat`` when a
    tensor is not float. :meth:`choose` picks the cuts (:func:`choose_cuts`).
    """

    width: float = 0.25
    scope: float = SCOPE_PENALTY
    nesting: float = 0.1
    nonfloat: float = 1.0

    def penalty(self, width: int, depths: list[int] | None, has_nonfloat: bool) -> float:
        """The penalty of one cut: ``width`` tensors, their module ``depths`` (0: no module output;
        None: the graph has no scopes) and whether one of them is not float."""
        s = self.width * (width - 1)
        if depths is not None:
            s += sum(self.scope if d == 0 else self.nesting * (d - 1) for d in depths) / width
        if has_nonfloat:
            s += self.nonfloat
        return s

    def choose(self, cum_cost: list[float], penalty: list[float], total: float, stages: int) -> list[int]:
        """The indices of the chosen cuts (:func:`choose_cuts`)."""
        return choose_cuts(cum_cost, penalty, total, stages)


def choose_cuts(cum_cost: list[float], penalty: list[float], total: float, stages: int) -> list[int]:
    """Pick ``stages - 1`` of the candidate cuts (indices into ``cum_cost``, ascending), minimising

        sum over stages of (cost_s / (total / stages) - 1)^2  +  sum over chosen cuts of penalty

    where ``cost_s`` is the cost between consecutive cuts (the first stage starts at cost 0, the last
    ends at ``total``) and ``cum_cost[k]`` is the cumulative cost up to and including cut ``k``'s node
    (non-decreasing). Exact dynamic programming over the candidates (the linear-partition recurrence,
    O(stages * C^2) with numpy); with more than ``min(16 * stages, 512)`` candidates they are first
    thinned to the lowest-penalty candidate per bin of ``total / min(16 * stages, 512)`` cost (a
    balance loss of at most 1/16 of a stage). With more than 128 cuts to choose, the linear
    target-matching programme :func:`match_targets` (cut ``j`` close to ``j * total / stages``) is
    used instead. Never returns fewer than ``min(stages - 1, len(cum_cost))`` cuts.
    """
    import numpy as np

    C = len(cum_cost)
    m = min(stages - 1, C)
    if m <= 0:
        return []
    P = np.asarray(cum_cost, dtype=np.float64)
    pen = np.asarray(penalty, dtype=np.float64)
    step = total / stages if total > 0 else 1.0
    if m == C:
        return list(range(C))
    if m > _DP_MAX_CUTS:
        return match_targets(P, pen, total, stages, m)
    idx = np.arange(C)
    limit = min(_DP_BINS * stages, _DP_MAX)
    if C > limit:
        bins = np.minimum((P / (total if total > 0 else 1.0) * limit).astype(np.int64), limit - 1)
        order = np.lexsort((idx, pen, bins))  # by bin, then penalty, then position
        first = np.ones(C, dtype=bool)
        first[1:] = bins[order][1:] != bins[order][:-1]
        keep = np.sort(order[first])
        if len(keep) < m:  # cuts bunched in few bins: add evenly spaced ones
            keep = np.union1d(keep, np.linspace(0, C - 1, min(C, _DP_MAX), dtype=np.int64))
        idx = keep
    Pk, pk = P[idx] / step, pen[idx]
    n = len(idx)
    # f[k]: best score of stages up to and including the one closed by candidate k (j cuts so far)
    f = (Pk - 1.0) ** 2 + pk
    back = np.zeros((m, n), dtype=np.int64)
    tri = np.triu(np.ones((n, n), dtype=bool), 1)  # k' < k
    seg = Pk[None, :] - Pk[:, None]  # seg[k', k] = cost between cut k' and cut k, in stages
    w = np.where(tri, (seg - 1.0) ** 2, np.inf)
    for j in range(1, m):
        tot = f[:, None] + w  # [k', k]
        arg = np.argmin(tot, axis=0)
        f = tot[arg, np.arange(n)] + pk
        back[j] = arg
    last = f + (total / step - Pk - 1.0) ** 2
    k = int(np.argmin(last))
    picks = [k]
    for j in range(m - 1, 0, -1):
        k = int(back[j][k])
        picks.append(k)
    picks.reverse()
    return [int(idx[k]) for k in picks]


def match_targets(P, pen, total: float, stages: int, m: int) -> list[int]:
    """``m`` ascending candidates, cut j as close as possible to ``j * total / stages``: minimises
    sum_j |P[c_j] - t_j| / step + pen[c_j] by dynamic programming with prefix minima, O(m * C)."""
    import numpy as np

    C = len(P)
    step = total / stages if total > 0 else 1.0
    back = np.zeros((m, C), dtype=np.int64)
    f = np.abs(P - step) / step + pen
    f[C - m + 1 :] = np.inf  # leave room for the later cuts
    for j in range(1, m):
        pm = np.minimum.accumulate(f)
        am = np.zeros(C, dtype=np.int64)
        better = np.r_[True, f[1:] < pm[:-1]]
        am = np.maximum.accumulate(np.where(better, np.arange(C), 0))
        prev = np.r_[np.inf, pm[:-1]]  # best of k' < k
        f = prev + np.abs(P - step * (j + 1)) / step + pen
        f[:j] = np.inf
        if C - m + j + 1 < C:
            f[C - m + j + 1 :] = np.inf
        back[j] = np.r_[0, am[:-1]]
    k = int(np.argmin(f))
    picks = [k]
    for j in range(m - 1, 0, -1):
        k = int(back[j][k])
        picks.append(k)
    picks.reverse()
    return picks
