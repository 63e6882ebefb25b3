"""Converter and runtime gaps found on the wheel models magika and ppocr-cls (issue 18 coverage run), each
reproduced on a network built here and compared with ONNX Runtime on every anchor:

1. onnx2tf's ``Slice`` cuts the wrong axes when its converted ``axes`` are not increasing (magika's
   ``Slice(Conv output, axes [0,1,2,3], ends [max,max,max,1])`` on the channels-last tensor kept
   channel 0 only) -> :func:`anpred.backends.tf_prepare.split_multi_axis_slices` (``tf``, ``litert``);
2. MNN 3.6.1 scrambles ``Op(one-element constant of full rank, conv-derived tensor)`` (magika's
   ``Add([1,1,1] ones, Tanh(...))`` in its GELU) -> :mod:`anpred.backends.mnn_prepare`; the defect itself
   is asserted on raw MNN so that an MNN release that fixes it shows up here;
3. ONNX Runtime's ``ReduceSum`` over a non-innermost axis accumulates sequentially in float32, torch's
   and TensorFlow's more accurately: on magika's LayerNorm (``E[x^2] - E[x]^2``, cancellation up to
   383x) ``torch`` and ``tf`` are the ones closer to a float64 execution (2.2e-6 and 8.1e-6 nRMSE at
   ``Conv_0/Conv2D__120`` against 6.6e-5 to 7.0e-5 for ort, openvino, tvm, mnn, litert): the consensus
   flagged the more accurate pair; asserted here on the reduction itself;
4. onnx2tf passes ONNX node names to TensorFlow as op names (``Softmax@0`` from Paddle2ONNX is not a
   valid one) -> :func:`anpred.backends.tf_prepare.tf_safe_node_names`.

Tolerance (fp32): ``max |y - ort| <= 64 * eps32 * max(1, max |ort|)`` per anchor. Measured (this
machine): tf and litert <= 9.6e-7 on the slice/softmax net (values up to ~25), mnn <= 4.8e-7 on the GELU
net. Two onnx2tf conversions (the slice net, magika; cached in ``$ANPRED_CACHE``); the whole file took
40 s uncached here, magika end to end through tf, litert and mnn 26 s of it. onnx.reference's defects,
found by the same run: tests/test_reference_defects.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from isa_reasons import EXACT_OPS
from ort_session import ort_outputs
from converter_graphs import RTOL, anchor_outputs, f32, gap_model, i64


def _compare(backend, path: Path, workdir: Path, feeds: dict[str, np.ndarray]) -> dict[str, float]:
    """Prepare ``backend`` on the anchored ``path``, run ``feeds``, compare every anchor with ONNX Runtime
    (after the capture's transform) within RTOL; returns max |error| per anchor."""
    from anpred.manifest import AnchorManifest

    manifest = AnchorManifest.from_model(onnx.load(str(path), load_external_data=False))
    ref = ort_outputs(onnx.load(str(path)), feeds)
    backend.prepare(path, manifest, workdir)
    info = backend.anchor_info()
    got = backend.run(feeds)
    errs = {}
    for a in manifest.anchors:
        assert info[a.name].status != "missing", f"{backend.name}: {a.name} missing: {info[a.name].reason}"
        y = got[a.name]
        perm = (info[a.name].transform or {}).get("permute")
        y = np.transpose(y, perm) if perm else y
        r = ref[a.name] if a.name in ref else ref[a.value]
        assert y.shape == r.shape, f"{backend.name} {a.name}: shape {y.shape} vs ort {r.shape}"
        err = float(np.max(np.abs(y.astype(np.float64) - r)))
        assert err <= RTOL * max(1.0, float(np.abs(r).max())), f"{backend.name} {a.name}: max |err| {err:.3g}"
        errs[a.name] = err
    print(f"\n{backend.name}: {len(errs)} anchors, max abs error {max(errs.values()):.3g}")
    return errs


# ---- 1 + 4: onnx2tf's Slice and node names --------------------------------------------------------
def slice_net():
    """magika's conv block and the Slice forms onnx2tf cut wrongly, plus a Paddle-named Softmax:
    x [1, 108] -> Reshape [1, 9, 12] -> Unsqueeze [1, 9, 12, 1] -> Slice(axes [0,2,1,3], no-op) ->
    Transpose [0,2,1,3] -> Conv(8x12x3x1) -> c [1, 8, 7, 1];
    ``y_sq`` = Add(Squeeze(Slice(c, axes [0,1,2,3], ends [max,max,max,1]), 3), bias [1,8,1]) [1, 8, 7];
    ``y_ch`` = Slice(c, axes [1, 2], starts [2, 1], ends [6, 6]) [1, 4, 5, 1] (channel + height);
    ``y_un`` = Slice(c, axes [2, 1], starts [1, 2], ends [6, 6]) (unsorted axes; same cut);
    ``y_sm`` = Softmax(y_sq, axis 1) by a node named ``Softmax@0``."""
    rng = np.random.default_rng(0)
    big = 2**31 - 1
    inits = [
        i64("shp", [1, 9, 12]),
        i64("ax3", [3]),
        i64("s0", [0, 0, 0, 0]),
        i64("e0", [10**9] * 4),
        i64("a0", [0, 2, 1, 3]),
        i64("st0", [1, 1, 1, 1]),
        f32("w", rng.standard_normal((8, 12, 3, 1)) * 0.3),
        i64("e1", [big, big, big, 1]),
        i64("a1", [0, 1, 2, 3]),
        f32("b", rng.standard_normal((1, 8, 1))),
        i64("s2", [2, 1]),
        i64("e2", [6, 6]),
        i64("a2", [1, 2]),
        i64("s3", [1, 2]),
        i64("e3", [6, 6]),
        i64("a3", [2, 1]),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "shp"], ["r"], name="reshape@0"),
        helper.make_node("Unsqueeze", ["r", "ax3"], ["u"]),
        helper.make_node("Slice", ["u", "s0", "e0", "a0", "st0"], ["u2"], name="slice:noop"),
        helper.make_node("Transpose", ["u2"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Conv", ["t", "w"], ["c"], kernel_shape=[3, 1], name="conv@0"),
        helper.make_node("Slice", ["c", "s0", "e1", "a1"], ["c1"], name="slice@magika"),
        helper.make_node("Squeeze", ["c1", "ax3"], ["sq"]),
        helper.make_node("Add", ["sq", "b"], ["y_sq"]),
        helper.make_node("Slice", ["c", "s2", "e2", "a2"], ["y_ch"], name="slice@ch"),
        helper.make_node("Slice", ["c", "s3", "e3", "a3"], ["y_un"], name="slice@unsorted"),
        helper.make_node("Softmax", ["y_sq"], ["y_sm"], axis=1, name="Softmax@0"),
    ]
    return gap_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 108])],
        ["y_sq", "y_ch", "y_un", "y_sm"],
        inits,
    )


