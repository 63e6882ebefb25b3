"""Models whose own tensors are float16 on every fp32 backend, and the float64 execution
``onnx-reference-fp64`` (issue 17, deliverables 2 and 4).

Networks are built here with ``onnx.helper``:
- a float16 network (float16 input, weights, activations and output: Conv -> Relu -> Conv -> Add ->
  Sigmoid -> MatMul), anchored with ``anpred.instrument`` and run with ``anpred.run`` on ``ort``,
  ``ort-noopt``, ``openvino``, ``onnx-reference``, ``torch`` (onnx2torch), ``tf`` (onnx2tf) and
  ``onnx-reference-fp64``;
- a float32 network with Conv, BatchNormalization, Sigmoid, Resize (linear), ConstantOfShape, Concat,
  a Cast, MatMul and Softmax, computed by hand in float64 with numpy (:func:`numpy_small`).
The zoo's YOLOv8n at 320 px (the test suite's cached dynamo export, anchored) is compared with
torch in float64 (onnx2torch's GraphModule ``.double()``: an independent float64 implementation).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from anpred.errors import BackendError

from isa_reasons import EXACT_OPS, FLOAT64_BOUND

FP16_BACKENDS = ["ort", "ort-noopt", "openvino", "onnx-reference", "torch", "tf"]


def nrmse(x, ref) -> float:
    """``||x - ref|| / ||ref - mean(ref)||`` in float64 (the normalised error of anpred.align)."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref - ref.mean()))


# ---- models ---------------------------------------------------------------------------------------
def fp16_network(elem: int = 10, seed: int = 0):
    """Conv(3->8) -> Relu -> Conv(8->8) -> Add(residual) -> Sigmoid -> MatMul(16x10), input
    ``x`` (1, 3, 16, 16), output ``y`` (1, 8, 16, 10), every tensor of ONNX element type ``elem``
    (10 = FLOAT16, 11 = DOUBLE, 1 = FLOAT)."""
    import onnx
    from onnx import helper as h
    from onnx import numpy_helper as nh

    dt = onnx.helper.tensor_dtype_to_np_dtype(elem)
    rng = np.random.default_rng(seed)

    def w(name, shape, scale):
        return nh.from_array((rng.standard_normal(shape) * scale).astype(dt), name)

    inits = [
        w("w1", [8, 3, 3, 3], 0.3),
        w("b1", [8], 0.1),
        w("w2", [8, 8, 3, 3], 0.15),
        w("b2", [8], 0.1),
        w("wm", [16, 10], 0.3),
    ]
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        h.make_node("Add", ["c2", "r1"], ["a1"], name="add"),
        h.make_node("Sigmoid", ["a1"], ["s1"], name="sig"),
        h.make_node("MatMul", ["s1", "wm"], ["y"], name="mm"),
    ]
    g = h.make_graph(
        nodes,
        "fp16net",
        [h.make_tensor_value_info("x", elem, [1, 3, 16, 16])],
        [h.make_tensor_value_info("y", elem, [1, 8, 16, 10])],
        inits,
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m


def small_network(seed: int = 0):
    """The float32 network of the module docstring; returns ``(model, weights as float64)``."""
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(seed)
    f = lambda a: a.astype(np.float32)  # noqa: E731
    w = {
        "W": f(rng.standard_normal((3, 2, 3, 3)) * 0.5),
        "b": f(rng.standard_normal(3) * 0.1),
        "gamma": f(1 + 0.2 * rng.standard_normal(3)),
        "beta": f(0.1 * rng.standard_normal(3)),
        "mean": f(0.1 * rng.standard_normal(3)),
        "var": f(0.5 + rng.random(3)),
        "scales": np.array([1, 1, 2, 2], np.float32),
        "kshape": np.array([1, 1, 8, 8], np.int64),
        "wi": rng.integers(-3, 4, (8, 8)).astype(np.int64),
    }
    nodes = [
        h.make_node("Conv", ["x", "W", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        h.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], epsilon=1e-3, name="bn"),
        h.make_node("Sigmoid", ["n"], ["s"], name="sig"),
        h.make_node("Resize", ["s", "", "scales"], ["r"], mode="linear", name="resize"),
        h.make_node("ConstantOfShape", ["kshape"], ["k"], value=nh.from_array(np.array([0.3], np.float32)), name="cos"),
        h.make_node("Concat", ["r", "k"], ["cat"], axis=1, name="concat"),
        h.make_node("Cast", ["wi"], ["wf"], to=TP.FLOAT, name="cast"),
        h.make_node("MatMul", ["cat", "wf"], ["mm"], name="matmul"),
        h.make_node("Softmax", ["mm"], ["y"], axis=-1, name="softmax"),
    ]
    g = h.make_graph(
        nodes,
        "small",
        [h.make_tensor_value_info("x", TP.FLOAT, [1, 2, 4, 4])],
        [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 8, 8])],
        [nh.from_array(v, k) for k, v in w.items()],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m, {k: v.astype(np.float64) for k, v in w.items()}


