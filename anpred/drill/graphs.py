"""Subgraphs for the drill-down: a stage cut out of the anchored model, all stages side by side fed
from the consensus (isolated stage replay), a stage with its inner tensors exposed, one operator alone.

Extraction is :class:`onnx.utils.Extractor` (the nodes needed to compute the outputs from the given
inputs, with the initializers they read); renaming for the side-by-side replay is
:func:`onnx.compose.add_prefix_graph` (initializers keep their names and are shared). Types of the
cut tensors come from the arrays that will be fed (static shapes: what the backends will see) and
from ONNX shape inference (:func:`passes.shapes.infer_value_types`) for the others.

Every function here is pure: the model given is never modified.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from anpred.errors import GraphError

__all__ = [
    "StageCut",
    "stage_cuts",
    "extract",
    "replay_model",
    "expose",
    "producers",
    "ancestors_of",
    "topo_values",
    "MANIFEST_KEY",
]

MANIFEST_KEY = "anpred.manifest"


@dataclass
class StageCut:
    """Stage ``index`` of a manifest as a cut of the model: ``entries`` (anchor names of the previous
    stage's boundary; graph inputs for stage 0, named by ``inputs``) -> ``exits`` (its own boundary).
    ``values``: anchor name -> ONNX value name for entries and exits."""

    index: int
    entries: list[str]
    exits: list[str]
    inputs: list[str] = field(default_factory=list)  # graph inputs the stage reads directly
    values: dict[str, str] = field(default_factory=dict)


def stage_cuts(model, manifest) -> list[StageCut]:
    """The manifest's stages as cuts, in order. A stage's entries are the previous stage's boundary
    (the partition guarantees it separates the graph: every path from an input to the stage crosses
    it; a skip tensor read later is listed in each boundary it crosses); stage 0 reads the graph
    inputs. A graph input read inside a later stage (a second input, a shape) is added to its
    ``inputs``.

    Raises:
        GraphError: the manifest names an anchor whose value is not in the model.
    """
    from anpred.onnx_io import real_inputs

    by_name = {a.name: a for a in manifest.anchors}
    produced = {v for n in model.graph.node for v in n.output}
    graph_inputs = [n for n, _, _ in real_inputs(model)]
    cuts: list[StageCut] = []
    prev: list[str] = []
    for st in manifest.stages:
        exits = [x for x in st.boundary if x in by_name]
        for x in exits:
            if by_name[x].value not in produced and by_name[x].value not in graph_inputs:
                raise GraphError(f"anchor {x}: value {by_name[x].value!r} is not in the model")
        values = {x: by_name[x].value for x in prev + exits}
        cuts.append(StageCut(st.index, list(prev), exits, [], values))
        prev = exits
    # the graph inputs each stage needs beyond its entries: those its extracted nodes read
    for c in cuts:
        stop = {c.values[e] for e in c.entries}
        c.inputs = [i for i in graph_inputs if i in _reached_inputs(model, [c.values[x] for x in c.exits], stop)]
    return cuts


def _reached_inputs(model, outputs: list[str], stop: set[str]) -> set[str]:
    """Graph inputs reached walking back from ``outputs`` without crossing ``stop`` (subgraph
    bodies' outer references included)."""
    from passes.graph import subgraph_outer_refs

    producer = {v: n for n in model.graph.node for v in n.output if v}
    inputs = {i.name for i in model.graph.input}
    seen: set[str] = set()
    todo = [o for o in outputs if o not in stop]
    out: set[str] = set()
    while todo:
        v = todo.pop()
        if v in seen or v in stop:
            continue
        seen.add(v)
        if v in inputs:
            out.add(v)
            continue
        node = producer.get(v)
        if node is not None:
            todo.extend(x for x in list(node.input) + subgraph_outer_refs(node) if x)
    return out


def _value_info(name: str, elem_type: int, shape) -> Any:
    from onnx import helper

    return helper.make_tensor_value_info(
        name, elem_type, None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape]
    )


def extract(model, inputs: dict[str, np.ndarray], outputs: list[str], types: dict | None = None):
    """The subgraph computing ``outputs`` from ``inputs`` (``{value name: an array of the shape and
    dtype that will be fed}``) and the initializers, as a new model (same opsets, IR version and
    functions; no anchor manifest).

    Raises:
        GraphError: an output cannot be computed from the given inputs and the initializers (a graph
            input it needs is missing from ``inputs``).
    """
    import onnx
    from onnx import helper
    from onnx.utils import Extractor

    from passes.shapes import infer_value_types

    m = onnx.ModelProto()
    m.CopyFrom(model)
    types = types if types is not None else infer_value_types(model)
    del m.graph.value_info[:]
    keep = {i.name for i in m.graph.input} | {o.name for o in m.graph.output}
    for name, arr in inputs.items():
        elem = helper.np_dtype_to_tensor_dtype(np.asarray(arr).dtype)
        m.graph.value_info.append(_value_info(name, elem, list(np.shape(arr))))
    for name in outputs:
        if name in inputs or name in keep:
            continue
        elem, shape = types.get(name, (0, None))
        m.graph.value_info.append(_value_info(name, elem or onnx.TensorProto.FLOAT, shape))
    ex = Extractor(m)
    for o in outputs:  # a graph output keeps its declared type; an inner one takes the inferred one
        if o in keep and o not in inputs:
            elem, shape = types.get(o, (0, None))
            if elem:
                ex.value_infos[o] = _value_info(o, elem, shape)
    for name, arr in inputs.items():  # graph inputs fed with static shapes
        ex.value_infos[name] = _value_info(
            name, helper.np_dtype_to_tensor_dtype(np.asarray(arr).dtype), list(np.shape(arr))
        )
    sub = ex.extract_model(list(inputs), list(outputs))
    missing = {i.name for i in sub.graph.input} - set(inputs)
    if missing:
        raise GraphError(f"cannot cut out {outputs}: it also reads {sorted(missing)}, not given")
    fed = {i.name for i in sub.graph.input}
    dangling = [
        v
        for n in sub.graph.node
        for v in n.input
        if v
        and v not in fed
        and v not in {x.name for x in sub.graph.initializer}
        and v not in {o for nn in sub.graph.node for o in nn.output}
    ]
    if dangling:
        raise GraphError(
            f"cannot cut out {outputs}: values {sorted(set(dangling))[:5]} are read but neither fed nor computed"
        )
    sub.ir_version = model.ir_version
    del sub.opset_import[:]
    sub.opset_import.extend(model.opset_import)
    del sub.functions[:]
    sub.functions.extend(model.functions)
    del sub.metadata_props[:]
    # the value_info the extractor copied is partly ours (possibly dynamic): let backends infer
    del sub.graph.value_info[:]
    return sub


def replay_model(model, cuts: list[StageCut], feeds: dict[str, np.ndarray], types: dict | None = None):
    """All stages side by side, each fed on its own inputs (isolated stage replay).

    Stage ``k`` becomes a copy of its subgraph whose inputs and inner values are prefixed ``sKK.``
    (``s03.t1``) and whose outputs are its exits (``s03.<exit value>``); initializers are shared.
    ``feeds``: ONNX value name -> an array of the shape and dtype that will be fed (entries and the
    graph inputs the stages read). Returns ``(model, inputs, outputs)`` with ``inputs[new name] =
    (stage, value)`` and ``outputs[new name] = (stage, exit anchor name)``.

    Raises:
        GraphError: as :func:`extract`.
    """
    import onnx
    from onnx import helper
    from onnx.compose import add_prefix_graph

    from passes.shapes import infer_value_types

    types = types if types is not None else infer_value_types(model)
    nodes, ins, outs, inits, seen_init = [], [], [], [], set()
    inputs: dict[str, tuple[int, str]] = {}
    outputs: dict[str, tuple[int, str]] = {}
    for c in cuts:
        in_vals = [c.values[e] for e in c.entries] + list(c.inputs)
        in_vals = list(dict.fromkeys(in_vals))
        out_vals = [c.values[x] for x in c.exits]
        if not out_vals or set(out_vals) <= set(in_vals):
            continue
        sub = extract(model, {v: feeds[v] for v in in_vals}, out_vals, types)
        prefix = f"s{c.index:02d}."
        g = add_prefix_graph(sub.graph, prefix, rename_initializers=False)
        nodes.extend(g.node)
        ins.extend(g.input)
        outs.extend(g.output)
        for t in g.initializer:
            if t.name not in seen_init:
                seen_init.add(t.name)
                inits.append(t)
        inputs.update({prefix + v: (c.index, v) for v in in_vals})
        by_value = {c.values[x]: x for x in c.exits}
        outputs.update({prefix + v: (c.index, by_value[v]) for v in out_vals})
    if not nodes:
        raise GraphError("no stage to replay: the manifest has no stage with its own operators")
    g = helper.make_graph(nodes, f"{model.graph.name}.replay", ins, outs, inits)
    m = helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    m.functions.extend(model.functions)
    m.producer_name = "anpred.drill"
    onnx.checker.check_model(m)
    return m, inputs, outputs


def topo_values(sub, exclude: set[str] = frozenset()) -> list[str]:
    """Every float value computed by a node of ``sub`` from its graph inputs (nodes in graph order,
    which ONNX requires to be topological), without ``exclude`` and without constants (values that
    depend on no graph input: converters fold them and return no tensor for them): the candidates for
    exposing."""
    from passes.graph import subgraph_outer_refs
    from passes.shapes import FLOAT_TYPES, infer_value_types

    types = infer_value_types(sub)
    inits = {t.name for t in sub.graph.initializer}
    live = {i.name for i in sub.graph.input if i.name not in inits}  # values that depend on a graph input
    out = []
    for n in sub.graph.node:
        if not any(x in live for x in list(n.input) + subgraph_outer_refs(n)):
            continue  # a constant (weights reshaped or cast, a Constant node): folded by converters, never exposed
        for v in n.output:
            if v:
                live.add(v)
            if v and v not in exclude and types.get(v, (1, None))[0] in FLOAT_TYPES:
                out.append(v)
    return out


def ancestors_of(sub, value: str) -> set[str]:
    """Every value computed by a node of ``sub`` upstream of ``value`` (subgraph bodies' outer
    references included): a backward walk, linear in the size of the graph."""
    from passes.graph import subgraph_outer_refs

    prod = producers(sub)
    seen: set[str] = set()
    todo = [value]
    while todo:
        n = prod.get(todo.pop())
        if n is None:
            continue
        for x in list(n.input) + subgraph_outer_refs(n):
            if x and x in prod and x not in seen:
                seen.add(x)
                todo.append(x)
    return seen


def producers(sub) -> dict[str, Any]:
    """value -> the node of ``sub`` that computes it."""
    return {v: n for n in sub.graph.node for v in n.output if v}


def expose(sub, values: list[str]):
    """A copy of ``sub`` with ``values`` (inner tensors) added to its graph outputs, typed by shape
    inference (a type left unknown is declared float32 without a shape)."""
    import onnx

    from passes.shapes import infer_value_types

    types = infer_value_types(sub)
    m = onnx.ModelProto()
    m.CopyFrom(sub)
    have = {o.name for o in m.graph.output}
    for v in values:
        if v in have:
            continue
        elem, shape = types.get(v, (0, None))
        m.graph.output.append(_value_info(v, elem or onnx.TensorProto.FLOAT, shape))
    return m