@pytest.mark.isa_independent(EXACT_OPS)
def test_split_multi_axis_slices_keeps_the_values():
    from anpred.backends.tf_prepare import split_multi_axis_slices, tf_safe_node_names

    m = slice_net()
    x = {"x": np.random.default_rng(1).standard_normal((1, 108)).astype(np.float32)}
    before = ort_outputs(m, x)
    done = split_multi_axis_slices(m)
    assert done == ["slice:noop", "slice@magika", "slice@ch", "slice@unsorted"]
    slices = [n for n in m.graph.node if n.op_type == "Slice"]
    # the no-op Slice's ends are 1e9 (< 2^31 - 1: kept per axis), magika's keeps only axis 3, the others 2 each
    assert len(slices) == 4 + 1 + 2 + 2
    assert all(
        numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == n.input[3])).size == 1 for n in slices
    )
    after = ort_outputs(m, x)
    for k in before:
        assert np.array_equal(before[k], after[k]), k
    assert before["y_ch"].shape == (1, 4, 5, 1) and np.array_equal(before["y_ch"], before["y_un"])
    renamed = tf_safe_node_names(m)
    assert renamed["Softmax_0"] == "Softmax@0" and renamed["slice_magika/axis3"] == "slice@magika/axis3"
    assert "reshape_0" in renamed and all(not set(n.name) & set("@:") for n in m.graph.node)


