"""The node matcher of the structural diff: which node of graph A is which node of graph B.

Matching runs in tiers, cheapest and most certain first; every tier only looks at nodes that are
still unmatched (:meth:`Matcher.run`):

1. **names**: nodes whose (unique, non-empty) name agrees and whose operator type agrees; then nodes
   whose first output *value* name agrees (exporters keep value names through optimisers and
   converters even when they rename nodes).
2. **structure**: a directed Weisfeiler-Lehman signature per node. Level 0 is the node's local label
   (domain, op type, attributes, input arity, shapes of its constant inputs); level ``k`` hashes the
   level ``k-1`` labels of the producers of each input slot (forward) and, separately, of the
   consumers of each output (backward). Nodes whose signature is unique in both graphs at the deepest
   level are paired first, then shallower levels (Shervashidze et al., "Weisfeiler-Lehman Graph
   Kernels", JMLR 12, 2011, applied per node as in networkx ``weisfeiler_lehman_subgraph_hashes``).
   A second pass uses a coarse label (op type and the shape of the first constant input).
3. **propagation**: from every matched pair, producers of the same input slot and consumers of the
   same output slot with the same operator type are paired (looking through inserted
   Cast/Transpose/QuantizeLinear/DequantizeLinear/Identity nodes), until nothing changes. Where the
   neighbours differ because a tool fused or split a few nodes (``Sigmoid+Mul -> QuickGelu``), the
   step crosses that region: the smallest unmatched region on each side that closes on one exit value
   (downwards) or opens on one entry value (upwards), at most :data:`REGION_LIMIT` nodes, with
   different operator multisets, is treated as one box whose boundary values correspond, and matching
   continues beyond it (without names, YOLOv8n vs its ORT-optimised graph: every surviving node paired).
4. **sequence alignment**: what is left is aligned by operator sequence in topological order
   (``difflib.SequenceMatcher``); a candidate pair is kept only when one of its dataflow neighbours is
   already matched to the other's neighbour.

Propagation runs after each of tiers 1, 2 (both passes) and 4 (up to three rounds).
"""

from __future__ import annotations

import difflib
import heapq
from collections import Counter, defaultdict, deque
from typing import Any

from anpred.diff.graphs import TRANSPARENT_OPS, DiffGraph, attr_sig, normalized_attrs

__all__ = ["REGION_LIMIT", "WL_LEVELS", "Matcher"]

REGION_LIMIT = 8  # most nodes on one side of a fused/split region that propagation steps across
WL_LEVELS = 4  # deepest Weisfeiler-Lehman level used for seeding (measured: deeper adds nothing)


