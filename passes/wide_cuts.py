"""Wider cuts inside long blocks that no cut of the usual width splits.

Some blocks have no narrow cut at all: an unrolled recurrent layer (a loop of ``LSTMCell``/``GRUCell``
exported step by step) keeps every step's output alive until the final ``Stack``/``Concat`` and the
input sequence alive until its last step, so after step ``t`` about ``t + 3`` tensors cross; a stack
of transformer layers that all read the same mask, memory and position tensors has ``1 + shared``
tensors crossing between any two layers. With ``max_cut_width`` 4 such a block is one stage, however
many nodes it holds (a CRNN: 768 of 902 nodes in the last stage, every anchor in the CNN before it).

:class:`WideCuts` finds the stages of a first choice that hold more than their share of the *nodes*
(over ``max(2 / K, 0.2)`` of the live nodes, the share rule of the cost note in
:mod:`passes.partition`, and at least :data:`LONG_BLOCK_MIN_NODES`) with no admissible cut inside, lists the cuts inside
them of width up to
``wide_cut_width`` (:data:`WIDE_CUT_WIDTH`) whose tensors together hold no more elements than a
``1 / K`` share of all the data tensors the model computes (exposing them costs no more memory than the
activations of one stage of fair size), and gives the partition a cost that counts nodes as well as FLOPs
(:meth:`WideCuts.blended`: half the FLOPs share, half the node share), so that the re-made choice places cuts inside the
block (a recurrent block is cheap in FLOPs but holds most of the operators a defect can sit in). Every wide
cut taken is stated in the partition's notes and in ``options["wide_cuts"]`` (the manifest's
``partition``).
"""

from __future__ import annotations

import itertools

from passes.cost import NO_TYPE, numel
from passes.cuts import sweep_cuts
from passes.graph import GraphIndex

__all__ = ["LONG_BLOCK_MIN_NODES", "USUAL_CUT_WIDTH", "WIDE_CUT_WIDTH", "WideCuts"]

#: the fewest live nodes a long block holds before it is cut inside: the drill-down exposes up to 64 inner
#: tensors of a stage per round (``anpred.drill.DrillConfig.max_exposed``), so a stage of up to 64
#: operators is searched in one round and needs no wider cut to be observable (docs/instrument.md)
LONG_BLOCK_MIN_NODES = 64

#: the usual most tensors of a cut (``--max-cut-width``'s default); a smaller one asks for narrow cuts
#: only, and no wide cut is added
USUAL_CUT_WIDTH = 4

#: the most tensors of a cut taken inside a long block (docs/instrument.md, "Wide cuts"): 64 covers an
#: unrolled sequence of up to ~30 steps in both directions (about 2T + 3 crossing tensors) and a layer
#: stack reading up to 63 shared tensors; each tensor of a cut is an anchor (a graph output and a judged
#: cell per backend), so the bound also bounds the report.
WIDE_CUT_WIDTH = 256


