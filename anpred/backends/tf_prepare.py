"""The ``tf`` backend's pre-conversion step (:func:`prepare_for_onnx2tf`): the ONNX graph fixes that
onnx2tf 1.29 needs, applied to the backend's scratch copy before ``onnx2tf.convert`` (shared with
``litert``, which runs the same conversion)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["prepare_for_onnx2tf"]


#: graph output names onnx2tf keeps as they are (it rewrites ':' to '__' and, with some options, a leading
#: '/'; an output whose name it rewrote is then silently left out of the Keras model)
_SAFE_OUTPUT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def prepare_for_onnx2tf(model) -> dict[str, Any]:
    """The tf backend's pre-conversion step on its scratch copy of the model (weights loaded,
    ``Constant`` nodes folded), in place. Returns ``{"outputs": {new output name: original name},
    "constant": [original names of dropped constant outputs], "unrolled": [recurrent node names],
    "inlined": [If/Loop node names]}``.

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
    3. Every other graph output is renamed ``anpred_out_<i>`` through an appended
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
    return {"outputs": renamed, "constant": constant, "unrolled": unrolled, "inlined": inlined}


def _node_reads(node) -> list[str]:
    """The values a node reads: its inputs and the outer-scope names its sub-graphs use."""
    from anpred.onnx_io import iter_graphs

    reads = [v for v in node.input if v]
    for a in node.attribute:
        for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for sub in iter_graphs(sg):
                reads.extend(v for n in sub.node for v in n.input if v)
    return reads
