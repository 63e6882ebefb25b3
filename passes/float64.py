"""The float64 widening: a float64 copy of a model for the float64 execution ``onnx-reference-fp64``
(:class:`anpred.backends.fp64.ReferenceFp64Backend`).

Every float32/float16/bfloat16 tensor is widened; slots the ONNX spec types ``tensor(float)`` itself
are kept by Casts (:func:`model_to_float64`, or :class:`Float64Pass` in a
:class:`passes.base.PassManager`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anpred.errors import BackendError
from passes.base import GraphPass, PassResult

__all__ = ["Float64Pass", "model_to_float64", "WIDENED_ELEM_TYPES", "DTYPE_ATTRIBUTES", "REFERENCE_FLOAT32_ONLY"]

#: the floating element types a float64 copy widens (float8 types are quantized data: left alone).
WIDENED_ELEM_TYPES = frozenset({1, 10, 16})  # TensorProto.FLOAT, FLOAT16, BFLOAT16
#: attributes that name the element type of a node's output (Cast ``to``, EyeLike/Random* ``dtype``,
#: DequantizeLinear-21 ``output_dtype``): a floating value (or default) becomes DOUBLE.
DTYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")
#: operators whose onnx.reference implementation returns float32 whatever its inputs' type
#: (``onnx/reference/ops/op_affine_grid.py``: ``grid.astype(np.float32)``).
REFERENCE_FLOAT32_ONLY = frozenset({"AffineGrid"})


def _widen_type(tp) -> bool:
    """Widen a ``TypeProto``'s floating element types to DOUBLE in place (tensor, sequence, optional,
    map values); True when something changed."""
    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        tt = getattr(tp, which)
        if tt.elem_type in WIDENED_ELEM_TYPES:
            tt.elem_type = 11  # DOUBLE
            return True
        return False
    if which == "sequence_type":
        return _widen_type(tp.sequence_type.elem_type)
    if which == "optional_type":
        return _widen_type(tp.optional_type.elem_type)
    if which == "map_type":
        return _widen_type(tp.map_type.value_type)
    return False


def _type_str(tp) -> str:
    """The ONNX schema spelling of a ``TypeProto`` (``tensor(float)``, ``seq(tensor(double))``); ""
    when unknown."""
    from onnx import TensorProto

    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        elem = getattr(tp, which).elem_type
        kind = "tensor" if which == "tensor_type" else "sparse_tensor"
        return f"{kind}({TensorProto.DataType.Name(elem).lower()})" if elem else ""
    if which in ("sequence_type", "optional_type"):
        inner = _type_str(getattr(tp, which).elem_type)
        return f"{'seq' if which == 'sequence_type' else 'optional'}({inner})" if inner else ""
    return ""


_FLOAT_SPELLINGS = ("(float)", "(float16)", "(bfloat16)")


def _widen_tensor(t) -> bool:
    """Replace a floating ``TensorProto``'s data by float64 (same name, dims), in place."""
    from onnx import numpy_helper

    if t.data_type not in WIDENED_ELEM_TYPES:
        return False
    arr = numpy_helper.to_array(t).astype(np.float64)
    new = numpy_helper.from_array(arr, t.name)
    if t.doc_string:
        new.doc_string = t.doc_string
    t.CopyFrom(new)
    return True


def _value_types(model) -> dict[str, Any]:
    """Value name -> ``TypeProto`` for every typed value of the model and its subgraphs (graph
    inputs/outputs, value_info after ``onnx.shape_inference``, initializers, Constant outputs)."""
    import onnx
    from onnx import helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - an un-inferable model keeps its own value_info
        inferred = model
    from anpred.onnx_io import iter_graphs

    types: dict[str, Any] = {}
    for g in iter_graphs(inferred.graph):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.WhichOneof("value"):
                types.setdefault(vi.name, vi.type)
        for t in g.initializer:
            types.setdefault(t.name, helper.make_tensor_type_proto(t.data_type, None))
    return types


