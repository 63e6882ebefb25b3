"""Fault injection pass: the variant differs from the clean model exactly at the injection point
(on ONNX Runtime every anchor downstream of the faulty tensor in the data flow differs, every other
anchor, upstream or on a parallel branch, is bit-identical), and its ground truth is recorded."""

from __future__ import annotations

import json

import numpy as np
import pytest
from isa_reasons import SAME_RUNTIME

from anpred.errors import AnpredError
from passes.faults import FAULT_METADATA_KEY, FaultError, applicable_nodes, inject_fault
from ort_session import ort_anchors


@pytest.fixture(scope="session")
def anchored_yolov8n(yolov8n_onnx):
    import onnx

    from anpred.instrument import instrument_model

    return instrument_model(onnx.load(yolov8n_onnx))


def _downstream_values(model, value: str) -> set[str]:
    """``value`` and every tensor computed from it in ``model`` (one forward sweep over the nodes in
    graph order, which ONNX requires to be topological)."""
    reach = {value}
    for n in model.graph.node:
        if any(i in reach for i in n.input):
            reach.update(o for o in n.output if o)
    return reach


@pytest.mark.parametrize(
    "kind,magnitude", [("round", 8), ("approx-sigmoid", 1.0), ("weight-ulp", 64), ("padding-same", None)]
)
@pytest.mark.isa_independent(SAME_RUNTIME)
def test_fault_differs_exactly_from_injection_stage(anchored_yolov8n, yolov8n_model, kind, magnitude):
    model, manifest = anchored_yolov8n
    x = yolov8n_model.real_inputs(1)[0]
    clean = ort_anchors(model, manifest, {model.graph.input[0].name: x}, threads=2)
    stages = sorted({a.stage for a in manifest.anchors if a.kind == "boundary"})
    tried = 0
    for stage in (stages[1], stages[len(stages) // 2]):
        try:
            variant, truth = inject_fault(model, kind, stage=stage, magnitude=magnitude, manifest=manifest)
        except FaultError:
            continue  # this kind has no applicable node in this stage (e.g. no stride-2 conv)
        tried += 1
        assert truth.stage == stage and truth.kind == kind
        stored = {p.key: p.value for p in variant.metadata_props}[FAULT_METADATA_KEY]
        assert json.loads(stored)["node"] == truth.node
        faulty = ort_anchors(variant, manifest, {variant.graph.input[0].name: x}, threads=2)
        down = _downstream_values(model, truth.value)
        for a in manifest.anchors:  # by data flow: every anchor the fault cannot reach is bit-identical
            d = float(np.abs(faulty[a.name].astype(np.float64) - clean[a.name]).max())
            if a.value in down:
                assert d > 0, f"{kind}@{stage}: downstream anchor {a.name} unchanged"
            else:
                assert d == 0.0, f"{kind}@{stage}: anchor {a.name} (not downstream of {truth.value}) changed by {d}"
        at_stage = [float(np.abs(faulty[a.name] - clean[a.name]).max()) for a in manifest.anchors if a.stage == stage]
        assert max(at_stage) > 0, f"{kind}@{stage}: no anchor of the injection stage changed"
        assert any(a.value in down and a.stage > stage for a in manifest.anchors)
    assert tried >= 1, f"{kind} applied to no stage"


def test_round_fault_matches_numpy_bfloat16_and_float16():
    import ml_dtypes
    import onnx.helper as h
    import onnxruntime as ort

    g = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"], name="r")],
        "g",
        [h.make_tensor_value_info("x", 1, [4096])],
        [h.make_tensor_value_info("y", 1, [4096])],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    x = (np.random.default_rng(1).standard_normal(4096) * 100).astype(np.float32)
    for bits, dt in [(8, ml_dtypes.bfloat16), (11, np.float16)]:
        v, truth = inject_fault(m, "round", node="r", magnitude=bits)
        y = ort.InferenceSession(v.SerializeToString()).run(None, {"x": x})[0]
        ref = np.maximum(x, 0).astype(dt).astype(np.float32)
        assert int((y != ref).sum()) == 0
        assert truth.value == "y"


def test_fault_bad_requests(anchored_yolov8n):
    model, manifest = anchored_yolov8n
    with pytest.raises(AnpredError, match="unknown fault kind"):
        inject_fault(model, "cosmic-ray", stage=0, manifest=manifest)
    with pytest.raises(FaultError, match="no node named"):
        inject_fault(model, "round", node="nope")
    with pytest.raises(FaultError, match="no applicable node"):
        inject_fault(model, "norm-epsilon", stage=0, manifest=manifest)  # BN folded by the exporter
    assert applicable_nodes(model, "norm-epsilon") == []


def test_round_op_rounding_mode_truth_names_the_original_op():
    """Regression: the ground truth of a Round-op rounding-mode fault recorded the node's op type after
    injection ("Identity") instead of "Round"; and the variant rounds ties away from zero."""
    import onnx.helper as h
    import onnxruntime as ort

    g = h.make_graph(
        [h.make_node("Round", ["x"], ["y"], name="round")],
        "g",
        [h.make_tensor_value_info("x", 1, [5])],
        [h.make_tensor_value_info("y", 1, [5])],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    v, truth = inject_fault(m, "rounding-mode", node="round")
    assert truth.op_type == "Round" and truth.node == "round"
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5], np.float32)
    y = ort.InferenceSession(v.SerializeToString()).run(None, {"x": x})[0]
    assert y.tolist() == [1.0, 2.0, 3.0, -1.0, -3.0]  # half-to-even would give [0, 2, 2, -0, -2]
