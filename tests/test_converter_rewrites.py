"""Converter rewrites (issue 18): what the converter backends change in a graph before converting it,
each checked on its own against ONNX Runtime, onnx.reference or math: passes.recurrent's unrolling of
LSTM/GRU/RNN (and what it keeps), passes.frontend_rewrites' GlobalLpPool and Erf decompositions,
OpenVINO's int8 constant fake quantization folded, a data-dependent Loop kept (a clear error), and the
recurrent defects of onnx.reference that the backend names instead of unrolling. Tolerance: RTOL of
tests/converter_graphs.py. The converters on whole networks: tests/test_converter_coverage.py.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from anpred.errors import BackendError
from models.opclass import rnn_node

from converter_graphs import RTOL


# ---- tests ---------------------------------------------------------------------------------------
@pytest.mark.kernels
def test_unroll_pass_matches_onnx_semantics():
    """passes.recurrent on every (op, direction, initial state, layout) vs ONNX Runtime (layout 0) and
    onnx.reference (layout 1, which ONNX Runtime refuses); the pass keeps output names."""
    import onnx
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    from passes.recurrent import unroll_recurrent

    rng = np.random.default_rng(3)
    worst = 0.0
    for op in ("LSTM", "GRU", "RNN"):
        for direction in ("forward", "reverse", "bidirectional"):
            for states in ((), ("init",)):
                for layout in (0, 1):
                    node, inits, outs = rnn_node(
                        op,
                        "n",
                        "x",
                        4,
                        3,
                        direction,
                        rng,
                        states=states,
                        lbr=(1 if direction == "reverse" else 0) if op == "GRU" else None,
                        layout=layout,
                    )
                    if layout:  # initializer states in the batch-first layout [B, D, H]
                        for t in inits:
                            if t.name.endswith("0"):
                                dims = list(t.dims)
                                t.CopyFrom(
                                    onnx.numpy_helper.from_array(
                                        np.ascontiguousarray(onnx.numpy_helper.to_array(t).transpose(1, 0, 2)), t.name
                                    )
                                )
                                assert list(t.dims) == [dims[1], dims[0], dims[2]]
                    g = onnx.helper.make_graph(
                        [node],
                        "r",
                        [
                            onnx.helper.make_tensor_value_info(
                                "x", onnx.TensorProto.FLOAT, [2, 5, 4] if layout else [5, 2, 4]
                            )
                        ],
                        [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outs],
                        inits,
                    )
                    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 14)])
                    u = copy.deepcopy(m)
                    info = unroll_recurrent(u)
                    assert info["unrolled"] == ["n"] and not any(n.op_type == op for n in u.graph.node)
                    x = rng.normal(0, 1, (2, 5, 4) if layout else (5, 2, 4)).astype(np.float32)
                    want = (
                        ReferenceEvaluator(m).run(None, {"x": x})
                        if layout
                        else ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
                            None, {"x": x}
                        )
                    )
                    got = ort.InferenceSession(u.SerializeToString(), providers=["CPUExecutionProvider"]).run(
                        None, {"x": x}
                    )
                    for a, b in zip(want, got):
                        assert a.shape == b.shape
                        worst = max(worst, float(np.max(np.abs(a - b))))
    assert worst <= RTOL, worst


def test_unroll_pass_keeps_what_it_cannot_unroll():
    import onnx

    from passes.recurrent import unroll_recurrent

    rng = np.random.default_rng(0)
    node, inits, outs = rnn_node("LSTM", "dyn", "x", 4, 3, "forward", rng)
    g = onnx.helper.make_graph(
        [node],
        "r",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["T", 2, 4])],
        [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outs],
        inits,
    )
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])
    info = unroll_recurrent(m)
    assert info["unrolled"] == [] and "not static" in info["kept"]["dyn"]
    assert [n.op_type for n in m.graph.node] == ["LSTM"]


def test_reference_names_a_recurrent_defect_it_cannot_unroll(tmp_path):
    """An LSTM with ``clip`` and a dynamic sequence length: the evaluator ignores the clip (library
    probe), the node cannot be unrolled (no static length), so the backend names the defect
    (``reference_defects``, and a failing or flagged run says so) instead of computing silently."""
    from onnx import TensorProto, helper

    from anpred.backends.reference_defects import probe_recurrent_attribute, reference_defects, work_around

    assert "LSTM ignores clip" in probe_recurrent_attribute("LSTM", "clip")
    rng = np.random.default_rng(0)
    node, inits, outs = rnn_node("LSTM", "dyn", "x", 4, 3, "forward", rng, clip=0.5)
    g = helper.make_graph(
        [node],
        "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "N", 4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    assert work_around(m) == {} and [n.op_type for n in m.graph.node] == ["LSTM"]
    found = reference_defects(m)
    assert list(found) == ["dyn"] and "ignores clip" in found["dyn"]


@pytest.mark.kernels
@pytest.mark.parametrize("opset", [17, 18])
def test_global_lp_pool_decomposition_on_ort(opset):
    """passes.frontend_rewrites.DecomposePass: GlobalLpPool p = 1, 2, 3 on rank 3 and 4 inputs equals
    ONNX Runtime's own GlobalLpPool (the axes as an attribute at opset 17, as an input at 18)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from passes.frontend_rewrites import decompose_ops

    rng = np.random.default_rng(0)
    for shape in ([2, 3, 7], [1, 4, 5, 6]):
        nodes = [helper.make_node("GlobalLpPool", ["x"], [f"y{p}"], name=f"glp{p}", p=p) for p in (1, 2, 3)]
        g = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(f"y{p}", TensorProto.FLOAT, None) for p in (1, 2, 3)],
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        d = copy.deepcopy(m)
        assert decompose_ops(d, {"GlobalLpPool"})["rewritten"] == ["glp1", "glp2", "glp3"]
        assert not any(n.op_type == "GlobalLpPool" for n in d.graph.node)
        x = {"x": rng.standard_normal(shape).astype(np.float32)}
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)
        got = ort.InferenceSession(d.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)
        for a, b in zip(want, got):
            assert a.shape == b.shape == tuple(shape[:2] + [1] * (len(shape) - 2))
            assert float(np.max(np.abs(a - b))) <= RTOL * max(1.0, float(np.max(np.abs(a))))


