"""Stage partition: split an ONNX graph into contiguous slices of its topological order, closed by cuts.

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

Boundaries: ``K - 1`` of the admissible cuts, chosen by :func:`choose_cuts` (exact dynamic
programming) to minimise ``sum_s (cost_s / (total / K) - 1)^2`` plus a penalty per chosen cut:
``0.25 * (width - 1)``, :data:`SCOPE_PENALTY` (1.0) per tensor share that is not the output of a whole
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

import ast
import contextlib
import gc
import itertools
import operator
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from anpred.errors import GraphError
from passes.base import GraphPass, PassResult
from passes.graph import GraphIndex, build_index

ANCHOR_NODE_PREFIX = "anpred/"  # name prefix of the Identity nodes AnchorInsertionPass adds

#: ops through which a tensor keeps its layout (for the layout hint): elementwise ops and
#: rank-preserving data movement (Pad, Slice, Concat along any axis ...).
_LAYOUT_KEEP = frozenset({
    "Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish", "Clip", "Mul",
    "Add", "Sub", "Div", "Pow", "Sqrt", "Exp", "Log", "Abs", "Neg", "Identity", "Cast", "Erf", "Softplus",
    "PRelu", "Gelu", "Mish", "Max", "Min", "Dropout", "Where", "Mean", "Sum", "Reciprocal", "Floor", "Ceil",
    "Round", "Sign", "Softsign", "ThresholdedRelu", "Celu", "Sin", "Cos", "QuantizeLinear", "DequantizeLinear",
    # rank-preserving data movement: the axes keep their meaning
    "Pad", "Slice", "Split", "Concat", "Softmax", "LogSoftmax", "Tile", "Expand", "ReverseSequence",
})
_NCHW_OPS = frozenset({
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "BatchNormalization", "InstanceNormalization", "LpPool", "DepthToSpace", "SpaceToDepth", "Upsample",
    "Resize",
})
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                               "Multinomial", "Bernoulli"})
DEFAULT_STAGES = 8
_FLOAT_TYPES = frozenset({1, 10, 11, 16})  # float, float16, double, bfloat16


@dataclass
class StagePlan:
    """Stage ``index`` = nodes ``[first, last]`` (inclusive) of the topological order."""

    index: int
    first: int
    last: int
    num_nodes: int
    cost: float
    boundary: list[str]  # ONNX value names crossing the cut that closes this stage


@dataclass
class AnchorPlan:
    """A tensor to expose. ``order`` is its producer's topological position (-1 for a graph input)."""

    value: str
    kind: str  # "boundary" | "explicit" | "output"
    stage: int
    order: int
    producer: str
    op_type: str
    scope: str  # source module/layer whose output this tensor is, "" if none
    label: str  # scope if known, else the value name
    elem_type: int  # onnx.TensorProto data type (0 = unknown)
    shape: list[Any] | None  # ints / symbolic strings / None; None if rank unknown
    layout: str


@dataclass
class Partition:
    """Result of :class:`StagePartitionPass`: stages (contiguous, non-empty, covering all nodes) and
    the anchors in topological order (original outputs last, in graph-output order)."""

    stages: list[StagePlan]
    anchors: list[AnchorPlan]
    options: dict[str, Any]
    framework: str  # "torch-dynamo" | "torch-script" | "tf2onnx" | "paddle" | "onnx"
    cost_unit: str  # "flops" | "nodes"
    total_cost: float
    num_nodes: int
    candidates: int = 0  # number of cut positions within max_cut_width
    node_order: list[int] = field(default_factory=list)  # file index of each topological position
    value_names: set[str] = field(default_factory=set)  # every value name of the partitioned graph

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("node_order")
        d.pop("value_names")
        return d


