"""Binding configuration inputs: graph inputs that configure a model, rather than carry its data,
replaced by constants, and the control flow they select inlined.

A model may take, beside its data, an input that chooses *how* it computes: Silero VAD's sample rate
``sr`` (int64 scalar) selects, through ``If(Equal(sr, 16000))``, a 16 kHz or an 8 kHz network; a
``training``/``mode`` flag or a beam width does the same elsewhere. Such an input hides the whole
network inside one ``If``: the instrumentation places anchors in the main graph only, and several
converters have no ``If``. :class:`BindInputsPass` specialises the graph to the value the user fixes:

1. **bind**: each named graph input becomes an initializer of the given value (numpy array of the
   input's ONNX dtype and shape, :func:`coerce_value`) and leaves ``graph.input``;
2. **fold**: computations that now depend on constants and static input shapes only (the ``If``
   conditions: ``Equal(sr, 16000)``, ``Gather(Shape(x), -1) == 1`` ...) become initializers
   (:func:`passes.fold_shapes.fold_shape_computations`: integer/bool arithmetic on constants,
   ``Shape``/``Size`` of tensors whose shape ONNX shape inference knows, evaluated with
   ``onnx.reference``; float arithmetic is left to the runtimes);
3. **inline**: every ``If`` whose condition is now a constant is replaced by its taken branch alone
   (:class:`passes.control_flow.ControlFlowInlinePass` with ``constant_only=True``: names prefixed
   ``<if node>/then/`` or ``/else/``, the ``If`` outputs kept as ``Identity`` of the branch outputs);
   steps 2-3 repeat (at most :data:`MAX_ROUNDS`) since an inlined branch holds more ``If`` nodes
   whose conditions fold once their inputs are in the main graph;
4. **clean**: main-graph ``Constant`` nodes (a ``value`` tensor) become initializers; data movement
   on constants (:data:`LAYOUT_OPS`: ``Slice``, ``Concat``, ``Unsqueeze``, ``Reshape``, ``Transpose``,
   ``Gather`` ... of initializers, whatever their size and dtype) is evaluated into initializers
   (:func:`fold_constant_layout`; exact: these ops copy values, they compute none), so that weights
   an exporter re-orders at run time (a scripted PyTorch ``nn.LSTM``: the gates sliced and
   concatenated from ``weight_ih`` into the ONNX ``iofc`` order) reach the converters as the
   constants they require (onnx2torch's LSTM converter, :mod:`passes.recurrent`); then nodes whose
   results nothing reads are removed, and initializers nothing reads (the bound value itself once
   folded away).

The other graph inputs and every graph output keep their names, order and types; on the bound values
the specialised model computes exactly what the original computes (the same operators on the same
values: ``If`` selects a branch, it computes nothing). ``info``: ``{"bound": {name: {"dtype",
"shape", "value"}}, "folded": n, "inlined": [If node names], "ifs_left": [If nodes still in the main
graph], "constants_lifted": n, "layout_folded": n, "removed_nodes": n, "removed_initializers": n}``.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

import numpy as np

from anpred.errors import InputError
from passes.base import GraphPass, PassResult
from passes.protos import subgraph_reads

__all__ = [
    "BindInputsPass",
    "bind_inputs",
    "coerce_value",
    "parse_bindings",
    "bindable_inputs",
    "fold_constant_layout",
    "weight_inputs",
    "MAX_ROUNDS",
    "LAYOUT_OPS",
]

#: most fold + inline rounds (each inlines the Ifs whose conditions became constant)
MAX_ROUNDS = 16
#: operators that only move, select or copy values (no arithmetic, no rounding): evaluated on constants
#: by :func:`fold_constant_layout`
LAYOUT_OPS = (
    "Identity",
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Concat",
    "Slice",
    "Gather",
    "Split",
    "Expand",
    "Tile",
)
#: largest result (elements) :func:`fold_constant_layout` writes (a Tile/Expand may grow a constant)
LAYOUT_FOLD_MAX = 1 << 24


def parse_bindings(given: Mapping[str, Any] | Iterable[str] | str | None) -> dict[str, Any]:
    """The bindings ``{input name: value}`` from a mapping (returned as a dict) or from ``NAME=VALUE``
    texts (the CLI's ``--bind``; a string may hold several, comma-separated at the top level): VALUE
    is JSON (``16000``, ``0.5``, ``true``, ``[1, 2]``), else kept as the text. Dtypes and shapes are
    checked against the graph later (:func:`coerce_value`).

    Raises:
        InputError: an entry without ``=``, an empty name, a name given twice.
    """
    if given is None:
        return {}
    if isinstance(given, Mapping):
        out = {str(k): v for k, v in given.items()}
        if any(not k.strip() for k in out):
            raise InputError("bind: an empty input name")
        return out
    texts = _split_top(given) if isinstance(given, str) else [str(t) for t in given]
    out: dict[str, Any] = {}
    for t in texts:
        name, sep, raw = t.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name or not raw:
            raise InputError(f"bind {t!r}: expected NAME=VALUE (e.g. sr=16000, or mask=[1,0,1] for a tensor)")
        if name in out:
            raise InputError(f"bind: input {name!r} given twice")
        try:
            out[name] = json.loads(raw)
        except json.JSONDecodeError:
            out[name] = raw
    return out


def _split_top(text: str) -> list[str]:
    """``text`` split at commas outside brackets (``a=1,b=[1,2]`` -> ``a=1``, ``b=[1,2]``)."""
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (s.strip() for s in parts) if p] or [text]


def bindable_inputs(model) -> dict[str, tuple[str, list[int | None] | None]]:
    """The graph inputs of ``model`` that may be bound (initializers listed as inputs excluded):
    ``{name: (numpy dtype name, dims)}``, dims None where dynamic, None for an unknown rank."""
    from anpred.onnx_io import real_inputs

    return {name: (dtype, dims) for name, dtype, dims in real_inputs(model)}


def _inputs_text(avail: Mapping[str, tuple[str, Any]]) -> str:
    def dims(d):
        return "scalar" if d == [] else "?" if d is None else "x".join("?" if v is None else str(v) for v in d)

    return ", ".join(f"{n} ({dt} {dims(d)})" for n, (dt, d) in avail.items()) or "none"


def coerce_value(name: str, value: Any, dtype: str, dims: list[int | None] | None) -> np.ndarray:
    """``value`` as the array the graph input ``name`` (numpy ``dtype``, ``dims`` as in
    :func:`bindable_inputs`) would be fed: same rank, the static dimensions equal, the dtype the
    input's. A Python scalar binds a rank-0 input; a nested list or an array any rank.

    Raises:
        InputError: the value does not fit: another rank or dimension, a non-numeric value for a
        numeric input, a fractional value for an integer input, a value outside the integer dtype's
        range, a value other than 0/1/true/false for a bool input, an input dtype numpy lacks.
    """
    try:
        want = np.dtype(dtype)
    except TypeError as err:
        raise InputError(f"bind {name}: the input's dtype {dtype} cannot be bound (no numpy dtype)") from err
    try:
        a = np.asarray(value)
    except (ValueError, TypeError) as err:
        raise InputError(f"bind {name}={value!r}: not an array ({err})") from err
    if a.dtype.kind not in "biuf":
        raise InputError(
            f"bind {name}={value!r}: input {name!r} is {dtype}; give a number "
            f"{'or a nested list of numbers ' if dims else ''}(JSON)"
        )
    shape_txt = (
        "?" if dims is None else ("scalar" if not dims else "x".join("?" if d is None else str(d) for d in dims))
    )
    if dims is not None and (a.ndim != len(dims) or any(d is not None and d != s for d, s in zip(dims, a.shape))):
        raise InputError(
            f"bind {name}: value of shape {'x'.join(map(str, a.shape)) or 'scalar'} does not fit the "
            f"input's shape {shape_txt}"
        )
    if want.kind == "b":
        if not np.isin(a, (0, 1)).all():
            raise InputError(f"bind {name}={value!r}: input {name!r} is bool; give true/false or 0/1")
        return a.astype(bool)
    if want.kind in "iu":
        if a.dtype.kind == "f" and not np.all(np.isfinite(a) & (a == np.round(a))):
            raise InputError(f"bind {name}={value!r}: input {name!r} is {dtype}; the value is not an integer")
        info = np.iinfo(want)
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise InputError(f"bind {name}={value!r}: outside the range of {dtype} ({info.min} .. {info.max})")
        return a.astype(want)
    return a.astype(want)


class BindInputsPass(GraphPass):
    """Bind graph inputs to constants, fold, inline the ``If`` nodes they decide (module docstring).

    Args:
        values: ``{graph input name: value}`` (array, Python scalar or nested list; checked and cast
            by :func:`coerce_value`).

    The input model is left untouched (``in_place = False``); ``result.model`` is the specialised copy.

    Raises (when called):
        InputError: no value given, an unknown input name (the message lists the graph's inputs with
        their dtypes and shapes), a value that does not fit its input (:func:`coerce_value`).
    """

    in_place = False

    def __init__(self, values: Mapping[str, Any]):
        self.values = dict(values)

    def call(self, model) -> PassResult:
        import onnx
        from onnx import numpy_helper

        from passes.control_flow import inline_control_flow
        from passes.fold_shapes import fold_shape_computations

        if not self.values:
            raise InputError("bind: no input given")
        avail = bindable_inputs(model)
        unknown = sorted(set(self.values) - set(avail))
        if unknown:
            raise InputError(
                f"bind: no graph input named {', '.join(map(repr, unknown))}; the model's inputs: {_inputs_text(avail)}"
            )
        if len(self.values) == len(avail):
            raise InputError(f"bind: binding every graph input ({', '.join(avail)}) leaves nothing to feed")
        arrays = {n: coerce_value(n, v, *avail[n]) for n, v in self.values.items()}
        m = onnx.ModelProto()
        m.CopyFrom(model)
        g = m.graph
        kept = [vi for vi in g.input if vi.name not in arrays]
        del g.input[:]
        g.input.extend(kept)
        g.initializer.extend(numpy_helper.from_array(a, n) for n, a in arrays.items())
        shapes = {n: d for n, (_, d) in bindable_inputs(m).items() if d is not None and None not in d}
        folded, inlined = 0, []
        for _ in range(MAX_ROUNDS):
            m, n = fold_shape_computations(m, shapes)
            info = inline_control_flow(m, constant_only=True)
            folded += n
            inlined += info["inlined"]
            if not n and not info["inlined"]:
                break
        from passes.fold_shapes import fold_constant_nodes

        lifted = fold_constant_nodes(m)
        layout = fold_constant_layout(m)
        removed_nodes, removed_inits = _remove_dead(m)
        return PassResult(
            m,
            True,
            {
                "bound": {
                    n: {"dtype": str(a.dtype), "shape": list(a.shape), "value": a.tolist()} for n, a in arrays.items()
                },
                "folded": folded,
                "inlined": inlined,
                "ifs_left": [nd.name or nd.output[0] for nd in m.graph.node if nd.op_type == "If"],
                "constants_lifted": lifted,
                "layout_folded": layout,
                "removed_nodes": removed_nodes,
                "removed_initializers": removed_inits,
            },
        )


def fold_constant_layout(model) -> int:
    """Evaluate, in place, every main-graph node of :data:`LAYOUT_OPS` (default domain) whose inputs
    are all initializers, not a graph output, with a result of at most :data:`LAYOUT_FOLD_MAX`
    elements: its outputs become initializers (``onnx.reference.ReferenceEvaluator``, the model's
    opsets) and the node is removed, in graph order, so chains fold. Exact (no arithmetic). The
    initializers it read stay (remove unread ones afterwards). Needs the weights loaded. Returns the
    number of nodes folded; a node the reference evaluator fails on is left as it is."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    outputs = {o.name for o in g.output}
    keep, folded = [], 0
    for n in g.node:
        ins = [x for x in n.input if x]
        if (
            n.domain not in ("", "ai.onnx")
            or n.op_type not in LAYOUT_OPS
            or not ins
            or any(x not in inits for x in ins)
            or any(o in outputs for o in n.output)
        ):
            keep.append(n)
            continue
        feeds = {x: numpy_helper.to_array(inits[x]) for x in ins}
        vi = [helper.make_tensor_value_info(x, inits[x].data_type, list(inits[x].dims)) for x in ins]
        one = helper.make_model(
            helper.make_graph([n], "fold", vi, [helper.make_empty_tensor_value_info(o) for o in n.output if o]),
            opset_imports=list(model.opset_import),
        )
        try:
            res = ReferenceEvaluator(one).run(None, feeds)
        except Exception:  # noqa: BLE001 - left to the runtime
            keep.append(n)
            continue
        if any(np.asarray(r).size > LAYOUT_FOLD_MAX for r in res):
            keep.append(n)
            continue
        for o, r in zip([o for o in n.output if o], res):
            t = numpy_helper.from_array(np.asarray(r), o)
            g.initializer.append(t)
            inits[o] = t
        folded += 1
    if folded:
        del g.node[:]
        g.node.extend(keep)
    return folded


def _remove_dead(m) -> tuple[int, int]:
    """Nodes whose results nothing reads, then initializers nothing reads, removed (in place; value_info
    of removed values dropped). Returns ``(nodes removed, initializers removed)``."""
    g = m.graph
    keep = list(g.node)
    outputs = {o.name for o in g.output}
    while True:  # dead nodes, last first (ONNX ops have no side effects)
        used = outputs | {x for n in keep for x in n.input} | subgraph_reads(keep)
        live = [n for n in keep if any(o and o in used for o in n.output)]
        if len(live) == len(keep):
            break
        keep = live
    removed_nodes = len(g.node) - len(keep)
    del g.node[:]
    g.node.extend(keep)
    used = outputs | {x for n in keep for x in n.input} | subgraph_reads(keep)
    used_inits = [t for t in g.initializer if t.name in used]
    removed_inits = len(g.initializer) - len(used_inits)
    if removed_inits:
        del g.initializer[:]
        g.initializer.extend(used_inits)
    names = {o for n in keep for o in n.output} | {t.name for t in g.initializer} | {i.name for i in g.input}
    vis = [vi for vi in g.value_info if vi.name in names]
    del g.value_info[:]
    g.value_info.extend(vis)
    return removed_nodes, removed_inits


def bind_inputs(model, values: Mapping[str, Any]):
    """``(model', info)``: :class:`BindInputsPass` on ``model`` (left untouched); see the module
    docstring for ``info``. Raises InputError as the pass does."""
    r = BindInputsPass(values)(model)
    return r.model, r.info


def weight_inputs(model) -> list[str]:
    """The graph inputs of ``model`` that feed its operators as parameters rather than as data, in
    graph order: inputs that main-graph nodes read only at an operand position >= 1 (a Conv's or
    Gemm's ``W``/``B``, a normalization's ``scale``/``bias``, a Reshape's ``shape``, a
    QuantizeLinear's ``y_scale``), never as a first operand nor inside a sub-graph. Where every graph
    input would qualify, the first one is left out (something must remain fed).

    ONNX's node conformance cases feed such values as graph inputs, where a real model holds them as
    initializers; converters that need them constant (onnx2torch: ``KeyError: 'W'``; onnx2tf:
    ``IndexError``) get them bound with :func:`bind_inputs` (:mod:`anpred.conformance`). On those values
    the bound model computes what the original does (the same operators on the same values)."""
    avail = bindable_inputs(model)
    first: set[str] = set()
    later: set[str] = set()
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            (first if i == 0 else later).add(name)
    inner = subgraph_reads(model.graph.node)
    names = [vi.name for vi in model.graph.input if vi.name in avail]
    out = [n for n in names if n in later and n not in first and n not in inner]
    if out and len(out) == len(names):
        out = out[1:]
    return out
