"""Anchor insertion: expose a partition's boundary tensors as extra graph outputs with readable names.

For every non-output anchor the pass appends ``Identity(value) -> <anchor name>`` (node name
``anpred/<anchor name>``) and a typed, shaped graph output ``<anchor name>``. The Identity nodes are
appended in *reverse* topological order of their values' producers (last anchor first), so that a
runtime walking the graph by reverse DFS from its leaf nodes (ONNX Runtime's default topological order)
visits each anchor Identity right after its value's producer, before the value's other consumers are
rewritten. Appended in forward order, ONNX Runtime 1.32 (default optimisations) rejects models such as
MobileNetV2 ("Node input ... is not a graph input, initializer, or output of a previous node"): its
``Pad_Fusion`` rule rewires ``Pad -> Conv`` without adding the producer -> Conv edge, and a later visit
of the anchor Identity by ``EliminateIdentity`` then sees a single consumer and renames the producer's
output to the anchor name under the Conv's feet (see docs/native-mapping.md for the reproduction). Original outputs stay
first and unchanged (they are anchors of kind ``output`` but are not added twice). The anchor manifest
is stored in ``metadata_props["anpred.manifest"]``. Nothing else of the model changes (IR version,
opsets, initializers, external-data references, metadata), except that a model whose file order was
not topological gets its nodes sorted.

Idempotent: a model already instrumented for the same partition is returned unchanged with
``modified=False``; an earlier instrumentation with other options is replaced.
"""

from __future__ import annotations

import dataclasses

from anpred.errors import GraphError
from anpred.manifest import METADATA_KEY, Anchor, AnchorManifest
from anpred.naming import anchor_name, output_anchor_name, uniquify
from anpred.onnx_io import elem_type_name
from passes.anchor_nodes import ANCHOR_NODE_PREFIX, is_anchor_node, strip_anchor_nodes
from passes.base import GraphPass, PassResult
from passes.plan import Partition

__all__ = ["AnchorInsertionPass", "build_manifest"]


def build_manifest(partition: Partition, taken: set[str] = frozenset(), model_info=None) -> AnchorManifest:
    """Name the partition's anchors (see :mod:`anpred.naming`) and build the manifest (no model
    edits). ``taken`` are value names already used in the graph: anchor names never collide with
    them."""
    raw = [
        output_anchor_name(a.value) if a.kind == "output" else anchor_name(a.stage, a.label) for a in partition.anchors
    ]
    names = uniquify(raw)
    for i, nm in enumerate(names):  # an existing value with the same name: suffix until free
        k = 0
        base = nm
        while partition.anchors[i].kind != "output" and nm in taken:
            k += 1
            nm = f"{base}#x{k}"
        names[i] = nm
    anchors = []
    by_value: dict[str, str] = {}
    for a, nm in zip(partition.anchors, names):
        anchors.append(
            Anchor(
                name=nm,
                value=a.value,
                stage=a.stage,
                order=a.order,
                producer=a.producer,
                op_type=a.op_type,
                shape=list(a.shape) if a.shape is not None else [],
                dtype=elem_type_name(a.elem_type),
                layout=a.layout,
                scope=a.scope,
                kind=a.kind,
            )
        )
        by_value[a.value] = nm
    stages = [
        dataclasses.replace(s, cost=float(s.cost), boundary=[by_value[v] for v in s.boundary if v in by_value])
        for s in partition.stages
    ]
    part = dict(partition.options)
    part.update(
        framework=partition.framework,
        cost_unit=partition.cost_unit,
        total_cost=float(partition.total_cost),
        num_nodes=partition.num_nodes,
        candidate_cuts=partition.candidates,
    )
    return AnchorManifest(anchors=anchors, stages=stages, model=dict(model_info or {}), partition=part)


def _identity_order(inner: list[Anchor]) -> list[Anchor]:
    """``inner`` sorted by the topological position of their value's producer (``Anchor.order``, from
    the partition's graph index), last producer first; graph inputs (order -1) go last."""
    ranked = sorted(range(len(inner)), key=lambda k: (inner[k].order, k), reverse=True)
    return [inner[k] for k in ranked]


class AnchorInsertionPass(GraphPass):
    """Insert the anchors of ``partition`` (from :class:`~passes.partition.StagePartitioner` run on
    the same model). Returns a new model (the input is not modified); ``result.info["manifest"]`` is
    the :class:`~anpred.manifest.AnchorManifest`.

    Raises:
        GraphError: an anchor whose element type shape inference could not determine.
    """

    in_place = False

    def __init__(self, partition: Partition, model_info: dict | None = None):
        self.partition = partition
        self.model_info = model_info

    def call(self, model) -> PassResult:
        import onnx
        from onnx import helper

        g = model.graph
        taken = self.partition.value_names
        if not taken:
            taken = {v for n in g.node if not is_anchor_node(n) for v in n.output}
            taken.update(i.name for i in g.input)
            taken.update(t.name for t in g.initializer)
        manifest = build_manifest(self.partition, taken, self.model_info)
        inner = [a for a in manifest.anchors if a.kind != "output"]
        plans = {a.value: a for a in self.partition.anchors}
        node_order = _identity_order(inner)
        want_nodes = [(f"{ANCHOR_NODE_PREFIX}{a.name}", a.value, a.name) for a in node_order]

        # idempotence: same anchor nodes, outputs and manifest already there -> unchanged
        have_nodes = [(n.name, n.input[0], n.output[0]) for n in g.node if is_anchor_node(n)]
        stored = AnchorManifest.from_model(model) if any(p.key == METADATA_KEY for p in model.metadata_props) else None
        n_orig_out = len(g.output) - len(have_nodes)
        if (
            have_nodes == want_nodes
            and stored is not None
            and stored.to_dict() == manifest.to_dict()
            and [o.name for o in g.output[n_orig_out:]] == [a.name for a in inner]
        ):
            return PassResult(model, False, {"manifest": manifest})

        out = onnx.ModelProto()
        out.CopyFrom(model)
        strip_anchor_nodes(out)
        og = out.graph
        order = self.partition.node_order
        if order and any(a >= b for a, b in zip(order, order[1:])):
            nodes = list(og.node)
            del og.node[:]
            og.node.extend(nodes[i] for i in order)
        for a in inner:
            plan = plans[a.value]
            if not plan.elem_type:
                raise GraphError(
                    f"cannot expose {a.value!r}: its element type is unknown (shape inference could not determine it)"
                )
            og.output.append(helper.make_tensor_value_info(a.name, plan.elem_type, plan.shape))
        for a in node_order:  # reverse topological order of the producers (see the module docstring)
            og.node.append(helper.make_node("Identity", [a.value], [a.name], name=f"{ANCHOR_NODE_PREFIX}{a.name}"))
        manifest.to_model(out)
        return PassResult(out, True, {"manifest": manifest})