# ------------------------------------------------------------------------------------------------
# source scopes
# ------------------------------------------------------------------------------------------------
def detect_framework(model, index: GraphIndex) -> str:
    prod = (model.producer_name or "").lower()
    if "tf2onnx" in prod:
        return "tf2onnx"
    if "paddle" in prod:
        return "paddle"
    if "pytorch" in prod or "torch" in prod:
        for n in index.nodes[:200]:
            if any(p.key == "pkg.torch.onnx.name_scopes" for p in n.metadata_props):
                return "torch-dynamo"
        return "torch-script"
    return "onnx"


def _torchscript_modules(name: str) -> list[str]:
    """``/model.22/cv2.0/cv2.0.0/conv/Conv`` -> ``[model.22, model.22.cv2.0, model.22.cv2.0.0,
    model.22.cv2.0.0.conv]`` (the last component is the op; a component that extends the previous one,
    as ModuleList/Sequential children are named, replaces it)."""
    if not name.startswith("/"):
        return []
    comps = [c for c in name.split("/")[1:-1] if c]
    mods: list[str] = []
    parts: list[str] = []
    for c in comps:
        if parts and c.startswith(parts[-1] + "."):
            parts[-1] = c
        else:
            parts.append(c)
        mods.append(".".join(parts))
    return mods


def _tf2onnx_modules(name: str, model_names: set[str]) -> list[str]:
    """tf2onnx node names look like ``<model>/<layer>/<op>`` or ``<layer>/<op>``; returns the layer."""
    comps = [c for c in name.split("/") if c]
    if len(comps) < 2:
        return []
    if comps[0] in model_names and len(comps) >= 3:
        return [comps[1]]
    return [comps[0]]


_TRACE_SUFFIX = re.compile(r"_\d+$")


def _strip_keras3_suffix(mods: list[list[str]], model_names: set[str]) -> list[list[str]]:
    """Keras 3 appends ``_<k>`` to every name scope while tracing (``smallcnn_1/conv1_1/Relu``). When
    the model scope and (nearly) all layer scopes carry such a suffix, drop one to recover the layer
    names."""
    layers = [m[0] for m in mods if m]
    if not layers or not model_names or not all(_TRACE_SUFFIX.search(n) for n in model_names):
        return mods
    if sum(bool(_TRACE_SUFFIX.search(x)) for x in layers) < 0.9 * len(layers):
        return mods
    return [[_TRACE_SUFFIX.sub("", m[0])] if m else [] for m in mods]