def _slots(params, names: list[str]) -> list[tuple[str, Any]]:
    """Pair a node's input (or output) names with the schema's formal parameters (a variadic last
    parameter takes the rest); empty names (omitted optional inputs) are skipped."""
    out = []
    for i, n in enumerate(names):
        if not n:
            continue
        if i < len(params):
            out.append((n, params[i]))
        elif params and params[-1].option.name == "Variadic":
            out.append((n, params[-1]))
    return out


class _Widening:
    """One widening of a model copy: the value types read before it, and what it found and did
    (``problems``: nodes that do not take double; ``casts``: the slots kept by a Cast; ``counts``)."""

    def __init__(self, model):
        self.opsets = {imp.domain or "": int(imp.version) for imp in model.opset_import}
        self.types = _value_types(model)
        self.problems: list[str] = []
        self.casts: list[str] = []
        self.counts = {"widened_tensors": 0, "widened_values": 0, "dtype_attributes": 0}

    def is_float(self, name: str) -> bool:
        tp = self.types.get(name)
        return tp is not None and any(f in _type_str(tp) for f in _FLOAT_SPELLINGS)

    def graph(self, g) -> None:
        """Widen graph ``g`` (and its subgraphs) in place: its nodes, then its initializers and the
        element types of its inputs, outputs and value_info."""
        new_nodes = []
        back: set[str] = set()  # the input Casts already made in this graph
        for node in g.node:
            new_nodes += self.node(node, back)
        del g.node[:]
        g.node.extend(new_nodes)
        for t in g.initializer:
            self.counts["widened_tensors"] += _widen_tensor(t)
        for st in g.sparse_initializer:
            self.counts["widened_tensors"] += _widen_tensor(st.values)
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            self.counts["widened_values"] += _widen_type(vi.type)

    def node(self, node, back: set[str]) -> list:
        """Widen one node in place; returns it with the Casts put before and after it."""
        import onnx
        from onnx import defs

        dom = "" if node.domain in ("", "ai.onnx") else node.domain
        where = f"(node {node.name or node.output[0]!r})"
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                self.graph(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    self.graph(sg)
        floats_in = [n for n in node.input if n and self.is_float(n)]
        floats_out = [n for n in node.output if n and self.is_float(n)]
        if node.op_type in REFERENCE_FLOAT32_ONLY and dom == "":
            self.problems.append(f"{node.op_type} {where}: onnx.reference computes it in float32 only")
        try:
            schema = defs.get_schema(
                node.op_type, max_inclusive_version=self.opsets.get(dom, self.opsets.get("", 1)), domain=dom
            )
        except Exception:  # noqa: BLE001 - SchemaError: custom domain or model-local function
            if floats_in or floats_out or dom:
                self.problems.append(
                    f"{node.op_type} {where}: no ONNX schema for domain {dom or 'ai.onnx'!r}; "
                    "cannot tell whether it accepts double"
                )
            return [node]
        label = f"{node.op_type}-{schema.since_version} {where}"
        pre, post = self.slots(node, schema, label, back)
        # dtype attributes naming a floating type (explicit or by default) -> DOUBLE
        if floats_out:
            self.dtype_attributes(node, schema)
        self.tensor_attributes(node, dom, floats_out)
        return pre + [node] + post

    def slots(self, node, schema, label: str, back: set[str]) -> tuple[list, list]:
        """Check each floating input and output of ``node`` against the schema: a slot whose type
        parameter does not allow double is a problem; a slot the spec types ``tensor(float)`` itself
        gets a Cast. Returns the Casts to put before and after the node."""
        params = {t.type_param_str: list(t.allowed_type_strs) for t in schema.type_constraints}
        pre, post = [], []
        for kind, names, formal in (
            ("input", list(node.input), schema.inputs),
            ("output", list(node.output), schema.outputs),
        ):
            for v, fp in _slots(formal, names):
                if not self.is_float(v):
                    continue
                have = _type_str(self.types[v])
                want = have
                for f in _FLOAT_SPELLINGS:
                    want = want.replace(f, "(double)")
                if fp.type_str in params:
                    if want not in params[fp.type_str]:
                        self.problems.append(
                            f"{label}: {kind} {fp.name!r} is {have}, the spec's {fp.type_str} allows "
                            f"{', '.join(params[fp.type_str])}"
                        )
                    continue
                # a slot typed tensor(float) by the spec itself: keep that type at the slot
                self.keep_float_slot(node, kind, v, back, (pre, post))
                self.casts.append(f"{label}: {kind} {fp.name!r}")
        return pre, post

    def keep_float_slot(self, node, kind: str, v: str, back: set[str], pre_post: tuple[list, list]) -> None:
        """Keep the spec's own float type at a slot of ``node``: a Cast back to the value's original
        type in front of an input, a Cast to DOUBLE after an output (named ``<value>/fp64.cast``)."""
        from onnx import helper

        pre, post = pre_post
        tp = self.types[v]
        elem = tp.tensor_type.elem_type if tp.HasField("tensor_type") else 1
        if kind == "input":
            cast_name = f"{v}/fp64.cast"
            if cast_name not in back:  # one Cast per value and graph, before its first use
                back.add(cast_name)
                pre.append(helper.make_node("Cast", [v], [cast_name], to=elem, name=cast_name))
            for i, n in enumerate(node.input):
                if n == v:
                    node.input[i] = cast_name
        else:
            raw = f"{v}/fp64.raw"
            i = list(node.output).index(v)
            node.output[i] = raw
            post.append(helper.make_node("Cast", [raw], [v], to=11, name=f"{v}/fp64.cast"))

    def dtype_attributes(self, node, schema) -> None:
        """Set the :data:`DTYPE_ATTRIBUTES` of ``node`` that name a floating type, explicitly or by
        the schema's default, to DOUBLE."""
        import onnx
        from onnx import helper

        present = {a.name: a for a in node.attribute}
        for an in DTYPE_ATTRIBUTES:
            if an in present:
                if present[an].i in WIDENED_ELEM_TYPES:
                    present[an].i = 11
                    self.counts["dtype_attributes"] += 1
            elif an in schema.attributes:
                d = schema.attributes[an].default_value
                if d.type == onnx.AttributeProto.INT and d.i in WIDENED_ELEM_TYPES:
                    node.attribute.append(helper.make_attribute(an, 11))
                    self.counts["dtype_attributes"] += 1

    def tensor_attributes(self, node, dom: str, floats_out: list[str]) -> None:
        """Widen the tensor attributes of ``node``; a ``Constant`` ``value_float(s)`` becomes a float64
        ``value``, a floating ``ConstantOfShape`` without ``value`` gets a float64 zero."""
        import onnx
        from onnx import helper, numpy_helper

        for a in list(node.attribute):
            if a.type == onnx.AttributeProto.TENSOR:
                self.counts["widened_tensors"] += _widen_tensor(a.t)
            elif a.type == onnx.AttributeProto.TENSORS:
                self.counts["widened_tensors"] += sum(_widen_tensor(t) for t in a.tensors)
            elif a.type == onnx.AttributeProto.SPARSE_TENSOR:
                self.counts["widened_tensors"] += _widen_tensor(a.sparse_tensor.values)
            elif node.op_type == "Constant" and dom == "" and a.name in ("value_float", "value_floats"):
                arr = np.asarray(helper.get_attribute_value(a), dtype=np.float64)
                node.attribute.remove(a)
                node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(arr)))
                self.counts["widened_tensors"] += 1
        if (
            node.op_type == "ConstantOfShape"
            and dom == ""
            and floats_out
            and not any(a.name == "value" for a in node.attribute)
        ):
            node.attribute.append(helper.make_attribute("value", helper.make_tensor("value", 11, [1], [0.0])))
            self.counts["widened_tensors"] += 1