@pytest.mark.kernels
@pytest.mark.parametrize("name", ["tf", "litert"])
def test_slice_net_on_onnx2tf(name, tmp_path):
    """tf and litert (one onnx2tf conversion, cached) on every anchor of :func:`slice_net`. Before the
    fix: y_sq off by up to 15.6 (channel 0 only kept), and the conversion failed at ``Softmax@0``."""
    from anpred.backends import backend_class

    path = anchor_outputs(slice_net(), tmp_path / "slice.onnx")
    x = {"x": np.random.default_rng(2).standard_normal((1, 108)).astype(np.float32)}
    b = backend_class(name)({})
    _compare(b, path, tmp_path / "work", x)
    conv = b.conversion if name == "tf" else {}
    if conv:
        assert conv["slices_split"] == ["slice:noop", "slice@magika", "slice@ch", "slice@unsorted"]


# ---- 2: MNN ---------------------------------------------------------------------------------------
def one_element_const_net(op: str = "Add", rank: int = 3):
    """x [1, 16, 20, 1] -> Conv(8x16x3x1) [1, 8, 18, 1] (-> Squeeze(3) [1, 8, 18] when ``rank`` 3) ->
    ``op``(k, .) with k a one-element constant 0.5 of shape [1]*rank, as first operand -> y."""
    rng = np.random.default_rng(0)
    inits = [f32("w", rng.standard_normal((8, 16, 3, 1)) * 0.3), f32("k", np.full([1] * rank, 0.5)), i64("ax3", [3])]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 1])]
    src = "c"
    if rank == 3:
        nodes.append(helper.make_node("Squeeze", ["c", "ax3"], ["s"]))
        src = "s"
    nodes.append(helper.make_node(op, ["k", src], ["y"]))
    return gap_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 20, 1])], ["y"], inits)


def _mnn_raw(model, feeds, tmp: Path) -> np.ndarray:
    """The wheel's MNN itself (its converter, default flags, then its Module API; no anpred rewrite): the
    single output of ``model`` for the float32 ``feeds``."""
    from anpred.backends.mnn import import_mnn

    src, dst = tmp / "m.onnx", tmp / "m.mnn"
    onnx.save(model, str(src))
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, _tools; _tools.mnnconvert(sys.argv[1:])",
            "mnnconvert",
            "-f",
            "ONNX",
            "--modelFile",
            str(src),
            "--MNNModel",
            str(dst),
            "--bizCode",
            "anpred-test",
        ],
        capture_output=True,
        check=True,
        cwd=str(tmp),
    )
    import_mnn()  # kept off stdout: MNN prints its CPU features on import
    import MNN.expr as F
    import MNN.nn as nn

    rt = nn.create_runtime_manager(({"backend": "CPU", "precision": 1, "numThread": 1},))
    names = list(feeds)
    mod = nn.load_module_from_file(str(dst), names, [model.graph.output[0].name], runtime_manager=rt)
    out = mod.forward([F.const(np.ascontiguousarray(feeds[n]), list(feeds[n].shape), F.NCHW, F.float) for n in names])
    out = out[0] if isinstance(out, (list, tuple)) else out
    if out.data_format != F.NCHW:
        out = F.convert(out, F.NCHW)
    return np.array(out.read(), copy=True)