def node_modules(model, index: GraphIndex, framework: str) -> list[list[str]]:
    """Per topological position, the source modules enclosing the node, coarse to fine ("" never)."""
    out: list[list[str]] = []
    if framework == "torch-dynamo":
        for n in index.nodes:
            mods: list[str] = []
            for p in n.metadata_props:
                if p.key == "pkg.torch.onnx.name_scopes":
                    try:
                        scopes = ast.literal_eval(p.value)
                    except (ValueError, SyntaxError):
                        scopes = []
                    # the last entry is the FX op itself, the first the root module ("")
                    mods = [s for s in scopes[:-1] if s]
                    break
            out.append(mods)
    elif framework == "torch-script":
        out = [_torchscript_modules(n.name) for n in index.nodes]
    elif framework == "tf2onnx":
        firsts: dict[str, int] = {}
        for n in index.nodes:
            c = n.name.split("/", 1)[0]
            firsts[c] = firsts.get(c, 0) + 1
        # the Keras model's own name prefixes (almost) every node when the model is functional
        model_names = {c for c, k in firsts.items() if k > max(3, len(index.nodes) // 3)}
        out = _strip_keras3_suffix([_tf2onnx_modules(n.name, model_names) for n in index.nodes], model_names)
    else:
        out = [[]] * len(index.nodes)  # one shared empty list: never appended to
    return out


# ------------------------------------------------------------------------------------------------
# shapes, dtypes, costs
# ------------------------------------------------------------------------------------------------
_SIMPLE_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:]*$")  # not an expression like "floor(h/2) + 1"


def _decode_type(tp) -> tuple[int, list[Any] | None]:
    tt = tp.tensor_type  # default (elem_type 0) for sequence/map/optional types
    dims = tt.shape.dim
    if dims:
        simple = _SIMPLE_SYMBOL.match
        shape: list[Any] | None = []
        for d in dims:
            dv = d.dim_value
            if dv:
                shape.append(dv)
            else:
                dp = d.dim_param
                shape.append(dp if dp and simple(dp) and not dp.startswith("unk__") else None)
    else:
        shape = [] if tt.HasField("shape") else None
    return tt.elem_type, shape


def _collect_types(g, types) -> None:
    """Add ``name -> (elem_type, shape)`` for ``g``'s value_info, inputs, outputs and initializers.
    Types are decoded once per distinct serialised ``TypeProto`` (most tensors of a network share a
    few types), which makes this about 4x faster than decoding every dim of every value."""
    get = types.get
    decoded: dict[bytes, tuple[int, list[Any] | None]] = {}
    for vis in (g.value_info, g.input, g.output):
        for vi in vis:
            tp = vi.type
            key = tp.SerializeToString()
            new = decoded.get(key)
            if new is None:
                new = decoded[key] = _decode_type(tp)
            name = vi.name
            old = get(name)
            if old is None:
                types[name] = new  # shared between values of one type: never mutate a shape in place
            elif _known(new[1]) > _known(old[1]):
                types[name] = (new[0] or old[0], new[1])
    for t in g.initializer:
        types[t.name] = (t.data_type, list(t.dims))


def _known(shape) -> int:
    """Number of known dims (+1 for a known rank), to prefer the more complete inference."""
    if shape is None:
        return 0
    return 1 + sum(d is not None for d in shape)


_WEIGHT_BYTES = 4096  # initializers above this size are replaced by typed inputs for shape inference


def weightless_copy(model, fixed_inputs: dict[str, list[int]] | None = None):
    """A copy of ``model`` for shape inference only: initializers larger than 4 KiB (and every
    external-data initializer) become typed graph inputs (same name, dtype, dims; no data), small
    ones (shape constants that ``data_prop`` reads) stay. The copy costs about as much as the graph
    without its weights, and shape inference no longer serialises the weights twice. With
    ``fixed_inputs`` (``{input name: dims}``) those inputs' shapes are replaced."""
    import onnx

    src = model.graph
    inits = src.initializer
    big = [t for t in inits if t.data_location == 1 or t.ByteSize() > _WEIGHT_BYTES]
    m = onnx.ModelProto()
    if not big:
        m.CopyFrom(model)
    else:
        # copy everything but the graph's initializers, then add back the small ones
        saved = list(inits)
        keep = [t for t in saved if not (t.data_location == 1 or t.ByteSize() > _WEIGHT_BYTES)]
        shell = onnx.ModelProto()
        shell.ir_version = model.ir_version
        shell.opset_import.extend(model.opset_import)
        shell.functions.extend(model.functions)
        g = shell.graph
        g.node.extend(src.node)
        g.input.extend(src.input)
        g.output.extend(src.output)
        g.value_info.extend(src.value_info)
        g.sparse_initializer.extend(src.sparse_initializer)
        g.initializer.extend(keep)
        declared = {i.name for i in src.input}
        for t in big:
            if t.name not in declared:
                vi = g.input.add()
                vi.name = t.name
                tt = vi.type.tensor_type
                tt.elem_type = t.data_type
                tt.shape.SetInParent()
                for d in t.dims:
                    tt.shape.dim.add().dim_value = d
        m = shell
    if fixed_inputs:
        for i in m.graph.input:
            dims = fixed_inputs.get(i.name)
            if dims is not None:
                shp = i.type.tensor_type.shape
                del shp.dim[:]
                for d in dims:
                    shp.dim.add().dim_value = d
    return m


def infer_value_types(model, produced: list[str] | None = None, *, data_prop: bool = True,
                      _weightless: bool = False) -> dict[str, tuple[int, list[Any] | None]]:
    """``value -> (elem_type, shape)`` for inputs, outputs, initializers and every intermediate.

    ONNX shape inference first (``strict_mode=False, data_prop=True``, on :func:`weightless_copy`;
    ``data_prop=False`` saves ~15% where no shape is computed from tensor values, i.e. no ``Shape``/
    ``Size`` node);
    if it leaves dims unknown (typically Slice/Reshape targets computed from ``Shape`` in TorchScript
    exports), ONNX Runtime's symbolic shape inference (``onnxruntime.tools.symbolic_shape_infer``)
    fills them, when the inputs are static (with symbolic inputs it only yields sympy expressions,
    slowly). Shapes list ints, symbolic names (``"batch"``) or None (unknown); unknown rank gives
    ``shape=None``. ``produced`` (every node output name; computed when None) saves a pass over the
    graph."""
    import onnx

    light = model if _weightless else weightless_copy(model)
    types: dict[str, tuple[int, list[Any] | None]] = {}
    try:
        _collect_types(onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=data_prop).graph, types)
    except Exception:  # noqa: BLE001 - best effort; fall back to declared types
        _collect_types(model.graph, types)
    if produced is None:
        produced = [v for n in model.graph.node for v in n.output if v]
    incomplete = False
    if _fix_input_dims(model, copy=False) is None:
        get = types.get
        for v in produced:
            t = get(v)
            if t is None or t[1] is None or None in t[1]:
                incomplete = True
                break
    if incomplete:
        try:
            import contextlib
            import tempfile

            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

            # on incomplete inference it saves "sym_shape_infer_temp.onnx" into the working
            # directory: run it in a scratch one so the user's folder is left alone
            with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
                sym = SymbolicShapeInference.infer_shapes(light, auto_merge=True)
            if sym is not None:
                _collect_types(sym.graph, types)
        except Exception:  # noqa: BLE001 - unsupported op or missing weights: keep what we have
            pass
    for t in model.graph.initializer:  # the weightless copy declared some as inputs: same types
        types[t.name] = (t.data_type, list(t.dims))
    return types