def _check_types(copy, original) -> None:
    """Raise BackendError when ``copy`` fails ``onnx.shape_inference.infer_shapes(strict_mode=True,
    check_type=True)`` while ``original`` passes it."""
    import onnx

    try:
        onnx.shape_inference.infer_shapes(copy, check_type=True, strict_mode=True)
    except Exception as err:  # noqa: BLE001 - InferenceError/ValidationError
        try:
            onnx.shape_inference.infer_shapes(original, check_type=True, strict_mode=True)
        except Exception:  # noqa: BLE001 - the original fails the same check: nothing to learn
            pass
        else:
            raise BackendError(f"the float64 copy fails ONNX type inference: {str(err).strip()[:500]}") from err


def model_to_float64(model) -> tuple[Any, dict[str, Any]]:
    """A float64 copy of ``model`` (an ``onnx.ModelProto`` with its weights loaded; not modified) for
    a float64 execution (:class:`anpred.backends.fp64.ReferenceFp64Backend`).

    Every float32/float16/bfloat16 tensor becomes float64: initializers (and sparse ones), tensor
    attributes (``Constant`` ``value``, ``ConstantOfShape`` ``value``; a ConstantOfShape without
    ``value`` gets a float64 zero, ``Constant`` ``value_float(s)`` becomes a float64 ``value``), the
    element types of graph inputs/outputs and value_info (subgraphs included), and the dtype
    attributes of :data:`DTYPE_ATTRIBUTES` (``Cast`` ``to``, ``EyeLike``/``RandomNormal``... ``dtype``,
    explicit or by the schema's default) that name a floating type. Integer, bool, string and float8
    tensors are left alone.

    The ONNX schema decides each node's slots (``onnx.defs.get_schema`` at the model's opset): a
    floating value at a slot whose type parameter allows ``tensor(double)`` is widened; a slot the
    spec types ``tensor(float)`` itself (``Resize`` ``scales``, ``QuantizeLinear`` ``y_scale``,
    ``NonMaxSuppression`` ``boxes``) gets a ``Cast`` back to its original type in front of it (inputs)
    or a ``Cast`` to DOUBLE after it (outputs), named ``<value>/fp64.cast``.

    The copy is checked with ``onnx.shape_inference.infer_shapes(strict_mode=True, check_type=True)``
    when the original passes that check.

    Returns:
        ``(copy, report)``; report: ``{"widened_tensors": n, "widened_values": n, "dtype_attributes": n,
        "casts_inserted": [...]}`` (the casts as ``"op node: slot"``).

    Raises:
        BackendError: a node whose operator does not accept double where the model has a floating
            tensor (``"QuantizeLinear-13 (node 'q'): input 'x' is tensor(float), the spec's T1 allows
            tensor(float), tensor(int32)"``), all such nodes named at once; an operator without an ONNX
            schema (custom domains, model-local functions); an operator onnx.reference computes in
            float32 only (:data:`REFERENCE_FLOAT32_ONLY`); a copy that fails ONNX type inference
            where the original passes (the message names the node).
    """
    import onnx

    original = model
    model = onnx.ModelProto()
    model.CopyFrom(original)

    widening = _Widening(model)
    for fn in model.functions:
        widening.problems.append(f"model-local function {fn.domain}.{fn.name}: not converted to float64")
    widening.graph(model.graph)
    problems = widening.problems
    if problems:
        raise BackendError(
            f"no float64 copy: {len(problems)} node(s) do not take double: "
            + "; ".join(problems[:10])
            + (" ..." if len(problems) > 10 else "")
        )
    _check_types(model, original)
    return model, {**widening.counts, "casts_inserted": widening.casts}


class Float64Pass(GraphPass):
    """:func:`model_to_float64` as a graph pass: returns the float64 copy (the input is left alone);
    ``info`` is the widening's report. Raises BackendError as :func:`model_to_float64` does."""

    in_place = False

    def call(self, model) -> PassResult:
        copy, report = model_to_float64(model)
        return PassResult(copy, True, report)