@pytest.mark.kernels
def test_erf_decomposition_accuracy():
    """passes.frontend_rewrites: Erf as Eigen's float32 rational approximation, run by ONNX Runtime on
    200,001 points of [-5, 5] against math.erf: float32 max |error| 4.19e-7 and relative error <= 2.21e-7
    for |x| < 0.5 (onnx2tf's pseudo Erf, Abramowitz & Stegun 7.1.26 in float32, is off by 0.48% there:
    asserted on the same points); float16 (computed in float32, cast back; at opset 10, where Clip takes
    no bound inputs) within 2.5e-4, ORT's own Erf's error on the same float16 points (2.4e-4); a float64
    Erf is kept (the approximation is float32's)."""
    import math

    import onnxruntime as ort
    from onnx import TensorProto, helper

    from passes.frontend_rewrites import decompose_ops

    x32 = np.linspace(-5, 5, 200001).astype(np.float32)
    for dtype, elem, bound in ((np.float32, TensorProto.FLOAT, 4.2e-7), (np.float16, TensorProto.FLOAT16, 2.5e-4)):
        g = helper.make_graph(
            [helper.make_node("Erf", ["x"], ["y"], name="erf")],
            "g",
            [helper.make_tensor_value_info("x", elem, [x32.size])],
            [helper.make_tensor_value_info("y", elem, [x32.size])],
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 10 if dtype == np.float16 else 17)])
        m.ir_version = 8
        d = copy.deepcopy(m)
        assert decompose_ops(d, {"Erf"})["rewritten"] == ["erf"] and "Erf" not in {n.op_type for n in d.graph.node}
        x = x32.astype(dtype)
        exact = np.array([math.erf(float(v)) for v in x])
        got = ort.InferenceSession(d.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        err = np.abs(got.astype(np.float64) - exact)
        assert err.max() <= bound, (dtype, err.max())
        if dtype == np.float32:
            small = np.abs(x) < 0.5
            assert (err / np.maximum(np.abs(exact), 1e-30))[small].max() <= 2.3e-7
            t = np.float32(1) / (np.float32(1) + np.float32(0.3275911) * np.abs(x))
            poly = (
                (
                    ((np.float32(1.061405429) * t - np.float32(1.453152027)) * t + np.float32(1.421413741)) * t
                    - np.float32(0.284496736)
                )
                * t
                + np.float32(0.254829592)
            ) * t
            pseudo = np.sign(x) * (np.float32(1) - poly * np.exp(-x * x))
            assert (np.abs(pseudo - exact) / np.maximum(np.abs(exact), 1e-30))[small].max() > 1e-3
    g64 = helper.make_graph(
        [helper.make_node("Erf", ["x"], ["y"], name="erf")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4])],
    )
    m64 = helper.make_model(g64, opset_imports=[helper.make_opsetid("", 17)])
    assert "float64" in decompose_ops(m64, {"Erf"})["kept"]["erf"]