@pytest.mark.kernels
@pytest.mark.parametrize("op,rank", [("Add", 3), ("Div", 3), ("Add", 4)])
def test_mnn_defect_one_element_constant_first(op, rank, tmp_path):
    """The MNN 3.6.1 defect, on MNN alone: scrambled values (off by more than 1 where |y| < 110). If this
    fails because MNN computes it right, the rewrite in anpred.backends.mnn_prepare can go."""
    from anpred.backends.mnn_prepare import prepare_for_mnn

    m = one_element_const_net(op, rank)
    x = {"x": np.random.default_rng(1).standard_normal((1, 16, 20, 1)).astype(np.float32)}
    ref = ort_outputs(m, x)["y"]
    wrong = _mnn_raw(m, x, tmp_path)
    assert wrong.shape == ref.shape and np.abs(wrong - ref).max() > 1.0, "MNN computes it right now"
    assert prepare_for_mnn(m)["scalar_constants"] == [f"node {2 if rank == 3 else 1}: k {[1] * rank} -> scalar"]
    (tmp_path / "fixed").mkdir()
    right = _mnn_raw(m, x, tmp_path / "fixed")
    # elementwise, the a priori bound of two float32 evaluations (ORT's, MNN's) of this conv and op, in
    # whatever summation order their kernels take: on this CPU MNN may equal ORT bit for bit, on an AVX2
    # CPU its conv sums in another order, and where the conv output cancels to ~0.005 the Div by it
    # amplifies 1.4e-7 of rounding to 2.75e-3 on 99.2 (measured under the emulated EPYC-Rome; 2.6 % of
    # the bound there). The scrambled result breaks the same bound: it can fail both ways
    bound = _fp32_bound(m, op, x)
    assert np.all(np.abs(right - ref) <= bound), float(np.max(np.abs(right - ref) / bound))
    assert not np.all(np.abs(wrong - ref) <= bound)


def _fp32_bound(model, op: str, feeds) -> np.ndarray:
    """Bound on |a - b| for two float32 evaluations a, b of ``one_element_const_net``'s
    ``op(k, Conv(x, w))`` (shape of its output): each conv output s is within
    ds = gamma_K * (|w| * |x|) of the exact one (Higham, Accuracy and Stability of Numerical Algorithms,
    2nd ed., eq. 3.5: gamma_K = K u / (1 - K u), K = 48 products, u = 2**-24), so two evaluations
    differ by 2 ds in s; Add passes that on, Div(k, s) turns it into |k| 2 ds / (|s| (|s| - 2 ds)),
    with s the ONNX Runtime value; plus the op's own rounding, u |y| on each side."""
    nodes = {n.op_type: n for n in model.graph.node}
    k_name, src = nodes[op].input
    inits = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    w, k = inits["w"], float(inits[k_name].ravel()[0])
    x = np.abs(feeds["x"][0, :, :, 0].astype(np.float64))  # [cin, 20]; the kernel is 3x1, no padding
    n_out = x.shape[1] - w.shape[2] + 1
    s_abs = sum(np.abs(w[:, :, kh, 0]) @ x[:, kh : kh + n_out] for kh in range(w.shape[2]))  # [cout, n_out]
    u, n = 2.0**-24, w.shape[1] * w.shape[2]
    ds = n * u / (1 - n * u) * s_abs
    exposed = onnx.ModelProto.FromString(model.SerializeToString())
    exposed.graph.output.append(helper.make_tensor_value_info(src, TensorProto.FLOAT, None))
    got = ort_outputs(exposed, feeds)
    s, y = got[src].astype(np.float64).reshape(ds.shape), np.abs(got["y"].astype(np.float64)).reshape(ds.shape)
    if op == "Div":
        err = abs(k) * 2 * ds / (np.abs(s) * np.maximum(np.abs(s) - 2 * ds, np.finfo(np.float64).tiny))
    else:
        err = 2 * ds
    return (err + 2 * u * y).reshape(got["y"].shape)


