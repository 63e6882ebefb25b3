"""Faults of one reduced-precision implementation (passes.faults_lowp): each is injected into the
*converted* model (a QDQ int8 model from onnxruntime.quantization.quantize_static, a float16 model from
onnxconverter_common.float16), run on ONNX Runtime with all graph optimisations against the intact
converted model, and its effect is checked element by element against numpy; stage= works on the
converted models (the fault's first effect is at the chosen stage's anchors); OpenVINO and the ONNX
reference evaluator compute the same fault (nothing folds it away).

The network: 4 Conv(3x3) + Relu (one stride 2), Reshape, Gemm; 1x3x16x16 -> 1x10, instrumented into 4
stages with single-tensor cuts (anchors r0, c1, r2, logits).
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from passes.faults import FAULT_KINDS, LOWP_KINDS, FaultError, applicable_nodes, inject_fault, node_stages

from ort_session import ort_outputs

# every test here touches a runtime's kernel arithmetic (tests/test_kernel_markers.py)
pytestmark = pytest.mark.kernels


def _convnet():
    rng = np.random.default_rng(0)
    inits, nodes = [], []
    prev, cin = "x", 3
    for i, cout in enumerate([8, 8, 16, 16]):
        w = rng.normal(0, 1.0 / np.sqrt(cin * 9), (cout, cin, 3, 3)).astype(np.float32)
        inits += [nh.from_array(w, f"w{i}"), nh.from_array(rng.normal(0, 0.1, cout).astype(np.float32), f"b{i}")]
        nodes += [
            h.make_node(
                "Conv",
                [prev, f"w{i}", f"b{i}"],
                [f"c{i}"],
                name=f"conv{i}",
                pads=[1, 1, 1, 1],
                strides=[2, 2] if i == 2 else [1, 1],
            ),
            h.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        prev, cin = f"r{i}", cout
    inits += [
        nh.from_array(np.array([1, -1], np.int64), "shp"),
        nh.from_array(rng.normal(0, 0.1, (16 * 8 * 8, 10)).astype(np.float32), "wf"),
        nh.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "bf"),
    ]
    nodes += [
        h.make_node("Reshape", [prev, "shp"], ["flat"], name="flatten"),
        h.make_node("Gemm", ["flat", "wf", "bf"], ["logits"], name="fc"),
    ]
    g = h.make_graph(
        nodes,
        "convnet",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [h.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """``{"anchored", "manifest", "qdq", "qdq_pc" (per-channel weights), "f16", "x"}``."""
    import logging

    from onnxconverter_common import float16
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from anpred.instrument import instrument_model

    am, man = instrument_model(_convnet(), stages=4, max_cut_width=1)
    d = tmp_path_factory.mktemp("lowp")
    onnx.save(am, str(d / "am.onnx"))
    rng = np.random.default_rng(1)
    calib = [rng.normal(size=(1, 3, 16, 16)).astype(np.float32) for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": x} for x in calib])

        def get_next(self):
            return next(self.it, None)

    logging.getLogger().setLevel(logging.ERROR)
    out = {
        "anchored": am,
        "manifest": man,
        "x": np.random.default_rng(5).normal(size=(1, 3, 16, 16)).astype(np.float32),
    }
    for key, pc in (("qdq", False), ("qdq_pc", True)):
        quantize_static(
            str(d / "am.onnx"),
            str(d / f"{key}.onnx"),
            Reader(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=pc,
        )
        out[key] = onnx.load(str(d / f"{key}.onnx"))
    m = copy.deepcopy(am)
    del m.graph.value_info[:]  # as ort-fp16 converts (anpred.backends.ort_lowp)
    out["f16"] = float16.convert_float_to_float16(m, keep_io_types=True)
    return out


def _expose(model, names):
    """A copy of ``model`` with ``names`` added as graph outputs (element types from shape inference)."""
    m = copy.deepcopy(model)
    inf = onnx.shape_inference.infer_shapes(m)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(inf.graph.value_info) + list(inf.graph.output)}
    for n in names:
        m.graph.output.append(h.make_tensor_value_info(n, types[n], None))
    return m


def _ort(model, x, level="ORT_ENABLE_ALL", x64quantprecision=False):
    """Every graph output on ONNX Runtime CPU (2 threads), as :func:`_openvino` and :func:`_reference` run
    the model (``x64quantprecision``: tests/ort_session.py)."""
    return ort_outputs(model, {"x": x}, threads=2, level=level, x64quantprecision=x64quantprecision)


def _openvino(model, x):
    ov = pytest.importorskip("openvino")
    core = ov.Core()
    cm = core.compile_model(
        core.read_model(model.SerializeToString(), b""),
        "CPU",
        {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 2},
    )
    r = cm({"x": x})
    return {n: np.asarray(r[o]) for o in cm.outputs for n in o.get_names()}


def _reference(model, x):
    from onnx import version_converter
    from onnx.reference import ReferenceEvaluator

    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node):
        model = version_converter.convert_version(model, 21)  # the evaluator implements Q/DQ from opset 19
    names = [o.name for o in model.graph.output]
    return dict(zip(names, ReferenceEvaluator(model).run(None, {"x": x})))


def _anchor_out(man, stage):
    a = next(a for a in man.anchors if a.stage == stage)
    return a.value if a.kind == "output" else a.name


def _init(model, name):
    return nh.to_array(next(t for t in model.graph.initializer if t.name == name))


def _node(model, name):
    return next(n for n in model.graph.node if n.name == name)


def _nrmse(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.sqrt(((a - b) ** 2).sum() / (b**2).sum()))


def test_registry_lists_the_lowp_kinds():
    for k in ("quantize-rounding", "zero-point", "accumulator-saturation", "fp16-overflow"):
        assert k in FAULT_KINDS and FAULT_KINDS[k] == LOWP_KINDS[k]
    assert FAULT_KINDS["accumulator-saturation"][0] == 16 and FAULT_KINDS["fp16-overflow"][0] == 14


def test_quantize_rounding_truncation_at_the_node_output(net):
    """Mode 1 (truncation) at stage 1's QuantizeLinear, ONNX Runtime fully optimised: the node's uint8
    output is exactly trunc(x / s) + zp (saturated), the clean one round-half-even(x / s) + zp; about half
    of the nonzero inputs are one step off, none more."""
    q, man, x = net["qdq"], net["manifest"], net["x"]
    variant, truth = inject_fault(q, "quantize-rounding", stage=1, magnitude=1, manifest=man)
    assert truth.stage == 1 and truth.op_type == "QuantizeLinear" and truth.node == "c1_QuantizeLinear"
    qn = _node(q, truth.node)
    s, zp = _init(q, qn.input[1]), int(_init(q, qn.input[2]))
    names = [qn.input[0], qn.output[0]]
    clean, faulty = _ort(_expose(q, names), x), _ort(_expose(variant, names), x)
    xin = faulty[names[0]]
    assert np.array_equal(xin, clean[names[0]])
    t = xin / s  # float32, as the kernel divides
    want_clean = np.clip(np.round(t) + zp, 0, 255)
    want_faulty = np.clip(np.trunc(t) + zp, 0, 255)
    assert np.array_equal(clean[names[1]], want_clean.astype(np.uint8))
    assert np.array_equal(faulty[names[1]], want_faulty.astype(np.uint8))
    steps = faulty[names[1]].astype(int) - clean[names[1]].astype(int)
    assert np.abs(steps).max() == 1
    off = float((steps != 0).mean())
    assert off == float((want_faulty != want_clean).mean())
    assert 0.35 < off < 0.65, off  # truncation is one step off wherever |frac(x/s)| >= 0.5
    # the dequantized anchor moves by exactly those steps
    a = _anchor_out(man, 1)
    qa, fa = _ort(q, x)[a], _ort(variant, x)[a]
    assert np.allclose(fa - qa, steps * s, rtol=0, atol=1e-6)


@pytest.mark.parametrize("ztype", [TensorProto.UINT8, TensorProto.INT8])
def test_quantize_rounding_half_away_differs_only_at_ties(ztype):
    """Mode 0 (half away from zero) on a per-axis QuantizeLinear whose inputs are exact ties and near-ties
    (scales powers of two): it differs from half-to-even exactly at the ties with an even floor, by one
    step away from zero, and nowhere else (0.49999997 stays 0)."""
    zp = np.array(
        [128, 100] if ztype == TensorProto.UINT8 else [0, -3], np.uint8 if ztype == TensorProto.UINT8 else np.int8
    )
    s = np.array([0.25, 0.5], np.float32)
    g = h.make_graph(
        [
            h.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q", axis=1),
            h.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dq", axis=1),
        ],
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 12])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 12])],
        [nh.from_array(s, "s"), nh.from_array(zp, "zp")],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    ticks = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.49999997, 3.2, -3.7, 1000.0, -1000.0], np.float32)
    x = (ticks[None, None, :] * s[None, :, None]).astype(np.float32)
    v, truth = inject_fault(m, "quantize-rounding", node="q", magnitude=0)
    assert truth.value == "q" and [n.op_type for n in v.graph.node].count("QuantizeLinear") == 0
    lo, hi = (0, 255) if ztype == TensorProto.UINT8 else (-128, 127)
    t = x / s[None, :, None]
    away = np.sign(t) * np.floor(np.abs(t) + 0.5)
    away[np.abs(t) < 0.5] = 0
    want = (np.clip(away + zp[None, :, None], lo, hi) - zp[None, :, None]) * s[None, :, None]
    clean = _ort(m, x)["y"]
    got = _ort(v, x)["y"]
    assert np.array_equal(got, want.astype(np.float32))
    diff = (got - clean) / s[None, :, None]
    ties_even = np.isin(np.abs(ticks), [0.5, 2.5])  # half-to-even rounds these toward zero
    assert np.array_equal(diff != 0, np.broadcast_to(ties_even, diff.shape))
    assert np.array_equal(np.sign(diff[diff != 0]), np.sign(t[diff != 0]))


def test_zero_point_shift_is_k_steps_where_not_saturated(net):
    """zero-point k=1 at stage 1 (ONNX Runtime fuses the QDQ group into its integer Conv with the shifted
    output zero point): the dequantized anchor is the clean one plus exactly one step, except where the
    uint8 saturates (255 stays 255); the DequantizeLinear keeps the original zero point."""
    q, man, x = net["qdq"], net["manifest"], net["x"]
    variant, truth = inject_fault(q, "zero-point", stage=1, manifest=man)
    assert truth.stage == 1 and truth.magnitude == 1
    qn = _node(variant, truth.node)
    s, zp = _init(q, qn.input[1]), int(_init(q, "c1_zero_point"))
    assert int(_init(variant, qn.input[2])) == zp + 1 and int(_init(variant, "c1_zero_point")) == zp
    a = _anchor_out(man, 1)
    clean, faulty = _ort(q, x), _ort(variant, x)
    qc = np.round(clean[a] / s).astype(np.int64) + zp
    want = (np.minimum(qc + 1, 255) - zp).astype(np.float32) * s
    assert np.array_equal(faulty[a], want)
    assert (qc == 255).sum() < qc.size and (faulty[a] != clean[a]).mean() > 0.9
    for st in (0,):  # upstream anchors bit-identical
        assert np.array_equal(faulty[_anchor_out(man, st)], clean[_anchor_out(man, st)])
    with pytest.raises(FaultError, match="leaves the range 0..255"):
        inject_fault(q, "zero-point", node="r0_QuantizeLinear", magnitude=-1)  # r0's zero point is 0 (after Relu)
    with pytest.raises(FaultError, match="nonzero integer"):
        inject_fault(q, "zero-point", node="r0_QuantizeLinear", magnitude=0.5)


@pytest.mark.parametrize("key", ["qdq", "qdq_pc"])
def test_accumulator_saturation_clips_at_the_int16_bound(net, key):
    """accumulator-saturation (16 bits) at stage 1's Conv: its output is the float Conv clipped to
    +-32767 * s_x * s_w (s_w per output channel for the per-channel model), and the stage's anchor is
    that clipped tensor requantized by the following QuantizeLinear/DequantizeLinear."""
    q, man, x = net[key], net["manifest"], net["x"]
    variant, truth = inject_fault(q, "accumulator-saturation", stage=1, manifest=man)
    assert truth.stage == 1 and truth.node == "conv1" and truth.value == "c1"
    conv = _node(q, "conv1")
    dqx = next(n for n in q.graph.node if n.output[0] == conv.input[0])
    dqw = next(n for n in q.graph.node if n.output[0] == conv.input[1])
    s_x, s_w = _init(q, dqx.input[1]).astype(np.float64), _init(q, dqw.input[1]).astype(np.float64)
    bound = 32767 * s_x * (s_w.reshape(1, -1, 1, 1) if s_w.size > 1 else s_w)
    raw = "c1__anpred_fault_raw"
    got = _ort(_expose(variant, [raw, "c1"]), x)
    want = np.clip(got[raw].astype(np.float64), -bound, bound).astype(np.float32)
    assert np.array_equal(got["c1"], want)
    clipped = np.abs(got[raw]) > bound
    assert 0 < clipped.sum() < clipped.size // 10
    # the anchor: the clipped value through the stage's QuantizeLinear -> DequantizeLinear
    s, zp = _init(q, "c1_scale"), int(_init(q, "c1_zero_point"))
    a = _anchor_out(man, 1)
    faulty, clean = _ort(variant, x)[a], _ort(q, x)[a]
    requant = (np.clip(np.round(want / s) + zp, 0, 255) - zp).astype(np.float32) * s
    assert np.array_equal(faulty[clipped], requant[clipped])
    assert np.abs(faulty - clean).max() > 10 * s and np.abs(faulty - clean)[~clipped].max() <= s


def test_fp16_overflow_inf_exactly_where_scaled_value_overflows(net):
    """fp16-overflow (m = 16) at stage 2's Conv of the float16 model, ONNX Runtime fully optimised (which
    computes the float16 model in float32 and folds a literal Mul into the Conv): +-inf exactly where
    |y| * 2**m > 65504 (float16 y), y unchanged elsewhere; at the stage's anchor (after Relu) +inf
    where y overflows upward, the clean anchor elsewhere."""
    f, man, x = net["f16"], net["manifest"], net["x"]
    m = 16
    variant, truth = inject_fault(f, "fp16-overflow", stage=2, magnitude=m, manifest=man)
    assert truth.stage == 2 and truth.node == "conv2" and truth.value == "c2"
    raw = "c2__anpred_fault_raw"
    got = _ort(_expose(variant, [raw, "c2"]), x)
    y = got[raw]
    assert y.dtype == np.float16
    over = np.abs(y.astype(np.float64)) * 2.0**m > 65504
    assert 0 < over.sum() < over.size
    assert np.array_equal(np.isinf(got["c2"]), over)
    assert np.array_equal(np.sign(got["c2"][over]), np.sign(y[over]))
    assert np.array_equal(got["c2"][~over], y[~over])
    # the unmodified variant (no extra outputs, so every fusion applies) against the clean model
    a = _anchor_out(man, 2)
    clean_y = _ort(_expose(f, ["c2"]), x)["c2"].astype(np.float64)
    clean, faulty = _ort(f, x), _ort(variant, x)
    up = clean_y * 2.0**m > 65504
    assert np.array_equal(np.isposinf(faulty[a]), up) and not np.isneginf(faulty[a]).any()
    assert np.array_equal(faulty[a][~up], clean[a][~up])
    for st in (0, 1):
        assert np.array_equal(faulty[_anchor_out(man, st)], clean[_anchor_out(man, st)])


def test_fp16_overflow_on_a_float32_output_keeps_its_type(net):
    """The converter keeps some ops in float32 (here: none, so the anchored fp32 model's Gemm): the
    overflow applies to a float32 output with float32 values kept elsewhere (no extra float16 rounding)."""
    am, x = net["anchored"], net["x"]
    v, truth = inject_fault(am, "fp16-overflow", node="fc", magnitude=17)
    got = _ort(_expose(v, ["logits__anpred_fault_raw"]), x)
    y, out = got["logits__anpred_fault_raw"], got["logits"]
    over = np.abs(y.astype(np.float64)) >= 65520 / 2**17
    assert over.any() and not over.all()
    assert np.array_equal(np.isinf(out), over) and np.array_equal(out[~over], y[~over])


@pytest.mark.parametrize(
    "key,kind,magnitude",
    [
        ("qdq", "zero-point", 1),
        ("qdq", "quantize-rounding", 1),
        ("qdq", "accumulator-saturation", 10),
        ("f16", "fp16-overflow", 18),
    ],
)
def test_stage_selection_on_converted_models(net, key, kind, magnitude):
    """stage= on the QDQ / float16 model (node positions shifted by the converter): the chosen node lies
    in the asked stage, every anchor of an earlier stage is bit-identical to the clean converted
    model's, and an anchor of the asked stage differs (ONNX Runtime, fully optimised)."""
    model, man, x = net[key], net["manifest"], net["x"]
    stages = node_stages(model, man)
    clean = _ort(model, x)
    for st in range(len(man.stages)):
        variant, truth = inject_fault(model, kind, stage=st, magnitude=magnitude, manifest=man)
        assert truth.stage == st
        pos = next(i for i, n in enumerate(model.graph.node) if n.name == truth.node)
        assert stages[pos] == st and truth.node in applicable_nodes(model, kind)
        faulty = _ort(variant, x)
        for a in man.anchors:
            nm = a.value if a.kind == "output" else a.name
            same = np.array_equal(faulty[nm], clean[nm])
            if a.stage < st:
                assert same, f"{kind}@{st}: earlier anchor {nm} changed"
            elif a.stage == st:
                assert not same, f"{kind}@{st}: anchor {nm} of the fault's stage unchanged"


def test_stage_selection_errors(net):
    man = net["manifest"]
    with pytest.raises(FaultError, match="no applicable node in stage 0"):
        inject_fault(net["f16"], "zero-point", stage=0, manifest=man)  # no QuantizeLinear in a float16 model
    bare = copy.deepcopy(net["qdq"])
    del bare.graph.output[1:]
    with pytest.raises(FaultError, match="does not expose 3 of the manifest's anchors"):
        inject_fault(bare, "zero-point", stage=1, manifest=man)
    v, truth = inject_fault(bare, "zero-point", node="c1_QuantizeLinear", manifest=man)
    assert truth.stage is None  # named node, anchors gone: no stage rather than a wrong one


@pytest.mark.parametrize(
    "key,kind,stage,magnitude",
    [
        ("qdq", "quantize-rounding", 1, 1),
        ("qdq", "zero-point", 1, 1),
        ("qdq", "accumulator-saturation", 1, 16),
        ("f16", "fp16-overflow", 2, 16),
    ],
)
def test_fault_survives_on_openvino_and_the_reference_evaluator(net, key, kind, stage, magnitude):
    """The same faulty converted model on OpenVINO (f32 inference precision: its int8 kernels on the QDQ
    model) and on the ONNX reference evaluator: the fault's anchor moves as on ONNX Runtime (zero point:
    every unsaturated element one step up; truncation: about half the nonzero elements one step, none
    more; saturation: the same elements clipped, to the same values; overflow: +inf at the same
    positions), so no runtime folds it away; earlier anchors stay as the clean model gives them.
    Where the run's CPU makes ONNX Runtime's u8s8 kernels saturate int16 pairs (no VNNI/AMX:
    anpred.machine), its clean QDQ model already differs from the others (measured under the emulated
    AVX2-only EPYC-Rome: 23 steps at the first anchor, 8 at c1), and a fault that takes one operator
    out of its integer path (quantize-rounding) changes 1037 elements there instead of 1035; ONNX
    Runtime then runs with ``session.x64quantprecision=1`` (its U8U8 kernels) here, and its default
    kernels are checked to differ from that (the saturation seen, not assumed)."""
    from anpred.machine import int16_saturation_possible, machine_info

    model, man, x = net[key], net["manifest"], net["x"]
    variant, truth = inject_fault(model, kind, stage=stage, magnitude=magnitude, manifest=man)
    a = _anchor_out(man, stage)
    ort_run = _ort
    if key == "qdq" and int16_saturation_possible(machine_info()["cpu_flags"]):

        def ort_run(m, x):  # noqa: E306 - ONNX Runtime's integer path without the int16 pairs
            return _ort(m, x, x64quantprecision=True)

        a0 = _anchor_out(man, 0)
        assert not np.array_equal(_ort(model, x)[a0], ort_run(model, x)[a0])
    ref_change = None
    for run in (ort_run, _openvino, _reference):
        clean, faulty = run(model, x), run(variant, x)
        for st in range(stage):
            e = _anchor_out(man, st)
            assert np.allclose(faulty[e], clean[e], rtol=0, atol=1e-6), f"{run.__name__}: {e} changed"
        c, fa = clean[a].astype(np.float64), faulty[a].astype(np.float64)
        if kind == "fp16-overflow":
            change = np.isposinf(fa)
            assert change.any() and not np.isinf(c).any()
        else:
            s = float(_init(model, "c1_scale"))
            steps = np.round((fa - c) / s).astype(int)
            assert np.allclose(fa - c, steps * s, rtol=0, atol=1e-5)
            change = steps
            if kind == "zero-point":
                assert ((steps == 1) | (c / s + int(_init(model, "c1_zero_point")) > 254.5)).all()
            elif kind == "quantize-rounding":
                assert np.abs(steps).max() == 1 and 0.35 < (steps != 0).mean() < 0.65
            else:
                assert 0 < (steps != 0).sum() < steps.size // 10
        if ref_change is None:
            ref_change = change
        else:  # the same effect, element by element, on every runtime
            assert np.array_equal(change, ref_change), f"{run.__name__}: the fault's effect differs from ORT's"


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_fp16_overflow_threshold_is_float16_round_to_nearest(dtype):
    """The overflow boundary is float16's: for m = 8, a float16 output overflows from 256 on (255.875 is
    the largest value whose scaled copy, 65504, is finite); a float32 output from 255.9375 on, where
    y * 2**8 = 65520 is the tie between 65504 and the next step, 65536, which rounds to infinity (IEEE
    754 round to nearest, ties to even), not below (255.9374). Values elsewhere are unchanged."""
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    vals = np.array([255.875, 256.0, -256.0, -255.875, 0.0, 1e-3, 65504.0, 255.9375, 255.9374, -255.9375], dtype)
    n = vals.size
    g = h.make_graph(
        [h.make_node("MatMul", ["x", "eye"], ["y"], name="mm")],
        "g",
        [h.make_tensor_value_info("x", elem, [1, n])],
        [h.make_tensor_value_info("y", elem, [1, n])],
        [nh.from_array(np.eye(n, dtype=dtype), "eye")],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    v, truth = inject_fault(m, "fp16-overflow", node="mm", magnitude=8)
    assert truth.value == "y" and truth.op_type == "MatMul"
    import onnxruntime as ort

    x = vals[None, :]
    got = ort.InferenceSession(v.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0][0]
    with np.errstate(over="ignore"):
        over = np.isinf((vals.astype(np.float32) * np.float32(256)).astype(np.float16))  # numpy's float16 rounding
    assert over.tolist() == [False, True, True, False, False, False, True, True, False, True]
    assert np.array_equal(np.isinf(got), over)
    assert np.array_equal(np.sign(got[over]), np.sign(vals[over]))
    assert np.array_equal(got[~over], vals[~over])
