"""The one read-only index of an ONNX graph: used by the partition, the anchor pass, the native
mapping (:mod:`exporters.mapping`) and the oracle's data flow.

Built once from a ``GraphProto`` in O(nodes + edges), iteratively (no recursion over the graph):

- a topological order of the nodes: Kahn's algorithm with a min-heap keyed on the node's position in
  the file, so a graph that is already sorted (the ONNX requirement) keeps its order exactly;
- per value: producer position, consumer positions;
- which values are *constant* (computed from initializers / ``Constant`` nodes only) or *shape-only*
  (computed from ``Shape``/``Size`` of activations, e.g. dynamic reshape targets): neither is ever an
  anchor nor counted in a cut;
- which nodes are *live* (some graph output depends on them); dead nodes never close a cut.

Values are identified by their ONNX name, which is unique in a valid graph (SSA); the index is rebuilt
after any edit. Sub-graphs (``If``/``Loop``/``Scan`` bodies) are not descended into for partitioning,
but the outer values they read count as inputs of the node that owns them. With ``skip`` (e.g.
:func:`passes.anchor_nodes.is_anchor_node`) some nodes are left out as if absent, with the graph
outputs only they produce.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from anpred.errors import GraphError

__all__ = ["build_lenient_index", "SHAPE_OPS", "GraphIndex", "build_index", "subgraph_outer_refs"]

#: ops whose output depends only on the *shape* of their inputs, not on their values.
SHAPE_OPS = frozenset({"Shape", "Size"})
#: standard ops that carry sub-graphs (GRAPH/GRAPHS attributes)
_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
_NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


def subgraph_outer_refs(node) -> list[str]:
    """Names read inside ``node``'s sub-graphs (at any depth) that are not defined there (iterative)."""
    import onnx

    refs: list[str] = []
    stack = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            stack.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            stack.extend(a.graphs)
    if not stack:
        return refs
    defined: set[str] = set()
    graphs = []
    while stack:  # collect every nested graph first: names defined anywhere inside are local
        g = stack.pop()
        graphs.append(g)
        defined.update(i.name for i in g.input)
        defined.update(t.name for t in g.initializer)
        for n in g.node:
            defined.update(n.output)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
    seen: set[str] = set()
    for g in graphs:
        for n in g.node:
            for v in n.input:
                if v and v not in defined and v not in seen:
                    seen.add(v)
                    refs.append(v)
        for o in g.output:
            if o.name not in defined and o.name not in seen:
                seen.add(o.name)
                refs.append(o.name)
    return refs


@dataclass
class GraphIndex:
    """Topologically ordered view of a graph. Positions index :attr:`nodes` (topological order)."""

    nodes: list  # NodeProto in topological order
    file_index: list[int]  # file position of nodes[i]
    inputs: list[list[str]]  # data inputs of nodes[i] (incl. sub-graph outer references), no ""
    outputs: list[list[str]]  # outputs of nodes[i], no ""
    producer: dict[str, int]  # value -> position of its producer
    consumers: dict[str, list[int]]  # value -> positions of consumers (ascending)
    graph_inputs: list[str]  # real inputs (initializers excluded)
    initializers: set[str]
    graph_outputs: list[str]
    constant: set[str] = field(default_factory=set)  # values independent of the graph inputs
    shape_only: set[str] = field(default_factory=set)  # values depending only on input shapes
    live: list[bool] = field(default_factory=list)  # nodes[i] reaches a graph output
    is_sorted: bool = True  # the file order already was topological
    op_types: list[str] = field(default_factory=list)
    data_node: list[bool] = field(default_factory=list)  # nodes[i]'s outputs are data (not const/shape)

    def is_data(self, value: str) -> bool:
        """True if ``value`` carries activations: depends on the inputs' values, not only shapes."""
        return (
            value not in self.constant
            and value not in self.shape_only
            and (value in self.producer or value in self._input_set)
        )

    @property
    def _input_set(self) -> set[str]:
        s = self.__dict__.get("_inputs_cache")
        if s is None:
            s = self.__dict__["_inputs_cache"] = set(self.graph_inputs)
        return s

    def value_slots(self) -> tuple[dict[str, tuple[int, int]], dict[str, list[tuple[int, int]]]]:
        """The edges with their slots, counted in each node's own ``input``/``output`` lists (an omitted
        optional value, ``""``, keeps its place): value -> ``(position, output slot)`` of its producer,
        and value -> ``[(position, input slot), ...]`` of the nodes that read it, one entry per slot
        that names it, ascending (a value read only inside a node's sub-graph has no slot and no
        entry). Built on the first call, then cached (the index is read-only)."""
        got = self.__dict__.get("_slots_cache")
        if got is None:
            nodes = self.nodes
            producer: dict[str, tuple[int, int]] = {}
            for pos, node in enumerate(nodes):
                for j, v in enumerate(node.output):
                    if v:
                        producer[v] = (pos, j)
            consumers: dict[str, list[tuple[int, int]]] = {}
            for v, positions in self.consumers.items():
                slots = [(pos, k) for pos in positions for k, x in enumerate(nodes[pos].input) if x == v]
                if slots:
                    consumers[v] = slots
            got = self.__dict__["_slots_cache"] = (producer, consumers)
        return got