@pytest.mark.kernels
def test_mnn_backend_one_element_constants(tmp_path):
    """The mnn backend on every anchor of a GELU(tanh) block like magika's after a conv, its constants of
    shape [1, 1, 1] first: before the rewrite its output was off by up to 53.7 on magika."""
    from anpred.backends.mnn import MnnBackend

    rng = np.random.default_rng(3)
    c = lambda n, v: f32(n, np.full((1, 1, 1), v))  # noqa: E731
    inits = [
        f32("w", rng.standard_normal((8, 16, 3, 1)) * 0.3),
        i64("ax3", [3]),
        f32("b", rng.standard_normal((1, 8, 1))),
        c("k0", 0.044715),
        c("k1", 0.7978846),
        c("one", 1.0),
        c("half", 0.5),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["cv"], kernel_shape=[3, 1]),
        helper.make_node("Squeeze", ["cv", "ax3"], ["s"]),
        helper.make_node("Add", ["s", "b"], ["a"]),
        helper.make_node("Mul", ["k0", "a"], ["m0"]),
        helper.make_node("Mul", ["a", "m0"], ["m1"]),
        helper.make_node("Mul", ["a", "m1"], ["m2"]),
        helper.make_node("Add", ["a", "m2"], ["m3"]),
        helper.make_node("Mul", ["k1", "m3"], ["m4"]),
        helper.make_node("Tanh", ["m4"], ["t"]),
        helper.make_node("Add", ["one", "t"], ["t1"]),
        helper.make_node("Mul", ["half", "t1"], ["t2"]),
        helper.make_node("Mul", ["a", "t2"], ["gelu"]),
        helper.make_node("Max", ["half", "gelu"], ["y"]),
    ]
    m = gap_model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 20, 1])], ["a", "gelu", "y"], inits
    )
    x = {"x": rng.standard_normal((1, 16, 20, 1)).astype(np.float32)}
    _compare(MnnBackend({}), anchor_outputs(m, tmp_path / "gelu.onnx"), tmp_path / "work", x)


# ---- 3: reduction accuracy (why torch and tf left the consensus on magika) ---------------------------
@pytest.mark.kernels  # ONNX Runtime's ReduceSum order of float32 sums: ISA-dependent
def test_reduce_sum_accumulation_against_float64():
    """ReduceSum over axis 1 of x^2, x [1, 512, 256] (magika's LayerNorm_0/Sum_1 shape): ONNX Runtime equals a
        sequential float32 accumulation bit for bit; torch's and TensorFlow's sums are several times closer to
        the float64 sum. Measured: median relative error ort 2.0e-7, torch 3.9e-8, tf 6.2e-8 here (on magika's own
    LayerNorm input: 8.7e-7, 4.2e-8, 2.4e-7)."""
    import onnxruntime as ort
    import tensorflow as tf
    import torch

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((1, 512, 256)) + 2.0).astype(np.float32)  # mean 2, std 1: like a LayerNorm input
    sq = x * x
    m = gap_model(
        [helper.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512, 256])],
        ["y"],
        [i64("ax", [1])],
    )
    y_ort = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": sq})[0]
    seq = np.zeros((1, 256), np.float32)
    for i in range(512):
        seq += sq[:, i, :]
    assert np.array_equal(y_ort, seq)
    exact = sq.astype(np.float64).sum(1)
    rel = {
        k: float(np.median(np.abs(v.astype(np.float64) - exact) / exact))
        for k, v in {
            "ort": y_ort,
            "torch": torch.sum(torch.from_numpy(sq), dim=1).numpy(),
            "tf": tf.reduce_sum(tf.constant(sq), axis=1).numpy(),
        }.items()
    }
    print(f"\nmedian relative error vs float64: {rel}")
    assert rel["torch"] * 3 < rel["ort"] and rel["tf"] * 2 < rel["ort"]


