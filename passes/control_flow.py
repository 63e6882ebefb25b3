"""Inlining of ONNX control flow (``If``, ``Loop``) into the main graph, for converters without it.

:class:`ControlFlowInlinePass` rewrites, in the main graph (repeated until nothing changes, so nested
control flow is inlined from the outside in):

- ``If`` with a constant condition (an initializer): the taken branch's nodes, renamed
  ``<if node>/then/<value>`` (or ``/else/``), and ``Identity(branch output) -> If output``;
- ``If`` with a computed condition: *both* branches inlined and ``Where(cond, then_out, else_out)``
  per output (the condition reshaped to a scalar). Exact for side-effect-free branches whose outputs
  have one shape (the ONNX spec allows branches of different shapes: such a node is kept, with the
  reason); the branch not taken is computed too, so a branch that would fail on the other case's data
  (an out-of-range ``Gather``) makes the inlined graph fail where the ``If`` would not;
- ``Loop`` with a constant trip count ``M`` (1 .. :data:`MAX_UNROLL`), no loop-carried condition
  (the ``cond`` input absent or constant true, and the body's ``cond_out`` its ``cond_in``, or a
  constant true): the body inlined ``M`` times (``<loop node>/iter<k>/<value>``), ``iter_num`` a
  constant ``k``, the loop-carried values chained; scan outputs are ``Unsqueeze(axis 0)`` +
  ``Concat`` of the per-iteration values.

With ``constant_only=True`` only the first rewrite is done (``If`` with a constant condition, the
taken branch alone): exact whatever the branches hold, as used after binding configuration inputs
(:mod:`passes.bind_inputs`); every other ``If`` and every ``Loop`` is left as it is (not listed in
``kept``).

The control-flow node's outputs keep their names, so anchors on them still map; ``anpred.instrument``
places anchors in the main graph only (values inside branches and bodies are never anchors).
``info``: ``{"inlined": [node names], "kept": {node name: reason}, "reordered": nodes moved}``; after
inlining, the main graph is sorted topologically (:func:`stable_toposort`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from passes.base import GraphPass, PassResult
from passes.protos import attribute_proto

__all__ = ["ControlFlowInlinePass", "inline_control_flow", "stable_toposort", "MAX_UNROLL"]

#: largest constant trip count a Loop is unrolled for
MAX_UNROLL = 64


def _defined(graph) -> set[str]:
    """Values a (sub-)graph defines itself: node outputs, initializers, its inputs."""
    return (
        {o for n in graph.node for o in n.output if o}
        | {t.name for t in graph.initializer}
        | {i.name for i in graph.input}
    )


def _rename_refs(graph, mapping: dict[str, str]) -> None:
    """Rename references in a nested sub-graph (in place), except names it defines itself."""
    local = _defined(graph)
    m = {k: v for k, v in mapping.items() if k not in local}
    for n in graph.node:
        n.input[:] = [m.get(v, v) for v in n.input]
        for a in n.attribute:
            for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _rename_refs(sg, m)
    for o in graph.output:
        if o.name in m:
            o.name = m[o.name]


def _inline(body, prefix: str, bind: dict[str, str]):
    """Copies of ``body``'s nodes and initializers with every value it defines renamed
    ``prefix + name``, its inputs bound to ``bind`` (formal input name -> outer value). Returns
    ``(nodes, initializers, {body output name: outer value name})``."""
    import onnx

    mapping = dict(bind)
    for n in body.node:
        for o in n.output:
            if o:
                mapping[o] = prefix + o
    for t in body.initializer:
        mapping[t.name] = prefix + t.name
    nodes = []
    for n in body.node:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.input[:] = [mapping.get(v, v) for v in c.input]
        c.output[:] = [mapping.get(v, v) for v in c.output]
        c.name = prefix + (n.name or n.output[0])
        for a in c.attribute:
            for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _rename_refs(sg, mapping)
        nodes.append(c)
    inits = []
    for t in body.initializer:
        c = onnx.TensorProto()
        c.CopyFrom(t)
        c.name = mapping[t.name]
        inits.append(c)
    return nodes, inits, {o.name: mapping.get(o.name, o.name) for o in body.output}


def _const_bool_true(name: str, consts: dict[str, np.ndarray]) -> bool:
    v = consts.get(name)
    return v is not None and v.size == 1 and bool(np.asarray(v).reshape(-1)[0])


def _static_shape(vi):
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return dims if all(d is not None for d in dims) else None


class ControlFlowInlinePass(GraphPass):
    """Inline ``If``/``Loop`` nodes of the main graph (module docstring), in place.

    Args:
        constant_only: inline only ``If`` nodes whose condition is a constant (an initializer).
    """

    in_place = True

    def __init__(self, constant_only: bool = False):
        self.constant_only = bool(constant_only)

    def call(self, model) -> PassResult:
        from onnx import numpy_helper

        info: dict[str, Any] = {"inlined": [], "kept": {}}
        opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        g = model.graph
        changed = True
        while changed:
            changed = False
            consts = {
                t.name: numpy_helper.to_array(t)
                for t in g.initializer
                if t.data_type in (9, 7, 6) and len(t.dims) <= 1 and int(np.prod(t.dims or [1])) == 1
            }
            new_nodes, new_inits = [], []
            for node in g.node:
                label = node.name or node.output[0]
                if (
                    node.domain not in ("", "ai.onnx")
                    or node.op_type not in ("If", "Loop")
                    or label in info["kept"]
                    or (self.constant_only and (node.op_type != "If" or node.input[0] not in consts))
                ):
                    new_nodes.append(node)
                    continue
                try:
                    nodes, inits = (
                        self._if(node, label, consts, opset)
                        if node.op_type == "If"
                        else self._loop(node, label, consts, opset)
                    )
                except ValueError as err:
                    info["kept"][label] = f"{node.op_type}: {err}"
                    new_nodes.append(node)
                    continue
                new_nodes.extend(nodes)
                new_inits.extend(inits)
                info["inlined"].append(label)
                changed = True
            if changed:
                del g.node[:]
                g.node.extend(new_nodes)
                g.initializer.extend(new_inits)
        if info["inlined"]:
            info["reordered"] = stable_toposort(g)
        return PassResult(model, bool(info["inlined"]), info)

    @staticmethod
    def _if(node, label: str, consts, opset: int):
        from onnx import helper, numpy_helper

        then_g, else_g = attribute_proto(node, "then_branch").g, attribute_proto(node, "else_branch").g
        cond = node.input[0]
        if cond in consts:
            taken, tag = (then_g, "then") if bool(np.asarray(consts[cond]).reshape(-1)[0]) else (else_g, "else")
            nodes, inits, outs = _inline(taken, f"{label}/{tag}/", {})
            for b_out, o in zip(taken.output, node.output):
                if o:
                    nodes.append(helper.make_node("Identity", [outs[b_out.name]], [o], name=f"{label}/{tag}/out/{o}"))
            return nodes, inits
        for a, b in zip(then_g.output, else_g.output):
            if not a.type.HasField("tensor_type") or not b.type.HasField("tensor_type"):
                raise ValueError("a branch output is not a tensor (sequence/optional)")
            sa, sb = _static_shape(a), _static_shape(b)
            if sa is not None and sb is not None and sa != sb:
                raise ValueError(f"the branches' outputs differ in shape ({sa} vs {sb}): no element-wise select")
        tn, ti, touts = _inline(then_g, f"{label}/then/", {})
        en, ei, eouts = _inline(else_g, f"{label}/else/", {})
        scalar = f"{label}/cond_scalar"
        shape = numpy_helper.from_array(np.zeros((0,), np.int64), f"{label}/scalar_shape")
        nodes = tn + en + [helper.make_node("Reshape", [cond, shape.name], [scalar], name=f"{label}/cond_reshape")]
        for a, b, o in zip(then_g.output, else_g.output, node.output):
            if o:
                nodes.append(
                    helper.make_node("Where", [scalar, touts[a.name], eouts[b.name]], [o], name=f"{label}/select/{o}")
                )
        return nodes, ti + ei + [shape]

    @staticmethod
    def _loop(node, label: str, consts, opset: int):
        from onnx import helper, numpy_helper

        body = attribute_proto(node, "body").g
        ins = list(node.input) + [""] * (2 - len(node.input))
        m_name, c_name, carried = ins[0], ins[1], ins[2:]
        if not m_name or m_name not in consts:
            raise ValueError("the trip count M is absent or not a constant")
        M = int(np.asarray(consts[m_name]).reshape(-1)[0])
        if not 1 <= M <= MAX_UNROLL:
            raise ValueError(f"trip count {M} is outside 1..{MAX_UNROLL}")
        if c_name and not _const_bool_true(c_name, consts):
            raise ValueError("the loop condition input is not a constant true")
        iter_in, cond_in = body.input[0].name, body.input[1].name
        cond_out = body.output[0].name
        body_consts = {t.name for t in body.initializer}
        passthrough = cond_out == cond_in or any(
            n.op_type == "Identity" and n.output[0] == cond_out and n.input[0] == cond_in for n in body.node
        )
        const_true = cond_out in body_consts and _const_bool_true(
            cond_out, {t.name: numpy_helper.to_array(t) for t in body.initializer}
        )
        if not (passthrough or const_true):
            raise ValueError("the body computes its continuation condition (data-dependent trip count)")
        n_car = len(carried)
        v_in = [i.name for i in body.input[2:]]
        v_out = [o.name for o in body.output[1 : 1 + n_car]]
        scan_out = [o.name for o in body.output[1 + n_car :]]
        true = numpy_helper.from_array(np.array(True), f"{label}/true")
        inits, nodes = [true], []
        cur = list(carried)
        scans: list[list[str]] = [[] for _ in scan_out]
        for k in range(M):
            it = numpy_helper.from_array(np.array(k, np.int64), f"{label}/iter{k}/iter_num")
            inits.append(it)
            bind = {iter_in: it.name, cond_in: true.name, **dict(zip(v_in, cur))}
            bn, bi, outs = _inline(body, f"{label}/iter{k}/", bind)
            nodes += bn
            inits += bi
            cur = [outs[v] for v in v_out]
            for j, s in enumerate(scan_out):
                u = f"{label}/iter{k}/scan{j}"
                if opset >= 13:
                    ax = numpy_helper.from_array(np.array([0], np.int64), f"{u}/axes")
                    inits.append(ax)
                    nodes.append(helper.make_node("Unsqueeze", [outs[s], ax.name], [u], name=u))
                else:
                    nodes.append(helper.make_node("Unsqueeze", [outs[s]], [u], name=u, axes=[0]))
                scans[j].append(u)
        outs_final = list(node.output)
        for v, o in zip(cur, outs_final[:n_car]):
            if o:
                nodes.append(helper.make_node("Identity", [v], [o], name=f"{label}/out/{o}"))
        for parts, o in zip(scans, outs_final[n_car:]):
            if o:
                nodes.append(helper.make_node("Concat", parts, [o], name=f"{label}/scan/{o}", axis=0))
        return nodes, inits


def inline_control_flow(model, constant_only: bool = False) -> dict[str, Any]:
    """Run :class:`ControlFlowInlinePass` (``constant_only``: only ``If`` with a constant condition)
    on ``model`` in place; returns its ``info``."""
    return ControlFlowInlinePass(constant_only)(model).info


def _outer_reads(node) -> set[str]:
    """The values ``node``'s sub-graphs read from outside themselves (outer-scope references)."""
    reads: set[str] = set()
    for a in node.attribute:
        for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            defined = {i.name for i in sub.input} | {t.name for t in sub.initializer}
            for n in sub.node:
                defined.update(n.output)
            for n in sub.node:
                reads.update(v for v in n.input if v and v not in defined)
                reads.update(v for v in _outer_reads(n) if v not in defined)
            reads.update(o.name for o in sub.output if o.name not in defined)
    return reads


