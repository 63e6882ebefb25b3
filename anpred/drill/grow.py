"""The smallest reproducing subgraph around a culprit, when the operator alone does not reproduce.

A deviation that needs more than one operator (a converter folding a lossy ``Cast`` pair, fusing an
activation into the ``MatMul`` before it, a layout change across two operators) shows in the stage but
not in the culprit alone. :class:`Growth` grows the repro from the culprit outwards, ring by ring over
the dataflow graph of the stage (ring ``d``: the operators ``d`` edges away from the culprit, producers
and consumers alike, so a fusion with a following operator is found too), testing the union of rings
``0..d`` until one reproduces; then it removes the operators of that set one at a time, farthest
first, keeping a removal when the rest still reproduces and stays connected around the culprit. This
is delta debugging's minimising step (Zeller and Hildebrandt, "Simplifying and isolating
failure-inducing input", IEEE TSE 28(2), 2002: ddmin with subsets of size one, which yields a
1-minimal set) over operators instead of input characters, restricted to connected subgraphs so that
every tried model is a valid graph fed with real consensus values at its cut.

Each test is one sub-run of the drill (every replayed backend, each in its own process): the number of
tests is bounded by :attr:`anpred.drill.DrillConfig.max_repro_runs`; sets already known to fail are
never run twice (the operator alone is the first of them).

Only *data* operators count (those that depend on a graph input of the stage); constants (weights
reshaped or cast, ``Constant`` nodes) come along with the operators that read them.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["Growth"]


class Growth:
    """The rings of data operators around ``culprit`` in the stage subgraph ``sub`` (an ONNX model).

    Args:
        sub: the stage's subgraph (graph inputs: the stage's entries; nodes in topological order).
        culprit: the culprit node (a node of ``sub``).
        out_val: the culprit's departing output (always an output of every tried subgraph).
        max_nodes: the largest set grown (operators); rings stop before exceeding it.
    """

    def __init__(self, sub, culprit, out_val: str, max_nodes: int):
        from passes.graph import subgraph_outer_refs

        self.sub, self.out_val = sub, out_val
        inits = {t.name for t in sub.graph.initializer}
        live = {i.name for i in sub.graph.input if i.name not in inits}
        self.entries = set(live)
        self.nodes: dict[str, Any] = {}  # key -> data node, in graph (topological) order
        self.reads: dict[str, list[str]] = {}
        for i, n in enumerate(sub.graph.node):
            ins = [x for x in list(n.input) + subgraph_outer_refs(n) if x]
            if not any(x in live for x in ins):
                continue  # a constant: follows the operators that read it
            key = n.name or f"#{i}:{n.output[0]}"
            self.nodes[key] = n
            self.reads[key] = [x for x in ins if x in live]
            live.update(v for v in n.output if v)
        self.live = live
        self.prod = {v: k for k, n in self.nodes.items() for v in n.output if v}
        self.cons: dict[str, list[str]] = {}
        for k, xs in self.reads.items():
            for x in xs:
                self.cons.setdefault(x, []).append(k)
        self.culprit = next(k for k, n in self.nodes.items() if out_val in n.output)
        self.dist = self._distances()
        self.max_nodes = max_nodes

    def _neighbours(self, k: str) -> list[str]:
        up = [self.prod[x] for x in self.reads[k] if x in self.prod]
        down = [c for v in self.nodes[k].output if v for c in self.cons.get(v, [])]
        return list(dict.fromkeys(up + down))

    def _distances(self) -> dict[str, int]:
        """Undirected dataflow distance of every data operator from the culprit (breadth first)."""
        dist = {self.culprit: 0}
        frontier = [self.culprit]
        while frontier:
            nxt = []
            for k in frontier:
                for m in self._neighbours(k):
                    if m not in dist:
                        dist[m] = dist[k] + 1
                        nxt.append(m)
            frontier = nxt
        return dist

    def rings(self) -> list[list[str]]:
        """The growing sets ``[culprit], [culprit + ring 1], ...`` (keys in graph order), each at most
        :attr:`max_nodes` operators; the last one may be the whole stage."""
        order = list(self.nodes)
        out = []
        for d in range(1, max(self.dist.values()) + 1):
            s = [k for k in order if self.dist.get(k, 1 << 30) <= d]
            if len(s) > self.max_nodes:
                break
            out.append(s)
        return [[self.culprit]] + out

    def connected(self, keys: list[str]) -> bool:
        """Whether ``keys`` (the culprit among them) form one connected subgraph."""
        ks = set(keys)
        seen = {self.culprit}
        todo = [self.culprit]
        while todo:
            for m in self._neighbours(todo.pop()):
                if m in ks and m not in seen:
                    seen.add(m)
                    todo.append(m)
        return seen == ks

    def cut(self, keys: list[str]) -> tuple[list[str], list[str]]:
        """``(inputs, outputs)`` of the subgraph of ``keys``: the data values its operators read and
        none of them computes (stage entries or inner values of the stage), and the culprit's output
        with every output of an operator of the set that no operator of the set reads (so that the
        operators after the culprit stay in the model)."""
        made = {v for k in keys for v in self.nodes[k].output if v}
        ins = list(dict.fromkeys(x for k in keys for x in self.reads[k] if x not in made))
        read = {x for k in keys for x in self.reads[k]}
        outs = [self.out_val] + [
            v for k in keys if k != self.culprit for v in self.nodes[k].output if v and v not in read and v in self.live
        ]
        return ins, list(dict.fromkeys(outs))

    def values(self, sets: list[list[str]]) -> list[str]:
        """Every inner value (not a stage entry) that a subgraph of ``sets``, or one of its one-smaller
        subsets, reads at its cut: what must be known (the consensus) to feed them."""
        need: list[str] = []
        for s in sets:
            need += self.cut(s)[0]
            need += [v for k in s for v in self.nodes[k].output if v]
        return [v for v in dict.fromkeys(need) if v not in self.entries and v in self.live]

    def search(
        self, attempt: Callable[[list[str]], bool], budget: int, known_bad: list[list[str]] = ()
    ) -> tuple[list[str] | None, int, list[dict[str, Any]]]:
        """Grow, then minimise (module docstring). ``attempt(keys)`` runs one subgraph and says whether
        it reproduces; at most ``budget`` attempts. Returns ``(kept keys or None, attempts, log)``
        where ``log`` lists every attempt as ``{"nodes": n, "kept": [node names], "reproduced"}``."""
        tried: dict[frozenset, bool] = {frozenset(b): False for b in known_bad}
        log: list[dict[str, Any]] = []
        runs = 0

        def test(keys: list[str]) -> bool | None:
            nonlocal runs
            f = frozenset(keys)
            if f in tried:
                return tried[f]
            if runs >= budget:
                return None
            runs += 1
            ok = bool(attempt(keys))
            tried[f] = ok
            log.append({"nodes": len(keys), "kept": [self.nodes[k].name or k for k in keys], "reproduced": ok})
            return ok

        found = None
        for s in self.rings():
            r = test(s)
            if r is None:
                return None, runs, log
            if r:
                found = s
                break
        if found is None:
            return None, runs, log
        # minimise: drop one operator at a time, farthest from the culprit first
        for k in sorted([k for k in found if k != self.culprit], key=lambda k: (-self.dist[k], k)):
            smaller = [x for x in found if x != k]
            if not self.connected(smaller):
                continue
            r = test(smaller)
            if r is None:
                break
            if r:
                found = smaller
        return found, runs, log
