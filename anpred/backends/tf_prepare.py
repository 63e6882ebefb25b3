"""The ``tf`` backend's pre-conversion step (:func:`prepare_for_onnx2tf`): the ONNX graph fixes that
onnx2tf 1.29 needs, applied to the backend's scratch copy before ``onnx2tf.convert`` (shared with
``litert``, which runs the same conversion)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["prepare_for_onnx2tf", "split_multi_axis_slices", "tf_safe_node_names"]


#: graph output names onnx2tf keeps as they are (it rewrites ':' to '__' and, with some options, a leading
#: '/'; an output whose name it rewrote is then silently left out of the Keras model)
_SAFE_OUTPUT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def prepare_for_onnx2tf(model) -> dict[str, Any]:
    """The tf backend's pre-conversion step on its scratch copy of the model (weights loaded,
    ``Constant`` nodes folded), in place. Returns ``{"outputs": {new output name: original name},
    "constant": [original names of dropped constant outputs], "unrolled": [recurrent node names],
    "inlined": [If/Loop node names], "slices_split": [Slice node names], "node_names": {new node name: original}}``.

    0. ``If``/``Loop`` nodes are inlined (:class:`passes.control_flow.ControlFlowInlinePass`): onnx2tf 1.29's
       ``If`` failed with ``KeyError`` on a branch that reads a value of the enclosing graph.
    1. ``LSTM``/``GRU``/``RNN`` nodes with a static sequence length are unrolled into elementary ops
       (:class:`passes.recurrent.RecurrentUnrollPass`): onnx2tf 1.29's recurrent layers failed on every
       such node whose ``X`` is a 3-D graph input (it transposes 3-D inputs to channels-last and its
       LSTM/GRU/RNN then reshape the wrong axes: ``InvalidArgumentError: Input to reshape is a tensor
       with 48 values, but the requested shape has 24``), and on bidirectional ones without initial
       states (``TypeError``).
    2. Graph outputs that depend on no graph input (constants: onnxsim folds them into initializers
       and onnx2tf's Keras model has no tensor for them) are removed from the outputs and reported.
    3. ``Slice`` nodes with constant parameters on more than one axis become a chain of one-axis
       ``Slice`` nodes (:func:`split_multi_axis_slices`).
    4. Node names that are not valid TensorFlow op names are made valid (:func:`tf_safe_node_names`;
       ``"node_names"`` maps the new names back).
    5. Every other graph output is renamed ``anpred_out_<i>`` through an appended
       ``Identity(value) -> anpred_out_<i>``: onnx2tf looks outputs up by name after rewriting ``:``
       to ``__`` and drops those it cannot find without an error (``get_tf_model_outputs``), so a model
       whose outputs carry TF-style names (``head/cls:0``) gave a Keras model with fewer outputs than
       the ONNX graph, and the outputs could not be mapped back to anchors.
    """
    from onnx import helper

    from passes.recurrent import unroll_recurrent

    from passes.control_flow import inline_control_flow

    g = model.graph
    inlined = inline_control_flow(model)["inlined"]
    unrolled = unroll_recurrent(model)["unrolled"]
    split = split_multi_axis_slices(model)
    node_names = tf_safe_node_names(model)
    variable = {i.name for i in g.input} - {t.name for t in g.initializer}
    for n in g.node:  # nodes are in topological order (ONNX requires it of the main graph)
        if n.op_type in ("RandomNormal", "RandomUniform") or any(v in variable for v in _node_reads(n)):
            variable.update(o for o in n.output if o)
    constant = [o.name for o in g.output if o.name not in variable]
    renamed: dict[str, str] = {}
    outputs = []
    taken = {v for n in g.node for v in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer}
    for k, o in enumerate(g.output):
        if o.name in constant:
            continue
        new = o.name
        if not _SAFE_OUTPUT.match(o.name) or o.name in variable and o.name in {i.name for i in g.input}:
            new = f"anpred_out_{k}"
            while new in taken:
                new += "_"
            taken.add(new)
            g.node.append(helper.make_node("Identity", [o.name], [new], name=f"anpred_rename/{new}"))
            renamed[new] = o.name
        vi = type(o)()
        vi.CopyFrom(o)
        vi.name = new
        outputs.append(vi)
    del g.output[:]
    g.output.extend(outputs)
    return {
        "outputs": renamed,
        "constant": constant,
        "unrolled": unrolled,
        "inlined": inlined,
        "slices_split": split,
        "node_names": node_names,
    }


def _node_reads(node) -> list[str]:
    """The values a node reads: its inputs and the outer-scope names its sub-graphs use."""
    from anpred.onnx_io import iter_graphs

    reads = [v for v in node.input if v]
    for a in node.attribute:
        for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for sub in iter_graphs(sg):
                reads.extend(v for n in sub.node for v in n.input if v)
    return reads


#: an ONNX Slice ``end`` at or above this (with ``start`` 0 and ``step`` 1) keeps the whole axis, whatever its size
_WHOLE_AXIS_END = 2**31 - 1


def split_multi_axis_slices(model) -> list[str]:
    """Rewrite, in the main graph of ``model`` (``onnx.ModelProto``, in place), every ``Slice`` whose
    ``starts``/``ends``/``axes``/``steps`` are initializers (opset >= 10) or attributes (opset < 10) and
    that cuts more than one axis into a chain of one-axis ``Slice`` nodes, one per axis in the node's
    ``axes`` order, leaving out axes it keeps whole (start 0, step 1, end >= 2^31 - 1); a Slice that
    keeps every axis whole becomes ``Identity``. The result is the same tensor (slicing distinct axes
    commutes). Returns the names of the rewritten nodes.

    Why: onnx2tf 1.29's ``Slice`` (``onnx2tf/ops/Slice.py``) converts the ``axes`` to its channels-last
    layout (``convert_axis``: NCHW axis 1 -> 3, 2 -> 1, 3 -> 2) but fills the ``tf.strided_slice``
    ``begin``/``end`` vectors positionally from ``starts``/``ends`` in the ONNX order; its re-ordering for
    unsorted axes is guarded by ``len(axes.shape) > 1``, never true for the 1-D ``axes``. So a Slice
    whose converted axes are not increasing cuts the wrong dimensions: magika's
    ``Slice(Conv output [1,512,508,1], axes [0,1,2,3], ends [max,max,max,1])`` on the channels-last
    ``[1,508,1,512]`` kept channel 0 only (``Conv_0/AddV2`` then nRMSE 1.32 against ONNX Runtime);
    ONNX ``axes`` [1, 2] of an NCHW tensor, or unsorted ``axes`` of any tensor, are cut wrongly alike.
    A one-axis Slice has nothing to re-order.
    """
    import numpy as np
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    taken = {v for n in g.node for v in list(n.input) + list(n.output)} | set(inits) | {i.name for i in g.input}

    def fresh(base: str) -> str:
        name = base
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    def const(base: str, values, dtype) -> str:
        name = fresh(base)
        g.initializer.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    out_nodes, rewritten = [], []
    for k, n in enumerate(g.node):
        params = _slice_params(n, inits)
        if params is None:
            out_nodes.append(n)
            continue
        starts, ends, axes, steps, dtype = params
        if len(axes) < 2:
            out_nodes.append(n)
            continue
        cut = [i for i in range(len(axes)) if not (steps[i] == 1 and starts[i] == 0 and ends[i] >= _WHOLE_AXIS_END)]
        base = n.name or f"slice_{k}"
        rewritten.append(base)
        if not cut:
            out_nodes.append(helper.make_node("Identity", [n.input[0]], [n.output[0]], name=f"{base}/whole"))
            continue
        src = n.input[0]
        for j, i in enumerate(cut):
            dst = n.output[0] if j == len(cut) - 1 else fresh(f"{base}/axis{int(axes[i])}")
            name = f"{base}/axis{int(axes[i])}"
            if n.input[1:]:  # opset >= 10: parameters are inputs
                ins = [
                    src,
                    const(f"{name}/starts", [starts[i]], dtype),
                    const(f"{name}/ends", [ends[i]], dtype),
                    const(f"{name}/axes", [axes[i]], dtype),
                    const(f"{name}/steps", [steps[i]], dtype),
                ]
                out_nodes.append(helper.make_node("Slice", ins, [dst], name=name))
            else:  # opset < 10: attributes, no steps
                out_nodes.append(
                    helper.make_node(
                        "Slice",
                        [src],
                        [dst],
                        name=name,
                        starts=[int(starts[i])],
                        ends=[int(ends[i])],
                        axes=[int(axes[i])],
                    )
                )
            src = dst
    del g.node[:]
    g.node.extend(out_nodes)
    return rewritten


def _slice_params(node, inits):
    """``(starts, ends, axes, steps, dtype)`` of a ``Slice`` node as int64 lists (``axes`` defaulting to
    ``0 .. len(starts)-1`` and ``steps`` to ones), or None when it is not a Slice or a parameter is
    computed (not an initializer)."""
    import numpy as np
    from onnx import helper, numpy_helper

    if node.op_type != "Slice" or node.domain not in ("", "ai.onnx"):
        return None
    if len(node.input) > 1:  # opset >= 10
        names = list(node.input[1:5]) + [""] * (5 - len(node.input))
        if any(v and v not in inits for v in names[:4]) or not names[0] or not names[1]:
            return None
        vals = [numpy_helper.to_array(inits[v]).reshape(-1) if v else None for v in names[:4]]
        dtype = vals[0].dtype
    else:
        attrs = {a.name: list(helper.get_attribute_value(a)) for a in node.attribute}
        if "starts" not in attrs or "ends" not in attrs:
            return None
        vals = [
            np.asarray(attrs["starts"]),
            np.asarray(attrs["ends"]),
            np.asarray(attrs["axes"]) if "axes" in attrs else None,
            None,
        ]
        dtype = np.int64
    starts, ends, axes, steps = vals
    if axes is None:
        axes = np.arange(len(starts))
    if steps is None:
        steps = np.ones(len(starts), dtype=np.int64)
    if not (len(starts) == len(ends) == len(axes) == len(steps)):
        return None
    return [int(v) for v in starts], [int(v) for v in ends], [int(v) for v in axes], [int(v) for v in steps], dtype


#: TensorFlow's op name rule (``tensorflow/python/framework/ops.py`` ``_VALID_OP_NAME_REGEX``); scope
#: names (``_VALID_SCOPE_NAME_REGEX``) allow the same characters, and any first character
_TF_OP_NAME = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*$")
_TF_INVALID_CHAR = re.compile(r"[^A-Za-z0-9_.\\/>-]")


def tf_safe_node_names(model) -> dict[str, str]:
    """Rename, in place, the main-graph nodes of ``model`` whose non-empty name is not a valid
    TensorFlow op name: each character outside ``[A-Za-z0-9_./>-]`` (and ``\\``) becomes ``_``, a
    leading ``_``/``/``/``-``/``>`` gets an ``n`` before it, and a clash with another node name gets
    ``_`` appended. Values are not renamed (anchors and outputs keep their names). Returns ``{new
    name: original name}``.

    Why: onnx2tf 1.29 passes the ONNX node name as the TensorFlow op or scope name in some of its
    converters (``ops/Softmax.py``: ``tf.nn.softmax(logits, axis, name=graph_node.name)``), and
    TensorFlow refuses names such as Paddle2ONNX's ``Softmax@0`` (``ValueError: 'Softmax@0' is not a
    valid scope name``): RapidOCR's text-orientation classifier (``ppocr-cls``) failed there."""
    names = {n.name for n in model.graph.node if n.name}
    renamed: dict[str, str] = {}
    for n in model.graph.node:
        if not n.name or _TF_OP_NAME.match(n.name):
            continue
        new = _TF_INVALID_CHAR.sub("_", n.name)
        if not re.match(r"[A-Za-z0-9.]", new):
            new = "n" + new
        while new in names:
            new += "_"
        names.add(new)
        renamed[new] = n.name
        n.name = new
    return renamed