# ---- magika end to end ----------------------------------------------------------------------------
@pytest.mark.kernels
@pytest.mark.slow  # magika through onnx2tf, LiteRT and MNN (~30 s cold)
def test_magika_on_the_fixed_backends(tmp_path):
    """magika (anchored, one real sample) through tf, litert and mnn against ONNX Runtime: every anchor
    within nRMSE 2e-4 (before: tf/litert 1.32 at Conv_0/AddV2, mnn 0.99 at ApplyActivation_1/Mul_5;
    after, measured: tf 6.5e-5, litert 3.1e-6, mnn 4.3e-6 at Conv_0/AddV2; the LayerNorm's cancellation
    makes tf's 6.5e-5, and it is the closer one to float64: see the module docstring)."""
    import models
    from anpred.instrument import instrument_model
    from anpred.pipeline.samples import fix_static_inputs
    from anpred.run import run_model

    zm = models.get("magika")
    proto = onnx.load(str(zm.onnx_path()))
    fix_static_inputs(proto, (640, 640), {"bytes": (1, 2048)})
    am, man = instrument_model(proto, stages=8)
    man.to_model(am)
    path = tmp_path / "magika.onnx"
    onnx.save(am, str(path))
    _, arrays = zm.real_samples(1)[0]
    np.savez(tmp_path / "in.npz", **arrays)
    store = run_model(path, ["ort", "tf", "litert", "mnn"], str(tmp_path / "in.npz"), tmp_path / "run", progress=False)
    ref = store.read_anchors("ort", "s0000")
    for name in ("tf", "litert", "mnn"):
        st = store.statuses()[name]
        assert st.status == "ok", st.reason
        got = store.read_anchors(name, "s0000")
        for a, r in ref.items():
            y = got[a]
            perm = ((st.captures.get(a) or {}).get("transform") or {}).get("permute")
            y = np.transpose(y, perm) if perm else y
            r = r.astype(np.float64)
            nrmse = float(np.sqrt(np.mean((y - r) ** 2) / max(np.mean(r**2), 1e-30)))
            print(f"\n{name} {a}: nRMSE vs ort {nrmse:.3g}, max abs {float(np.abs(y - r).max()):.3g}", end="")
            assert nrmse <= 2e-4, f"{name} {a}: nRMSE {nrmse:.3g}"


# ---- OpenVINO: two recurrent layers reading one tensor ---------------------------------------------
def _two_grus(path: Path) -> Path:
    """x [T=3, B=2, 4] read by two forward GRUs (linear_before_reset=1, hidden 3, seeded weights), both
    outputs graph outputs (opset 14)."""
    from models.opclass import rnn_node

    rng = np.random.default_rng(0)
    nodes, inits, outs = [], [], []
    for k in range(2):
        n, i, o = rnn_node("GRU", f"gru{k}", "x", 4, 3, "forward", rng, B=2, lbr=1)
        nodes.append(n)
        inits += i
        outs += o
    g = helper.make_graph(
        nodes,
        "two_grus",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.mark.kernels
def test_openvino_two_recurrent_layers_on_one_tensor(tmp_path):
    """Found by the coverage matrix on opclass:recurrent (openvino flagged with its fp16/int8 members),
    confirmed against the float64 execution: OpenVINO 2026.4's CPU plugin computes the first of two
    recurrent layers that read the same tensor wrongly (each alone is right to 6e-8; measured: max |error|
    0.63 on gru0.Y, gru1 right). Asserted on raw OpenVINO (a fixed release makes this fail), then the
    consensus of ort, torch and onnx-reference flags openvino alone, at gru0's outputs."""
    import openvino as ov

    from anpred.judge import check_run
    from anpred.run import run_model

    path = _two_grus(tmp_path / "two_grus.onnx")
    x = {"x": np.random.default_rng(1).normal(0, 1, (3, 2, 4)).astype(np.float32)}
    want = ort_outputs(onnx.load(str(path)), x)
    core = ov.Core()
    cm = core.compile_model(core.read_model(str(path)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    got = cm(x)
    err = {o: float(np.abs(got[cm.output(o)] - want[o]).max()) for o in want}
    assert err["gru0.Y"] > 0.1 and err["gru1.Y"] < 1e-6, err
    anchored = anchor_outputs(onnx.load(str(path)), tmp_path / "anchored.onnx")
    np.savez(tmp_path / "in.npz", **x)
    run_model(
        anchored,
        ["ort", "openvino", "torch", "onnx-reference"],
        str(tmp_path / "in.npz"),
        tmp_path / "run",
        progress=False,
        timeout_s=300,
    )
    rep = check_run(tmp_path / "run")
    assert [b for b, v in rep.verdicts.items() if v.flagged] == ["openvino"]
    bad = {c.anchor for c in rep.cells if c.backend == "openvino" and c.flagged}
    assert bad and all("gru0" in a for a in bad), bad