def build_index(graph, skip=None) -> GraphIndex:
    """Index ``graph`` (an ``onnx.GraphProto``).

    ``skip``: a predicate on nodes; the nodes it accepts are left out (positions then count the
    kept nodes only, :attr:`GraphIndex.file_index` included), and so are the graph outputs that
    only they produce.

    Raises:
        GraphError: no graph inputs or no graph outputs, a value produced twice, a node input that nothing produces, or
            a cycle (the message names a node on it).
    """
    return _build_index(graph, strict=True, skip=skip)


def build_lenient_index(graph) -> GraphIndex:
    """Index ``graph`` like :func:`build_index`, for tools that compare graphs as they are (``anpred.diff``):
    a graph without real inputs or without outputs, a node input that nothing provides (read like an
    outer-scope value: no edge) and a graph output that nothing produces are accepted.

    Raises:
        GraphError: a value produced twice, or a cycle (the message names a node on it).
    """
    return _build_index(graph, strict=False)


def _build_index(graph, strict: bool, skip=None) -> GraphIndex:
    """:func:`build_index` (``strict``) or :func:`build_lenient_index`."""
    initializers, graph_inputs, graph_outputs, file_nodes = _graph_ends(graph, strict, skip)
    n_nodes = len(file_nodes)
    file_ops = [n.op_type for n in file_nodes]
    ins, outs = _node_values(file_nodes, file_ops)
    known = initializers.union(graph_inputs)
    prod_file, consumers, is_sorted = _file_producers(file_nodes, ins, outs, known, strict)
    for v in graph_outputs:
        if strict and v not in prod_file and v not in known:
            raise GraphError(f"graph output {v!r} is not produced by any node")

    if is_sorted:
        order = list(range(n_nodes))
        nodes = file_nodes
        producer = prod_file
    else:
        order = _topological_order(file_nodes, ins, prod_file)
        nodes = [file_nodes[i] for i in order]
        ins = [ins[i] for i in order]
        outs = [outs[i] for i in order]
        producer = {}
        for pos, out in enumerate(outs):
            for v in out:
                producer[v] = pos
        consumers = {}
        for pos, inp in enumerate(ins):
            for v in inp:
                c = consumers.get(v)
                if c is None:
                    consumers[v] = [pos]
                elif c[-1] != pos:
                    c.append(pos)
    op_types = file_ops if is_sorted else [file_ops[i] for i in order]
    constant, shape_only, data_node = _value_kinds(op_types, ins, outs, initializers)
    live = _liveness(ins, outs, graph_outputs)
    return GraphIndex(
        nodes=nodes,
        file_index=order,
        inputs=ins,
        outputs=outs,
        producer=producer,
        consumers=consumers,
        graph_inputs=graph_inputs,
        initializers=initializers,
        graph_outputs=graph_outputs,
        constant=constant,
        shape_only=shape_only,
        live=live,
        is_sorted=is_sorted,
        op_types=op_types,
        data_node=data_node,
    )


def _graph_ends(graph, strict: bool, skip) -> tuple[set[str], list[str], list[str], list]:
    """``(initializer names, graph input names that are no initializer, graph output names, nodes)``;
    the nodes ``skip`` selects are left out, and so are the graph outputs only they produce.

    Raises:
        GraphError: ``strict`` and the graph has no inputs or no outputs.
    """
    initializers = {t.name for t in graph.initializer}
    initializers.update(t.values.name for t in graph.sparse_initializer)
    graph_inputs = [i.name for i in graph.input if i.name not in initializers]
    if strict and not graph_inputs:
        raise GraphError("the graph has no inputs (every graph input is an initializer or there are none)")
    graph_outputs = [o.name for o in graph.output]
    file_nodes = list(graph.node)
    if skip is not None:
        left = [n for n in file_nodes if skip(n)]
        if left:
            file_nodes = [n for n in file_nodes if not skip(n)]
            kept = {v for n in file_nodes for v in n.output}
            gone = {v for n in left for v in n.output if v not in kept}
            graph_outputs = [v for v in graph_outputs if v not in gone]
    if strict and not graph_outputs:
        raise GraphError("the graph has no outputs (nothing is computed for anyone: nothing to instrument)")
    return initializers, graph_inputs, graph_outputs, file_nodes


