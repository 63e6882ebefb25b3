"""Structural diff of two ONNX graphs and the correspondence of their anchors.

Matching (which node of graph A is which node of graph B) runs in tiers, cheapest and most certain
first; every tier only looks at nodes that are still unmatched:

1. **names**: nodes whose (unique, non-empty) name agrees and whose operator type agrees; then nodes
   whose first output *value* name agrees (exporters keep value names through optimisers and
   converters even when they rename nodes).
2. **structure**: a directed Weisfeiler-Lehman signature per node. Level 0 is the node's local label
   (domain, op type, attributes, input arity, shapes of its constant inputs); level ``k`` hashes the
   level ``k-1`` labels of the producers of each input slot (forward) and, separately, of the
   consumers of each output (backward). Nodes whose signature is unique in both graphs at the deepest
   level are paired first, then shallower levels (Shervashidze et al., "Weisfeiler-Lehman Graph
   Kernels", JMLR 12, 2011, applied per node as in networkx ``weisfeiler_lehman_subgraph_hashes``).
3. **propagation**: from every matched pair, producers of the same input slot and consumers of the
   same output slot with the same operator type are paired (looking through inserted
   Cast/Transpose/QuantizeLinear/DequantizeLinear/Identity nodes), until nothing changes. Where the
   neighbours differ because a tool fused or split a few nodes (``Sigmoid+Mul -> QuickGelu``), the
   step crosses that region: the smallest unmatched region on each side that closes on one exit value
   (downwards) or opens on one entry value (upwards), at most ``REGION_LIMIT`` nodes, with different
   operator multisets, is treated as one box whose boundary values correspond, and matching continues
   beyond it (without names, YOLOv8n vs its ORT-optimised graph: every surviving node paired).
4. **sequence alignment**: what is left is aligned by operator sequence in topological order
   (``difflib.SequenceMatcher``); a candidate pair is kept only when one of its dataflow neighbours is
   already matched to the other's neighbour.

Why this and not a networkx graph-matching algorithm: exact (sub)graph isomorphism (VF2) fails as soon
as the graphs differ, and graph edit distance is exponential; the tiers above are linear in the graph
size (10k-node graphs in about a second, see ``docs/diff.md`` and ``benchmarks/bench_diff.py``).

Unmatched nodes are grouped into regions (connected unmatched nodes of A and of B that share a
boundary edge between matched nodes) and classified: ``fused`` (n A nodes -> 1 B node), ``split``
(1 -> n), ``replaced`` (1 -> 1 of another type), ``rewritten`` (n -> m), ``inserted``/``removed``
(only Cast/Q/DQ/Transpose/Identity/layout reorders on one side), ``folded``/``unfolded`` (a node
absorbed into a matched neighbour whose constants changed, e.g. BatchNormalization folded into Conv),
``added``/``deleted`` (anything else on one side only).

Subgraphs (If/Loop/Scan bodies) are compared as whole attributes, not diffed inside.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
from collections import Counter, defaultdict, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anpred.errors import AnpredError, GraphError
from anpred.manifest import AnchorManifest

SCHEMA = "anpred.graphdiff/1"

#: Operators that convert or re-layout a value without computing anything new: when only these are
#: on one side of a region it is an insertion/removal, and propagation looks through them.
TRANSPARENT_OPS = frozenset({
    "Cast", "CastLike", "Transpose", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
    "Identity", "ReorderInput", "ReorderOutput",
})

REGION_LIMIT = 8  # most nodes on one side of a fused/split region that propagation steps across
WL_LEVELS = 4  # deepest Weisfeiler-Lehman level used for seeding (measured: deeper adds nothing)


# ---------------------------------------------------------------------------------------------
# result types
# ---------------------------------------------------------------------------------------------
@dataclass
class Change:
    """One difference between two matched nodes.

    kind: ``renamed``, ``op_type``, ``domain``, ``attribute``, ``input_arity``, ``output_arity``,
        ``dtype``, ``shape``, ``initializer`` or ``rewired``.
    what: the attribute name, ``input[i]`` or ``output[j]`` the change is about ("" for the node).
    a, b: the values in A and B (JSON-friendly: str, number, list).
    max_abs_diff: for ``initializer`` and tensor attributes of equal shape: max |a - b| computed in
        float64 (None otherwise).
    """

    kind: str
    what: str = ""
    a: Any = None
    b: Any = None
    max_abs_diff: float | None = None

    def describe(self) -> str:
        s = f"{self.kind}{'(' + self.what + ')' if self.what else ''}: {self.a!r} -> {self.b!r}"
        if self.max_abs_diff is not None:
            s += f" (max |diff| {self.max_abs_diff:.3g})"
        return s


@dataclass
class NodeMatch:
    """A node of A paired with a node of B.

    a, b: node names (or ``#<index>`` for unnamed nodes); a_index, b_index: topological positions.
    how: the tier that paired them: ``name``, ``value``, ``structure``, ``propagation``, ``sequence``.
    stage: ANPRED stage index when known (from either graph's manifest), else None.
    """

    a: str
    b: str
    a_index: int
    b_index: int
    op_type: str
    how: str
    changes: list[Change] = field(default_factory=list)
    stage: int | None = None


@dataclass
class NodeRef:
    """A node that exists in one graph only (``side`` "a" or "b")."""

    side: str
    name: str
    index: int
    op_type: str
    domain: str = ""
    stage: int | None = None


@dataclass
class Region:
    """A group of unmatched nodes of A and B that replace each other (see module docstring)."""

    kind: str
    label: str
    a_nodes: list[str]
    b_nodes: list[str]
    a_ops: list[str]
    b_ops: list[str]
    stage: int | None = None


@dataclass
class AnchorMatch:
    """Where an anchor of one graph is in the other.

    status: ``exact`` (same value), ``equivalent`` (same values after ``transform``, applied to the
        ``to`` graph's tensor to obtain the ``from`` graph's), ``unmapped`` (no counterpart).
    transform: ``{"dtype": "float16"}`` (the counterpart is held or computed in float16: an fp16
        conversion, possibly cast back to the anchor's dtype by an inserted Cast, so values are not
        bit-identical), ``{"permute": [0, 3, 1, 2]}`` (a Transpose to undo), ``{"quantized": true}``
        (behind QuantizeLinear/DequantizeLinear); None for exact.
    """

    anchor: str
    stage: int
    a_value: str | None
    b_value: str | None
    status: str
    transform: dict[str, Any] | None = None
    reason: str = ""


@dataclass
class GraphInfo:
    """Facts about one of the two graphs.

    path: the file (or the label given to :func:`diff_models`); num_nodes: top-level nodes (subgraph
    bodies not counted); op_counts: ``op_type`` (``op_type(domain)`` outside the default domain) ->
    count; opset: domain (``ai.onnx`` for the default one) -> imported version; producer:
    ``producer_name producer_version``; has_manifest: the graph carries an ANPRED anchor manifest in
    ``metadata_props``; num_stages: its number of stages (0 without a manifest).
    """

    path: str
    num_nodes: int
    op_counts: dict[str, int]
    opset: dict[str, int]
    producer: str
    has_manifest: bool
    num_stages: int = 0


@dataclass
class StageDiff:
    """Per ANPRED stage: how many nodes on each side, matched, changed, and the regions there."""

    index: int
    a_nodes: int = 0
    b_nodes: int = 0
    matched: int = 0
    changed: int = 0
    regions: list[int] = field(default_factory=list)  # indices into GraphDiff.regions
    a_ops: list[str] = field(default_factory=list)   # "op:name:status" strings for the HTML view
    b_ops: list[str] = field(default_factory=list)


@dataclass
class GraphDiff:
    """The structural diff of graph A and graph B (schema ``anpred.graphdiff/1``).

    ``changed`` holds only matched pairs with at least one change; ``match_counts`` counts pairs per
    tier. ``identical`` is true when nothing differs (names included).
    """

    a: GraphInfo
    b: GraphInfo
    matched: int
    match_counts: dict[str, int]
    changed: list[NodeMatch]
    only_a: list[NodeRef]
    only_b: list[NodeRef]
    regions: list[Region]
    anchors: list[AnchorMatch] = field(default_factory=list)
    stages: list[StageDiff] = field(default_factory=list)
    io: list[Change] = field(default_factory=list)  # graph input/output differences
    opset: list[Change] = field(default_factory=list)  # opset_import differences per domain
    seconds: float = 0.0
    schema: str = SCHEMA

    @property
    def identical(self) -> bool:
        return not (self.changed or self.only_a or self.only_b or self.regions or self.io or self.opset)

    def region_counts(self) -> dict[str, int]:
        return dict(Counter(r.kind for r in self.regions))

    def fusions(self) -> dict[str, int]:
        """Label -> count for fused/split/replaced/rewritten/folded regions."""
        return dict(Counter(r.label for r in self.regions
                            if r.kind in ("fused", "split", "replaced", "rewritten", "folded", "unfolded")))

    def insertions(self) -> dict[str, int]:
        """Op type -> count of inserted conversion nodes (Cast, Q/DQ, Transpose ...) in B."""
        c: Counter = Counter()
        for r in self.regions:
            if r.kind == "inserted":
                c.update(r.b_ops)
        return dict(c)

    def change_counts(self) -> dict[str, int]:
        return dict(Counter(ch.kind for m in self.changed for ch in m.changes))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GraphDiff":
        if d.get("schema") != SCHEMA:
            raise AnpredError(f"unsupported graph diff schema {d.get('schema')!r} (expected {SCHEMA!r})")
        try:
            return cls(
                a=GraphInfo(**d["a"]), b=GraphInfo(**d["b"]), matched=d["matched"],
                match_counts=d["match_counts"],
                changed=[NodeMatch(**{**m, "changes": [Change(**c) for c in m["changes"]]}) for m in d["changed"]],
                only_a=[NodeRef(**n) for n in d["only_a"]], only_b=[NodeRef(**n) for n in d["only_b"]],
                regions=[Region(**r) for r in d["regions"]],
                anchors=[AnchorMatch(**a) for a in d.get("anchors", [])],
                stages=[StageDiff(**s) for s in d.get("stages", [])],
                io=[Change(**c) for c in d.get("io", [])], opset=[Change(**c) for c in d.get("opset", [])],
                seconds=d.get("seconds", 0.0), schema=d["schema"],
            )
        except (KeyError, TypeError) as err:
            raise AnpredError(f"malformed graph diff: {err}") from err

    def summary(self, max_lines: int = 40) -> str:
        """A terminal summary (plain text, one fact per line)."""
        L = [f"A: {self.a.path} ({self.a.num_nodes} nodes)", f"B: {self.b.path} ({self.b.num_nodes} nodes)"]
        if self.identical:
            L.append("graphs are identical (same nodes, names, attributes, constants, types)")
            return "\n".join(L)
        how = ", ".join(f"{k} {v}" for k, v in self.match_counts.items() if v)
        L.append(f"matched {self.matched} node pairs ({how}); only in A: {len(self.only_a)}; only in B: "
                 f"{len(self.only_b)}; changed pairs: {len(self.changed)}")
        if self.opset:
            L.append("opset imports: " + ", ".join(f"{c.what} {c.a} -> {c.b}" for c in self.opset))
        for c in self.io:
            L.append(f"  graph io {c.describe()}")
        if self.change_counts():
            L.append("changes: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.change_counts().items())))
        if self.fusions():
            L.append("fused/split regions:")
            for lab, n in sorted(self.fusions().items(), key=lambda kv: -kv[1]):
                L.append(f"  {n:4d} x {lab}")
        if self.insertions():
            L.append("inserted in B: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.insertions().items())))
        rest = [r for r in self.regions if r.kind in ("removed", "added", "deleted")]
        for r in rest[:10]:
            L.append(f"  {r.kind}: {r.label}")
        shown = 0
        for m in self.changed:
            if shown >= max_lines // 2:
                L.append(f"  ... {len(self.changed) - shown} more changed pairs (see --json/--html)")
                break
            L.append(f"  {m.a} ~ {m.b} [{m.op_type}, {m.how}]: " + "; ".join(c.describe() for c in m.changes[:3])
                     + (" ..." if len(m.changes) > 3 else ""))
            shown += 1
        if self.anchors:
            c = Counter(a.status for a in self.anchors)
            L.append("anchors: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
        return "\n".join(L)


# ---------------------------------------------------------------------------------------------
# graph index
# ---------------------------------------------------------------------------------------------
class _Graph:
    """Index over one ONNX graph: topological node list, producers, consumers, constants, types."""

    def __init__(self, model, path: str = ""):
        from onnx import numpy_helper

        self.model = model
        self.path = path
        g = model.graph
        self.init = {t.name: t for t in g.initializer}
        self._init_arrays: dict[str, np.ndarray] = {}
        self._numpy_helper = numpy_helper
        self.inputs = [i.name for i in g.input if i.name not in self.init]
        self.outputs = [o.name for o in g.output]
        self.nodes = _toposort(list(g.node), set(self.init) | {i.name for i in g.input})
        n = len(self.nodes)
        self.producer: dict[str, tuple[int, int]] = {}
        self.consumers: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, nd in enumerate(self.nodes):
            for j, o in enumerate(nd.output):
                if o:
                    self.producer[o] = (i, j)
            for k, v in enumerate(nd.input):
                if v:
                    self.consumers[v].append((i, k))
        self.ids = [nd.name if nd.name else f"#{i}" for i, nd in enumerate(self.nodes)]
        self.op = [nd.op_type for nd in self.nodes]
        self.types = _value_types(model)
        self.manifest = AnchorManifest.from_model(model)
        self.stage: list[int | None] = [None] * n
        if self.manifest is not None and self.manifest.stages:
            self._stages_from_manifest()

    def _stages_from_manifest(self) -> None:
        """Place nodes in stages by the anchor values, not by node positions (an optimiser's copy of
        the anchored model keeps the manifest in its metadata but reorders, renames and fuses nodes).

        Seeds: the producer of each anchor's value (``anchor.value``, else the graph output named
        like the anchor, seen through Identity/Cast ...) belongs to the anchor's stage. Every other
        node gets the smallest stage among the anchors it feeds: ``stage(n) = min(stage of anchors
        n produces, stage(c) for each consumer c)``, one sweep in reverse topological order. With
        boundary anchors that close each stage (every value crossing a cut is an anchor) this is the
        manifest's own ``[first, last]`` slice; nodes that feed no anchor stay None and are placed
        later from their matches and neighbours (:func:`_spread_stages`)."""
        seed: dict[int, int] = {}
        for anc in self.manifest.anchors:
            for v in (anc.value, anc.name):
                p = self.producer.get(v)
                if p is None:
                    continue
                i = p[0]
                while self.op[i] in ("Identity", "Cast", "CastLike") and v == anc.name:
                    q = self.producer.get(self.nodes[i].input[0]) if self.nodes[i].input else None
                    if q is None:
                        break
                    i = q[0]
                seed[i] = min(seed.get(i, anc.stage), anc.stage)
                break
        if not seed:
            return
        for i in range(len(self.nodes) - 1, -1, -1):
            st = seed.get(i)
            for o in self.nodes[i].output:
                for c, _k in self.consumers.get(o, ()):
                    sc = self.stage[c]
                    if sc is not None and (st is None or sc < st):
                        st = sc
            self.stage[i] = st

    def array(self, name: str) -> np.ndarray | None:
        if name not in self.init:
            return None
        if name not in self._init_arrays:
            try:
                self._init_arrays[name] = self._numpy_helper.to_array(self.init[name])
            except Exception:  # external data not loaded, exotic dtype: compare by shape only
                return None
        return self._init_arrays[name]

    def init_sig(self, name: str) -> str:
        t = self.init[name]
        return "x".join(str(d) for d in t.dims)

    def value_type(self, v: str) -> tuple[str | None, list | None]:
        if v in self.init:
            t = self.init[v]
            return _dtype_name(t.data_type), list(t.dims)
        return self.types.get(v, (None, None))


def _toposort(nodes: list, available: set[str]) -> list:
    """Kahn's algorithm, iterative, stable (keeps file order among ready nodes). Raises GraphError on
    a cycle. Values that no node produces (graph inputs, initializers, outer-scope names) count as
    available."""
    produced = {o for nd in nodes for o in nd.output if o}
    indeg = [0] * len(nodes)
    users: dict[str, list[int]] = defaultdict(list)
    for i, nd in enumerate(nodes):
        deps = {v for v in nd.input if v and v in produced and v not in available}
        indeg[i] = len(deps)
        for v in deps:
            users[v].append(i)
    import heapq

    ready = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)
        out.append(nodes[i])
        for o in nodes[i].output:
            for u in users.get(o, ()):
                indeg[u] -= 1
                if indeg[u] == 0:
                    heapq.heappush(ready, u)
    if len(out) != len(nodes):
        stuck = [nodes[i].name or nodes[i].op_type for i, d in enumerate(indeg) if d > 0][:5]
        raise GraphError(f"the graph has a cycle (or a value produced twice) around nodes {stuck}")
    return out


def _dtype_name(elem_type: int) -> str | None:
    from onnx import helper

    try:
        return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
    except Exception:
        return None


def _value_types(model) -> dict[str, tuple[str | None, list | None]]:
    """value name -> (numpy dtype name, shape) from ONNX shape inference (falls back to the
    value_info already in the file when inference fails, e.g. on contrib operators)."""
    import onnx

    g = model.graph
    try:
        if model.ByteSize() < (1 << 31) - (1 << 26):
            g = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:
        g = model.graph
    out: dict[str, tuple] = {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        shape = None
        if tt.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        out[vi.name] = (_dtype_name(tt.elem_type) if tt.elem_type else None, shape)
    return out


def _attr_value(attr) -> Any:
    """An attribute as a comparable, JSON-friendly value (tensors -> ndarray, graphs -> digest)."""
    from onnx import AttributeProto, helper, numpy_helper

    if attr.type == AttributeProto.TENSOR:
        try:
            return numpy_helper.to_array(attr.t)
        except Exception:
            return "tensor:" + hashlib.sha1(attr.t.SerializeToString()).hexdigest()[:12]
    if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
        data = attr.g.SerializeToString() if attr.type == AttributeProto.GRAPH else b"".join(
            x.SerializeToString() for x in attr.graphs)
        return "graph:" + hashlib.sha1(data).hexdigest()[:12]
    v = helper.get_attribute_value(attr)
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, list):
        return [x.decode(errors="replace") if isinstance(x, bytes) else x for x in v]
    return v


_LIST_DEFAULTS = {"pads": 0, "dilations": 1, "strides": 1, "output_padding": 0}


@functools.lru_cache(maxsize=None)
def _schema_defaults(op_type: str, domain: str) -> dict[str, Any]:
    import onnx.defs

    schema = None
    # contrib domains that re-implement a standard operator (com.microsoft.nchwc Conv/MaxPool ...)
    # have no schema in onnx.defs: fall back to the standard operator of the same name, whose
    # attributes they share (ORT's NCHWc transformer copies them over and spells defaults out)
    for dom in dict.fromkeys((domain, "")):
        try:
            schema = onnx.defs.get_schema(op_type, domain=dom)
            break
        except onnx.defs.SchemaError:
            continue
    if schema is None:  # contrib-only operators (QuickGelu, FusedConv ...): keep every attribute
        return {}
    return {k: _attr_value(v.default_value) for k, v in schema.attributes.items()
            if v.default_value.name or v.default_value.type}


def _normalized_attrs(nd) -> dict[str, Any]:
    """Attributes of ``nd`` with those equal to their ONNX schema default dropped (``auto_pad=NOTSET``,
    ``group=1``, ``ceil_mode=0``, all-zero ``pads``, all-one ``strides``/``dilations`` ...), so that
    exporters that spell defaults out and those that omit them compare equal."""
    out = {a.name: _attr_value(a) for a in nd.attribute}
    defaults = _schema_defaults(nd.op_type, nd.domain or "")
    for k in list(out):
        v = out[k]
        if k in defaults and not isinstance(v, np.ndarray) and v == defaults[k]:
            del out[k]
        elif k in _LIST_DEFAULTS and isinstance(v, list) and all(x == _LIST_DEFAULTS[k] for x in v):
            del out[k]
    return out


def _attr_sig(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"T{v.dtype.kind}{v.shape}" if v.size > 16 else f"T{v.dtype.kind}{v.tolist()}"
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


# ---------------------------------------------------------------------------------------------
# matching
# ---------------------------------------------------------------------------------------------
class _Matcher:
    def __init__(self, A: _Graph, B: _Graph):
        self.A, self.B = A, B
        self.a2b: dict[int, int] = {}
        self.b2a: dict[int, int] = {}
        self.how: dict[int, str] = {}
        self.attrs = [self._attrs(A), self._attrs(B)]
        self.local = [self._local(A, self.attrs[0]), self._local(B, self.attrs[1])]
        self.coarse = [self._coarse(A), self._coarse(B)]

    @staticmethod
    def _attrs(G: _Graph) -> list[dict[str, Any]]:
        return [_normalized_attrs(nd) for nd in G.nodes]

    @staticmethod
    def _coarse(G: _Graph) -> list[int]:
        """Operator type and the shape of the first constant input (weights): survives exporters
        that spell attributes differently or drop a zero bias."""
        out = []
        for nd in G.nodes:
            w = next((G.init_sig(v) for v in nd.input if v in G.init), "")
            out.append(hash((nd.op_type, w)))
        return out

    @staticmethod
    def _local(G: _Graph, attrs) -> list[int]:
        out = []
        for i, nd in enumerate(G.nodes):
            ins = tuple(("c" + G.init_sig(v)) if v in G.init else ("" if not v else "v") for v in nd.input)
            at = tuple(sorted((k, _attr_sig(v)) for k, v in attrs[i].items()))
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
    def _wl(self, G: _Graph, local: list[int]) -> list[tuple[list[int], list[int]]]:
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
                for (c, k) in G.consumers.get(o, ()):
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
    def _through(self, G: _Graph, idx: int | None, matched: dict[int, int], up: bool) -> list[int | None]:
        """Nodes reached from node ``idx`` by walking through unmatched transparent nodes
        (upwards: producer of input 0; downwards: all consumers)."""
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

    def _region_down(self, G: _Graph, v: str, matched: dict[int, int]) -> tuple[str, frozenset] | None:
        """The smallest region of unmatched nodes fed by value ``v`` that closes on one exit value:
        it holds every unmatched consumer of ``v``, its other inputs are constants, graph inputs,
        matched nodes' outputs or its own values, and exactly one of its values is used outside it
        (or is a graph output). Returns ``(exit value, node set)`` or None (no such region within
        :data:`REGION_LIMIT` nodes). Nodes are added in topological order (a heap)."""
        import heapq

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
            exits = {o for j in R for o in G.nodes[j].output if o and (
                o in G.outputs or any(c not in R for c, _ in G.consumers.get(o, ())))}
            if need <= R and len(exits) == 1:
                return exits.pop(), frozenset(R)
            for o in G.nodes[i].output:
                for c, _ in G.consumers.get(o, ()):
                    if c not in matched and c not in R:
                        heapq.heappush(heap, c)
        return None

    def _region_up(self, G: _Graph, v: str, matched: dict[int, int]) -> tuple[str, frozenset] | None:
        """The smallest region of unmatched nodes producing value ``v`` that opens on one entry
        value: its values other than ``v`` are used only inside it, and exactly one non-constant
        value it reads comes from outside it. Returns ``(entry value, node set)`` or None (within
        :data:`REGION_LIMIT` nodes; nodes added in reverse topological order)."""
        import heapq

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
            closed = all(c in R for j in R for o in G.nodes[j].output if o and o != v
                         for c, _ in G.consumers.get(o, ())) and not any(
                o in G.outputs for j in R for o in G.nodes[j].output if o != v)
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
        ca = [x for c in ca for x in self._through(A, c, self.a2b, False) if x is not None]
        cb = [x for c in cb for x in self._through(B, c, self.b2a, False) if x is not None]
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
                xas = self._through(A, pa, self.a2b, True)
                xbs = self._through(B, pb, self.b2a, True)
                for xa in xas:
                    for xb in xbs:
                        if xa is not None and xb is not None:
                            cands.append((xa, xb))
                if len(xas) == 1 and len(xbs) == 1 and xas[0] is not None and xbs[0] is not None \
                        and xas[0] not in self.a2b and xbs[0] not in self.b2a and not self._compatible(xas[0], xbs[0]):
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
            if not pa and not pb and va in A.inputs and vb in B.inputs and \
                    A.inputs.index(va) == B.inputs.index(vb):
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


# ---------------------------------------------------------------------------------------------
# differences of matched nodes
# ---------------------------------------------------------------------------------------------
def _jsonable(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist() if v.size <= 16 else f"<{v.dtype} tensor {list(v.shape)}>"
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return v


def _max_abs(x: np.ndarray, y: np.ndarray) -> float | None:
    if x.shape != y.shape or x.dtype.kind not in "fiub" or y.dtype.kind not in "fiub":
        return None
    if x.size == 0:
        return 0.0
    d = np.abs(x.astype(np.float64) - y.astype(np.float64))
    return float(np.nanmax(d)) if not np.all(np.isnan(d)) else float("nan")


def _node_changes(M: _Matcher, a: int, b: int) -> list[Change]:
    A, B = M.A, M.B
    na, nb = A.nodes[a], B.nodes[b]
    ch: list[Change] = []
    if na.name != nb.name:
        ch.append(Change("renamed", "", na.name, nb.name))
    if na.op_type != nb.op_type:
        ch.append(Change("op_type", "", na.op_type, nb.op_type))
    if (na.domain or "ai.onnx") != (nb.domain or "ai.onnx"):
        ch.append(Change("domain", "", na.domain, nb.domain))
    aa, ab = M.attrs[0][a], M.attrs[1][b]
    for k in sorted(set(aa) | set(ab)):
        va, vb = aa.get(k), ab.get(k)
        if isinstance(va, np.ndarray) or isinstance(vb, np.ndarray):
            if isinstance(va, np.ndarray) and isinstance(vb, np.ndarray) and va.shape == vb.shape \
                    and va.dtype == vb.dtype and np.array_equal(va, vb, equal_nan=True):
                continue
            mad = _max_abs(va, vb) if isinstance(va, np.ndarray) and isinstance(vb, np.ndarray) else None
            ch.append(Change("attribute", k, _jsonable(va), _jsonable(vb), mad))
        elif va != vb:
            ch.append(Change("attribute", k, va, vb))
    ia, ib = [v for v in na.input if v], [v for v in nb.input if v]
    if len(ia) != len(ib):
        ch.append(Change("input_arity", "", len(ia), len(ib)))
    oa, ob = [v for v in na.output if v], [v for v in nb.output if v]
    if len(oa) != len(ob):
        ch.append(Change("output_arity", "", len(oa), len(ob)))
    for j, (va, vb) in enumerate(zip(na.output, nb.output)):
        ta, tb = A.value_type(va), B.value_type(vb)
        if ta[0] and tb[0] and ta[0] != tb[0]:
            ch.append(Change("dtype", f"output[{j}]", ta[0], tb[0]))
        if ta[1] is not None and tb[1] is not None and ta[1] != tb[1]:
            ch.append(Change("shape", f"output[{j}]", ta[1], tb[1]))
    for i, (va, vb) in enumerate(zip(na.input, nb.input)):
        if va in A.init and vb in B.init:
            xa, xb = A.array(va), B.array(vb)
            ta, tb = A.value_type(va), B.value_type(vb)
            if ta != tb:
                mad = _max_abs(xa, xb) if xa is not None and xb is not None else None
                ch.append(Change("initializer", f"input[{i}]", f"{ta[0]}{ta[1]}", f"{tb[0]}{tb[1]}", mad))
            elif xa is not None and xb is not None and not np.array_equal(xa, xb, equal_nan=True):
                ch.append(Change("initializer", f"input[{i}]", f"{ta[0]}{ta[1]}", f"{tb[0]}{tb[1]}", _max_abs(xa, xb)))
        elif (va in A.init) != (vb in B.init) and va and vb:
            pa, pb = A.producer.get(va), B.producer.get(vb)
            # a constant that became computed (or the reverse) other than through inserted casts
            if not (pb and M._through(B, pb[0], M.b2a, True) == [None] and va in A.init):
                ch.append(Change("rewired", f"input[{i}]", "constant" if va in A.init else "computed",
                                 "constant" if vb in B.init else "computed"))
        else:
            pa, pb = A.producer.get(va), B.producer.get(vb)
            if pa and pb:
                xa = M._through(A, pa[0], M.a2b, True)
                xb = M._through(B, pb[0], M.b2a, True)
                if len(xa) == 1 and len(xb) == 1 and xa[0] in M.a2b and xb[0] in M.b2a and M.a2b[xa[0]] != xb[0]:
                    ch.append(Change("rewired", f"input[{i}]", A.ids[xa[0]], B.ids[xb[0]]))
    return ch


# ---------------------------------------------------------------------------------------------
# regions
# ---------------------------------------------------------------------------------------------
def _regions(M: _Matcher, changed_idx: set[int]) -> list[Region]:
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
        regions.append(_classify(M, ai, bi, changed_idx))
    regions.sort(key=lambda r: (r.stage if r.stage is not None else -1, r.label))
    return regions


def _op_label(G: _Graph, i: int) -> str:
    nd = G.nodes[i]
    return nd.op_type if not nd.domain or nd.domain == "ai.onnx" else f"{nd.op_type}({nd.domain})"


def _classify(M: _Matcher, ai: list[int], bi: list[int], changed_idx: set[int]) -> Region:
    A, B = M.A, M.B
    a_ops = [_op_label(A, i) for i in ai]
    b_ops = [_op_label(B, j) for j in bi]
    la, lb = "+".join(a_ops), "+".join(b_ops)
    if ai and bi:
        kind = "fused" if len(bi) == 1 and len(ai) > 1 else "split" if len(ai) == 1 and len(bi) > 1 \
            else "replaced" if len(ai) == 1 else "rewritten"
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
    return Region(kind, label, [A.ids[i] for i in ai], [B.ids[j] for j in bi], a_ops, b_ops,
                  min(stages) if stages else None)


# ---------------------------------------------------------------------------------------------
# stages and anchors
# ---------------------------------------------------------------------------------------------
def _spread_stages(M: _Matcher) -> None:
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


def _walk_transforms(G: _Graph, v: str, matched: dict[int, int]) -> tuple[str, dict[str, Any]]:
    """From value ``v`` walk up through transparent producers that the other graph lacks (unmatched
    Cast/Transpose/Q/DQ ...; Identity nodes are passed whether matched or not, they change nothing)
    and return the source value and the transform between the source and ``v``:
    ``{"dtype": d}`` when a Cast converts a value computed in dtype ``d`` (e.g. ``float16`` cast back to
    ``float32`` by an fp16 conversion with float32 I/O), ``{"permute": p}`` for Transposes (``p`` maps
    ``v`` back onto the source layout), ``{"quantized": True}`` for Q/DQ."""
    tf: dict[str, Any] = {}
    perm = None
    while v in G.producer:
        i, _ = G.producer[v]
        nd = G.nodes[i]
        if nd.op_type not in TRANSPARENT_OPS or not nd.input or (i in matched and nd.op_type != "Identity"):
            break
        if nd.op_type == "Transpose":
            p = [a.ints for a in nd.attribute if a.name == "perm"]
            p = list(p[0]) if p else None
            if p is not None:
                perm = p if perm is None else [p[k] for k in perm]
        elif nd.op_type in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"):
            tf["quantized"] = True
        elif nd.op_type in ("Cast", "CastLike"):
            src = G.value_type(nd.input[0])[0]
            if src and src != G.value_type(v)[0]:
                tf["dtype"] = src  # the deepest cast wins: the dtype the value was computed in
        v = nd.input[0]
    if perm is not None:
        inv = [0] * len(perm)
        for k, p in enumerate(perm):
            inv[p] = k
        tf["permute"] = inv
    return v, tf


def _describe_tf(tf: dict[str, Any]) -> str:
    parts = []
    if "dtype" in tf:
        parts.append(f"a Cast from {tf['dtype']}")
    if "permute" in tf:
        parts.append(f"a Transpose (permute {tf['permute']} to undo)")
    if tf.get("quantized"):
        parts.append("QuantizeLinear/DequantizeLinear")
    return ", ".join(parts)


def _anchor_map(M: _Matcher) -> list[AnchorMatch]:
    A, B = M.A, M.B
    if A.manifest is not None:
        X, Y, x2y, flip = A, B, M.a2b, False
    elif B.manifest is not None:
        X, Y, x2y, flip = B, A, M.b2a, True
    else:
        return []
    ynames = {a.name: a for a in Y.manifest.anchors} if Y.manifest is not None else {}
    y_matched = M.a2b if flip else M.b2a
    out = []
    for anc in X.manifest.anchors:
        v = anc.value
        yv = None
        tf: dict[str, Any] = {}
        reason = ""
        if anc.kind == "output" and v in X.outputs and v in Y.outputs:
            yv = v
            _src, tf = _walk_transforms(Y, yv, y_matched)
            reason = "graph output of the same name"
        elif anc.kind == "output" and v in X.outputs and X.outputs.index(v) < len(Y.outputs) \
                and Y.outputs[X.outputs.index(v)] not in X.outputs:
            yv = Y.outputs[X.outputs.index(v)]
            _src, tf = _walk_transforms(Y, yv, y_matched)
            reason = "graph output at the same position"
        elif anc.name in Y.outputs:
            # exposed by the instrumentation as a graph output named like the anchor: what a backend
            # captures is that output, whatever was inserted in front of it
            yv = anc.name
            _src, tf = _walk_transforms(Y, yv, y_matched)
            reason = "exposed as graph output " + ("through " + _describe_tf(tf) if tf else "unchanged")
        elif anc.name in ynames:
            yv, reason = ynames[anc.name].value, "same anchor name in both manifests"
        elif v in X.producer and X.producer[v][0] in x2y:
            i, j = X.producer[v]
            y_node = Y.nodes[x2y[i]]
            if j < len(y_node.output):
                yv, reason = y_node.output[j], "output of the matched producer"
        if yv is None:
            # consumed by a matched node: its counterpart's input is the same value (maybe converted)
            for c, k in X.consumers.get(v, ()):
                if c in x2y and k < len(Y.nodes[x2y[c]].input):
                    cand = Y.nodes[x2y[c]].input[k]
                    _src, tf = _walk_transforms(Y, cand, y_matched)
                    yv, reason = cand, f"input {k} of the matched consumer {Y.ids[x2y[c]]}"
                    break
        if yv is None and v in Y.producer:
            yv, reason = v, "same value name"
        if yv is None:
            p = X.producer.get(v)
            why = f"producer {X.ids[p[0]]} ({X.op[p[0]]}) has no counterpart" if p else "no producer"
            out.append(AnchorMatch(anc.name, anc.stage, None if flip else v, v if flip else None, "unmapped",
                                   None, why))
            continue
        tx, ty = X.value_type(v), Y.value_type(yv)
        if tx[0] and ty[0] and tx[0] != ty[0]:
            tf.setdefault("dtype", ty[0])
        if tf.get("dtype") == tx[0]:  # cast there and back: nothing lost
            del tf["dtype"]
        status = "equivalent" if tf else "exact"
        a_v, b_v = (yv, v) if flip else (v, yv)
        out.append(AnchorMatch(anc.name, anc.stage, a_v, b_v, status, tf or None, reason))
    return out


def _stage_table(M: _Matcher, changed_a: set[int], regions: list[Region]) -> list[StageDiff]:
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
                st.a_ops.append(f"{_op_label(G, i)}:{G.ids[i]}:{status}")
            else:
                st.b_nodes += 1
                st.b_ops.append(f"{_op_label(G, i)}:{G.ids[i]}:{status}")
    for k, r in enumerate(regions):
        table.get(r.stage, table[idx[0]]).regions.append(k)
    return list(table.values())


# ---------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------
def _info(G: _Graph) -> GraphInfo:
    m = G.model
    return GraphInfo(
        path=G.path, num_nodes=len(G.nodes), op_counts=dict(Counter(_op_label(G, i) for i in range(len(G.nodes)))),
        opset={(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        producer=f"{m.producer_name} {m.producer_version}".strip(), has_manifest=G.manifest is not None,
        num_stages=len(G.manifest.stages) if G.manifest is not None else 0)


def _io_changes(A: _Graph, B: _Graph) -> list[Change]:
    """Differences of the graph inputs and outputs. Each list is paired by name first; only the
    inputs/outputs left unpaired on both sides are then paired by position among themselves (a
    ``renamed`` change); what is still left is reported as ``graph_input``/``graph_output`` only in
    A (``b`` None) or only in B (``a`` None). Paired values are compared by dtype and shape."""
    ch = []
    anchors = {a.name for G in (A, B) if G.manifest is not None for a in G.manifest.anchors}
    for kind, la, lb in (("input", A.inputs, B.inputs), ("output", A.outputs, B.outputs)):
        sb = set(lb)
        pairs = [(va, va) for va in la if va in sb]
        ra, rb = [v for v in la if v not in sb], [v for v in lb if v not in set(la)]
        # leftovers by position among themselves while the types agree; outputs exposing anchors
        # (named like an anchor of either manifest) are never paired by position: a different
        # anchor set is not a rename
        pa = [v for v in ra if v not in anchors]
        pb = [v for v in rb if v not in anchors]
        k = 0
        while k < min(len(pa), len(pb)) and A.value_type(pa[k]) == B.value_type(pb[k]):
            k += 1
        for va, vb in zip(pa[:k], pb[:k]):
            ch.append(Change("renamed", f"{kind}[{la.index(va)}]", va, vb))
            pairs.append((va, vb))
        paired_a, paired_b = set(pa[:k]), set(pb[:k])
        for va in ra:
            if va not in paired_a:
                ch.append(Change(f"graph_{kind}", f"{kind}[{la.index(va)}]", va, None))
        for vb in rb:
            if vb not in paired_b:
                ch.append(Change(f"graph_{kind}", f"{kind}[{lb.index(vb)}]", None, vb))
        for va, vb in pairs:
            ta, tb = A.value_type(va), B.value_type(vb)
            if ta[0] != tb[0]:
                ch.append(Change("dtype", f"{kind} {va}", ta[0], tb[0]))
            if ta[1] != tb[1]:
                ch.append(Change("shape", f"{kind} {va}", ta[1], tb[1]))
    return ch


def _opset_changes(A: _Graph, B: _Graph) -> list[Change]:
    """``opset`` changes: per domain (``ai.onnx`` for the default one), the imported version in A
    and B (None where a graph does not import the domain)."""
    oa = {(o.domain or "ai.onnx"): o.version for o in A.model.opset_import}
    ob = {(o.domain or "ai.onnx"): o.version for o in B.model.opset_import}
    return [Change("opset", d, oa.get(d), ob.get(d)) for d in sorted(set(oa) | set(ob)) if oa.get(d) != ob.get(d)]


def diff_models(model_a, model_b, *, path_a: str = "A", path_b: str = "B") -> GraphDiff:
    """Structurally diff two ONNX ``ModelProto`` s (see the module docstring for the algorithm).

    Initializer values are compared only when their data is in memory (load external data first).
    Raises GraphError when a graph has a cycle.
    """
    import time

    t0 = time.perf_counter()
    A, B = _Graph(model_a, path_a), _Graph(model_b, path_b)
    M = _Matcher(A, B)
    M.run()
    changed: list[NodeMatch] = []
    changed_a: set[int] = set()
    changes_by_a: dict[int, list[Change]] = {}
    for a, b in M.a2b.items():
        ch = _node_changes(M, a, b)
        if ch:
            changes_by_a[a] = ch
            changed_a.add(a)
    # "constants changed" hosts for folded-region detection (indices in A)
    hosts = {a for a, ch in changes_by_a.items() if any(c.kind == "initializer" for c in ch)}
    _spread_stages(M)
    regions = _regions(M, hosts)
    for a in sorted(changed_a):
        b = M.a2b[a]
        changed.append(NodeMatch(A.ids[a], B.ids[b], a, b, A.op[a], M.how[a], changes_by_a[a],
                                 A.stage[a] if A.stage[a] is not None else B.stage[b]))
    only_a = [NodeRef("a", A.ids[i], i, A.op[i], A.nodes[i].domain, A.stage[i])
              for i in range(len(A.nodes)) if i not in M.a2b]
    only_b = [NodeRef("b", B.ids[j], j, B.op[j], B.nodes[j].domain, B.stage[j])
              for j in range(len(B.nodes)) if j not in M.b2a]
    counts = Counter(M.how.values())
    d = GraphDiff(
        a=_info(A), b=_info(B), matched=len(M.a2b),
        match_counts={k: counts.get(k, 0) for k in ("name", "value", "structure", "propagation", "sequence")},
        changed=changed, only_a=only_a, only_b=only_b, regions=regions, anchors=_anchor_map(M),
        stages=_stage_table(M, changed_a, regions), io=_io_changes(A, B), opset=_opset_changes(A, B))
    d.seconds = time.perf_counter() - t0
    return d


def diff_files(path_a: str | Path, path_b: str | Path) -> GraphDiff:
    """Load two ``.onnx`` files (with their external weights) and diff them.

    Raises ModelLoadError for unreadable files, GraphError for cyclic graphs."""
    from anpred.onnx_io import load_model

    ma = load_model(path_a, load_external=True)
    mb = load_model(path_b, load_external=True)
    return diff_models(ma, mb, path_a=str(path_a), path_b=str(path_b))


def anchor_correspondence(model_a, model_b) -> list[AnchorMatch]:
    """Which anchors of A's manifest (else B's) exist in the other graph, and how (see AnchorMatch)."""
    return diff_models(model_a, model_b).anchors
