"""Issue 17, the oracle side: non-finite values voted on (NaN/Inf majority, ties undecided), precision
populations with two verdicts per reduced-precision backend (budget against the fp32 consensus,
implementation against the population's own consensus), per-anchor scales from the model (natural
units: int8 quantization steps, float ULPs) and the basis each verdict used.

The NaN case runs real runtimes (ONNX Runtime, OpenVINO, the ONNX reference evaluator) on ``Log``
followed by ``Relu``; the population cases are synthetic tensors of a known structure, so that the
rule is checked against values computed here."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from anpred.defaults import OracleConfig
from anpred.instrument import instrument_model
from anpred.judge import AnchorInfo, BackendInfo, check_run
from anpred.judge.consensus import vote
from anpred.judge.populations import PopulationOracle
from anpred.judge.scales import cell_precision, floor_and_basis, floor_basis_of, unit_nrmse
from anpred.report.text import format_text
from check_runs import make_run


# ---- non-finite votes --------------------------------------------------------------------------
def test_vote_majority_nan_inf_and_ties():
    nan, inf = np.nan, np.inf
    a = np.array([nan, nan, 1.0, inf, nan, 2.0, -inf])
    b = np.array([nan, 0.0, 1.0, inf, inf, 2.0, -inf])
    c = np.array([0.0, 0.0, 3.0, 5.0, 4.0, nan, 1.0])
    got, und = vote([a, b, c])
    # col0: 2 NaN vs 1 finite -> NaN; col1: 2 finite vs 1 NaN -> median of finite (0); col2: median 1
    # col3: 2 +inf -> inf; col4: NaN, inf, finite -> undecided; col5: 2 finite -> 2; col6: 2 -inf
    assert np.isnan(got[0]) and got[1] == 0.0 and got[2] == 1.0 and got[3] == inf
    assert np.isnan(got[4]) and got[5] == 2.0 and got[6] == -inf
    assert und.tolist() == [False, False, False, False, True, False, False]
    # four votes, 2 NaN vs 2 finite: a tie
    got4, und4 = vote([np.array([nan]), np.array([nan]), np.array([1.0]), np.array([2.0])])
    assert und4.tolist() == [True] and np.isnan(got4[0])
    # no non-finite vote: the plain median, no mask
    got3, und3 = vote([np.array([1.0, 5.0]), np.array([2.0, 4.0]), np.array([3.0, 6.0])])
    assert und3 is None and got3.tolist() == [2.0, 5.0]


def _log_relu():
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 4, 8, 8])
    y = h.make_tensor_value_info("y", T.FLOAT, [1, 4, 8, 8])
    nodes = [
        h.make_node("Log", ["x"], ["l"], name="log"),
        h.make_node("Relu", ["l"], ["r"], name="relu"),
        h.make_node("Mul", ["r", "two"], ["y"], name="mul"),
    ]
    g = h.make_graph(nodes, "log_relu", [x], [y], [onnx.numpy_helper.from_array(np.float32([2.0]), "two")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return instrument_model(m, stages=3)


def test_nan_majority_flags_the_backend_that_suppresses_it(tmp_path):
    """Issue 17 (6): Relu(Log(x)) of a normal x: ONNX Runtime and the reference evaluator return NaN
    for the negative inputs, OpenVINO returns 0. Two of three families agree on NaN: that is the
    consensus, OpenVINO is the one that differs ("NaN suppressed"), the other two are consistent."""
    am, man = _log_relu()
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(3)]
    negative = sum(int((x < 0).sum()) for x in xs)
    run = make_run(tmp_path / "lr", am, man, xs, backends=["ort", "openvino", "onnx-reference"])
    rep = check_run(run)
    relu = next(a.name for a in man.anchors if a.op_type == "Relu")
    ov = rep.cell(relu, "openvino")
    assert rep.flagged_backends == ["openvino"], format_text(rep)
    assert ov.flagged and ov.suppressed == negative and "NaN suppressed" in ov.reason
    assert rep.verdicts["ort"].status == "consistent" and rep.verdicts["onnx-reference"].status == "consistent"
    assert rep.verdicts["openvino"].origin_anchor == relu


# ---- populations (synthetic tensors of known structure) ------------------------------------------
ANCHORS = [
    AnchorInfo("anchor/00/a", 0),
    AnchorInfo("anchor/01/b", 1),
    AnchorInfo("anchor/02/c", 2),
    AnchorInfo("output/y", 3, kind="output"),
]
FP32 = ["ort", "openvino", "onnx-reference", "torch"]
INT8 = ["ort-int8", "ort-int8-noopt", "openvino-int8", "onnx-reference-int8"]
FAM = {
    "ort": "onnxruntime",
    "openvino": "openvino",
    "onnx-reference": "onnx-reference",
    "torch": "torch",
    "ort-int8": "onnxruntime",
    "ort-int8-noopt": "onnxruntime",
    "openvino-int8": "openvino",
    "onnx-reference-int8": "onnx-reference",
}
STEP = 0.05  # the quantization step of every anchor in these populations


def _infos(names):
    return [
        BackendInfo(
            name=n,
            family=FAM[n],
            precision="int8" if n in INT8 else "fp32",
            votes=n not in INT8,
            requested="int8" if n in INT8 else "fp32",
        )
        for n in names
    ]


def _q(x, step=STEP):
    return np.round(x / step) * step


def _judge(names, fault=None, destroy=False, n=6, seed=0):
    """fp32 backends: the true tensor plus 1e-7 relative noise. int8 backends: the true tensor rounded
    to the step grid (the quantization the population shares) plus, per implementation, a different
    rounding at 2% of the elements (one step: what integer kernels and fake-quant differ by).
    ``fault = (backend, anchor index, steps)``: that backend adds ``steps`` quantization steps to every
    element from that anchor on. ``destroy``: every int8 backend returns zeros at the output."""
    rng = np.random.default_rng(seed)
    o = PopulationOracle(ANCHORS, _infos(names), OracleConfig(), steps={a.name: STEP for a in ANCHORS})
    for s in range(n):
        sample = {}
        for i, a in enumerate(ANCHORS):
            true = rng.standard_normal(2048)
            q = _q(true)
            sample[a.name] = {}
            for b in names:
                if b not in INT8:
                    sample[a.name][b] = true * (1 + 1e-7 * rng.standard_normal(2048))
                    continue
                x = q + STEP * (rng.random(2048) < 0.02) * rng.choice([-1.0, 1.0], 2048)
                if fault and b == fault[0] and i >= fault[1]:
                    x = x + fault[2] * STEP
                if destroy and a.kind == "output":
                    x = np.zeros_like(x)
                sample[a.name][b] = x
        o.add(sample, sample_id=f"s{s}")
    return o.finish()


def test_clean_int8_population_no_implementation_verdict():
    res = _judge(FP32 + INT8)
    for b in INT8:
        v = res.verdicts[b]
        assert v.implementation is not None and v.implementation.judged_against == "int8 population"
        assert not v.any_flagged, (b, v.flagged_anchors, v.implementation.flagged_anchors)
        assert v.population == INT8
    # the budget's expected level: the population's cost, the error of rounding to the grid:
    # STEP / sqrt(12) relative to a unit normal, ~0.0144 (plus the 2% one-step differences)
    c = next(c for c in res.cells if c.backend == "ort-int8" and c.anchor == "anchor/01/b")
    assert 0.012 < c.peer_level < 0.02 and c.threshold_by == "peers" and c.threshold == 10 * c.peer_level
    assert c.basis.startswith(
        f"threshold {c.threshold:.3g} = 10 x the peers' median {c.peer_level:.3g} (above the "
        f"floor {c.floor:.3g}); population: 10 x median of openvino-int8"
    )
    assert c.floor == pytest.approx(STEP / math.sqrt(12) / 1.0, rel=0.05)  # natural unit, RMS of c ~ 1
    assert c.units["unit"] == "int8 step" and c.units["size"] == STEP and 0.2 < c.units["rms"] < 0.5


def test_step_fault_in_one_implementation_flagged_there_only():
    """A zero point off by two steps in openvino-int8 from anchor 2 on: its error against the fp32
    consensus (~0.1 added to ~0.015) stays under 10 x the population's cost, so the budget verdict
    (and today's int8 floor of 2) sees nothing; against its population it is ~7 x the natural unit
    and ~13 x its peers' spread (population_k 10): the implementation verdict flags it, origin
    anchor 2. One step (~6 x the spread of implementations that round 2% of the elements
    differently) stays inside the population's own spread."""
    one = _judge(FP32 + INT8, fault=("openvino-int8", 2, 1.0))
    assert not one.verdicts["openvino-int8"].any_flagged
    res = _judge(FP32 + INT8, fault=("openvino-int8", 2, 2.0))
    v = res.verdicts["openvino-int8"]
    assert not v.flagged and v.implementation.flagged
    assert v.implementation.origin_anchor == "anchor/02/c" and v.implementation.origin_stage == 2
    assert [b for b in INT8 if res.verdicts[b].any_flagged] == ["openvino-int8"]
    cell = next(c for c in res.population_cells["int8"] if c.backend == "openvino-int8" and c.anchor == "anchor/02/c")
    # two steps everywhere (three where its own 2% rounding adds one): RMS ~2 steps, > 10 x the spread
    assert cell.units["max"] == pytest.approx(3.0) and cell.units["rms"] == pytest.approx(2.0, abs=0.03)
    assert cell.primary > 10 * cell.peer_level
    # today's rule: int8 judged against the fp32 consensus with the constant floor 2: nothing
    assert cell.primary < OracleConfig().floor_at("int8", 2)


def test_destroyed_output_never_consistent():
    """Every int8 implementation returns zeros at the output (the quantized model lost the signal):
    the population agrees with itself (no implementation verdict), but the budget verdict flags each
    one, since the fp32 voters agree on a signal the int8 tensors do not carry."""
    res = _judge(FP32 + INT8, destroy=True)
    for b in INT8:
        v = res.verdicts[b]
        assert v.flagged and v.status == "flagged" and v.flagged_anchors == ["output/y"]
        assert not v.implementation.flagged
        c = next(c for c in res.cells if c.backend == b and c.anchor == "output/y")
        assert "signal lost" in c.reason


def test_basis_names_the_term_that_set_the_threshold():
    """A new user's Resize: the fp32 voters differ by ~0.18 nRMSE, so the threshold 1.77 was 10 x the
    peers' median, yet the basis read only "constant: the measured fp32 floor 2e-05 ...". The basis now
    leads with the term that set the threshold (``threshold_by``), with both values."""
    cfg = OracleConfig()
    # every family off by its own 0.05 would split the vote into camps (no consensus): 1e-5 relative
    # noise per family puts the peers' median (~9e-6) x 10 above the floor (2.8e-5 at stage 1)
    for noise, term in ((1e-7, "floor"), (1e-5, "peers")):
        rng = np.random.default_rng(1)
        o = PopulationOracle(ANCHORS, _infos(FP32), cfg)
        for s in range(3):
            sample = {}
            for a in ANCHORS:
                true = rng.standard_normal(2048)
                sample[a.name] = {b: true * (1 + noise * rng.standard_normal(2048)) for b in FP32}
            o.add(sample, sample_id=f"s{s}")
        res = o.finish()
        c = next(c for c in res.cells if c.backend == "ort" and c.anchor == "anchor/01/b")
        floor = cfg.floor_at("fp32", 1)
        assert c.floor == floor and c.threshold_by == term and not c.flagged
        tail = "; peers: 10 x median of the other voting families; floor = constant: the measured fp32 floor 2e-05"
        if term == "peers":
            assert 5e-6 < c.peer_level < 2e-5 and c.threshold == pytest.approx(10 * c.peer_level)
            want = (
                f"threshold {c.threshold:.3g} = 10 x the peers' median {c.peer_level:.3g} (above the floor {floor:.3g})"
            )
        else:
            assert c.peer_level < 1e-6 and c.threshold == floor
            want = (
                f"threshold {floor:.3g} = the floor (10 x the peers' median {c.peer_level:.3g} = "
                f"{10 * c.peer_level:.3g} is not above it)"
            )
        assert c.basis.startswith(want + tail), c.basis
    # no peer at all: the floor, said so
    from anpred.judge.scales import threshold_basis

    assert threshold_basis(2e-5, 10.0, None, 2e-5, "x") == (
        "floor",
        "threshold 2e-05 = the floor (no peer judged here); x",
    )


def test_population_of_one_falls_back_to_the_constant():
    res = _judge(FP32 + ["ort-int8"])
    v = res.verdicts["ort-int8"]
    assert v.implementation is None and not v.flagged
    c = next(c for c in res.cells if c.backend == "ort-int8" and c.anchor == "anchor/01/b")
    assert floor_basis_of(c.basis).startswith("constant fallback") and c.floor == OracleConfig().floor_at("int8", 1)
    assert any("only ort-int8 computed in int8" in n for n in res.notes)


def test_scales_follow_the_anchor_dtype_and_the_precision():
    assert cell_precision("fp32", "float16") == "fp16" and cell_precision("int8", "float32") == "int8"
    assert cell_precision("fp16", "float32") == "fp16" and cell_precision("fp32", "bfloat16") == "bf16"
    assert unit_nrmse("fp16") == pytest.approx(2**-11 / math.sqrt(3))
    assert unit_nrmse("int8", 0.1, 2.0) == pytest.approx(0.1 / math.sqrt(12) / 2.0)
    assert unit_nrmse("int8") is None
    cfg = OracleConfig()
    f, basis = floor_and_basis(cfg, "fp16", 2)
    assert f == pytest.approx(0.03 * math.sqrt(3)) and basis.startswith(
        "peers: 10 x median of the other voting families; floor = constant"
    )


def test_reports_show_both_verdicts_and_scales(tmp_path):
    """Terminal, JSON and HTML: both verdicts per reduced-precision backend, the expected-error scale
    next to the measured error, natural units and the population it was judged in."""
    import json

    from anpred.judge.struct import CheckReport
    from anpred.report.html import write_html

    res = _judge(FP32 + INT8, fault=("openvino-int8", 2, 2.0))
    rep = CheckReport(
        run_dir="r",
        status="flagged",
        oracle="consensus",
        samples=res.samples,
        verdicts=res.verdicts,
        cells=res.cells,
        anchors=[
            {"name": a.name, "stage": a.stage, "kind": a.kind, "op_type": "", "dtype": "float32"} for a in ANCHORS
        ],
        backends={b: {} for b in res.verdicts},
        populations=res.populations,
        population_cells=res.population_cells,
        notes=res.notes,
    )
    text = format_text(rep)
    assert "openvino-int8" in text and "FLAGGED:i" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("implementation: FLAGGED"))
    assert "origin s2 anchor/02/c" in line and "its peers' spread" in line and "RMS in int8 step (0.05)" in line
    assert "budget:         ok worst" in text and "the population's cost" in text
    assert any(
        ln.startswith("      basis: threshold ") and "; population: 10 x median of " in ln for ln in text.splitlines()
    )
    lines = text.splitlines()
    i = lines.index(line)
    prof = next(ln for ln in lines[i:] if ln.startswith("      profile: "))
    assert "*" in prof and "x" in prof  # the implementation profile, its flagged anchors starred
    assert "population: ort-int8, ort-int8-noopt, openvino-int8, onnx-reference-int8" in text
    back = CheckReport.from_dict(json.loads(rep.to_json()))
    assert back.flagged_backends == ["openvino-int8"] == rep.flagged_backends
    v = back.verdicts["openvino-int8"]
    assert v.implementation.flagged and v.implementation.judged_against == "int8 population"
    c = back.cell("anchor/02/c", "openvino-int8", "int8")
    assert c.flagged and c.units["unit"] == "int8 step"
    assert floor_basis_of(c.basis).startswith("population: 10 x median")
    write_html(rep, tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert "Reduced precision: budget and implementation verdicts" in page
    assert "consistent; implementation: FLAGGED" in page and "peers&#x27; spread" in page


# ---- a model whose own tensors are float16 --------------------------------------------------------
@pytest.mark.kernels
def test_float16_network_judged_on_float16_scale_and_overflow_flagged_alone(tmp_path):
    """Issue 17 (2, acceptance): a network whose weights, activations, input and output are float16,
    on ONNX Runtime, OpenVINO, the reference evaluator and PyTorch (onnx2torch), plus a float64
    execution. ORT/OpenVINO compute in float32 and round to float16 at each output, PyTorch and the
    reference compute in float16 arithmetic: they differ by ~4e-4 (ordinary float16 rounding), which
    the fp32 floor (2e-5) would flag; the anchors' element type is float16, so the cells take
    float16's scale and nothing is flagged. Then one backend (OpenVINO) runs a variant whose second
    Conv overflows float16 (fp16-overflow, passes/faults_lowp.py): it alone is flagged."""
    from anpred.run import BackendSpec, run_model
    from passes.faults import inject_fault
    from tests.test_fp16_models import _anchored, fp16_network

    path, man = _anchored(fp16_network(), tmp_path, stages=4)
    names = ["ort", "openvino", "onnx-reference", "torch", "onnx-reference-fp64"]
    store = run_model(path, names, "random:normal:seed=0:n=2", tmp_path / "run", progress=False, timeout_s=300)
    rep = check_run(store.root)
    assert rep.status == "consistent", format_text(rep)
    assert not rep.verdicts["onnx-reference-fp64"].votes and rep.verdicts["onnx-reference-fp64"].precision == "fp64"
    c = rep.cell(man.anchors[-1].name, "torch")
    assert 1e-4 < c.primary < c.threshold and "natural unit of the anchor's element type (fp16" in c.basis
    assert c.floor == pytest.approx(10 * 2**-11 / math.sqrt(3))  # 2.8e-3, not fp32's 2e-5 nor the constant 0.05
    # the float64 execution gives the expected fp32-side error of each anchor: float16 rounding here
    for a in man.anchors:
        assert 1e-5 < rep.scales[a.name]["fp32"]["expected"] < 2e-3
    # one backend overflows: the conv2 output times 2**16 exceeds 65504 where |y| > ~1
    m = onnx.load(str(path))
    bad, truth = inject_fault(m, "fp16-overflow", node="conv2", magnitude=16, manifest=man)
    bad_path = tmp_path / "overflow.onnx"
    onnx.save(bad, str(bad_path))
    specs = [BackendSpec(b) for b in names if b != "openvino"] + [
        BackendSpec("openvino", options={"model": str(bad_path)})
    ]
    store2 = run_model(path, specs, "random:normal:seed=0:n=2", tmp_path / "run2", progress=False, timeout_s=300)
    rep2 = check_run(store2.root)
    assert rep2.flagged_backends == ["openvino"], format_text(rep2)
    v = rep2.verdicts["openvino"]
    # conv2 feeds the Add of anchor a1 (its stage): the first anchor that sees the infinities
    a1 = next(a for a in man.anchors if a.value == "a1")
    assert truth.stage == a1.stage and v.origin_anchor == a1.name and v.origin_stage == a1.stage
    assert rep2.cell(a1.name, "openvino").nonfinite > 0


def test_bit_identical_peers_do_not_make_a_correct_implementation_depart():
    """Regression (clean yolov8n 320): ort-int8, ort-int8-noopt and onnx-reference-int8 are
    bit-identical at the first anchors, openvino-int8 (its own u8 kernels) differs by one step at
    0.07% of the elements: its peers' median is 0, so "x times its peers" is infinite at every anchor.
    The sustained-departure rule flagged it at 4 anchors in a row; within a population the threshold
    alone decides, and its floor is the precision's own cost at the anchor (the population's median
    deviation from the fp32 consensus, ~STEP/sqrt(12) here): an implementation that differs from its
    peers by less than what int8 itself costs is consistent."""
    rng = np.random.default_rng(3)
    o = PopulationOracle(ANCHORS, _infos(FP32 + INT8), OracleConfig(), steps={a.name: STEP for a in ANCHORS})
    for s in range(4):
        sample = {}
        for a in ANCHORS:
            true = rng.standard_normal(4096)
            q = _q(true)
            sample[a.name] = {b: true * (1 + 1e-7 * rng.standard_normal(4096)) for b in FP32}
            sample[a.name].update({b: q for b in INT8})
            sample[a.name]["openvino-int8"] = q + STEP * (rng.random(4096) < 0.0007)
        o.add(sample, sample_id=f"s{s}")
    res = o.finish()
    impl = res.verdicts["openvino-int8"].implementation
    c = next(c for c in res.population_cells["int8"] if c.backend == "openvino-int8" and c.anchor == "anchor/00/a")
    assert c.peer_level == 0.0 and 0 < c.primary < c.threshold
    assert (
        c.floor == pytest.approx(math.sqrt(2) * STEP / math.sqrt(12), rel=0.1) and "sqrt(2) x the int8 cost" in c.basis
    )
    assert not impl.flagged and impl.status == "consistent"


@pytest.mark.kernels
def test_float16_network_weight_fault_above_float16_noise_flagged(tmp_path):
    """Regression (review): OpenVINO given the float16 network with conv2's weights x 1.03 deviates by
    nRMSE ~0.024 at the Add after conv2, ~80 x its peers and ~40 float16 ULPs RMS; under the constant
    fp16 floor (0.03 x sqrt(1 + stage) = 0.052 there) it was consistent. With k x one float16
    rounding as the floor (2.8e-3) it is flagged there, and only it."""
    from onnx import numpy_helper as nh

    from anpred.run import BackendSpec, run_model
    from tests.test_fp16_models import _anchored, fp16_network

    path, man = _anchored(fp16_network(), tmp_path, stages=4)
    m = onnx.load(str(path))
    w = next(t for t in m.graph.initializer if t.name == "w2")
    w.CopyFrom(nh.from_array((nh.to_array(w).astype(np.float32) * 1.03).astype(np.float16), "w2"))
    bad = tmp_path / "w2x1.03.onnx"
    onnx.save(m, str(bad))
    specs = [
        BackendSpec("ort"),
        BackendSpec("onnx-reference"),
        BackendSpec("torch"),
        BackendSpec("openvino", options={"model": str(bad)}),
    ]
    store = run_model(path, specs, "random:normal:seed=0:n=2", tmp_path / "run", progress=False, timeout_s=300)
    rep = check_run(store.root)
    assert rep.flagged_backends == ["openvino"], format_text(rep)
    a1 = next(a for a in man.anchors if a.value == "a1")
    c = rep.cell(a1.name, "openvino")
    assert rep.verdicts["openvino"].origin_anchor == a1.name
    assert c.flagged and 0.01 < c.primary < 0.05 and c.floor == pytest.approx(10 * 2**-11 / math.sqrt(3))
    assert c.primary > 5 * c.threshold  # threshold: max(10 x peers, the floor)
    assert c.units["unit"] == "float16 ULP at RMS" and c.units["rms"] > 10


def test_a_tie_inside_a_family_abstains():
    """Regression (review): ort finite, ort-noopt NaN (one family: a tie), openvino NaN, onnx-reference
    finite. The tied family abstains, openvino (NaN) and the reference (finite) tie: undecided, nobody
    flagged "NaN suppressed". With torch (finite) as a fourth family, finite wins and openvino alone
    is flagged."""
    from anpred.judge import Oracle

    anchors = [AnchorInfo("a", 0)]
    x = np.linspace(0.5, 2.0, 64)
    nan = np.full(64, np.nan)
    names = ["ort", "ort-noopt", "openvino", "onnx-reference"]
    o = Oracle(anchors, [BackendInfo.make(n) for n in names], OracleConfig(min_voters=3))
    o.add({"a": {"ort": x, "ort-noopt": nan, "openvino": nan, "onnx-reference": x}})
    res = o.finish()
    assert not any(v.flagged for v in res.verdicts.values())
    assert "a" in res.unjudged_anchors and "tie" in res.unjudged_anchors["a"]
    o2 = Oracle(anchors, [BackendInfo.make(n) for n in names + ["torch"]], OracleConfig(min_voters=3))
    # (torch not bit-identical to the reference: identical families would merge into one vote)
    o2.add({"a": {"ort": x, "ort-noopt": nan, "openvino": nan, "onnx-reference": x, "torch": x * (1 + 1e-7)}})
    res2 = o2.finish()
    assert sorted(b for b, v in res2.verdicts.items() if v.flagged) == ["openvino", "ort-noopt"]
    c = next(c for c in res2.cells if c.backend == "openvino")
    assert c.nonfinite == 64 and "NaN/Inf where the consensus is finite" in c.reason


def test_int8_implementation_floor_without_a_step_is_never_below_fp32():
    """opclass:misc's int8 model leaves a branch in float (no quantization step at its anchor): the
    members differ there by float32 rounding (3.7e-8) and the population's cost is as small (2.6e-8);
    sqrt(2) x that cost as the floor flagged onnx-reference-int8 for float32 rounding. The floor is now
    at least the measured fp32 floor of that stage, and sqrt(2) x cost where that is larger."""
    from anpred.defaults import OracleConfig
    from anpred.judge.scales import CellMeasures, floor_and_basis

    cfg = OracleConfig()
    floor, basis = floor_and_basis(
        cfg, "int8", 6, population=["ort-int8"], implementation=True, measured=CellMeasures(cost=2.62e-8)
    )
    assert floor == cfg.floor_at("fp32", 6) > 3.7e-8 and "fp32 floor" in basis
    big = 10 * cfg.floor_at("fp32", 6)
    assert floor_and_basis(
        cfg, "int8", 6, population=["ort-int8"], implementation=True, measured=CellMeasures(cost=big)
    )[0] == pytest.approx(2**0.5 * big)