COST_DIM = 256  # stands for a symbolic non-batch input dim in the cost estimate


def _fix_input_dims(model, copy: bool = True):
    """A weightless copy (:func:`weightless_copy`) of ``model`` whose symbolic/unknown input dims are
    fixed (first dim 1, others :data:`COST_DIM`) for the cost estimate only, or None if all input
    dims are static (with ``copy=False``: True instead of the copy)."""
    inits = {t.name for t in model.graph.initializer}
    dyn = [i for i in model.graph.input if i.name not in inits and i.type.HasField("tensor_type")
           and any(not d.HasField("dim_value") or d.dim_value <= 0 for d in i.type.tensor_type.shape.dim)]
    if not dyn:
        return None
    if not copy:
        return True
    fixed = {i.name: [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (1 if k == 0 else COST_DIM)
                      for k, d in enumerate(i.type.tensor_type.shape.dim)] for i in dyn}
    return weightless_copy(model, fixed)


def _numel(shape) -> int:
    if not shape:
        return 1
    n = 1
    for d in shape:
        if isinstance(d, int) and d > 0:
            n *= d
    return n


_HEAVY_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "MatMulInteger", "QLinearMatMul"})
_NO_TYPE = (0, None)


def node_cost(node, ins: list[str], outs: list[str], types) -> float | None:
    """FLOPs estimate for one node (None if its output shape is unknown)."""
    out_shapes = [types.get(v, (0, None))[1] for v in outs]
    if not out_shapes or out_shapes[0] is None:
        return None
    out_elems = sum(_numel(s) for s in out_shapes if s is not None)
    op = node.op_type
    if op in ("Conv", "ConvTranspose") and len(ins) >= 2:
        w = types.get(node.input[1], (0, None))[1]
        if w and len(w) >= 3:
            if op == "Conv":
                return 2.0 * out_elems * _numel(w[1:])
            x = types.get(node.input[0], (0, None))[1]
            return 2.0 * _numel(x) * _numel(w[1:])
    if op in ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul") and ins:
        a = types.get(node.input[0], (0, None))[1]
        if a:
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            k = a[0] if (op == "Gemm" and trans_a) else a[-1]
            if isinstance(k, int) and k > 0:
                return 2.0 * out_elems * k
    return float(max(out_elems, 1))


