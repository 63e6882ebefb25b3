"""onnx.reference's defects found on the wheel model ppocr-cls (issue 18 coverage run; the converters' gaps
it found: tests/test_converter_gaps.py), each reproduced on a network built here: onnx 1.23.2's
``onnx.reference`` ``GlobalMaxPool`` gives the wrong shape on rank-3/5 inputs, and its
``BatchNormalization`` (opsets 9-13, ``momentum`` given or its default) mixes in batch statistics: the
backends work around them by exact rewrites and name them (:mod:`anpred.backends.reference_defects`;
``workarounds=False`` runs the library as it is); the wrong results are asserted so that a fixed onnx
shows up here. The float64 basis (``onnx-reference-fp64``) works around the same evaluator defects.
Tolerance: RTOL of tests/converter_graphs.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from anpred.errors import BackendError

from isa_reasons import DEFECT_BOUND, EXACT_OPS, FLOAT64_BOUND, FP32_BOUND
from ort_session import ort_outputs
from converter_graphs import RTOL, anchor_outputs, f32, gap_model, i64


# ---- onnx.reference GlobalMaxPool ----------------------------------------------------------------
def test_onnx_reference_global_max_pool_shapes():
    """onnx 1.23.2's GlobalMaxPool reduces the last two axes: wrong for rank 3 and 5. If this fails because
    the shapes are right, onnx fixed it (the probe then reports nothing)."""
    from anpred.backends.reference_defects import probe_global_pool

    assert probe_global_pool("GlobalMaxPool", 3) == ([2, 1], [2, 3, 1])
    assert probe_global_pool("GlobalMaxPool", 5) == ([2, 3, 4, 1, 1, 1], [2, 3, 1, 1, 1])
    assert probe_global_pool("GlobalMaxPool", 4) == ([2, 3, 1, 1], [2, 3, 1, 1])
    for r in (3, 4, 5):
        got, want = probe_global_pool("GlobalAveragePool", r)
        assert got == want


@pytest.mark.isa_independent(DEFECT_BOUND)
def test_onnx_reference_batchnorm_momentum():
    """onnx 1.23.2's BatchNormalization-9 with ``momentum`` mixes the input's batch statistics into the
    mean/variance (found on ppocr-cls: 0.10 nRMSE from ONNX Runtime at its first BatchNormalization).
    Probe input arange(24) as [1, 2, 3, 4], mean 0, var 1: the spec's output is x; the evaluator's is off by
    8.31 at opsets 9-13, right at 14 (training_mode attribute instead). If this fails, onnx fixed it."""
    from anpred.backends.reference_defects import probe_batchnorm_momentum, reference_defects, summarize

    assert probe_batchnorm_momentum(11) == pytest.approx(8.3069, abs=1e-3)
    assert probe_batchnorm_momentum(14) == 0.0
    rng = np.random.default_rng(0)
    inits = [
        f32(n, v)
        for n, v in (
            ("s", rng.uniform(0.5, 2, 4)),
            ("b", rng.standard_normal(4)),
            ("m", rng.standard_normal(4)),
            ("v", rng.uniform(0.5, 2, 4)),
        )
    ]
    m = gap_model(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], momentum=0.9, name="bn@0")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
        ["y"],
        inits,
        opset=11,
    )
    found = reference_defects(m)
    assert list(found) == ["bn@0"] and "momentum" in found["bn@0"] and "[1 node(s): bn@0]" in summarize(found)
    from onnx.reference import ReferenceEvaluator

    x = {"x": rng.standard_normal((1, 4, 5, 5)).astype(np.float32)}
    ours = ReferenceEvaluator(m).run(None, x)[0]
    assert np.abs(ours - ort_outputs(m, x)["y"]).max() > 0.1  # the library's wrong values
    # without the attribute the schema's default momentum 0.9 applies: wrong alike, found alike
    plain = gap_model(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn@1")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
        ["y"],
        inits,
        opset=11,
    )
    assert list(reference_defects(plain)) == ["bn@1"]
    assert np.abs(ReferenceEvaluator(plain).run(None, x)[0] - ort_outputs(plain, x)["y"]).max() > 0.1
    from anpred.backends.reference_defects import inference_batchnorm_kernel

    fixed = ReferenceEvaluator(plain, new_ops=[inference_batchnorm_kernel()]).run(None, x)[0]
    assert np.abs(fixed - ort_outputs(plain, x)["y"]).max() <= RTOL * max(1.0, float(np.abs(fixed).max()))


@pytest.mark.isa_independent(EXACT_OPS)
def test_reference_backend_names_the_defect(tmp_path):
    """magika's pattern: GlobalMaxPool of [1, C, L] then Squeeze(axes [2]). By default onnx-reference
    computes it as ReduceMax over the spatial axis (an exact rewrite, named in reference_workarounds)
    and matches ORT; with ``workarounds=False`` it fails with the library's AxisError and the reason
    names the GlobalMaxPool defect; a rank-4 model reports none."""
    from anpred.backends.reference import ReferenceBackend
    from anpred.manifest import AnchorManifest

    m = gap_model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("GlobalMaxPool", ["r"], ["g"], name="gmp"),
            helper.make_node("Squeeze", ["g", "ax"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6])],
        ["y"],
        [i64("ax", [2])],
    )
    path = anchor_outputs(m, tmp_path / "gmp.onnx")
    fixed = ReferenceBackend({})
    fixed.prepare(path, AnchorManifest.from_model(onnx.load(str(path))), tmp_path / "wf")
    assert fixed.defects == {} and list(fixed.workarounds) == ["gmp"]
    assert "GlobalMaxPool on a rank-3 input" in fixed.versions()["reference_workarounds"]
    x = np.random.default_rng(0).standard_normal((1, 4, 6)).astype(np.float32)
    got = fixed.run({"x": x})
    assert np.array_equal(got["output/y"], ort_outputs(m, {"x": x})["y"])  # the max of each channel: exact
    b = ReferenceBackend({"workarounds": False})
    b.prepare(path, AnchorManifest.from_model(onnx.load(str(path))), tmp_path / "w")
    assert list(b.defects) == ["gmp"] and "reference_defects" in b.versions()
    with pytest.raises(
        BackendError,
        match=r"AxisError.*known defect.*'gmp'.*GlobalMaxPool on a rank-3 input returns "
        r"shape \[2, 1\] where the ONNX spec gives \[2, 3, 1\]",
    ):
        b.run({"x": np.ones((1, 4, 6), np.float32)})
    m4 = gap_model(
        [helper.make_node("GlobalMaxPool", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 5])],
        ["y"],
        [],
    )
    path4 = anchor_outputs(m4, tmp_path / "gmp4.onnx")
    b4 = ReferenceBackend({})
    b4.prepare(path4, AnchorManifest.from_model(onnx.load(str(path4))), tmp_path / "w4")
    assert b4.defects == {}


@pytest.mark.isa_independent(FP32_BOUND)
@pytest.mark.parametrize("workarounds", [False, True])
def test_report_says_which_known_reference_defect_explains_a_flag(tmp_path, workarounds):
    """conv -> BatchNormalization(momentum, opset 11) -> relu run on ort, openvino and onnx-reference.
    With ``workarounds=False`` the reference's wrong BatchNormalization gets it flagged at the BN anchor,
    and the report's notes say which known defect of the installed library explains it (the run did not
    fail: only the note tells). By default the evaluator is given the library's own inference formula
    for that node (momentum unused): nothing is flagged and the note says what was worked around."""
    from anpred.judge import check_run
    from anpred.run import BackendSpec, run_model

    rng = np.random.default_rng(1)
    inits = [f32("w", rng.normal(0, 0.3, (4, 3, 3, 3)))] + [
        f32(n, v)
        for n, v in (
            ("s", rng.uniform(0.5, 2, 4)),
            ("b", rng.standard_normal(4)),
            ("m", rng.standard_normal(4)),
            ("v", rng.uniform(0.5, 2, 4)),
        )
    ]
    m = gap_model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], momentum=0.9, name="bn"),
            helper.make_node("Relu", ["n"], ["y"], name="relu"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        ["y"],
        inits,
        opset=11,
    )
    path = anchor_outputs(m, tmp_path / "bn.onnx")
    ref = BackendSpec("onnx-reference", options={"workarounds": workarounds})
    run_model(path, ["ort", "openvino", ref], "random:uniform:n=2", tmp_path / "run", progress=False, timeout_s=300)
    rep = check_run(tmp_path / "run")
    if not workarounds:
        assert [b for b, v in rep.verdicts.items() if v.flagged] == ["onnx-reference"]
        notes = [n for n in rep.notes if n.startswith("onnx-reference: the installed library has known defects")]
    else:
        assert [b for b, v in rep.verdicts.items() if v.flagged] == []
        assert max(c.stats.nrmse for c in rep.cells if c.backend == "onnx-reference") < 1e-5
        assert not [n for n in rep.notes if "explain a deviation" in n]  # no defect left unexplained
        notes = [
            n
            for n in rep.notes
            if n.startswith("onnx-reference: known defects of the installed library")
            and "worked around" in n
            and "_batchnorm_test_mode" in n
        ]
    assert (
        len(notes) == 1
        and "BatchNormalization (opset 11; momentum given or its default 0.9)" in notes[0]
        and "bn" in notes[0]
    )


@pytest.mark.isa_independent(FLOAT64_BOUND)
def test_float64_basis_works_around_the_evaluator_defects(tmp_path):
    """onnx-reference-fp64 (the oracle's float64 basis) runs the same evaluator: conv -> BatchNormalization
    (opset 11, no momentum attribute: the schema's 0.9 applies) -> GlobalMaxPool of a rank-3 tensor ->
    Squeeze. Raw, it would blend batch statistics and fail on the Squeeze; with the workarounds it runs and
    matches ONNX Runtime within float32 rounding (it is float64), and names what it worked around."""
    from anpred.backends.fp64 import ReferenceFp64Backend
    from anpred.manifest import AnchorManifest

    rng = np.random.default_rng(2)
    inits = [f32("w", rng.normal(0, 0.3, (4, 3, 3)))] + [
        f32(n, v)
        for n, v in (
            ("s", rng.uniform(0.5, 2, 4)),
            ("b", rng.standard_normal(4)),
            ("m", rng.standard_normal(4)),
            ("v", rng.uniform(0.5, 2, 4)),
        )
    ]
    m = gap_model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1], name="conv"),
            helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
            helper.make_node("GlobalMaxPool", ["n"], ["g"], name="gmp"),
            helper.make_node("Squeeze", ["g"], ["y"], name="squeeze", axes=[2]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10])],
        ["y"],
        inits,
        opset=11,
    )
    path = anchor_outputs(m, tmp_path / "f64.onnx")
    x = {"x": rng.standard_normal((1, 3, 10)).astype(np.float32)}
    with ReferenceFp64Backend() as b:
        b.prepare(path, AnchorManifest.from_model(onnx.load(str(path))), tmp_path / "w")
        assert sorted(b.workarounds) == ["bn", "gmp"] and b.defects == {}
        got = b.run(x)["output/y"]
    want = ort_outputs(m, x)["y"]
    assert got.dtype == np.float64 and np.abs(got - want).max() <= RTOL * max(1.0, float(np.abs(want).max()))
