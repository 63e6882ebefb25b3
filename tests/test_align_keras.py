"""Alignment (anpred.align) on tensors produced by real libraries: the Keras case.

Canonical side: a Keras model exported with tf2onnx (exporters.tf_export, cached) and run in
onnxruntime with intermediate values exposed as outputs (NCHW/NCW/NCDHW). Other side: the same Keras
model run natively in TensorFlow (NHWC/NWC/NDHWC), onnxconverter-common's float16 model and
onnxruntime's QDQ quantization in onnxruntime, and a torch model run unbatched and in bfloat16
(tests/align_cases.py builds the case). Nothing stands in for a converter. YOLOv8n through onnx2tf:
tests/test_align_onnx2tf.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from anpred.align import (
    AlignmentError,
    AlignmentReport,
    Aligner,
    apply_rule,
    find_segment_permutation,
    normalized_error,
)
from anpred.backends.base import AnchorCapture, BackendStatus
from anpred.manifest import Anchor, AnchorManifest

from isa_reasons import DEFECT_BOUND, FP32_BOUND
from ort_session import ort_outputs
from align_cases import ANCHORS, FP32_NOISE, expose_outputs, keras_run, ort_status, tf_status


@pytest.mark.isa_independent(FP32_BOUND)
def test_keras_nhwc_vs_ort_nchw_known_rule(keras_case):
    m = keras_case["manifest"]
    al = Aligner(m, {"ort": ort_status(m), "tf-native": tf_status(m)})
    for sid, (o, k) in enumerate(zip(keras_case["ort"], keras_case["keras"])):
        raw_k = {a: k[a] for a in ANCHORS}
        assert raw_k["anchor/00/relu1"].shape == (1, 16, 16, 8) and o["anchor/00/relu1"].shape == (1, 8, 16, 16)
        res = al.align(f"s{sid}", {"ort": o, "tf-native": raw_k})
        assert not res.unaligned.get("anchor/00/relu1")
        for a in [
            "anchor/00/relu1",
            "anchor/01/pool1",
            "anchor/02/conv2",
            "anchor/03/gap",
            "anchor/05/c1d",
            "anchor/06/c3d",
            "output/flat",
        ]:
            t = res.tensors[a]
            assert t["tf-native"].dtype == np.float64 and t["tf-native"].shape == tuple(m[a].shape)
            e = normalized_error(t["tf-native"], t["ort"])
            assert e < FP32_NOISE, (a, e)
    d = al.decisions
    for a, perm in [
        ("anchor/00/relu1", [0, 3, 1, 2]),
        ("anchor/01/pool1", [0, 3, 1, 2]),
        ("anchor/05/c1d", [0, 2, 1]),
        ("anchor/06/c3d", [0, 4, 1, 2, 3]),
    ]:
        assert d[(a, "tf-native")].source == "capture" and d[(a, "tf-native")].rule == {"permute": perm}
        assert d[(a, "tf-native")].samples == 2
    # Keras GlobalAveragePooling2D (1, 16) vs ONNX GlobalAveragePool (1, 16, 1, 1): shape decides
    gap = d[("anchor/03/gap", "tf-native")]
    assert gap.source == "shape" and gap.rule == {"reshape": True} and gap.backend_shape == [1, 16]
    assert d[("output/flat", "tf-native")].rule == {} and d[("anchor/00/relu1", "ort")].rule == {}
    rep = al.report()
    listed = {(x.anchor, x.backend) for x in rep.alignments}
    assert ("anchor/00/relu1", "tf-native") in listed and ("anchor/00/relu1", "ort") not in listed
    assert rep.identity["ort"] == len(ANCHORS) and not rep.unaligned
    assert AlignmentReport.from_dict(rep.to_dict()).to_dict() == rep.to_dict()
    assert "permute [0, 3, 1, 2] [capture]" in rep.format_text()


@pytest.mark.isa_independent(FP32_BOUND)
def test_segment_permutation_of_concatenated_heads_is_found_and_recorded(keras_case):
    """A Keras port concatenating the two heads in the other order: the layout is known, the head
    order is found from the data (against the ORT reference) and recorded."""
    m = keras_case["manifest"]
    al = Aligner(m, {"ort": ort_status(m), "tf-native": tf_status(m)})
    for sid, (o, k) in enumerate(zip(keras_case["ort"], keras_case["keras"])):
        raw = {"anchor/04/cat": k["cat_swapped"]}  # heads b (6 ch) then a (4 ch)
        res = al.align(f"s{sid}", {"ort": {"anchor/04/cat": o["anchor/04/cat"]}, "tf-native": raw})
        t = res.tensors["anchor/04/cat"]
        assert normalized_error(t["tf-native"], t["ort"]) < FP32_NOISE
        raw_err = normalized_error(np.transpose(k["cat_swapped"], [0, 3, 1, 2]).astype(np.float64), o["anchor/04/cat"])
        assert raw_err > 0.5  # the layout alone does not explain it
    dec = al.decisions[("anchor/04/cat", "tf-native")]
    assert dec.source == "data" and dec.rule["permute"] == [0, 3, 1, 2]
    assert dec.rule["segments"] == {"axis": 1, "order": [[6, 4], [0, 6]]}
    assert dec.error < FP32_NOISE and dec.runner_up > 0.5 and dec.samples == 2
    text = al.report().format_text()
    assert "segments axis 1 [6:10, 0:6]" in text
    assert "segment order found by the data (check these: a port's order or a real defect): 1" in text


@pytest.mark.isa_independent(FP32_BOUND)
def test_c_eq_h_eq_w_decided_by_data(keras_case):
    """pool1 is 1x8x8x8 in both libraries and the backend says nothing about its layout: three
    layout candidates fit the shape; the data picks NHWC -> NCHW with a decisive margin, once."""
    m = keras_case["manifest"]
    st = {"ort": ort_status(m), "tf-native": tf_status(m, known=False)}
    al = Aligner(m, st)
    first = None
    for sid, (o, k) in enumerate(zip(keras_case["ort"], keras_case["keras"])):
        res = al.align(f"s{sid}", {"ort": o, "tf-native": {a: k[a] for a in ANCHORS}})
        t = res.tensors["anchor/01/pool1"]
        assert normalized_error(t["tf-native"], t["ort"]) < FP32_NOISE
        dec = res.decisions[("anchor/01/pool1", "tf-native")]
        first = first or dec
        assert dec is first  # taken once, reused
    print(
        f"\npool1 data decision: error {dec.error:.2e}, runner-up {dec.runner_up:.3f}, "
        f"candidates {[round(c['error'], 4) for c in dec.candidates]}"
    )
    assert dec.source == "data" and dec.rule == {"permute": [0, 3, 1, 2]}
    assert len(dec.candidates) == 3 and dec.error < FP32_NOISE and dec.runner_up > 0.3
    assert dec.margin is None or dec.margin > 1e4
    assert dec.samples == 2
    # shapes that decide alone: (1,8,8,16) -> (1,16,8,8), (1,32,6) -> (1,6,32), NDHWC -> NCDHW
    for a in ["anchor/02/conv2", "anchor/05/c1d", "anchor/06/c3d"]:
        d = al.decisions[(a, "tf-native")]
        assert d.source == "shape" and "permute" in d.rule, (a, d)
    # with no other backend, nothing to decide by: unaligned, with the shapes
    alone = Aligner(m, {"tf-native": st["tf-native"]})
    res = alone.align("s0", {"tf-native": {"anchor/01/pool1": keras_case["keras"][0]["anchor/01/pool1"]}})
    why = res.unaligned["anchor/01/pool1"]["tf-native"]
    assert "ambiguous" in why and "[1, 8, 8, 8]" in why and "anchor/01/pool1" not in res.tensors


@pytest.mark.isa_independent(DEFECT_BOUND)
def test_wrong_tensor_is_never_explained_away(keras_case):
    """The same architecture with other weights (seed 1): right shapes, wrong values. A naive
    permutation search fits noise (it lowers the error); the aligner keeps the difference: known
    layouts are applied as they are, no channel permutation is accepted, ambiguous layouts stay
    unaligned."""
    from scipy.optimize import linear_sum_assignment

    m = keras_case["manifest"]
    o, w = keras_case["ort"][0], keras_case["wrong"][0]
    # known layout: aligned, and exactly as different as the raw tensor
    al = Aligner(m, {"ort": ort_status(m), "tf-native": tf_status(m)})
    res = al.align("s0", {"ort": o, "tf-native": {a: w[a] for a in ANCHORS}})
    a = "anchor/02/conv2"
    got = res.tensors[a]["tf-native"]
    ref = o[a].astype(np.float64)
    plain = np.transpose(w[a], [0, 3, 1, 2]).astype(np.float64)
    assert np.array_equal(got, plain)
    e = normalized_error(got, ref)
    assert e > 0.5
    assert "segments" not in al.decisions[(a, "tf-native")].rule
    # the naive channel assignment (Hungarian on channel distances) would have "improved" it
    A, M = plain[0].reshape(16, -1), ref[0].reshape(16, -1)
    cost = ((A[:, None, :] - M[None, :, :]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    naive = np.empty_like(A)
    naive[cols] = A[rows]
    assert not np.array_equal(cols, np.arange(16))
    print(
        f"\nwrong conv2: error {e:.3f} kept; naive channel assignment would give "
        f"{normalized_error(naive.reshape(ref.shape), ref):.3f}"
    )
    assert normalized_error(naive.reshape(ref.shape), ref) < e  # noise fitted
    assert find_segment_permutation(plain, ref) is None
    # ambiguous layout (1x8x8x8, no layout reported): a naive argmin would pick a candidate anyway
    al2 = Aligner(m, {"ort": ort_status(m), "tf-native": tf_status(m, known=False)})
    res2 = al2.align("s0", {"ort": o, "tf-native": {a: w[a] for a in ANCHORS}})
    why = res2.unaligned["anchor/01/pool1"]["tf-native"]
    assert "no candidate matches the consensus" in why and "[1, 8, 8, 8]" in why
    assert "anchor/01/pool1" not in res2.tensors or "tf-native" not in res2.tensors["anchor/01/pool1"]
    # the correct tensor with a genuine small error still gets its true layout and keeps the error
    k = keras_case["keras"][0]["anchor/01/pool1"].copy()
    k[0, 2, 3, :] += 0.5  # one pixel wrong in every channel
    res3 = Aligner(m, {"ort": ort_status(m), "tf-native": tf_status(m, known=False)}).align(
        "s0", {"ort": {"anchor/01/pool1": o["anchor/01/pool1"]}, "tf-native": {"anchor/01/pool1": k}}
    )
    t = res3.tensors["anchor/01/pool1"]
    diff = t["tf-native"] - t["ort"]
    assert np.allclose(diff[0, :, 2, 3], 0.5, atol=1e-5) and np.abs(diff).sum() == pytest.approx(4.0, abs=1e-3)
    rep = al2.report()
    assert any(u.anchor == "anchor/01/pool1" and u.backend == "tf-native" for u in rep.unaligned)


@pytest.mark.kernels
def test_float16_and_int8_aligned_to_float(keras_case):
    """onnxconverter-common's float16 model (float16 outputs) and onnxruntime's QDQ int8 model (raw
    uint8 QuantizeLinear output, scale/zero point from the model) are widened/dequantized."""
    import onnx
    from onnx import numpy_helper
    from onnxconverter_common import float16
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    m, proto, values = keras_case["manifest"], keras_case["proto"], keras_case["values"]
    names = list(values.values())
    fp16 = float16.convert_float_to_float16(onnx.ModelProto.FromString(proto.SerializeToString()), keep_io_types=False)
    feeds16 = [{k: v.astype(np.float16) for k, v in f.items()} for f in keras_case["samples"]]
    out16 = [ort_outputs(fp16.SerializeToString(), f, names) for f in feeds16]
    assert out16[0][values["anchor/00/relu1"]].dtype == np.float16

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "f.onnx", Path(d) / "q.onnx"
        onnx.save(proto, str(src))

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter(keras_case["samples"])

            def get_next(self):
                return next(self.it, None)

        # reduce_range (7-bit weights): ONNX Runtime's documented remedy for the int16 saturation of its
        # u8s8 kernels on x86 without VNNI (VPMADDUBSW); with it the int8 result does not depend on the
        # CPU's instruction set, which this alignment test must not (checked both ways, docs/run.md)
        quantize_static(
            str(src),
            str(dst),
            Reader(),
            quant_format=QuantFormat.QDQ,
            reduce_range=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
        q = onnx.load(str(dst))
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    relu = values["anchor/00/relu1"]
    # the quantizer re-creates the value as DequantizeLinear(QuantizeLinear(...)): expose the uint8 tensor
    dql = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == relu)
    ql = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.output[0] == dql.input[0])
    scale, zp = float(inits[ql.input[1]]), int(inits[ql.input[2]])
    q = expose_outputs(q, [ql.output[0]])
    qnames = names + [ql.output[0]]
    outq = [ort_outputs(q.SerializeToString(), f, qnames) for f in keras_case["samples"]]
    assert outq[0][ql.output[0]].dtype == np.uint8

    caps_q = {a.name: AnchorCapture("exact", a.layout).__dict__ for a in m.anchors}
    caps_q["anchor/00/relu1"] = AnchorCapture(
        "exact", "NCHW", {"dequantize": {"scale": scale, "zero_point": zp}}
    ).__dict__
    st = {
        "ort": ort_status(m),
        "ort-fp16": ort_status(m, "ort-fp16", "fp16"),
        "ort-int8": ort_status(m, "ort-int8", "int8", caps_q),
    }
    al = Aligner(m, st)
    errs16, errs8 = [], []
    for sid in range(2):
        raw = {
            "ort": keras_case["ort"][sid],
            "ort-fp16": {a: out16[sid][v] for a, v in values.items()},
            "ort-int8": {a: outq[sid][v] for a, v in values.items()} | {"anchor/00/relu1": outq[sid][ql.output[0]]},
        }
        res = al.align(f"s{sid}", raw)
        assert not res.unaligned
        for a in ANCHORS:
            t = res.tensors[a]
            assert t["ort-fp16"].dtype == np.float64 and t["ort-int8"].shape == t["ort"].shape
            errs16.append(normalized_error(t["ort-fp16"], t["ort"]))
        errs8.append(
            normalized_error(res.tensors["anchor/00/relu1"]["ort-int8"], res.tensors["anchor/00/relu1"]["ort"])
        )
    # fp16: visibly not fp32, well within fp16's precision; int8: a quantization-level error
    print(f"\nfp16 normalised error max {max(errs16):.2e}; int8 relu1 {max(errs8):.2e}")
    assert 1e-5 < max(errs16) < 2e-2, errs16
    assert 1e-3 < max(errs8) < 0.1, errs8
    d = al.decisions
    assert d[("anchor/00/relu1", "ort-fp16")].rule == {"cast": "float16"}
    assert d[("anchor/00/relu1", "ort-int8")].rule["dequantize"]["zero_point"] == zp
    dq = (outq[0][ql.output[0]].astype(np.float64) - zp) * scale
    assert np.array_equal(apply_rule(d[("anchor/00/relu1", "ort-int8")].rule, outq[0][ql.output[0]], None), dq)
    # an integer tensor with no scale/zero point is never guessed
    st2 = {"ort": st["ort"], "ort-int8": ort_status(m, "ort-int8", "int8")}
    res = Aligner(m, st2).align(
        "s0", {"ort": keras_case["ort"][0], "ort-int8": {"anchor/00/relu1": outq[0][ql.output[0]]}}
    )
    assert "zero point" in res.unaligned["anchor/00/relu1"]["ort-int8"]


@pytest.mark.kernels  # torch's bfloat16 convolution: bf16 instructions where the CPU has them, fp32 where not
def test_flatten_and_batch_squeeze_and_bfloat16(keras_case, tmp_path):
    """Keras Flatten output (channels-last order) against the ONNX NCHW conv anchor; a torch module run
    on an unbatched input (C, H, W) and in bfloat16, through the run store, against its ONNX export."""
    import ml_dtypes
    import torch

    from anpred.run import RunStore
    from exporters.torch_export import export_torch

    m = keras_case["manifest"]
    o, k = keras_case["ort"][0], keras_case["keras"][0]
    al = Aligner(m, {"ort": ort_status(m), "tf-native": tf_status(m, known=False)})
    res = al.align(
        "s0", {"ort": {"anchor/02/conv2": o["anchor/02/conv2"]}, "tf-native": {"anchor/02/conv2": k["output/flat"]}}
    )  # (1, 1024) HWC order
    dec = al.decisions[("anchor/02/conv2", "tf-native")]
    assert dec.source == "data" and dec.rule == {"view": [1, 8, 8, 16], "permute": [0, 3, 1, 2]}
    assert normalized_error(res.tensors["anchor/02/conv2"]["tf-native"], o["anchor/02/conv2"]) < FP32_NOISE

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(0))
    x = torch.randn(1, 3, 6, 6)
    path = export_torch(net[:2], (x,), tmp_path / "t.onnx", dynamo=False).path
    import onnxruntime as ort

    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()[0].name: x.numpy()}
    )[0]
    with torch.no_grad():
        unbatched = net[:2](x[0]).numpy()  # torch accepts (C, H, W): batch squeezed
        flat = net(x[0]).numpy()  # torch.flatten of (C, H, W): NCHW order
        bf = net[:2].to(torch.bfloat16)(x.to(torch.bfloat16)).view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    assert unbatched.shape == (5, 6, 6) and ref.shape == (1, 5, 6, 6)
    man = AnchorManifest(
        anchors=[
            Anchor("anchor/00/relu", "r", 0, 0, "", "Relu", [1, 5, 6, 6], "float32", "NCHW"),
            Anchor("anchor/01/relu_flat", "r2", 0, 1, "", "Relu", [1, 5, 6, 6], "float32", "NCHW"),
        ]
    )
    store = RunStore.create(tmp_path / "run", man)
    store.add_sample("s0000", {"x": x.numpy()})
    store.write_anchors("ort", "s0000", {"anchor/00/relu": ref, "anchor/01/relu_flat": ref})
    store.write_anchors("torch-native", "s0000", {"anchor/00/relu": unbatched, "anchor/01/relu_flat": flat})
    store.write_anchors("torch-bf16", "s0000", {"anchor/00/relu": bf, "anchor/01/relu_flat": bf})
    caps = {a.name: AnchorCapture("exact", "NCHW").__dict__ for a in man.anchors}
    store.set_status(BackendStatus("ort", "onnxruntime", "ok", captures=caps))
    store.set_status(BackendStatus("torch-native", "torch", "ok", captures=caps))
    store.set_status(
        BackendStatus(
            "torch-bf16",
            "torch",
            "ok",
            precision="bf16",
            captures=caps,
            dtypes={a.name: "bfloat16" for a in man.anchors},
        )
    )
    r = RunStore.open(tmp_path / "run")
    assert r.read_anchors("torch-bf16", "s0000")["anchor/00/relu"].dtype.kind == "V"  # npz drops bfloat16
    al = Aligner(r.manifest, r.statuses())
    for sid, raw in r.iter_samples():
        res = al.align(sid, raw)
        for a in ("anchor/00/relu", "anchor/01/relu_flat"):
            t = res.tensors[a]
            assert normalized_error(t["torch-native"], t["ort"]) < FP32_NOISE
            assert "torch-bf16" in t, res.unaligned
            assert 1e-4 < normalized_error(t["torch-bf16"], t["ort"]) < 3e-2
    d = al.decisions
    assert d[("anchor/00/relu", "torch-native")].rule == {"reshape": True}
    assert "reshape [5, 6, 6] -> [1, 5, 6, 6]" in d[("anchor/00/relu", "torch-native")].detail
    assert d[("anchor/01/relu_flat", "torch-native")].rule == {"reshape": True}
    assert d[("anchor/00/relu", "torch-bf16")].rule == {"cast": "bfloat16"}


@pytest.mark.isa_independent(FP32_BOUND)
def test_manifest_pins_override_and_bad_pins(keras_case):
    m0 = keras_case["manifest"]
    m = AnchorManifest.from_dict(m0.to_dict())
    m["anchor/01/pool1"].alignment = {"tf-native": {"permute": [0, 3, 1, 2]}}
    m["anchor/00/relu1"].alignment = {"tf-native": {"exclude": "known to differ (issue 123)"}}
    o, k = keras_case["ort"][0], keras_case["keras"][0]
    al = Aligner(m, {"ort": ort_status(m), "tf-native": tf_status(m, known=False)})
    res = al.align("s0", {"ort": o, "tf-native": {a: k[a] for a in ANCHORS}})
    assert al.decisions[("anchor/01/pool1", "tf-native")].source == "manifest"
    assert normalized_error(res.tensors["anchor/01/pool1"]["tf-native"], o["anchor/01/pool1"]) < FP32_NOISE
    assert "issue 123" in res.unaligned["anchor/00/relu1"]["tf-native"]
    m["anchor/01/pool1"].alignment = {"tf-native": {"permute": [0, 3, 3, 2]}}
    with pytest.raises(AlignmentError, match="not a permutation"):
        Aligner(m, {"tf-native": tf_status(m)}).align("s0", {"tf-native": {"anchor/01/pool1": k["anchor/01/pool1"]}})
    m["anchor/01/pool1"].alignment = {"tf-native": {"transpose": [0, 3, 1, 2]}}
    with pytest.raises(AlignmentError, match="unknown alignment rule key"):
        Aligner(m, {"tf-native": tf_status(m)}).align("s0", {"tf-native": {"anchor/01/pool1": k["anchor/01/pool1"]}})
    # a tensor that fits nothing is unaligned with its shapes
    wrong = {"ort": {"anchor/00/relu1": np.zeros((1, 7, 16, 16), np.float32)}}
    res = Aligner(m0, {"ort": ort_status(m0)}).align("s0", wrong)
    unfit = res.unaligned["anchor/00/relu1"]["ort"]
    assert "[1, 7, 16, 16]" in unfit and "[1, 8, 16, 16]" in unfit


def test_cli_align_prints_report_and_writes_json(keras_case, tmp_path, capsys):
    from anpred.cli import main
    from anpred.run import RunStore

    m = keras_case["manifest"]
    store = RunStore.create(tmp_path / "run", m)
    for sid, (feeds, o, k) in enumerate(zip(keras_case["samples"], keras_case["ort"], keras_case["keras"])):
        s = f"s{sid:04d}"
        store.add_sample(s, feeds)
        store.write_anchors("ort", s, o)
        store.write_anchors("tf-native", s, {a: k[a] for a in ANCHORS})
    store.set_status(ort_status(m))
    store.set_status(tf_status(m, known=False))
    out = tmp_path / "align.json"
    assert main(["align", str(tmp_path / "run"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "alignment over 2 sample(s)" in text and "permute [0, 3, 1, 2] [data:" in text
    assert "reshape [shape]" in text and "unaligned: none" in text
    rep = AlignmentReport.from_dict(__import__("json").loads(out.read_text()))
    assert rep.samples == 2 and any(a.source == "data" and a.anchor == "anchor/01/pool1" for a in rep.alignments)
    assert main(["align", str(tmp_path / "nothing")]) == 2
    assert "not a run folder" in capsys.readouterr().err


@pytest.mark.isa_independent(FP32_BOUND)
def test_native_reorderings_in_check_report(keras_case, tmp_path):
    """tf-native (a separate Keras graph): its conv2 channel halves swapped is found as a segment order
    (a port could concatenate so) and *reported* by `anpred check` (note per anchor, counted in the text
    summary); rows flipped (relu1) and a 3-column roll (pool1) stay different and are flagged."""
    from anpred.judge import check_run
    from anpred.report.text import format_text

    def edit(t):
        t = dict(t)
        t["anchor/02/conv2"] = np.concatenate([t["anchor/02/conv2"][..., 8:], t["anchor/02/conv2"][..., :8]], axis=3)
        t["anchor/00/relu1"] = t["anchor/00/relu1"][:, ::-1].copy()
        t["anchor/01/pool1"] = np.roll(t["anchor/01/pool1"], 3, axis=2)
        return t

    rep = check_run(keras_run(keras_case, tmp_path / "run", edit))
    seg = [a for a in rep.alignment["alignments"] if "segments" in a["rule"]]
    assert [(a["anchor"], a["rule"]["segments"]) for a in seg] == [
        ("anchor/02/conv2", {"axis": 1, "order": [[8, 8], [0, 8]]})
    ]
    assert seg[0]["source"] == "data" and seg[0]["error"] < FP32_NOISE
    text = format_text(rep)
    print("\n" + "\n".join(ln for ln in text.splitlines() if "alignment" in ln))
    assert "note: alignment: 1 segment order(s) found by the data" in text
    assert "tf-native at anchor/02/conv2: permute [0, 3, 1, 2] + segments axis 1 [8:16, 0:8] found by the data" in text
    v = rep.verdicts["tf-native"]
    assert v.flagged and v.origin_anchor == "anchor/00/relu1"
    assert {"anchor/00/relu1", "anchor/01/pool1"} <= set(v.flagged_anchors)
    assert "anchor/02/conv2" not in v.flagged_anchors
    for a in ("anchor/00/relu1", "anchor/01/pool1"):
        assert rep.cell(a, "tf-native").primary > 0.1
    # reversed channels (16 single-channel blocks) are never a segment order, even in a native backend
    o, k = keras_case["ort"][0]["anchor/02/conv2"], keras_case["keras"][0]["anchor/02/conv2"]
    rev = np.transpose(k[..., ::-1], [0, 3, 1, 2])
    assert find_segment_permutation(rev, o, axes=[1]) is None


BAD_PINS = [
    ({"segments": {"axis": 1, "order": [[0, 8], [0, 8]]}}, "not a bijection"),
    ({"segments": {"axis": 1, "order": [[0, 4], [8, 8]]}}, "gap"),
    ({"segments": {"axis": -1, "order": [[0, 8]]}}, "must be >= 0"),
    ({"permute": "abc"}, "'permute' must be a non-empty list of integers"),
    ({"permute": [0, 1.5, 2, 3]}, "must be an integer"),
    ({"permute": [0, 3, 1, 2], "dequantize": {"zero_point": 3}}, "'dequantize' must be"),
    ({"dequantize": {"scale": 0.0}}, "non-zero"),
    ({"dequantize": {"scale": [0.1, 0.2]}}, "needs 'axis'"),
    ({"cast": "int8"}, "'cast' must be one of"),
    ({"reshape": "yes"}, "'reshape' must be true or false"),
    ({"exclude": ""}, "non-empty reason"),
    ({"view": "1x8"}, "'view' must be a non-empty list"),
    ("permute", "must be a dict"),
]


@pytest.mark.parametrize("pin,message", BAD_PINS, ids=[m for _, m in BAD_PINS])
def test_bad_pins_rejected_with_one_message(keras_case, pin, message):
    m = AnchorManifest.from_dict(keras_case["manifest"].to_dict())
    m["anchor/01/pool1"].alignment = {"tf-native": pin}
    with pytest.raises(AlignmentError, match=re.escape(message)) as err:
        Aligner(m, {"ort": ort_status(m)})  # validated when made, before any work
    assert "manifest pin anchor/01/pool1/tf-native" in str(err.value)


def test_cli_bad_pins_and_options_exit_2(keras_case, tmp_path, capsys):
    from anpred.cli import main

    run = keras_run(keras_case, tmp_path / "run")
    for args, message in [
        (["--close-tol", "inf"], "--close-tol must be in (0, 1)"),
        (["--close-tol", "0"], "--close-tol must be in (0, 1)"),
        (["--min-margin", "inf"], "--min-margin must be a finite number > 1"),
        (["--backends", ","], "--backends ',' names no backend; this run has: ort, tf-native"),
        (["--json", str(tmp_path)], "is a folder"),
        (["--json", str(tmp_path / "no" / "a.json")], "does not exist"),
    ]:
        assert main(["align", str(run), *args]) == 2, args
        cap = capsys.readouterr()
        assert cap.out == "" and message in cap.err and "Traceback" not in cap.err, (args, cap)
    for pin, message in [
        ({"permute": "abc"}, "'permute' must be a non-empty list of integers"),
        ({"permute": [0, 3, 1, 2], "dequantize": {"zero_point": 3}}, "'dequantize' must be"),
        ({"segments": {"axis": 1, "order": [[0, 8], [0, 8]]}}, "not a bijection"),
    ]:
        bad = keras_run(keras_case, tmp_path / f"bad{len(message)}", pins={"anchor/01/pool1": {"tf-native": pin}})
        for cmd in ("align", "check"):
            assert main([cmd, str(bad)]) == 2, (cmd, pin)
            cap = capsys.readouterr()
            assert message in cap.err and "Traceback" not in cap.err and len(cap.err.strip().splitlines()) == 1, cap