def _layout(index: GraphIndex, value: str, types, framework: str) -> str:
    et, shape = types.get(value, (0, None))
    if shape is None or et not in (1, 10, 11, 16):  # float, float16, double, bfloat16
        return "unknown"
    rank = len(shape)
    v = value
    for _ in range(64):  # walk back through layout-preserving ops
        p = index.producer.get(v)
        if p is None:
            if v in index.graph_inputs:
                return ({3: "NWC", 4: "NHWC", 5: "NDHWC"} if framework == "tf2onnx"
                        else {3: "NCW", 4: "NCHW", 5: "NCDHW"}).get(rank, "unknown")
            return "unknown"
        node = index.nodes[p]
        if node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            if perm == [0, 2, 3, 1]:
                return "NHWC"
            if perm == [0, 3, 1, 2]:
                return "NCHW"
            return "unknown"
        if node.op_type in _NCHW_OPS:
            return {3: "NCW", 4: "NCHW", 5: "NCDHW"}.get(rank, "unknown")
        if node.op_type in _LAYOUT_KEEP:
            nxt = [u for u in index.inputs[p] if index.is_data(u) and
                   len(types.get(u, (0, [None] * rank))[1] or []) == rank]
            if not nxt:
                return "unknown"
            v = nxt[0]
            continue
        return "unknown"
    return "unknown"


# ------------------------------------------------------------------------------------------------
# the pass
# ------------------------------------------------------------------------------------------------
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


@contextlib.contextmanager
def gc_paused():
    """Pause Python's cyclic garbage collector for the block (re-enabled after it if it was on).

    The passes allocate tens of thousands of small lists/tuples per 10k-node graph and create no
    reference cycles (everything is freed by reference counting), but each allocation burst makes the
    collector walk every tracked object again: 10-20% of the partition's time on the synthetic
    10.5k-node graph (benchmarks/bench_instrument.py)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


SCOPE_PENALTY = 1.0  # a boundary tensor that is not the output of a whole source module (see docs)
_DP_BINS = 16  # candidate bins per stage for the exact dynamic programme
_DP_MAX = 512  # most candidates the exact dynamic programme considers
_DP_MAX_CUTS = 128  # above this many cuts, the linear target-matching programme is used


def choose_cuts(cum_cost: list[float], penalty: list[float], total: float, stages: int) -> list[int]:
    """Pick ``stages - 1`` of the candidate cuts (indices into ``cum_cost``, ascending), minimising

        sum over stages of (cost_s / (total / stages) - 1)^2  +  sum over chosen cuts of penalty

    where ``cost_s`` is the cost between consecutive cuts (the first stage starts at cost 0, the last
    ends at ``total``) and ``cum_cost[k]`` is the cumulative cost up to and including cut ``k``'s node
    (non-decreasing). Exact dynamic programming over the candidates (the linear-partition recurrence,
    O(stages * C^2) with numpy); with more than ``min(16 * stages, 512)`` candidates they are first
    thinned to the lowest-penalty candidate per bin of ``total / min(16 * stages, 512)`` cost (a
    balance loss of at most 1/16 of a stage). With more than 128 cuts to choose, the linear
    target-matching programme :func:`_match_targets` (cut ``j`` close to ``j * total / stages``) is
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
        return _match_targets(P, pen, total, stages, m)
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


