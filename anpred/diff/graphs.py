"""One side of a structural diff: an ONNX graph indexed for matching, and what nodes are compared by.

:class:`DiffGraph` wraps ``passes.graph``'s :class:`~passes.graph.GraphIndex` (built with
:func:`~passes.graph.build_lenient_index`: the diff takes the graphs as they are): the nodes in its
topological order, the edges with their slots (:meth:`~passes.graph.GraphIndex.value_slots`), the value
types from ONNX shape inference, the initializers as arrays (read once, on demand) and the ANPRED
stage of each node when the model carries an anchor manifest. Positions (``int``) index
:attr:`DiffGraph.nodes` everywhere in :mod:`anpred.diff`.

Nodes are compared by their attributes with schema defaults dropped (:func:`normalized_attrs`), so
exporters that spell defaults out and those that omit them agree; :data:`TRANSPARENT_OPS` are the
operators that only convert or re-layout a value.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import numpy as np

from anpred.manifest import AnchorManifest
from anpred.onnx_io import elem_type_name
from passes.graph import build_lenient_index

__all__ = ["TRANSPARENT_OPS", "DiffGraph", "value_types", "attr_value", "normalized_attrs", "attr_sig", "op_label"]

#: Operators that convert or re-layout a value without computing anything new: when only these are
#: on one side of a region it is an insertion/removal, and propagation looks through them.
TRANSPARENT_OPS = frozenset(
    {
        "Cast",
        "CastLike",
        "Transpose",
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "Identity",
        "ReorderInput",
        "ReorderOutput",
    }
)


class DiffGraph:
    """Index over one ONNX graph: topological node list, producers, consumers, constants, types.

    Attributes: ``model``, ``path``; ``nodes`` (``NodeProto`` in topological order); ``init``
    (initializer name -> ``TensorProto``); ``index`` (the graph index); ``inputs`` (real graph inputs), ``outputs``;
    ``producer`` (value -> ``(position, output slot)``), ``consumers`` (value -> ``[(position, input slot), ...]``);
    ``ids`` (node name, or ``#<position>`` for an unnamed node); ``op`` (op types); ``types`` (see
    :func:`value_types`); ``manifest`` (the anchor manifest or None); ``stage`` (ANPRED stage per
    node or None, filled from the manifest here and completed by :func:`anpred.diff.stages.spread_stages`).

    Raises GraphError (from the index) when the graph has a cycle or a value produced twice.
    """

    def __init__(self, model, path: str = ""):
        from onnx import numpy_helper

        self.model = model
        self.path = path
        g = model.graph
        self.init = {t.name: t for t in g.initializer}
        self._init_arrays: dict[str, np.ndarray] = {}
        self._numpy_helper = numpy_helper
        self.index = build_lenient_index(g)
        self.inputs = self.index.graph_inputs
        self.outputs = self.index.graph_outputs
        self.nodes = self.index.nodes
        n = len(self.nodes)
        self.producer, self.consumers = self.index.value_slots()
        self.ids = [nd.name if nd.name else f"#{i}" for i, nd in enumerate(self.nodes)]
        self.op = self.index.op_types
        self.types = value_types(model)
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
        later from their matches and neighbours (:func:`anpred.diff.stages.spread_stages`)."""
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
        """Initializer ``name`` as an array (cached); None when it is not an initializer or its data
        cannot be read (external data not loaded, exotic dtype: compared by shape only)."""
        if name not in self.init:
            return None
        if name not in self._init_arrays:
            try:
                self._init_arrays[name] = self._numpy_helper.to_array(self.init[name])
            except Exception:  # external data not loaded, exotic dtype: compare by shape only
                return None
        return self._init_arrays[name]

    def init_sig(self, name: str) -> str:
        """The shape of initializer ``name`` as ``"d0xd1x..."``."""
        t = self.init[name]
        return "x".join(str(d) for d in t.dims)

    def value_type(self, v: str) -> tuple[str | None, list | None]:
        """``(dtype name, shape)`` of value ``v`` (``(None, None)`` when unknown)."""
        if v in self.init:
            t = self.init[v]
            return elem_type_name(t.data_type), list(t.dims)
        return self.types.get(v, (None, None))


def value_types(model) -> dict[str, tuple[str | None, list | None]]:
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
        out[vi.name] = (elem_type_name(tt.elem_type) if tt.elem_type else None, shape)
    return out


def attr_value(attr) -> Any:
    """An attribute as a comparable, JSON-friendly value (tensors -> ndarray, graphs -> digest)."""
    from onnx import AttributeProto, helper, numpy_helper

    if attr.type == AttributeProto.TENSOR:
        try:
            return numpy_helper.to_array(attr.t)
        except Exception:
            return "tensor:" + hashlib.sha1(attr.t.SerializeToString()).hexdigest()[:12]
    if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
        data = (
            attr.g.SerializeToString()
            if attr.type == AttributeProto.GRAPH
            else b"".join(x.SerializeToString() for x in attr.graphs)
        )
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
    return {
        k: attr_value(v.default_value)
        for k, v in schema.attributes.items()
        if v.default_value.name or v.default_value.type
    }


def normalized_attrs(nd) -> dict[str, Any]:
    """Attributes of ``nd`` with those equal to their ONNX schema default dropped (``auto_pad=NOTSET``,
    ``group=1``, ``ceil_mode=0``, all-zero ``pads``, all-one ``strides``/``dilations`` ...), so that
    exporters that spell defaults out and those that omit them compare equal."""
    out = {a.name: attr_value(a) for a in nd.attribute}
    defaults = _schema_defaults(nd.op_type, nd.domain or "")
    for k in list(out):
        v = out[k]
        if k in defaults and not isinstance(v, np.ndarray) and v == defaults[k]:
            del out[k]
        elif k in _LIST_DEFAULTS and isinstance(v, list) and all(x == _LIST_DEFAULTS[k] for x in v):
            del out[k]
    return out


def attr_sig(v: Any) -> str:
    """A short hashable spelling of an attribute value for the structural labels (tensors over 16
    elements by dtype kind and shape, floats to 6 significant digits)."""
    if isinstance(v, np.ndarray):
        return f"T{v.dtype.kind}{v.shape}" if v.size > 16 else f"T{v.dtype.kind}{v.tolist()}"
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


def op_label(G: DiffGraph, i: int) -> str:
    """Op type of node ``i``, with ``(domain)`` appended outside the default domain."""
    nd = G.nodes[i]
    return nd.op_type if not nd.domain or nd.domain == "ai.onnx" else f"{nd.op_type}({nd.domain})"