def numpy_small(x: np.ndarray, w: dict) -> dict[str, np.ndarray]:
    """:func:`small_network` in float64 by hand (ONNX spec formulas); the float attributes
    ``epsilon`` and ``value`` are float32 in the model (AttributeProto/TensorProto), so their float32
    values are used."""
    x = x.astype(np.float64)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    c = np.zeros((1, 3, 4, 4))
    for i in range(4):
        for j in range(4):
            c[0, :, i, j] = np.einsum("ckl,ockl->o", xp[0, :, i : i + 3, j : j + 3], w["W"]) + w["b"]

    def bc(v):
        return v.reshape(1, -1, 1, 1)

    n = (c - bc(w["mean"])) / np.sqrt(bc(w["var"]) + float(np.float32(1e-3))) * bc(w["gamma"]) + bc(w["beta"])
    s = 1 / (1 + np.exp(-n))
    interp = np.zeros((8, 4))  # Resize linear, half_pixel, scale 2, edge-clamped source coordinates
    for o in range(8):
        src = min(max((o + 0.5) / 2 - 0.5, 0.0), 3.0)
        i0 = int(np.floor(src))
        t = src - i0
        interp[o, i0] += 1 - t
        interp[o, min(i0 + 1, 3)] += t
    r = np.einsum("hi,ncij,wj->nchw", interp, s, interp)
    cat = np.concatenate([r, np.full((1, 1, 8, 8), float(np.float32(0.3)))], axis=1)
    mm = cat @ w["wi"].astype(np.float64)
    e = np.exp(mm - mm.max(-1, keepdims=True))
    return {"c": c, "n": n, "s": s, "r": r, "cat": cat, "mm": mm, "y": e / e.sum(-1, keepdims=True)}


def _anchored(model, tmp: Path, **kw) -> tuple[Path, object]:
    import onnx

    from anpred.instrument import instrument_model

    m, man = instrument_model(model, **kw)
    man.to_model(m)
    path = tmp / "model.onnx"
    onnx.save(m, str(path))
    return path, man


def _prepared(name: str, path: Path, man, tmp: Path, **options):
    from anpred.backends import backend_class

    b = backend_class(name)(options)
    b.prepare(path, man, tmp / f"work-{name}")
    return b


# ---- float16 network on every fp32 backend ------------------------------------------------------
@pytest.fixture(scope="module")
def fp16_run(tmp_path_factory):
    from anpred.run import run_model

    tmp = tmp_path_factory.mktemp("fp16")
    path, man = _anchored(fp16_network(), tmp, stages=4)
    store = run_model(
        path,
        FP16_BACKENDS + ["onnx-reference-fp64"],
        "random:normal:seed=0:n=2",
        tmp / "run",
        progress=False,
        timeout_s=300,
    )
    return store, man