def stable_toposort(graph) -> int:
    """Reorder ``graph``'s nodes in place so that every node follows the producers of its inputs and of
    the outer-scope values its sub-graphs read, keeping the given order wherever it already is one
    (Kahn's algorithm taking the earliest ready node). Inlining needs it: a branch that read an
    outer value produced *after* its ``If`` (an order ONNX Runtime accepts; onnxconverter-common's
    float16 conversion writes it) would otherwise be inlined before that producer (onnx2torch:
    ``KeyError`` on the producer's name). Returns the number of nodes that moved; a cycle or a value
    with no producer leaves those nodes in their order at the end."""
    import heapq

    nodes = list(graph.node)
    producer = {}
    for k, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = k
    deps = [
        {producer[v] for v in set(n.input) | _outer_reads(n) if v in producer and producer[v] != k}
        for k, n in enumerate(nodes)
    ]
    users: dict[int, list[int]] = {}
    for k, ds in enumerate(deps):
        for d in ds:
            users.setdefault(d, []).append(k)
    waiting = [len(ds) for ds in deps]
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for u in users.get(k, []):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    seen = set(order)
    order += [k for k in range(len(nodes)) if k not in seen]
    moved = sum(1 for i, k in enumerate(order) if i != k)
    if moved:
        del graph.node[:]
        graph.node.extend(nodes[k] for k in order)
    return moved