def _match_targets(P, pen, total: float, stages: int, m: int) -> list[int]:
    """``m`` ascending candidates, cut j as close as possible to ``j * total / stages``: minimises
    sum_j |P[c_j] - t_j| / step + pen[c_j] by dynamic programming with prefix minima, O(m * C)."""
    import numpy as np

    C = len(P)
    step = total / stages if total > 0 else 1.0
    back = np.zeros((m, C), dtype=np.int64)
    f = np.abs(P - step) / step + pen
    f[C - m + 1:] = np.inf  # leave room for the later cuts
    for j in range(1, m):
        pm = np.minimum.accumulate(f)
        am = np.zeros(C, dtype=np.int64)
        better = np.r_[True, f[1:] < pm[:-1]]
        am = np.maximum.accumulate(np.where(better, np.arange(C), 0))
        prev = np.r_[np.inf, pm[:-1]]  # best of k' < k
        f = prev + np.abs(P - step * (j + 1)) / step + pen
        f[:j] = np.inf
        if C - m + j + 1 < C:
            f[C - m + j + 1:] = np.inf
        back[j] = np.r_[0, am[:-1]]
    k = int(np.argmin(f))
    picks = [k]
    for j in range(m - 1, 0, -1):
        k = int(back[j][k])
        picks.append(k)
    picks.reverse()
    return picks


def _is_anchor_node(node) -> bool:
    return node.op_type == "Identity" and node.name.startswith(ANCHOR_NODE_PREFIX)


def _has_anchor_nodes(graph) -> bool:
    starts = operator.methodcaller("startswith", ANCHOR_NODE_PREFIX)
    names = [n.name for n in graph.node]
    if not any(map(starts, names)):  # the common case, at C speed
        return False
    return any(starts(nm) and n.op_type == "Identity" for nm, n in zip(names, graph.node))


def strip_anchor_nodes(model) -> bool:
    """Remove what :class:`AnchorInsertionPass` added (its Identity nodes and their graph outputs) and
    the stored manifest, in place. Returns True if anything was removed."""
    from anpred.manifest import METADATA_KEY

    g = model.graph
    added: set[str] = set()
    if _has_anchor_nodes(g):
        prefix = ANCHOR_NODE_PREFIX
        marks = [n.name.startswith(prefix) and n.op_type == "Identity" for n in g.node]
        added = {n.output[0] for n, m in zip(g.node, marks) if m}
    changed = False
    if added:
        keep_nodes = [n for n, m in zip(g.node, marks) if not m]
        keep_out = [o for o in g.output if o.name not in added]
        del g.node[:]
        g.node.extend(keep_nodes)
        del g.output[:]
        g.output.extend(keep_out)
        changed = True
    if any(p.key == METADATA_KEY for p in model.metadata_props):
        props = [p for p in model.metadata_props if p.key != METADATA_KEY]
        del model.metadata_props[:]
        model.metadata_props.extend(props)
        changed = True
    return changed