class Matcher:
    """Pairs the nodes of graph ``A`` with those of graph ``B`` (:meth:`run`: the tiers of the module
    docstring in order).

    Results: ``a2b`` / ``b2a`` (position in A <-> position in B), ``how`` (position in A -> the tier
    that paired it: ``name``, ``value``, ``structure``, ``propagation``, ``sequence``); ``attrs``
    (per graph, each node's :func:`~anpred.diff.graphs.normalized_attrs`) and ``local`` (per graph,
    each node's local structural label) are kept for the comparison of matched pairs.
    """

    def __init__(self, A: DiffGraph, B: DiffGraph):
        self.A, self.B = A, B
        self.a2b: dict[int, int] = {}
        self.b2a: dict[int, int] = {}
        self.how: dict[int, str] = {}
        self.attrs = [self._attrs(A), self._attrs(B)]
        self.local = [self._local(A, self.attrs[0]), self._local(B, self.attrs[1])]
        self.coarse = [self._coarse(A), self._coarse(B)]

    @staticmethod
    def _attrs(G: DiffGraph) -> list[dict[str, Any]]:
        return [normalized_attrs(nd) for nd in G.nodes]

    @staticmethod
    def _coarse(G: DiffGraph) -> list[int]:
        """Operator type and the shape of the first constant input (weights): survives exporters
        that spell attributes differently or drop a zero bias."""
        out = []
        for nd in G.nodes:
            w = next((G.init_sig(v) for v in nd.input if v in G.init), "")
            out.append(hash((nd.op_type, w)))
        return out

    @staticmethod
    def _local(G: DiffGraph, attrs) -> list[int]:
        out = []
        for i, nd in enumerate(G.nodes):
            ins = tuple(("c" + G.init_sig(v)) if v in G.init else ("" if not v else "v") for v in nd.input)
            at = tuple(sorted((k, attr_sig(v)) for k, v in attrs[i].items()))
            out.append(hash((nd.domain or "ai.onnx", nd.op_type, ins, len(nd.output), at)))
        return out

    def pair(self, a: int, b: int, how: str) -> bool:
        if a in self.a2b or b in self.b2a:
            return False
        self.a2b[a] = b
        self.b2a[b] = a
        self.how[a] = how
        return True

    # -- tier 1: names -----------------------------------------------------------------------
    def by_names(self) -> None:
        A, B = self.A, self.B
        for key_fn, how in ((lambda nd: nd.name, "name"), (lambda nd: nd.output[0] if nd.output else "", "value")):
            ka, kb = Counter(key_fn(n) for n in A.nodes), Counter(key_fn(n) for n in B.nodes)
            bidx = {key_fn(n): i for i, n in enumerate(B.nodes)}
            for i, nd in enumerate(A.nodes):
                k = key_fn(nd)
                if k and ka[k] == 1 and kb.get(k) == 1:
                    j = bidx[k]
                    if B.nodes[j].op_type == nd.op_type:
                        self.pair(i, j, how)

    # -- tier 2: WL signatures ---------------------------------------------------------------
    def _wl(self, G: DiffGraph, local: list[int]) -> list[tuple[list[int], list[int]]]:
        """levels[k] = (forward labels, backward labels) for every node."""
        n = len(G.nodes)
        gin = {v: k for k, v in enumerate(G.inputs)}
        gout = {v: k for k, v in enumerate(G.outputs)}
        # predecessor lists per node: (slot, producer node or -1 - input index or None for constants)
        preds = []
        for nd in G.nodes:
            p = []
            for v in nd.input:
                if v in G.producer:
                    p.append(G.producer[v][0])
                elif v in gin:
                    p.append(-1 - gin[v])
                else:
                    p.append(None)
            preds.append(p)
        succs = []
        for nd in G.nodes:
            s = []
            for j, o in enumerate(nd.output):
                for c, k in G.consumers.get(o, ()):
                    s.append((j, c, k))
                if o in gout:
                    s.append((j, -1 - gout[o], 0))
            succs.append(s)
        levels = [(list(local), list(local))]
        f, b = local, local
        for _ in range(WL_LEVELS):
            f = [hash((f[i], tuple(f[p] if p is not None and p >= 0 else p for p in preds[i]))) for i in range(n)]
            b = [hash((b[i], tuple(sorted((j, b[c] if c >= 0 else c, k) for j, c, k in succs[i])))) for i in range(n)]
            levels.append((f, b))
        return levels

    def _unique_pairs(self, keys_a: dict[int, Any], keys_b: dict[int, Any], how: str) -> int:
        ga: dict[Any, list[int]] = defaultdict(list)
        gb: dict[Any, list[int]] = defaultdict(list)
        for i, k in keys_a.items():
            ga[k].append(i)
        for j, k in keys_b.items():
            gb[k].append(j)
        n = 0
        for k, la in ga.items():
            lb = gb.get(k)
            if lb and len(la) == 1 and len(lb) == 1:
                n += self.pair(la[0], lb[0], how)
        return n

    def by_structure(self, coarse: bool = False) -> None:
        loc = self.coarse if coarse else self.local
        la, lb = self._wl(self.A, loc[0]), self._wl(self.B, loc[1])
        for lvl in range(WL_LEVELS, -1, -1):
            fa, ba = la[lvl]
            fb, bb = lb[lvl]
            variants = [(lambda i, f=fa, b=ba: (f[i], b[i]), lambda j, f=fb, b=bb: (f[j], b[j]))]
            if lvl > 0:
                variants += [(lambda i, f=fa: f[i], lambda j, f=fb: f[j]), (lambda i, b=ba: b[i], lambda j, b=bb: b[j])]
            for ka, kb in variants:
                ua = {i: ka(i) for i in range(len(fa)) if i not in self.a2b}
                ub = {j: kb(j) for j in range(len(fb)) if j not in self.b2a}
                self._unique_pairs(ua, ub, "structure")

    # -- tier 3: propagation -----------------------------------------------------------------
    def through(self, G: DiffGraph, idx: int | None, matched: dict[int, int], up: bool) -> list[int | None]:
        """Nodes reached from node ``idx`` of ``G`` by walking through unmatched transparent nodes
        (upwards: producer of input 0; downwards: all consumers); ``matched`` is ``G``'s side of the
        pairing (``a2b`` for A, ``b2a`` for B). ``[None]`` when ``idx`` is None or the walk upwards
        ends at a value no node produces."""
        if idx is None:
            return [None]
        if idx in matched or G.op[idx] not in TRANSPARENT_OPS:
            return [idx]
        out, todo, seen = [], [idx], set()
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            if i in matched or G.op[i] not in TRANSPARENT_OPS:
                out.append(i)
                continue
            nd = G.nodes[i]
            if up:
                p = G.producer.get(nd.input[0]) if nd.input else None
                if p is None:
                    out.append(None)
                else:
                    todo.append(p[0])
            else:
                for o in nd.output:
                    todo.extend(c for c, _ in G.consumers.get(o, ()))
        return out

    def _compatible(self, a: int, b: int) -> bool:
        return self.A.op[a] == self.B.op[b]

    def _region_down(self, G: DiffGraph, v: str, matched: dict[int, int]) -> tuple[str, frozenset] | None:
        """The smallest region of unmatched nodes fed by value ``v`` that closes on one exit value:
        it holds every unmatched consumer of ``v``, its other inputs are constants, graph inputs,
        matched nodes' outputs or its own values, and exactly one of its values is used outside it
        (or is a graph output). Returns ``(exit value, node set)`` or None (no such region within
        :data:`REGION_LIMIT` nodes). Nodes are added in topological order (a heap)."""
        need = {c for c, _ in G.consumers.get(v, ()) if c not in matched}
        if not need:
            return None
        heap = sorted(need)
        R: set[int] = set()
        while heap and len(R) < REGION_LIMIT:
            i = heapq.heappop(heap)
            if i in R:
                continue
            for x in G.nodes[i].input:
                p = G.producer.get(x) if x and x != v else None
                if p is not None and p[0] not in matched and p[0] not in R:
                    return None  # fed by an unmatched node outside: not a region closed on v
            R.add(i)
            exits = {
                o
                for j in R
                for o in G.nodes[j].output
                if o and (o in G.outputs or any(c not in R for c, _ in G.consumers.get(o, ())))
            }
            if need <= R and len(exits) == 1:
                return exits.pop(), frozenset(R)
            for o in G.nodes[i].output:
                for c, _ in G.consumers.get(o, ()):
                    if c not in matched and c not in R:
                        heapq.heappush(heap, c)
        return None

    def _region_up(self, G: DiffGraph, v: str, matched: dict[int, int]) -> tuple[str, frozenset] | None:
        """The smallest region of unmatched nodes producing value ``v`` that opens on one entry
        value: its values other than ``v`` are used only inside it, and exactly one non-constant
        value it reads comes from outside it. Returns ``(entry value, node set)`` or None (within
        :data:`REGION_LIMIT` nodes; nodes added in reverse topological order)."""
        p = G.producer.get(v)
        if p is None or p[0] in matched:
            return None
        heap = [-p[0]]
        R: set[int] = set()
        while heap and len(R) < REGION_LIMIT:
            i = -heapq.heappop(heap)
            if i in R:
                continue
            R.add(i)
            entries = set()
            for j in R:
                for x in G.nodes[j].input:
                    if not x or x in G.init:
                        continue
                    q = G.producer.get(x)
                    if q is None or q[0] not in R:
                        entries.add(x)
            closed = all(
                c in R for j in R for o in G.nodes[j].output if o and o != v for c, _ in G.consumers.get(o, ())
            ) and not any(o in G.outputs for j in R for o in G.nodes[j].output if o != v)
            if closed and len(entries) == 1:
                return entries.pop(), frozenset(R)
            for x in G.nodes[i].input:
                q = G.producer.get(x) if x else None
                if q is not None and q[0] not in matched and q[0] not in R and G.nodes[q[0]].input:
                    heapq.heappush(heap, -q[0])
        return None

    def _different_regions(self, ra: frozenset, rb: frozenset) -> bool:
        """Regions worth stepping across: their operator multisets differ (equal ones are left to
        ordinary propagation, which pairs them node by node)."""
        return Counter(self.A.op[i] for i in ra) != Counter(self.B.op[j] for j in rb)

    def _consumer_cands(self, oa: str, ob: str, cands: list[tuple[int, int]]) -> bool:
        """Append candidate pairs among the unmatched consumers of ``oa`` (A) and ``ob`` (B) (looking
        through transparent nodes): the only ones on each side, else those unique by op type or by
        local label. Returns whether both sides had unmatched consumers."""
        A, B = self.A, self.B
        ca = [c for c, _ in A.consumers.get(oa, ())]
        cb = [c for c, _ in B.consumers.get(ob, ())]
        ca = [x for c in ca for x in self.through(A, c, self.a2b, False) if x is not None]
        cb = [x for c in cb for x in self.through(B, c, self.b2a, False) if x is not None]
        ca = [c for c in set(ca) if c not in self.a2b]
        cb = [c for c in set(cb) if c not in self.b2a]
        if not ca or not cb:
            return False
        if len(ca) == 1 and len(cb) == 1:
            cands.append((ca[0], cb[0]))
            return True
        for key in (lambda G, i, loc: G.op[i], lambda G, i, loc: loc[i]):
            ga, gb = defaultdict(list), defaultdict(list)
            for c in ca:
                ga[key(A, c, self.local[0])].append(c)
            for c in cb:
                gb[key(B, c, self.local[1])].append(c)
            for k, l1 in ga.items():
                l2 = gb.get(k)
                if l2 and len(l1) == 1 and len(l2) == 1:
                    cands.append((l1[0], l2[0]))
        return True

    def propagate(self) -> int:
        """Pair dataflow neighbours of matched pairs (same input slot / same output consumer, same
        op type, through transparent nodes). Where the neighbours differ because one graph fused or
        split a few nodes (``Sigmoid+Mul -> QuickGelu``), the step continues across that region:
        the region's exit (downwards) or entry (upwards) values of both graphs are treated as the
        same value (see :meth:`_region_down`, :meth:`_region_up`); the region's own nodes stay
        unmatched and are classified later."""
        A, B = self.A, self.B
        queue = deque(self.a2b.items())
        added = 0
        while queue:
            a, b = queue.popleft()
            na, nb = A.nodes[a], B.nodes[b]
            cands: list[tuple[int, int]] = []
            # inputs, slot by slot
            for va, vb in zip(na.input, nb.input):
                pa = A.producer.get(va, (None,))[0]
                pb = B.producer.get(vb, (None,))[0]
                if pa is None or pb is None:
                    continue
                xas = self.through(A, pa, self.a2b, True)
                xbs = self.through(B, pb, self.b2a, True)
                for xa in xas:
                    for xb in xbs:
                        if xa is not None and xb is not None:
                            cands.append((xa, xb))
                if (
                    len(xas) == 1
                    and len(xbs) == 1
                    and xas[0] is not None
                    and xbs[0] is not None
                    and xas[0] not in self.a2b
                    and xbs[0] not in self.b2a
                    and not self._compatible(xas[0], xbs[0])
                ):
                    ra, rb = self._region_up(A, va, self.a2b), self._region_up(B, vb, self.b2a)
                    if ra and rb and self._different_regions(ra[1], rb[1]):
                        qa, qb = A.producer.get(ra[0]), B.producer.get(rb[0])
                        if qa and qb:
                            cands.append((qa[0], qb[0]))
            # outputs: consumers grouped by (op type, slot); pair when unique in both
            for oa, ob in zip(na.output, nb.output):
                n0 = len(cands)
                if not self._consumer_cands(oa, ob, cands):
                    continue
                if not any(self._compatible(x, y) for x, y in cands[n0:]):
                    ra, rb = self._region_down(A, oa, self.a2b), self._region_down(B, ob, self.b2a)
                    if ra and rb and self._different_regions(ra[1], rb[1]):
                        self._consumer_cands(ra[0], rb[0], cands)
            for xa, xb in cands:
                if xa not in self.a2b and xb not in self.b2a and self._compatible(xa, xb):
                    self.pair(xa, xb, "propagation")
                    queue.append((xa, xb))
                    added += 1
        return added

    # -- tier 4: sequence alignment ------------------------------------------------------------
    def _neighbour_consistent(self, a: int, b: int) -> bool:
        A, B = self.A, self.B
        for va, vb in zip(A.nodes[a].input, B.nodes[b].input):
            pa, pb = A.producer.get(va), B.producer.get(vb)
            if pa and pb and self.a2b.get(pa[0]) == pb[0]:
                return True
            if not pa and not pb and va in A.inputs and vb in B.inputs and A.inputs.index(va) == B.inputs.index(vb):
                return True
        for oa, ob in zip(A.nodes[a].output, B.nodes[b].output):
            sb = {c for c, _ in B.consumers.get(ob, ())}
            if any(self.a2b.get(c) in sb for c, _ in A.consumers.get(oa, ())):
                return True
            if oa in A.outputs and ob in B.outputs and A.outputs.index(oa) == B.outputs.index(ob):
                return True
        return False

    def by_sequence(self) -> int:
        ua = [i for i in range(len(self.A.nodes)) if i not in self.a2b]
        ub = [j for j in range(len(self.B.nodes)) if j not in self.b2a]
        if not ua or not ub or len(ua) * len(ub) > 4e8:
            return 0
        sm = difflib.SequenceMatcher(None, [self.A.op[i] for i in ua], [self.B.op[j] for j in ub], autojunk=False)
        added = 0
        progress = True
        blocks = [(ua[x + k], ub[y + k]) for x, y, size in sm.get_matching_blocks() for k in range(size)]
        while progress:  # neighbours matched in this tier can validate later candidates
            progress = False
            for a, b in blocks:
                if a not in self.a2b and b not in self.b2a and self._neighbour_consistent(a, b):
                    self.pair(a, b, "sequence")
                    added += 1
                    progress = True
        return added

    def run(self) -> None:
        self.by_names()
        self.propagate()
        self.by_structure()
        self.propagate()
        self.by_structure(coarse=True)
        self.propagate()
        for _ in range(3):
            if not self.by_sequence():
                break
            self.propagate()
