"""Fault injection: a variant of a model with one known precision fault at a chosen node or stage.

The variant is meant to be run by *one* backend (``anpred.run.BackendSpec(..., options={"model":
path})``) while the clean backends run the clean model; the fault's ground truth (kind, magnitude,
node, value, stage) is returned as a :class:`FaultTruth` and stored in the variant's
``metadata_props`` under ``anpred.fault``.

Fault kinds (the registry :data:`FAULT_KINDS`; ``magnitude`` meaning in brackets):

``round``
    Round one float32 tensor to ``p`` significand bits [p: 11 = float16 precision, 8 = bfloat16].
    Implemented with Veltkamp splitting (T. J. Dekker, "A floating-point technique for extending the
    available precision", Numer. Math. 18, 1971): ``t = x * (2**(24-p) + 1); y = t - (t - x)``, which
    is exact round-to-nearest to ``p`` bits in float32 arithmetic, made of Mul/Sub nodes that no
    runtime folds (a Cast pair float32->float16->float32 can be folded away by graph optimisers).
    Range (overflow/subnormals of the narrow type) is not emulated: it is a precision fault.
``approx-sigmoid``
    A Sigmoid (e.g. inside SiLU = x * sigmoid(x)) replaced by a blend with the cheap "fast sigmoid"
    ``0.5 + 0.5 * x / (1 + |x|)``: ``(1-m) * sigmoid(x) + m * fast(x)`` [m in (0, 1]].
``norm-epsilon``
    The ``epsilon`` of a BatchNormalization/LayerNormalization/InstanceNormalization/
    GroupNormalization multiplied [factor].
``weight-ulp``
    A float initializer input of a node (Conv/Gemm/MatMul weight) perturbed by +-k ULP per element
    with seeded random signs [k]. A private copy is made when the initializer is shared.
``rounding-mode``
    A tie-breaking rounding change: ``Resize`` nearest_mode ``floor<->ceil`` /
    ``round_prefer_floor<->round_prefer_ceil``, or ``Round`` (half-to-even, ONNX spec) replaced by
    half-away-from-zero ``sign(x) * floor(|x| + 0.5)`` [unused].
``padding-same``
    A Conv/MaxPool/AveragePool's symmetric pads swapped for TensorFlow "SAME" padding (the extra
    pad at the end: pads_begin = total // 2), keeping the output shape [unused]. Applies only where
    the two conventions differ (stride > 1 on an even-sized input, for example).

Faults of one reduced-precision implementation, injected into the *converted* model that backend
runs (the QDQ int8 or float16 model), its peers running the intact one; formulas, measurements and
the public reports of each class are in :mod:`passes.faults_lowp` (registry :data:`LOWP_KINDS`,
merged here):

``quantize-rounding``
    One data QuantizeLinear rounding half away from zero [0] or truncating toward zero [1] instead
    of half to even (OpenVINO's FakeQuantize; ONNX Runtime's float16 QuantizeLinear, microsoft/onnxruntime#18576).
``zero-point``
    One QuantizeLinear's zero point off by k steps [k]; its DequantizeLinear keeps the original.
``accumulator-saturation``
    One Conv/MatMul/Gemm fed by DequantizeLinear nodes clipped to ``+-(2**(bits-1) - 1) s_x s_w``,
    an integer accumulator of that many bits [bits].
``fp16-overflow``
    One accumulating op's output ``+-inf`` where ``float16(y * 2**m)`` overflows [m].

Node selection. ``node=`` names the node. ``stage=`` picks, among the applicable nodes of that
manifest stage, the one closest to the stage's end whose output reaches the stage's anchors (its
effect is first observable there, through the fewest operators). On the anchored model itself (the
manifest's node positions hold: every anchor's producer sits at its recorded position and the model
has the partition's node count) a stage is its node range ``first..last``, as before. On any other
model that still exposes the manifest's anchors as graph outputs (the converters keep them: a QDQ or
float16 model inserts nodes, so positions shift) a stage's nodes are found by tensor names: the
ancestors of that stage's anchor outputs that are not ancestors of an earlier stage's anchors
(:func:`node_stages`), leaving out the anchor Identity nodes and what only they feed (the float16
converter's output Casts); "closest to the end" is then the last in topological order.
"""

