"""Stage partition, an analysis: propose contiguous slices of an ONNX graph's topological order,
closed by cuts (:class:`StagePartitioner`; the plan is a :class:`~passes.plan.Partition`, the graph is
never modified: :class:`~passes.anchors.AnchorInsertionPass` rewrites it from the plan).

A *cut* after position ``i`` of the topological order is the set of data tensors produced at or before
``i`` (graph inputs excluded: their values are known) that a live node after ``i`` still reads. Every
path from the graph inputs to the outputs crosses it, so the cut plus the inputs determines everything
downstream. Graph outputs are not counted (they are anchors anyway), nor are constant tensors
(initializers, ``Constant`` subgraphs) or shape-only tensors (``Shape``/``Size`` chains).

Width-1 cuts are exactly the single-tensor dominators of the live dataflow graph: if tensor ``d``
dominates every output, each live node is an ancestor or a descendant of ``d``'s producer, so in *any*
topological order nothing but ``d`` crosses the position of its producer. One linear sweep therefore
finds all of them (the same set as ``networkx.immediate_dominators`` on the node DAG with a virtual
source/sink, at a fraction of the cost; see docs/instrument.md), and also the narrow multi-tensor cuts
(up to ``max_cut_width``) where parallel branches run side by side (YOLO's P3/P4/P5 feature maps).

Boundaries: ``K - 1`` of the admissible cuts, chosen by :func:`~passes.cuts.choose_cuts` (exact dynamic
programming) to minimise ``sum_s (cost_s / (total / K) - 1)^2`` plus a penalty per chosen cut:
``0.25 * (width - 1)``, :data:`~passes.cuts.SCOPE_PENALTY` (1.0) per tensor share that is not the output of a whole
source module (torch module path or Keras layer; 0.1 per nesting level below a top-level module
otherwise), and 1.0 for a non-float tensor. The scope penalty equals the imbalance of a stage twice
its fair share: a cut inside a module is taken only where no module output is near, because the
torch-native and tf-native backends observe anchors through module forward hooks / layer outputs
and cannot observe a tensor in the middle of a module. The cost is FLOPs from inferred shapes
(``2 * out_elems * C_in/groups * prod(kernel)`` for Conv, ``2 * out_elems * K`` for MatMul/Gemm,
``out_elems`` for other ops), or node count when no shape is known. ``K`` stages result whenever
``K - 1`` admissible cuts exist; otherwise every cut is used and ``Partition.options["notes"]`` (the
manifest's ``partition.notes``) says so, as it does for a stage over twice its share that no
admissible cut could split.
"""

from __future__ import annotations

import bisect
import itertools

from anpred.errors import GraphError
from passes.anchor_nodes import has_anchor_nodes, strip_anchor_nodes
from passes.base import gc_paused
from passes.cost import HEAVY_OPS, NO_TYPE, layout_hint, node_cost, numel
from passes.cuts import CutPolicy, sweep_cuts
from passes.wide_cuts import USUAL_CUT_WIDTH, WIDE_CUT_WIDTH, WideCuts
from passes.exporter import detect_exporter, scope_style
from passes.graph import GraphIndex, build_index
from passes.plan import AnchorPlan, Partition, Stage
from passes.scopes import node_modules
from passes.shapes import FLOAT_TYPES, fix_input_dims, infer_value_types

__all__ = ["DEFAULT_STAGES", "MIN_STAGE_NODES", "StagePartitioner"]

DEFAULT_STAGES = 8
#: the automatic stage count gives each stage at least this many live data nodes
#: (``min(DEFAULT_STAGES, live nodes // MIN_STAGE_NODES)``), so that a small graph is not anchored after
#: nearly every operator (each anchor is a graph output a runtime must keep, which can split a fusion
#: such as Conv+Relu); ``--stages K`` overrides it (docs/instrument.md)
MIN_STAGE_NODES = 4