class StagePartitionPass(GraphPass):
    """Find stage boundaries. Never modifies the model; the plan is in ``result.info["partition"]``.

    Args:
        stages: number of stages K (K-1 cuts); None picks about 8 (fewer for small graphs). Exactly
            K stages result when K-1 admissible cuts exist; otherwise one per cut plus one, with a
            note in ``partition.options["notes"]``.
        max_cut_width: the most tensors a cut may hold (>= 1).
        anchors: explicit tensor names to expose as well (kind ``explicit``).

    Raises:
        GraphError: no inputs, a cycle, a dangling value, an unknown or constant ``anchors`` name.
    """

    in_place = False

    def __init__(self, stages: int | None = None, max_cut_width: int = 4, anchors=()):
        if stages is not None and stages < 1:
            raise GraphError(f"--stages must be at least 1 (got {stages})")
        if max_cut_width < 1:
            raise GraphError(f"--max-cut-width must be at least 1 (got {max_cut_width})")
        self.stages = stages
        self.max_cut_width = max_cut_width
        self.anchors = list(anchors)

    def call(self, model) -> PassResult:
        with gc_paused():
            return self._call(model)

    def _call(self, model) -> PassResult:
        index = build_index(model.graph)
        prefix = ANCHOR_NODE_PREFIX
        if any(op == "Identity" and n.name.startswith(prefix) for op, n in zip(index.op_types, index.nodes)):
            import onnx

            clean = onnx.ModelProto()
            clean.CopyFrom(model)
            strip_anchor_nodes(clean)
            part = self.plan(clean)
        else:
            part = self.plan(model, index)
        return PassResult(model, False, {"partition": part})

    # ---------------------------------------------------------------------------------------------
    def plan(self, model, index: GraphIndex | None = None) -> Partition:
        """The partition of ``model`` (``index``: its :func:`~passes.graph.build_index`, if built)."""
        if index is None:
            index = build_index(model.graph)
        n = len(index.nodes)
        if n == 0:
            raise GraphError("the graph has no nodes")
        framework = detect_framework(model, index)
        produced = [v for out in index.outputs for v in out]
        # data propagation only matters for values computed from shapes or constants (Reshape targets)
        data_prop = not all(index.data_node)
        types = infer_value_types(model, produced, data_prop=data_prop)
        cost_types = types
        fixed = _fix_input_dims(model)
        if fixed is not None:
            cost_types = infer_value_types(fixed, produced, data_prop=data_prop, _weightless=True)
        mods = node_modules(model, index, framework)

        # explicit anchors
        known = set(index.producer) | set(index.graph_inputs)
        for a in self.anchors:
            if a not in known:
                if a in index.initializers:
                    raise GraphError(f"--anchor {a!r} is an initializer (a constant), not an activation")
                import difflib

                close = difflib.get_close_matches(a, sorted(known), n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise GraphError(f"--anchor {a!r}: no tensor of that name in the graph{hint}")
            if not index.is_data(a):
                raise GraphError(f"--anchor {a!r} is computed from constants or shapes only; it is not an "
                                 "activation and cannot be an anchor")

        # costs
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
            if ops[p] in _HEAVY_OPS:
                c = node_cost(nodes[p], index.inputs[p], outs, cost_types)
            else:  # elementwise and data movement: one op per output element
                c = None
                for k, v in enumerate(outs):
                    sh = tget(v, _NO_TYPE)[1]
                    if sh is None:
                        if k == 0:
                            break
                        c += 1.0  # _numel(None): an output of unknown shape counts one
                        continue
                    key = tuple(sh)
                    e = numel_of.get(key)
                    if e is None:
                        e = numel_of[key] = float(_numel(sh))
                    c = e if c is None else c + e
            if c is None:
                unknown += 1
                c = 1.0
            costs[p] = c
        cost_unit = "flops"
        if data_nodes == 0 or unknown > data_nodes // 2:
            cost_unit = "nodes"
            costs = [1.0 if live[p] and data_node[p] else 0.0 for p in range(n)]
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
        odd = [v for v, t in types.items() if t[0] not in _FLOAT_TYPES]  # few: most tensors are float
        untyped = {v for v in odd if not types[v][0]} | missing
        if untyped:  # an output needs an element type
            cands = [c for c in cands if untyped.isdisjoint(c[1])]
        nonfloat = set(odd) | missing
        out_set = set(index.graph_outputs)

        # choose boundaries
        live_data = sum(1 for c in costs if c > 0)
        auto = max(1, min(DEFAULT_STAGES, live_data // 4))
        wanted = self.stages if self.stages is not None else auto
        K = min(wanted, len(cands) + 1)
        notes: list[str] = []
        if K < wanted:
            what = f"asked for {wanted} stages" if self.stages is not None else f"automatic choice: {wanted} stages"
            notes.append(f"{what}, but the graph has only {len(cands)} admissible cuts of width <= "
                         f"{self.max_cut_width}, so {K} stages" +
                         (" (a larger --max-cut-width allows more)" if self.max_cut_width < 8 else ""))
        has_scopes = any(mods)

        def penalty(cut) -> float:
            s = 0.25 * (len(cut) - 1)
            if has_scopes:
                depths = [module_output_scope(index.producer[v])[1] for v in cut]
                s += sum(SCOPE_PENALTY if d == 0 else 0.1 * (d - 1) for d in depths) / len(cut)
            if not nonfloat.isdisjoint(cut):
                s += 1.0
            return s

        if has_scopes or nonfloat:
            pens = [penalty(c) for _, c in cands]
        else:  # only the width term
            pens = [0.25 * (w - 1) for w in map(len, (c for _, c in cands))]
        picks = choose_cuts([prefix[p] for p, _ in cands], pens, total, K)
        chosen = [(cands[k][0], sorted(cands[k][1], key=lambda v: (index.producer[v], v))) for k in picks]
        # stages
        stages: list[StagePlan] = []
        first = 0
        for i, (pos, cut) in enumerate(chosen):
            stages.append(StagePlan(i, first, pos, pos - first + 1, prefix[pos] - (prefix[first - 1] if first else 0.0), list(cut)))
            first = pos + 1
        stages.append(StagePlan(len(chosen), first, n - 1, n - first,
                                total - (prefix[first - 1] if first else 0.0), list(index.graph_outputs)))
        if K > 1 and total > 0:
            import bisect

            cand_pos = [p for p, _ in cands]
            for st in stages:  # a stage far over its share that no admissible cut could split
                if st.cost > max(2.0 / K, 0.2) * total and \
                        bisect.bisect_left(cand_pos, st.first) == bisect.bisect_left(cand_pos, st.last):
                    notes.append(f"stage {st.index} carries {100 * st.cost / total:.0f}% of the cost: no admissible "
                                 f"cut of width <= {self.max_cut_width} lies inside it (nodes {st.first}..{st.last})")
        import bisect

        stage_lasts = [st.last for st in stages]

        def stage_of(p: int) -> int:
            return bisect.bisect_left(stage_lasts, p)

        # anchors
        def plan_anchor(v: str, kind: str) -> AnchorPlan:
            p = index.producer.get(v, -1)
            node = index.nodes[p] if p >= 0 else None
            scope = module_output_scope(p)[0] if p >= 0 else ""
            et, shape = types.get(v, (0, None))
            return AnchorPlan(
                value=v, kind=kind, stage=stages[-1].index if kind == "output" else (stage_of(p) if p >= 0 else 0),
                order=p, producer=(node.name if node is not None else ""),
                op_type=(node.op_type if node is not None else ""), scope=scope, label=scope or v,
                elem_type=et, shape=list(shape) if shape is not None else None,
                layout=_layout(index, v, types, framework))

        explicit = set(self.anchors)
        seen: set[str] = set()
        inner: list[AnchorPlan] = []
        for _, cut in chosen:
            for v in cut:
                if v not in seen:
                    seen.add(v)
                    inner.append(plan_anchor(v, "explicit" if v in explicit else "boundary"))
        for v in self.anchors:
            if v not in seen and v not in out_set:
                seen.add(v)
                inner.append(plan_anchor(v, "explicit"))
        inner.sort(key=lambda a: (a.order, a.value))
        outs = []
        for v in index.graph_outputs:
            if v not in seen:
                seen.add(v)
                outs.append(plan_anchor(v, "output"))

        return Partition(
            stages=stages, anchors=inner + outs,
            options={"stages": self.stages, "max_cut_width": self.max_cut_width, "anchors": list(self.anchors),
                     "notes": notes},
            framework=framework, cost_unit=cost_unit, total_cost=total, num_nodes=n, candidates=len(cands),
            node_order=list(index.file_index),
            value_names=set(index.producer) | set(index.graph_inputs) | index.initializers)