class WideCuts:
    """The wide-cut step of the partition (module docstring).

    Args:
        index: the graph index; ``narrow``: ``max_cut_width``; ``wide``: the most tensors of a wide cut.
        types: value -> (elem type, shape) used for element counts; ``untyped``: values without an
            element type (never in a cut).
    """

    def __init__(self, index: GraphIndex, narrow: int, wide: int, types, untyped: set[str]):
        self.index, self.narrow, self.wide = index, narrow, wide
        self.types, self.untyped = types, untyped
        self.long: list[tuple[int, int, float, float]] = []  # (first, last, node share, cost share)
        self.none_inside: list[tuple[int, int, float]] = []  # long spans without any wide cut

    def effective_width(self, width: int) -> float:
        """The width a cut is penalised as (:meth:`passes.cuts.CutPolicy.penalty`): its width up to
        ``max_cut_width``, then one more per doubling, ``narrow + log2(width / narrow)``: inside a long
        block every cut is wide, and a linear penalty (0.25 per tensor) would outweigh any balance, so
        that the choice would keep the block whole."""
        import math

        return float(width) if width <= self.narrow else self.narrow + math.log2(width / self.narrow)

    def _elements(self, v: str) -> int | None:
        shape = self.types.get(v, NO_TYPE)[1]
        if shape is None or any(not isinstance(d, int) for d in shape):
            return None
        return numel(shape)

    def inside(self, stages, costs_of: list[float], cands, wanted: int) -> list[tuple[int, tuple[str, ...]]]:
        """Wide candidates ``[(position, tensors)]`` inside the long blocks of ``stages`` (a first
        choice): runs of nodes between consecutive admissible cuts (``cands``, the narrow ones) of one
        stage holding over ``max(2 / K, 0.2)`` of the live nodes (``wanted``: K) and at least
        :data:`LONG_BLOCK_MIN_NODES`. ``costs_of``: the cost
        of each position (0 for dead and constant nodes). Empty when no block is long or the wide width
        is not wider."""
        if self.wide <= self.narrow or wanted < 2:
            return []
        counted = [1.0 if c > 0 else 0.0 for c in costs_of]
        total_nodes = sum(counted) or 1.0
        share = max(2.0 / wanted, 0.2)
        pos = [p for p, _ in cands]
        spans = []
        for st in stages:  # the runs of nodes between consecutive admissible cuts inside the stage
            bounds = [st.first - 1] + [p for p in pos if st.first <= p < st.last] + [st.last]
            for a, b in zip(bounds, bounds[1:]):
                nodes = sum(counted[a + 1 : b + 1])
                if nodes > share * total_nodes and nodes >= LONG_BLOCK_MIN_NODES:
                    spans.append((a + 1, b, nodes / total_nodes, sum(costs_of[a + 1 : b + 1])))
        if not spans:
            return []
        total_cost = sum(costs_of) or 1.0
        self.long = [(a, b, ns, c / total_cost) for a, b, ns, c in spans]
        # a stage's share of the activations the model computes: what exposing one cut may cost
        sizes_all = [e for v in self.index.producer if self.index.is_data(v) if (e := self._elements(v)) is not None]
        budget = sum(sizes_all) / wanted if sizes_all else None
        out = []
        for p, cut in sweep_cuts(self.index, self.wide):
            if len(cut) <= self.narrow or not any(a <= p < b for a, b, _, _ in self.long):
                continue
            if not self.untyped.isdisjoint(cut):
                continue
            sizes = [self._elements(v) for v in cut]
            if budget is not None and None not in sizes and sum(sizes) > budget:
                continue
            out.append((p, cut))
        self.none_inside = [(a, b, ns) for a, b, ns, _ in self.long if not any(a <= p < b for p, _ in out)]
        return out

    def blended(self, costs: list[float], cands) -> list[float]:
        """Per candidate of ``cands``, the cumulative cost up to its position that counts FLOPs and
        nodes half each: ``0.5 * cost[:p] / total cost + 0.5 * nodes[:p] / total nodes`` (in [0, 1])."""
        cum = list(itertools.accumulate(costs))
        nodes = list(itertools.accumulate(1.0 if c > 0 else 0.0 for c in costs))
        tc, tn = (cum[-1] if cum else 0.0) or 1.0, (nodes[-1] if nodes else 0.0) or 1.0
        return [0.5 * cum[p] / tc + 0.5 * nodes[p] / tn for p, _ in cands]

    def notes(self, chosen) -> list[str]:
        """The partition notes of the wide step: per long block, the wide cuts taken inside it."""
        out = []
        for a, b, ns, cs in self.long:
            inside = [len(c) for p, c in chosen if a <= p < b and len(c) > self.narrow]
            head = (
                f"nodes {a}..{b} held {100 * ns:.0f}% of the nodes ({100 * cs:.0f}% of the cost) with no cut of "
                f"width <= {self.narrow} inside (an unrolled recurrent block or layers reading shared tensors)"
            )
            if inside:
                out.append(
                    f"{head}: cut inside it by {len(inside)} wide cut(s) of {min(inside)}..{max(inside)} "
                    f"tensors (more than --max-cut-width {self.narrow}; at most {self.wide}, each no larger in "
                    "elements than a 1/K share of the model's activations); "
                    "the stages are balanced on FLOPs and "
                    "node count together"
                )
            elif any(x[:2] == (a, b) for x in self.none_inside):
                out.append(
                    f"{head}: no cut of at most {self.wide} tensors (and no larger than a 1/K share of the "
                    "model's activations) lies inside it either"
                )
        return out