def _check_anchors(index: GraphIndex, anchors: list[str]) -> None:
    """Raise GraphError for an ``--anchor`` name that is no activation of the graph."""
    known = set(index.producer) | set(index.graph_inputs)
    for a in anchors:
        if a not in known:
            if a in index.initializers:
                raise GraphError(f"--anchor {a!r} is an initializer (a constant), not an activation")
            import difflib

            close = difflib.get_close_matches(a, sorted(known), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise GraphError(f"--anchor {a!r}: no tensor of that name in the graph{hint}")
        if not index.is_data(a):
            raise GraphError(
                f"--anchor {a!r} is computed from constants or shapes only; it is not an "
                "activation and cannot be an anchor"
            )


def _node_costs(index: GraphIndex, cost_types) -> tuple[list[float], str]:
    """Per topological position the node's cost (0 for dead and constant/shape nodes) and the unit:
    ``flops``, or ``nodes`` (1 per live data node) when over half the shapes are unknown."""
    n = len(index.nodes)
    costs = [0.0] * n
    unknown = 0
    data_nodes = 0
    live, data_node, nodes, ops = index.live, index.data_node, index.nodes, index.op_types
    tget = cost_types.get
    numel_of: dict[tuple, float] = {}
    for p in range(n):
        if not (live[p] and data_node[p]):
            continue
        data_nodes += 1
        outs = index.outputs[p]
        if ops[p] in HEAVY_OPS:
            c = node_cost(nodes[p], index.inputs[p], outs, cost_types)
        else:  # elementwise and data movement: one op per output element
            c = None
            for k, v in enumerate(outs):
                sh = tget(v, NO_TYPE)[1]
                if sh is None:
                    if k == 0:
                        break
                    c += 1.0  # numel(None): an output of unknown shape counts one
                    continue
                key = tuple(sh)
                e = numel_of.get(key)
                if e is None:
                    e = numel_of[key] = float(numel(sh))
                c = e if c is None else c + e
        if c is None:
            unknown += 1
            c = 1.0
        costs[p] = c
    if data_nodes == 0 or unknown > data_nodes // 2:
        return [1.0 if live[p] and data_node[p] else 0.0 for p in range(n)], "nodes"
    return costs, "flops"


def _small_graph_note(stages: int, live_nodes: int, cuts: int) -> str:
    """Why the automatic choice gave fewer than :data:`DEFAULT_STAGES` stages although ``cuts``
    admissible cuts would allow more, and how to get more."""
    return (
        f"automatic choice: {stages} {'stage' if stages == 1 else 'stages'} for {live_nodes} live nodes "
        f"(at least {MIN_STAGE_NODES} nodes per stage, by design: fewer would anchor nearly every "
        f"operator); the graph has {cuts} admissible cuts: --stages N gives up to {cuts + 1} stages"
    )


def _stages(chosen, n: int, prefix: list[float], total: float, outputs: list[str]) -> list[Stage]:
    """The stages closed by the ``chosen`` cuts ``[(position, tensors)]`` (ascending) over ``n`` nodes;
    ``prefix``: cumulative cost per position; the last stage closes with the graph ``outputs``."""
    stages: list[Stage] = []
    first = 0
    for i, (pos, cut) in enumerate(chosen):
        stages.append(
            Stage(i, first, pos, pos - first + 1, prefix[pos] - (prefix[first - 1] if first else 0.0), list(cut))
        )
        first = pos + 1
    stages.append(
        Stage(len(chosen), first, n - 1, n - first, total - (prefix[first - 1] if first else 0.0), list(outputs))
    )
    return stages


def _plan_anchors(
    index: GraphIndex,
    stages: list[Stage],
    chosen,
    explicit_names: list[str],
    types,
    module_output_scope,
    framework: str,
) -> tuple[list[AnchorPlan], list[AnchorPlan]]:
    """``(inner, outputs)``: the anchors of the ``chosen`` cuts (``[(position, tensors)]``) and of the
    ``explicit_names`` (kind ``boundary``/``explicit``, in topological order), then the graph outputs
    (kind ``output``, in graph-output order). ``module_output_scope(p)``: the coarsest module whose last
    node is at position ``p``, and its depth."""
    stage_lasts = [st.last for st in stages]
    out_set = set(index.graph_outputs)

    def stage_of(p: int) -> int:
        return bisect.bisect_left(stage_lasts, p)

    def plan_anchor(v: str, kind: str) -> AnchorPlan:
        p = index.producer.get(v, -1)
        node = index.nodes[p] if p >= 0 else None
        scope = module_output_scope(p)[0] if p >= 0 else ""
        et, shape = types.get(v, (0, None))
        return AnchorPlan(
            value=v,
            kind=kind,
            stage=stages[-1].index if kind == "output" else (stage_of(p) if p >= 0 else 0),
            order=p,
            producer=(node.name if node is not None else ""),
            op_type=(node.op_type if node is not None else ""),
            scope=scope,
            label=scope or v,
            elem_type=et,
            shape=list(shape) if shape is not None else None,
            layout=layout_hint(index, v, types, framework),
        )

    explicit = set(explicit_names)
    seen: set[str] = set()
    inner: list[AnchorPlan] = []
    for _, cut in chosen:
        for v in cut:
            if v not in seen:
                seen.add(v)
                inner.append(plan_anchor(v, "explicit" if v in explicit else "boundary"))
    for v in explicit_names:
        if v not in seen and v not in out_set:
            seen.add(v)
            inner.append(plan_anchor(v, "explicit"))
    inner.sort(key=lambda a: (a.order, a.value))
    outs = []
    for v in index.graph_outputs:
        if v not in seen:
            seen.add(v)
            outs.append(plan_anchor(v, "output"))
    return inner, outs


class StagePartitioner:
    """Propose the stage partition of a model: an analysis, the model is never modified (the
    rewrite is :class:`passes.anchors.AnchorInsertionPass`, given the proposal).

    Args:
        stages: number of stages K (K-1 cuts); None picks about 8 (fewer for small graphs). Exactly
            K stages result when K-1 admissible cuts exist; otherwise one per cut plus one, with a
            note in ``partition.options["notes"]``.
        max_cut_width: the most tensors a cut may hold (>= 1).
        anchors: explicit tensor names to expose as well (kind ``explicit``).
        policy: how cuts are scored and chosen (:class:`~passes.cuts.CutPolicy`; default the
            documented penalties and :func:`~passes.cuts.choose_cuts`).
        wide_cut_width: the most tensors of a cut taken inside a long block that no cut of
            ``max_cut_width`` splits (:class:`~passes.wide_cuts.WideCuts`; default
            :data:`~passes.wide_cuts.WIDE_CUT_WIDTH`, or none when ``max_cut_width`` is below the usual
            :data:`~passes.wide_cuts.USUAL_CUT_WIDTH`: narrow cuts were asked for); at most
            ``max_cut_width`` disables them.

    Raises:
        GraphError: ``stages`` < 1 or ``max_cut_width`` < 1 (here); no inputs, a cycle, a dangling
            value, an unknown or constant ``anchors`` name (:meth:`propose`).
    """

    def __init__(
        self,
        stages: int | None = None,
        max_cut_width: int = 4,
        anchors=(),
        policy: CutPolicy | None = None,
        wide_cut_width: int | None = None,
    ):
        if stages is not None and stages < 1:
            raise GraphError(f"--stages must be at least 1 (got {stages})")
        if max_cut_width < 1:
            raise GraphError(f"--max-cut-width must be at least 1 (got {max_cut_width})")
        self.stages = stages
        self.max_cut_width = max_cut_width
        self.anchors = list(anchors)
        self.policy = policy if policy is not None else CutPolicy()
        if wide_cut_width is None:  # a width below the usual one asks for narrow cuts only
            wide_cut_width = WIDE_CUT_WIDTH if max_cut_width >= USUAL_CUT_WIDTH else max_cut_width
        self.wide_cut_width = max(wide_cut_width, max_cut_width)

    def propose(self, model, index: GraphIndex | None = None) -> Partition:
        """The partition of ``model``; an anchored model is partitioned as the model without its
        anchors (``index``: ``model``'s :func:`~passes.graph.build_index`, if built)."""
        with gc_paused():
            if index is None:
                index = build_index(model.graph)
            if has_anchor_nodes(model.graph):
                import onnx

                clean = onnx.ModelProto()
                clean.CopyFrom(model)
                strip_anchor_nodes(clean)
                return self._propose(clean, build_index(clean.graph))
            return self._propose(model, index)

    # ---------------------------------------------------------------------------------------------
    def _propose(self, model, index: GraphIndex) -> Partition:
        n = len(index.nodes)
        if n == 0:
            raise GraphError("the graph has no nodes")
        framework = scope_style(detect_exporter(model, index))
        produced = [v for out in index.outputs for v in out]
        # data propagation only matters for values computed from shapes or constants (Reshape targets)
        data_prop = not all(index.data_node)
        types = infer_value_types(model, produced, data_prop=data_prop)
        cost_types = types
        fixed = fix_input_dims(model)
        if fixed is not None:
            cost_types = infer_value_types(fixed, produced, data_prop=data_prop, weightless=True)
        mods = node_modules(model, index, framework)

        _check_anchors(index, self.anchors)
        costs, cost_unit = _node_costs(index, cost_types)
        live = index.live
        prefix = list(itertools.accumulate(costs))
        total = prefix[-1]

        # module ends: last topological position of each module (only live data nodes count)
        last_pos: dict[str, int] = {}
        for p, ms in enumerate(mods):
            if ms and live[p] and costs[p] > 0:
                for m in ms:
                    last_pos[m] = p

        def module_output_scope(p: int) -> tuple[str, int]:
            """Coarsest module whose last node is p, and its depth (1 = top level)."""
            for depth, m in enumerate(mods[p], start=1):
                if last_pos.get(m) == p:
                    return m, depth
            return "", 0

        cands = sweep_cuts(index, self.max_cut_width)
        missing = index.producer.keys() - types.keys()
        odd = [v for v, t in types.items() if t[0] not in FLOAT_TYPES]  # few: most tensors are float
        untyped = {v for v in odd if not types[v][0]} | missing
        if untyped:  # an output needs an element type
            cands = [c for c in cands if untyped.isdisjoint(c[1])]
        nonfloat = set(odd) | missing

        # choose boundaries
        live_data = sum(1 for c in costs if c > 0)
        auto = max(1, min(DEFAULT_STAGES, live_data // MIN_STAGE_NODES))
        wanted = self.stages if self.stages is not None else auto
        notes: list[str] = []
        has_scopes = any(mods)
        policy = self.policy

        wide = WideCuts(index, self.max_cut_width, self.wide_cut_width, cost_types, untyped)

        def penalty(cut) -> float:
            depths = [module_output_scope(index.producer[v])[1] for v in cut] if has_scopes else None
            return policy.penalty(wide.effective_width(len(cut)), depths, not nonfloat.isdisjoint(cut))

        def penalties(cs) -> list[float]:
            if has_scopes or nonfloat:
                return [penalty(c) for _, c in cs]
            # only the width term
            return [policy.width * (wide.effective_width(w) - 1) for w in map(len, (c for _, c in cs))]

        K = min(wanted, len(cands) + 1)
        picks = policy.choose([prefix[p] for p, _ in cands], penalties(cands), total, K)
        chosen = [cands[k] for k in picks]
        # a stage holding most of the nodes with no admissible cut inside (an unrolled recurrent block,
        # a stack of layers reading shared tensors): wider cuts inside it, and the choice made again
        more = wide.inside(_stages(chosen, n, prefix, total, index.graph_outputs), costs, cands, wanted)
        narrow_count = len(cands)
        if more:
            cands = sorted(cands + more)
            K = min(wanted, len(cands) + 1)
            blend = wide.blended(costs, cands)
            picks = policy.choose(blend, penalties(cands), 1.0, K)
            chosen = [cands[k] for k in picks]
            notes += wide.notes(chosen)
        count_note = self._stage_count_note(wanted, K, narrow_count, len(cands), live_data)
        if count_note:
            notes.insert(0, count_note)
        chosen = [(p, sorted(c, key=lambda v: (index.producer[v], v))) for p, c in chosen]
        stages = _stages(chosen, n, prefix, total, index.graph_outputs)
        if K > 1 and total > 0:
            notes.extend(self._heavy_stage_notes(stages, [p for p, _ in cands], K, total))
        inner, outs = _plan_anchors(index, stages, chosen, self.anchors, types, module_output_scope, framework)

        return Partition(
            stages=stages,
            anchors=inner + outs,
            options={
                "stages": self.stages,
                "max_cut_width": self.max_cut_width,
                "anchors": list(self.anchors),
                "notes": notes,
                "wide_cut_width": self.wide_cut_width,
                "wide_candidates": len(cands) - narrow_count,
                "wide_cuts": [{"after": p, "width": len(c)} for p, c in chosen if len(c) > self.max_cut_width],
            },
            framework=framework,
            cost_unit=cost_unit,
            total_cost=total,
            num_nodes=n,
            candidates=narrow_count,
            node_order=list(index.file_index),
            value_names=set(index.producer) | set(index.graph_inputs) | index.initializers,
        )

    def _stage_count_note(self, wanted: int, K: int, narrow_count: int, n_cands: int, live_data: int) -> str:
        """Why the partition has fewer stages than ``wanted`` (``K`` chosen from ``narrow_count``
        admissible cuts, ``n_cands`` with the wider ones; ``live_data``: the live data nodes), or why the
        automatic choice took fewer than the default on a small graph; "" when neither."""
        if K < wanted:
            what = f"asked for {wanted} stages" if self.stages is not None else f"automatic choice: {wanted} stages"
            wider = f" (and {n_cands - narrow_count} wider ones inside long blocks)" if n_cands > narrow_count else ""
            return (
                f"{what}, but the graph has only {narrow_count} admissible cuts of width <= "
                f"{self.max_cut_width}{wider}, so {K} stages"
                + (" (a larger --max-cut-width allows more)" if self.max_cut_width < 8 else "")
            )
        if self.stages is None and wanted < DEFAULT_STAGES and K < n_cands + 1:
            return _small_graph_note(wanted, live_data, n_cands)
        return ""

    def _heavy_stage_notes(self, stages, cand_pos: list[int], K: int, total: float) -> list[str]:
        """A note per stage far over its share of the cost (``K`` stages, ``total`` cost) that no admissible
        cut (at the positions ``cand_pos``, sorted) could split."""
        notes = []
        for st in stages:  # a stage far over its share that no admissible cut could split (one node: none can)
            if (
                st.last > st.first
                and st.cost > max(2.0 / K, 0.2) * total
                and bisect.bisect_left(cand_pos, st.first) == bisect.bisect_left(cand_pos, st.last)
            ):
                notes.append(
                    f"stage {st.index} carries {100 * st.cost / total:.0f}% of the cost: no admissible "
                    f"cut of width <= {self.max_cut_width} lies inside it (nodes {st.first}..{st.last})"
                )
        return notes