def _node_values(file_nodes: list, file_ops: list[str]) -> tuple[list[list[str]], list[list[str]]]:
    """``(inputs, outputs)`` per node, omitted optional ones dropped; a node's inputs include the
    outer values its sub-graphs read."""
    # slicing a repeated field is the cheapest way to read it from Python (one list, no iterator)
    ins: list[list[str]] = [n.input[:] for n in file_nodes]
    outs: list[list[str]] = [n.output[:] for n in file_nodes]
    for lists in (ins, outs):
        for i, lst in enumerate(lists):
            if "" in lst:  # omitted optional inputs/outputs
                lists[i] = [v for v in lst if v]
    for i, node in enumerate(file_nodes):
        # sub-graphs hang off If/Loop/Scan/SequenceMap, or ops of other domains
        if (file_ops[i] in _SUBGRAPH_OPS or node.domain not in ("", "ai.onnx")) and any(
            a.type == 5 or a.type == 10 for a in node.attribute
        ):  # GRAPH(S)
            extra = subgraph_outer_refs(node)
            if extra:
                have = set(ins[i])
                ins[i] += [v for v in extra if v not in have]
    return ins, outs


def _file_producers(
    file_nodes: list, ins: list[list[str]], outs: list[list[str]], known: set[str], strict: bool
) -> tuple[dict[str, int], dict[str, list[int]], bool]:
    """``(producer, consumers, is_sorted)`` by file position: value -> producing node, value -> reading
    nodes, and whether every node comes after the producers of its inputs.

    Raises:
        GraphError: a value produced twice (or produced and also an input/initializer); ``strict`` and a
            node reads a value nothing provides.
    """
    prod_file: dict[str, int] = {}
    for i, out in enumerate(outs):
        for v in out:
            if v in prod_file or v in known:
                node = file_nodes[i]
                raise GraphError(f"value {v!r} is produced more than once (node {node.name or node.op_type!r})")
            prod_file[v] = i
    is_sorted = True
    get = prod_file.get
    consumers: dict[str, list[int]] = {}  # by file position; renumbered by the caller if the file is unsorted
    cget = consumers.get
    for i, inp in enumerate(ins):
        for v in inp:
            p = get(v)
            if p is None:
                if strict and v not in known:
                    nm = file_nodes[i].name or file_nodes[i].op_type
                    raise GraphError(f"node {nm!r} reads {v!r}, which no node, input or initializer provides")
            elif p >= i:
                is_sorted = False
            c = cget(v)
            if c is None:
                consumers[v] = [i]
            elif c[-1] != i:
                c.append(i)
    return prod_file, consumers, is_sorted


def _topological_order(file_nodes: list, ins: list[list[str]], prod_file: dict[str, int]) -> list[int]:
    """File positions in a topological order (Kahn's algorithm, min-heap on file position: keeps the
    file order wherever it is valid).

    Raises:
        GraphError: the graph has a cycle (the message names a node on or behind it).
    """
    n_nodes = len(file_nodes)
    get = prod_file.get
    indeg = [0] * n_nodes
    succ: list[list[int]] = [[] for _ in range(n_nodes)]
    for i, inp in enumerate(ins):
        for v in inp:
            p = get(v)
            if p is not None:
                succ[p].append(i)
                indeg[i] += 1
    heap = [i for i in range(n_nodes) if indeg[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        i = heapq.heappop(heap)
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, j)
    if len(order) != n_nodes:
        stuck = next(i for i in range(n_nodes) if indeg[i] > 0)
        nm = file_nodes[stuck].name or file_nodes[stuck].op_type
        raise GraphError(f"the graph has a cycle ({n_nodes - len(order)} nodes on or behind it, e.g. node {nm!r})")
    return order


def _value_kinds(
    op_types: list[str], ins: list[list[str]], outs: list[list[str]], initializers: set[str]
) -> tuple[set[str], set[str], list[bool]]:
    """``(constant values, shape-only values, data_node per node)``: constant / shape-only propagation,
    forward in topological order (set operations run in C)."""
    constant: set[str] = set(initializers)
    shape_only: set[str] = set()
    not_data: set[str] = set(initializers)  # constant | shape_only
    data_node = [True] * len(op_types)
    for pos, op in enumerate(op_types):
        inp = ins[pos]
        if not_data.issuperset(inp):  # incl. no inputs (Constant)
            if op not in _NONDETERMINISTIC and constant.issuperset(inp):
                constant.update(outs[pos])
            else:
                shape_only.update(outs[pos])
            not_data.update(outs[pos])
            data_node[pos] = False
        elif op in SHAPE_OPS:
            shape_only.update(outs[pos])
            not_data.update(outs[pos])
            data_node[pos] = False
    return constant, shape_only, data_node


def _liveness(ins: list[list[str]], outs: list[list[str]], graph_outputs: list[str]) -> list[bool]:
    """Per node, in topological order, whether it is live (backward): one of its outputs is a graph
    output or is read by a live node (``needed``: every value a live node reads, plus the graph outputs)."""
    live = [False] * len(outs)
    needed = set(graph_outputs)
    for pos in range(len(outs) - 1, -1, -1):
        if not needed.isdisjoint(outs[pos]):
            live[pos] = True
            needed.update(ins[pos])
    return live