from __future__ import annotations

import copy

import numpy as np

from passes.anchor_nodes import is_anchor_node
from passes.base import GraphPass, PassResult
from passes.fault_truth import FaultError, FaultTruth
from passes.faults_lowp import LOWP_KINDS, inject_lowp, lowp_applicable
from passes.protos import attribute_value

__all__ = [
    "FAULT_METADATA_KEY",
    "FAULT_KINDS",
    "LOWP_KINDS",
    "NORM_OPS",
    "PAD_OPS",
    "WEIGHT_OPS",
    "FaultError",
    "FaultInjectionPass",
    "applicable_nodes",
    "inject_fault",
    "node_stages",
]

FAULT_METADATA_KEY = "anpred.fault"

NORM_OPS = ("BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization")
PAD_OPS = ("Conv", "MaxPool", "AveragePool")
WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")

# kind -> (default magnitude, description)
FAULT_KINDS: dict[str, tuple[float, str]] = {
    "round": (8.0, "one tensor rounded to p significand bits (11: float16, 8: bfloat16)"),
    "approx-sigmoid": (1.0, "Sigmoid blended with the fast sigmoid 0.5+0.5x/(1+|x|), weight m"),
    "norm-epsilon": (1000.0, "normalisation epsilon multiplied by a factor"),
    "weight-ulp": (4.0, "weights perturbed by +-k ULP"),
    "rounding-mode": (1.0, "tie-breaking rounding mode changed (Resize nearest_mode, Round)"),
    "padding-same": (1.0, "symmetric padding swapped for TensorFlow SAME padding"),
    **LOWP_KINDS,
}


def _float_elem(model, value: str) -> bool:
    import onnx

    for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input):
        if vi.name == value:
            return vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    return False


def _shape_of(model, value: str) -> list[int] | None:
    for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input):
        if vi.name == value:
            dims = vi.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                return [d.dim_value for d in dims]
            return None
    return None


def _set_attr(node, name, value) -> None:
    import onnx

    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.append(onnx.helper.make_attribute(name, value))