@pytest.mark.kernels
def test_openvino_int8_constant_fake_quantization_folded(tmp_path):
    """PP-OCR's pattern ``Add(Conv(...), Reshape(bias))`` quantized by the shared int8 recipe: the
    reshaped bias gets a QuantizeLinear/DequantizeLinear pair of its own, and OpenVINO 2026.4's
    low-precision AddTransformation throws compiling it (asserted on raw OpenVINO, so a fixed release
    shows). openvino-int8 compiles it once more with that constant fake quantization folded
    (passes.frontend_rewrites.fold_constant_fake_quantization) and matches ORT's fake-quantized run of the
    same model within one quantization step of the output."""
    import onnx
    import onnxruntime as ort
    import openvino as ov
    from onnx import TensorProto, helper, numpy_helper

    from anpred.backends.lowp_models import int8_model
    from anpred.backends.openvino import OpenVinoInt8Backend
    from anpred.manifest import AnchorManifest

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (2, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(0, 1, (2,)).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([1, 2, 1, 1], np.int64), "shp"),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["g"], name="gap"),
        helper.make_node("Conv", ["g", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["b", "shp"], ["rb"], name="reshape_bias"),
        helper.make_node("Add", ["c", "rb"], ["a"], name="add_bias"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    g = helper.make_graph(
        nodes,
        "bias_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 1, 1])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    from anpred.instrument import instrument_model

    am, man = instrument_model(m, stages=1)  # the output only: an anchor on the conv changes the pattern
    man.to_model(am)
    path = tmp_path / "bias_add.onnx"
    onnx.save(am, str(path))
    calib = []
    for k in range(4):
        np.savez(tmp_path / f"s{k}.npz", x=rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32))
        calib.append(str(tmp_path / f"s{k}.npz"))
    q = int8_model(path, calib)
    core = ov.Core()
    with pytest.raises(Exception, match=r"AddTransformation\].*CALLBACK HAS THROWN"):
        core.compile_model(core.read_model(str(q)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    manifest = AnchorManifest.from_model(onnx.load(str(path), load_external_data=False))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(q), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    with OpenVinoInt8Backend({"calibration": calib}) as b:
        b.prepare(path, manifest, tmp_path / "w")
        assert b.folded_fake_quantization and "openvino_folded_fake_quantization" in b.versions()
        steps = b.quantization_steps()
        for f in calib:
            x = {"x": np.load(f)["x"]}
            ref = dict(zip(names, sess.run(names, x)))
            got = b.run(x)
            for a in manifest.anchors:
                r = ref[a.name] if a.name in ref else ref[a.value]
                err = float(np.abs(got[a.name].astype(np.float64) - r).max())
                assert err <= 1.01 * steps[a.name], (a.name, err, steps[a.name])


def test_control_flow_kept_is_a_clear_error(tmp_path):
    """A Loop whose trip count is data-dependent is not inlined: the torch backend names it."""
    import onnx
    from onnx import TensorProto as TP, helper

    from anpred.backends.torch_onnx import TorchOnnxBackend
    from anpred.manifest import Anchor, AnchorManifest

    body = helper.make_graph(
        [
            helper.make_node("Relu", ["v_in"], ["v_out"], name="b_relu"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="b_cond"),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TP.INT64, []),
            helper.make_tensor_value_info("cond_in", TP.BOOL, []),
            helper.make_tensor_value_info("v_in", TP.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("cond_out", TP.BOOL, []), helper.make_tensor_value_info("v_out", TP.FLOAT, [2])],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], name="loop", body=body)],
        "dyn",
        [helper.make_tensor_value_info("x", TP.FLOAT, [2]), helper.make_tensor_value_info("n", TP.INT64, [])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "loop.onnx"
    onnx.save(m, str(path))
    manifest = AnchorManifest(anchors=[Anchor("output/y", "y", 0, 0, "loop", "Loop", [2], "float32", kind="output")])
    with pytest.raises(
        BackendError,
        match=r"Loop-16 \(node 'loop'\).*not inlined: loop: Loop: the trip count M is "
        r"absent or not a constant",
    ):
        TorchOnnxBackend().prepare(path, manifest, tmp_path / "w")
    from anpred.backends.torch_onnx import TorchOnnxBackend as T

    assert set(T.unsupported_ops(m)) == {"Loop"}


def test_reference_names_sequence_lens_it_ignores():
    """onnx.reference's recurrent kernels ignore sequence_lens: a per-sample length given as a graph input
    cannot be unrolled (it is not a constant) and is named in reference_defects; a constant equal to the
    sequence length everywhere is harmless and names nothing."""
    import onnx
    from onnx import TensorProto, helper

    from anpred.backends.reference_defects import reference_defects

    rng = np.random.default_rng(0)
    node, inits, outs = rnn_node("GRU", "g", "x", 4, 3, "forward", rng, B=2)
    ins = (list(node.input) + [""] * 5)[: max(5, len(node.input))]
    ins[4] = "lens"  # X, W, R, B, sequence_lens
    del node.input[:]
    node.input.extend(ins)
    g = helper.make_graph(
        [node],
        "r",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 2, 4]),
            helper.make_tensor_value_info("lens", TensorProto.INT32, [2]),
        ],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    assert "ignores sequence_lens" in reference_defects(m)["g"]
    m.graph.input.pop()
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array([5, 5], np.int32), "lens"))
    assert reference_defects(m) == {}