@pytest.mark.slow  # the float16 network on every backend: ~30 s cold
def test_fp16_network_runs_on_every_backend_in_float16(fp16_run):
    store, man = fp16_run
    st = store.statuses()
    assert len(man.anchors) == 4 and all(a.dtype == "float16" for a in man.anchors)
    for sid in store.sample_ids:  # anpred.inputs makes float16 samples for a float16 graph input
        assert store.read_inputs(sid)["x"].dtype == np.float16
    for b in FP16_BACKENDS:
        assert st[b].status == "ok", (b, st[b].reason)
        assert st[b].anchors_captured == len(man.anchors), (b, st[b].captures)
        assert set(st[b].dtypes.values()) == {"float16"}, (b, st[b].dtypes)
        for sid in store.sample_ids:
            assert all(v.dtype == np.float16 for v in store.read_anchors(b, sid).values())
    # onnx2tf computes a float16 graph in float32 (its Input op and auto_cast): the capture says so
    assert all("in float32" in c["reason"] for c in st["tf"].captures.values())
    fp64 = st["onnx-reference-fp64"]
    assert fp64.status == "ok" and fp64.precision == "fp64" and fp64.family == "onnx-reference-fp64"
    assert set(fp64.dtypes.values()) == {"float64"}
    assert all("declares float16" in c["reason"] for c in fp64.captures.values())


@pytest.mark.kernels
@pytest.mark.slow  # the float16 network on every backend: ~30 s cold
def test_fp16_backends_differ_by_float16_rounding_only(fp16_run):
    """Against ORT and against the float64 execution, every backend's anchors differ by ordinary float16
    rounding. Measured nRMSE (worst of 2 samples) vs ORT: ort-noopt/openvino/tf <= 8e-6 (they compute
    in float32 and round each output to float16), torch 3e-8 .. 4.6e-4 (its second Conv in float16
    kernels), onnx-reference 3.9e-4 .. 6.3e-4 (float16 numpy arithmetic); vs float64: 2.1e-4 .. 5.8e-4
    for every backend. Rounding to float16 alone costs ~1e-4 here; an overflow or a wrong kernel is far
    above 3e-3."""
    from anpred.align.rules import apply_rule

    store, man = fp16_run
    st = store.statuses()
    worst = {}
    for sid in store.sample_ids:
        ref = store.read_anchors("ort", sid)
        exact = store.read_anchors("onnx-reference-fp64", sid)
        for b in FP16_BACKENDS:
            got = store.read_anchors(b, sid)
            for a in man.anchors:
                x = apply_rule(st[b].captures[a.name].get("transform") or {}, got[a.name], None)
                e_ort, e64 = nrmse(x, ref[a.name]), nrmse(x, exact[a.name])
                assert e_ort < 2e-3, (b, a.name, e_ort)
                assert 1e-5 < e64 < 3e-3, (b, a.name, e64)
                worst[b] = max(worst.get(b, 0.0), e_ort)
    assert worst["ort"] == 0.0
    # the float16 reference evaluator accumulates in float16: visibly off, still fp16-sized
    assert 1e-4 < worst["onnx-reference"] < 2e-3


# ---- dtypes the converters receive ---------------------------------------------------------------
@pytest.mark.isa_independent(FLOAT64_BOUND)
@pytest.mark.slow  # a second onnx2tf conversion (~25 s cold); the float16 case stays in the default run
def test_tf_and_torch_take_float64_and_bfloat16_inputs(tmp_path):
    """float64 graph: tf (onnx2tf keeps float64) matches the float64 reference evaluator to ~1e-16.
    bfloat16 input (cast to float inside): torch takes it; tf refuses it before converting, naming the
    input and onnx2tf's missing bfloat16."""
    import ml_dtypes
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h

    path, man = _anchored(fp16_network(elem=TP.DOUBLE), tmp_path, stages=4)
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16))
    ref = _prepared("onnx-reference", path, man, tmp_path).run({"x": x})
    tf = _prepared("tf", path, man, tmp_path)
    got = tf.run({"x": x})
    from anpred.align.rules import apply_rule

    for a in man.anchors:
        assert got[a.name].dtype == np.float64
        y = apply_rule(tf.anchor_info()[a.name].transform or {}, got[a.name], None)
        assert nrmse(y, ref[a.name]) < 1e-13, a.name

    m = fp16_network(elem=TP.FLOAT)
    m.graph.input[0].type.tensor_type.elem_type = TP.BFLOAT16
    m.graph.node[0].input[0] = "xf"
    m.graph.node.insert(0, h.make_node("Cast", ["x"], ["xf"], to=TP.FLOAT, name="cast_in"))
    onnx.checker.check_model(m)
    d = tmp_path / "bf16"
    d.mkdir()
    path, man = _anchored(m, d, stages=4)
    xb = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(ml_dtypes.bfloat16)
    ref = _prepared("onnx-reference", path, man, d).run({"x": xb})
    got = _prepared("torch", path, man, d).run({"x": xb})
    for a in man.anchors:
        assert nrmse(got[a.name], ref[a.name]) < 1e-5, a.name
    with pytest.raises(BackendError, match=r"onnx2tf has no bfloat16.*input 'x'"):
        _prepared("tf", path, man, d)