def _same_pads(node, in_shape: list[int]) -> list[int] | None:
    """TensorFlow SAME pads for ``node`` on input spatial ``in_shape`` (N, C, *spatial)."""
    spatial = in_shape[2:]
    kernel = attribute_value(node, "kernel_shape")
    if kernel is None:
        return None
    strides = attribute_value(node, "strides", [1] * len(spatial))
    dil = attribute_value(node, "dilations", [1] * len(spatial))
    begin, end = [], []
    for i, n in enumerate(spatial):
        out = -(-n // strides[i])
        total = max((out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - n, 0)
        begin.append(total // 2)
        end.append(total - total // 2)
    return begin + end


def _constant_values(model) -> set[str]:
    """Values computed from initializers (and ``Constant`` nodes) only: one forward sweep in file order
    (topological in a valid model)."""
    const = {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        ins = [v for v in n.input if v]
        if (ins or n.op_type == "Constant") and all(v in const for v in ins):
            const.update(o for o in n.output if o)
    return const


def _applicable(
    model, node, kind: str, init_names: set[str], constant: set[str] | None = None, explicit: bool = False
) -> bool:
    if kind in LOWP_KINDS:
        return lowp_applicable(model, node, kind, _constant_values(model) if constant is None else constant, explicit)
    out = node.output[0] if node.output else ""
    if kind == "round":
        return bool(out) and _float_elem(model, out)
    if kind == "approx-sigmoid":
        return node.op_type == "Sigmoid"
    if kind == "norm-epsilon":
        return node.op_type in NORM_OPS
    if kind == "weight-ulp":
        return node.op_type in WEIGHT_OPS and len(node.input) > 1 and node.input[1] in init_names
    if kind == "rounding-mode":
        if node.op_type == "Round":
            return True
        return node.op_type == "Resize" and attribute_value(node, "mode", b"nearest") in (b"nearest", "nearest")
    if kind == "padding-same":
        if node.op_type not in PAD_OPS or attribute_value(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            return False
        shape = _shape_of(model, node.input[0])
        if shape is None:
            return False
        same = _same_pads(node, shape)
        pads = attribute_value(node, "pads", [0] * (2 * (len(shape) - 2)))
        return same is not None and list(same) != list(pads)
    raise FaultError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")


def applicable_nodes(model, kind: str) -> list[str]:
    """Names of the nodes of ``model`` (shape-inferred) where ``kind`` can be injected, in graph order."""
    if kind not in FAULT_KINDS:
        raise FaultError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
    inits = {i.name for i in model.graph.initializer}
    const = _constant_values(model) if kind in LOWP_KINDS else None
    return [n.name for n in model.graph.node if _applicable(model, n, kind, inits, const)]


def _reaches(nodes, start: int, last: int, targets: set[str]) -> bool:
    """Whether an output of ``nodes[start]`` flows into a value in ``targets`` through nodes at
    positions ``<= last`` (iterative forward sweep over the topologically ordered node list)."""
    live = set(nodes[start].output)
    if live & targets:
        return True
    for n in nodes[start + 1 : last + 1]:
        if live.intersection(n.input):
            live.update(n.output)
            if live & targets:
                return True
    return False


def _stage_of(manifest, index: int) -> int | None:
    if manifest is None:
        return None
    for s in manifest.stages:
        if s.first <= index <= s.last:
            return s.index
    return None


def _positions_hold(nodes, manifest) -> bool:
    """Whether ``nodes`` (file order) is the manifest's own anchored model: every anchor's producer at
    its recorded position and, anchor Identities aside, the partition's node count."""
    if not manifest.stages:
        return False
    for a in manifest.anchors:
        if a.order >= 0 and a.producer:
            if a.order >= len(nodes) or nodes[a.order].name != a.producer or a.value not in nodes[a.order].output:
                return False
    return sum(not is_anchor_node(n) for n in nodes) == manifest.stages[-1].last + 1


def _anchor_outputs(model, manifest) -> dict[int, list[str]]:
    """stage -> the graph-output names of its anchors (an original output keeps its value name).

    Raises:
        FaultError: an anchor that is not a graph output of ``model``."""
    outs = {o.name for o in model.graph.output}
    by_stage: dict[int, list[str]] = {}
    missing = []
    for a in manifest.anchors:
        name = a.value if a.kind == "output" else a.name
        if name not in outs:
            missing.append(name)
        by_stage.setdefault(a.stage, []).append(name)
    if missing:
        raise FaultError(
            f"the model does not expose {len(missing)} of the manifest's anchors as graph outputs "
            f"(e.g. {missing[0]!r}): stage= needs the anchored model or a conversion of it that "
            "keeps its anchors"
        )
    return by_stage


def node_stages(model, manifest) -> list[int | None]:
    """Per node of ``model`` (file order): the first manifest stage whose anchors the node is an
    ancestor of (found by tensor names, so it holds on a converted model whose anchors are still graph
    outputs), None for a node that reaches no anchor and for anchor Identities and the nodes only they
    feed (e.g. the float16 converter's output Casts). O(nodes + edges), iterative.

    Raises:
        FaultError: an anchor is not a graph output of ``model``.
        GraphError: the graph is invalid (see :func:`passes.graph.build_index`).
    """
    from passes.graph import build_index

    by_stage = _anchor_outputs(model, manifest)
    idx = build_index(model.graph)
    n = len(idx.nodes)
    tail = [False] * n  # anchor Identities and what only they feed
    for p, node in enumerate(idx.nodes):
        srcs = [idx.producer[v] for v in idx.inputs[p] if v in idx.producer]
        tail[p] = is_anchor_node(node) or (bool(srcs) and all(tail[q] for q in srcs))
    stage = [None] * n
    for s in sorted(by_stage):
        stack = [idx.producer[v] for v in by_stage[s] if v in idx.producer]
        while stack:  # ancestors already assigned had all their ancestors assigned before
            p = stack.pop()
            if stage[p] is not None:
                continue
            stage[p] = s
            stack.extend(q for q in (idx.producer.get(v) for v in idx.inputs[p]) if q is not None and stage[q] is None)
    out: list[int | None] = [None] * n
    for p in range(n):
        out[idx.file_index[p]] = None if tail[p] else stage[p]
    return out


class FaultInjectionPass(GraphPass):
    """Inject one fault of ``kind`` at ``node`` (a node name) or at the node of ``stage`` (a manifest
    stage index) chosen as the module docstring says, on the anchored model or on a converted copy
    of it that keeps the anchors as graph outputs (``manifest``: the anchored model's manifest). The
    pass works on a copy; ``PassResult.info["truth"]`` is the :class:`FaultTruth`.

    Raises:
        FaultError: unknown kind, unknown node, a magnitude out of the kind's range, no applicable
            node in the stage, or (``stage=`` on a converted model) anchors that are not graph outputs.
    """

    in_place = False

    def __init__(
        self,
        kind: str,
        *,
        node: str | None = None,
        stage: int | None = None,
        magnitude: float | None = None,
        manifest=None,
        seed: int = 0,
    ):
        if kind not in FAULT_KINDS:
            raise FaultError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
        if (node is None) == (stage is None):
            raise FaultError("give exactly one of node= or stage=")
        if stage is not None and manifest is None:
            raise FaultError("stage= needs the model's anchor manifest")
        self.kind, self.node, self.stage, self.manifest, self.seed = kind, node, stage, manifest, seed
        self.magnitude = float(FAULT_KINDS[kind][0] if magnitude is None else magnitude)

    def call(self, model) -> PassResult:
        import onnx

        model = copy.deepcopy(model)
        inferred = onnx.shape_inference.infer_shapes(model)
        nodes = list(model.graph.node)
        inits = {i.name for i in model.graph.initializer}
        const = _constant_values(model) if self.kind in LOWP_KINDS else None
        anchored = self.manifest is not None and _positions_hold(nodes, self.manifest)
        stages = None
        if self.manifest is not None and not anchored:
            try:
                stages = node_stages(model, self.manifest)
            except FaultError:
                if self.node is None:
                    raise
                stages = [None] * len(nodes)  # a named node in a model without the anchors: no stage
        if self.node is not None:
            idx = next((i for i, n in enumerate(nodes) if n.name == self.node), None)
            if idx is None:
                raise FaultError(f"no node named {self.node!r} in the model")
            if not _applicable(inferred, nodes[idx], self.kind, inits, const, explicit=True):
                raise FaultError(f"fault {self.kind!r} does not apply to node {self.node!r} ({nodes[idx].op_type})")
        elif anchored:
            st = self._stage()
            cands = [
                i
                for i in range(st.first, min(st.last, len(nodes) - 1) + 1)
                if _applicable(inferred, nodes[i], self.kind, inits, const)
            ]
            stage_values = {a.value for a in self.manifest.anchors if a.stage == self.stage}
            # The applicable node closest to the stage's end whose output reaches one of this stage's
            # own anchors: its effect is first observable at this stage, through the fewest operators
            # (so not masked, e.g. by a MaxPool, before the anchor).
            idx = next((i for i in reversed(cands) if _reaches(nodes, i, st.last, stage_values)), None)
        else:  # a converted model: the stage's nodes by tensor names (node_stages), last in topological order
            self._stage()
            from passes.graph import build_index

            order = build_index(model.graph).file_index
            idx = next(
                (
                    i
                    for i in reversed(order)
                    if stages[i] == self.stage and _applicable(inferred, nodes[i], self.kind, inits, const)
                ),
                None,
            )
        if idx is None:
            raise FaultError(
                f"fault {self.kind!r} has no applicable node in stage {self.stage} "
                "whose output reaches that stage's anchors"
            )
        node = nodes[idx]
        name, op_type = node.name, node.op_type  # before injection: a replaced node may be gone or renamed
        if self.kind in LOWP_KINDS:
            value, desc = inject_lowp(model, inferred, node, idx, self.kind, self.magnitude)
        else:
            value, desc = getattr(self, "_inject_" + self.kind.replace("-", "_"))(model, inferred, node, idx)
        stage = _stage_of(self.manifest, idx) if stages is None else stages[idx]
        truth = FaultTruth(self.kind, self.magnitude, name, op_type, value, stage, desc)
        props = [p for p in model.metadata_props if p.key != FAULT_METADATA_KEY]
        del model.metadata_props[:]
        model.metadata_props.extend(props)
        e = model.metadata_props.add()
        e.key, e.value = FAULT_METADATA_KEY, __import__("json").dumps(truth.to_dict())
        onnx.checker.check_model(model)
        return PassResult(model, True, {"truth": truth})

    def _stage(self):
        st = next((s for s in self.manifest.stages if s.index == self.stage), None)
        if st is None:
            raise FaultError(f"no stage {self.stage}; the manifest has stages 0..{len(self.manifest.stages) - 1}")
        return st

    # ---- kinds --------------------------------------------------------------------------------
    def _reroute(self, model, node, out_index: int = 0) -> tuple[str, str]:
        """Rename ``node``'s output to a fresh value and return (raw, original name): new nodes then
        compute the original name from the raw value, so every consumer and anchor sees the fault."""
        orig = node.output[out_index]
        raw = f"{orig}__anpred_fault_raw"
        node.output[out_index] = raw
        return raw, orig

    def _insert_after(self, model, idx: int, new_nodes) -> None:
        for k, n in enumerate(new_nodes):
            model.graph.node.insert(idx + 1 + k, n)

    def _const(self, model, name: str, value) -> str:
        import onnx

        arr = np.asarray(value, dtype=np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(arr, name))
        return name

    def _inject_round(self, model, inferred, node, idx):
        import onnx.helper as h

        p = int(self.magnitude)
        if not 2 <= p <= 23:
            raise FaultError(f"round: significand bits must be in 2..23, got {p}")
        raw, orig = self._reroute(model, node)
        c = self._const(model, f"{orig}__anpred_fault_c", float(2 ** (24 - p) + 1))
        t, d = f"{orig}__anpred_fault_t", f"{orig}__anpred_fault_d"
        self._insert_after(
            model,
            idx,
            [
                h.make_node("Mul", [raw, c], [t], name=f"{node.name}__anpred_fault_mul"),
                h.make_node("Sub", [t, raw], [d], name=f"{node.name}__anpred_fault_sub1"),
                h.make_node("Sub", [t, d], [orig], name=f"{node.name}__anpred_fault_sub2"),
            ],
        )
        return orig, f"{orig} rounded to {p} significand bits (Veltkamp splitting)"

    def _inject_approx_sigmoid(self, model, inferred, node, idx):
        import onnx.helper as h

        m = self.magnitude
        if not 0 < m <= 1:
            raise FaultError(f"approx-sigmoid: blend weight must be in (0, 1], got {m}")
        x = node.input[0]
        raw, orig = self._reroute(model, node)
        pre = f"{orig}__anpred_fault"
        half = self._const(model, pre + "_half", 0.5)
        one = self._const(model, pre + "_one", 1.0)
        w_exact = self._const(model, pre + "_w0", 1.0 - m)
        w_fast = self._const(model, pre + "_w1", m)
        self._insert_after(
            model,
            idx,
            [
                h.make_node("Abs", [x], [pre + "_abs"], name=pre + "_n0"),
                h.make_node("Add", [pre + "_abs", one], [pre + "_den"], name=pre + "_n1"),
                h.make_node("Div", [x, pre + "_den"], [pre + "_q"], name=pre + "_n2"),
                h.make_node("Mul", [pre + "_q", half], [pre + "_qh"], name=pre + "_n3"),
                h.make_node("Add", [pre + "_qh", half], [pre + "_fast"], name=pre + "_n4"),
                h.make_node("Mul", [raw, w_exact], [pre + "_a"], name=pre + "_n5"),
                h.make_node("Mul", [pre + "_fast", w_fast], [pre + "_b"], name=pre + "_n6"),
                h.make_node("Add", [pre + "_a", pre + "_b"], [orig], name=pre + "_n7"),
            ],
        )
        return orig, f"Sigmoid {node.name} blended {m:g} with the fast sigmoid"

    def _inject_norm_epsilon(self, model, inferred, node, idx):
        eps = float(attribute_value(node, "epsilon", 1e-5))
        _set_attr(node, "epsilon", eps * self.magnitude)
        return node.output[0], f"epsilon of {node.name} {eps:g} -> {eps * self.magnitude:g}"

    def _inject_weight_ulp(self, model, inferred, node, idx):
        import onnx

        wname = node.input[1]
        init = next(i for i in model.graph.initializer if i.name == wname)
        w = onnx.numpy_helper.to_array(init)
        if w.dtype != np.float32:
            raise FaultError(f"weight-ulp: initializer {wname} is {w.dtype}, only float32 is supported")
        k = int(self.magnitude)
        rng = np.random.default_rng(self.seed)
        signs = rng.choice(np.array([-1, 1], dtype=np.int32), size=w.shape)
        bits = w.view(np.int32).astype(np.int64)
        # ULP steps on the magnitude: add to |x|'s bit pattern, keep the sign bit.
        mag = (bits & 0x7FFFFFFF) + signs * k
        mag = np.clip(mag, 0, 0x7F7FFFFF)
        nw = ((bits & ~0x7FFFFFFF) | mag).astype(np.int32).view(np.float32)
        users = sum(wname in n.input for n in model.graph.node)
        new_name = f"{wname}__anpred_fault_ulp" if users > 1 else wname
        arr = onnx.numpy_helper.from_array(nw.reshape(w.shape), new_name)
        if users > 1:
            model.graph.initializer.append(arr)
            node.input[1] = new_name
        else:
            init.CopyFrom(arr)
        return node.output[0], f"{k} ULP perturbation of {wname} ({w.size} weights, seeded signs)"

    def _inject_rounding_mode(self, model, inferred, node, idx):
        import onnx.helper as h

        if node.op_type == "Resize":
            mode = attribute_value(node, "nearest_mode", b"round_prefer_floor")
            mode = mode.decode() if isinstance(mode, bytes) else mode
            swap = {
                "floor": "ceil",
                "ceil": "floor",
                "round_prefer_floor": "round_prefer_ceil",
                "round_prefer_ceil": "round_prefer_floor",
            }[mode]
            _set_attr(node, "nearest_mode", swap)
            return node.output[0], f"Resize {node.name} nearest_mode {mode} -> {swap}"
        # Round: half-to-even -> half-away-from-zero
        x = node.input[0]
        raw, orig = self._reroute(model, node)
        pre = f"{orig}__anpred_fault"
        half = self._const(model, pre + "_half", 0.5)
        node.op_type = "Identity"  # keep the node; its output is unused after rerouting
        self._insert_after(
            model,
            idx,
            [
                h.make_node("Abs", [x], [pre + "_abs"], name=pre + "_n0"),
                h.make_node("Add", [pre + "_abs", half], [pre + "_s"], name=pre + "_n1"),
                h.make_node("Floor", [pre + "_s"], [pre + "_f"], name=pre + "_n2"),
                h.make_node("Sign", [x], [pre + "_sg"], name=pre + "_n3"),
                h.make_node("Mul", [pre + "_f", pre + "_sg"], [orig], name=pre + "_n4"),
            ],
        )
        return orig, f"Round {node.name} half-to-even -> half-away-from-zero"

    def _inject_padding_same(self, model, inferred, node, idx):
        shape = _shape_of(inferred, node.input[0])
        same = _same_pads(node, shape)
        old = attribute_value(node, "pads", [0] * len(same))
        _set_attr(node, "pads", [int(v) for v in same])
        return node.output[0], f"{node.op_type} {node.name} pads {list(old)} -> TF SAME {same}"


def inject_fault(
    model,
    kind: str,
    *,
    node: str | None = None,
    stage: int | None = None,
    magnitude: float | None = None,
    manifest=None,
    seed: int = 0,
):
    """Return ``(variant ModelProto, FaultTruth)``; see :class:`FaultInjectionPass`."""
    r = FaultInjectionPass(kind, node=node, stage=stage, magnitude=magnitude, manifest=manifest, seed=seed)(model)
    return r.model, r.info["truth"]