# ---- onnx-reference-fp64 ----------------------------------------------------------------------------
@pytest.mark.isa_independent(FLOAT64_BOUND)
def test_fp64_is_float64_exact_on_a_network_computed_by_hand(tmp_path):
    base, w = small_network()
    path, man = _anchored(base, tmp_path, stages=8, anchors=["c", "n", "s", "r", "cat", "mm"])
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 4)).astype(np.float32)
    hand = numpy_small(x, w)
    fp64 = _prepared("onnx-reference-fp64", path, man, tmp_path)
    got64 = fp64.run({"x": x})
    got32 = _prepared("ort", path, man, tmp_path).run({"x": x})
    # Cast `to` -> DOUBLE, Resize scales kept float32 by one Cast, 9 weights/constants widened
    assert fp64.versions()["fp64_conversion"] == "widened_tensors:8,widened_values:8,dtype_attributes:1,float32_casts:1"
    assert fp64.effective_precision() == "fp64"
    assert {a.value for a in man.anchors} == set(hand)
    for a in man.anchors:
        assert got64[a.name].dtype == np.float64
        e64, e32 = nrmse(got64[a.name], hand[a.value]), nrmse(got32[a.name], hand[a.value])
        # measured: float64 9e-17 .. 4e-16, ORT float32 5e-8 .. 2.5e-7
        assert e64 < 1e-14, (a.name, e64)
        assert 1e-9 < e32 < 1e-6, (a.name, e32)
        assert e64 < 1e-5 * e32, (a.name, e64, e32)


@pytest.mark.isa_independent(EXACT_OPS)
def test_fp64_conversion_of_dtype_attributes_and_refusals():
    """Constant value_float, ConstantOfShape without value, EyeLike, Cast to float16: all float64 in
    the copy (checked by running it); QuantizeLinear-13 (no double for x in the spec) is refused by name."""
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh
    from onnx.reference import ReferenceEvaluator

    from passes.float64 import model_to_float64

    nodes = [
        h.make_node("Constant", [], ["k"], value_float=0.1, name="const"),
        h.make_node("Shape", ["x"], ["shp"]),
        h.make_node("ConstantOfShape", ["shp"], ["z"], name="zeros"),
        h.make_node("EyeLike", ["x"], ["eye"], dtype=TP.FLOAT, name="eye"),
        h.make_node("Cast", ["x"], ["x16"], to=TP.FLOAT16, name="to16"),
        h.make_node("Cast", ["x16"], ["xb"], to=TP.FLOAT, name="back"),
        h.make_node("Add", ["xb", "k"], ["a"]),
        h.make_node("Add", ["a", "z"], ["b"]),
        h.make_node("Add", ["b", "eye"], ["y"]),
    ]
    shown = ["k", "z", "eye", "x16", "y"]
    g = h.make_graph(
        nodes,
        "attrs",
        [h.make_tensor_value_info("x", TP.FLOAT, [3, 3])],
        [h.make_tensor_value_info(n, TP.FLOAT16 if n == "x16" else TP.FLOAT, None) for n in shown],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m64, rep = model_to_float64(m)
    assert m.graph.input[0].type.tensor_type.elem_type == TP.FLOAT  # the original is untouched
    assert rep["dtype_attributes"] == 3 and rep["widened_tensors"] == 2 and not rep["casts_inserted"]
    x = np.arange(9, dtype=np.float64).reshape(3, 3) / 3 + 1e-9  # not float32- nor float16-exact
    out = dict(zip(shown, ReferenceEvaluator(m64).run(None, {"x": x})))
    assert all(v.dtype == np.float64 for v in out.values()), {k: v.dtype for k, v in out.items()}
    assert out["k"] == float(np.float32(0.1))  # the model's float32 constant, widened exactly
    assert np.array_equal(out["z"], np.zeros((3, 3))) and np.array_equal(out["eye"], np.eye(3))
    assert np.array_equal(out["x16"], x)  # Cast to float16 became Cast to double: no rounding
    assert np.array_equal(out["y"], x + float(np.float32(0.1)) + np.eye(3))

    q = h.make_graph(
        [
            h.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="quant"),
            h.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dequant"),
        ],
        "qdq",
        [h.make_tensor_value_info("x", TP.FLOAT, [4])],
        [h.make_tensor_value_info("y", TP.FLOAT, [4])],
        [nh.from_array(np.array(0.1, np.float32), "s"), nh.from_array(np.array(3, np.uint8), "zp")],
    )
    qm = h.make_model(q, opset_imports=[h.make_opsetid("", 13)])
    onnx.checker.check_model(qm)
    # QuantizeLinear-13's x allows float/int32 only; the slots typed tensor(float) by the spec (the scales,
    # DequantizeLinear's output) would get Casts
    with pytest.raises(
        BackendError,
        match=r"1 node\(s\) do not take double: QuantizeLinear-13 \(node 'quant'\): "
        r"input 'x' is tensor\(float\), the spec's T1 allows tensor\(float\), "
        r"tensor\(int32\)$",
    ):
        model_to_float64(qm)


@pytest.mark.isa_independent(FLOAT64_BOUND)
@pytest.mark.slow  # YOLOv8n in float64 on the reference evaluator and in torch (~30 s)
def test_fp64_yolov8n_closer_to_torch_float64_than_fp32(tmp_path):
    """YOLOv8n at 320 px (13 anchors): the float64 copy on the reference evaluator vs onnx2torch's
    GraphModule in float64 (independent kernels): measured 8e-16 .. 2.2e-14, ORT float32 5e-7 .. 8e-6.
    Run time of one sample: float64 copy ~0.9 s vs the float32 reference evaluator ~0.7 s."""
    sys.path.insert(0, str(Path(__file__).parent))
    import run_models

    from anpred.run.model import load_anchored

    path = run_models.anchored_zoo_yolo(320)
    _, man, _ = load_anchored(path)
    x = np.random.default_rng(0).random((1, 3, 320, 320)).astype(np.float32)
    fp64 = _prepared("onnx-reference-fp64", path, man, tmp_path)
    name = list(fp64.sess.input_names)[0]
    got64 = fp64.run({name: x})
    got32 = _prepared("ort", path, man, tmp_path).run({name: x})
    ref32 = _prepared("onnx-reference", path, man, tmp_path)
    # the float64 copy and the float32 reference evaluator on the same sample, timed in turn twice and the
    # faster of each kept, so that a change of load between two timings weighs on both
    seconds64, seconds32 = np.inf, np.inf
    for _ in range(2):
        t = time.perf_counter()
        fp64.run({name: x})
        seconds64 = min(seconds64, time.perf_counter() - t)
        t = time.perf_counter()
        ref32.run({name: x})
        seconds32 = min(seconds32, time.perf_counter() - t)
    torch_be = _prepared("torch", path, man, tmp_path)
    torch_be._gm.double()  # noqa: SLF001 - the converted GraphModule, run in float64
    ref = torch_be.run({name: x.astype(np.float64)})
    assert fp64.versions()["fp64_conversion"].endswith("float32_casts:2")  # the two Resize scales
    for a in man.anchors:
        assert ref[a.name].dtype == np.float64 and got64[a.name].dtype == np.float64
        e64, e32 = nrmse(got64[a.name], ref[a.name]), nrmse(got32[a.name], ref[a.name])
        assert e64 < 1e-12, (a.name, e64)
        assert 1e-8 < e32 < 1e-4, (a.name, e32)
        assert e64 < 1e-5 * e32, (a.name, e64, e32)
    # a ratio taken in one run (load slows both): the float64 copy costs about what the float32 evaluator does
    # (0.9 s vs 0.7 s measured here); 5x would mean a slow path, e.g. a float64 op falling back to Python loops
    assert seconds64 < 5 * seconds32, (seconds64, seconds32)
