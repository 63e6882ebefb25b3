"""anpred.judge.consensus on synthetic populations: consensus by family, outlier + floor rule, origin,
propagation, NaN handling, reference fallback, config overrides (anpred.defaults)."""

import math

import numpy as np
import pytest

from anpred.defaults import OracleConfig, load_config
from anpred.errors import AnpredError
from anpred.judge import AnchorInfo, BackendInfo, Oracle, ThresholdCheck

from isa_reasons import SAME_DATA

ANCHORS = [AnchorInfo("anchor/00/a", 0), AnchorInfo("anchor/01/b", 1), AnchorInfo("anchor/02/c", 2),
           AnchorInfo("output/y", 3, kind="output")]
FP32 = ["ort", "ort-noopt", "openvino", "onnx-reference", "torch"]


def _backends(names):
    return [BackendInfo.make(n) for n in names]


def _population(names, faults=None, n=8, noise=3e-7, seed=0):
    """Yield samples {anchor: {backend: x}}: a true tensor per anchor plus relative fp32-like noise per
    backend; ``faults[backend] = (anchor index, fn(true, rng) -> deviation)`` adds a deviation from that
    anchor on (carried forward, scaled by ``gain`` per later anchor)."""
    rng = np.random.default_rng(seed)
    faults = faults or {}
    for _ in range(n):
        sample = {}
        carried = {b: None for b in names}
        for i, a in enumerate(ANCHORS):
            true = rng.standard_normal(512)
            sample[a.name] = {}
            for b in names:
                x = true * (1 + noise * rng.standard_normal(512))
                if b in faults:
                    at, fn, gain = faults[b]
                    if i == at:
                        carried[b] = fn(true, rng)
                    elif i > at and carried[b] is not None:
                        carried[b] = carried[b] * gain
                    if carried[b] is not None:
                        x = x + carried[b]
                sample[a.name][b] = x
        yield sample


def _judge(names, faults=None, config=None, reference=None, **kw):
    o = Oracle(ANCHORS, _backends(names), config, reference=reference)
    for s in _population(names, faults, **kw):
        o.add(s)
    return o.finish()


def test_clean_population_flags_nothing():
    res = _judge(FP32)
    assert not any(v.flagged for v in res.verdicts.values())
    c = next(c for c in res.cells if c.backend == "openvino" and c.anchor == "output/y")
    assert 1e-8 < c.primary < 1e-6 < c.floor
    assert res.consensus["anchor/00/a"] == ["median:onnx-reference,onnxruntime,openvino,torch"]


def test_fault_flagged_with_origin_and_propagation():
    bias = (1, lambda t, r: 1e-3 * r.standard_normal(t.shape), 4.0)
    res = _judge(FP32, {"openvino": bias})
    v = res.verdicts["openvino"]
    assert v.flagged and v.origin_anchor == "anchor/01/b" and v.origin_stage == 1
    assert [s.kind for s in v.steps] == ["amplified", "amplified", "amplified"]
    assert v.steps[0].ratio > 100  # from the noise level to the fault
    assert v.steps[1].ratio == pytest.approx(4.0, rel=0.15)
    assert v.propagation == "amplified" and not v.non_monotonic and v.output_flagged
    assert [b for b, x in res.verdicts.items() if x.flagged] == ["openvino"]
    cell = next(c for c in res.cells if c.backend == "openvino" and c.anchor == "anchor/01/b")
    assert cell.primary == pytest.approx(1e-3, rel=0.1)
    assert cell.primary > 10 * cell.peer_level and "floor" in cell.reason


def test_masked_when_output_is_clean():
    res = _judge(FP32, {"torch": (0, lambda t, r: 1e-3 * r.standard_normal(t.shape), 1e-6)})
    v = res.verdicts["torch"]
    assert v.flagged and v.origin_stage == 0 and v.propagation == "masked" and not v.output_flagged


def test_one_family_cannot_outvote_others():
    # both onnxruntime members deviate identically: still one vote, so they are flagged, not the others
    dev = {}
    for b in ("ort", "ort-noopt"):
        dev[b] = (2, lambda t, r: 0.01 * t, 1.0)
    res = _judge(["ort", "ort-noopt", "openvino", "onnx-reference"], dev)
    assert res.verdicts["ort"].flagged and res.verdicts["ort-noopt"].flagged
    assert not res.verdicts["openvino"].flagged and not res.verdicts["onnx-reference"].flagged


def test_reduced_precision_does_not_vote_and_uses_its_floor():
    cfg = OracleConfig()
    fp16 = (0, lambda t, r: t * 4.9e-4 * r.standard_normal(t.shape), 1.0)  # ~ half-precision rounding
    res = _judge(["ort", "openvino", "onnx-reference", "ort-fp16"], {"ort-fp16": fp16}, cfg)
    v = res.verdicts["ort-fp16"]
    assert not v.votes and v.precision == "fp16" and not v.flagged
    assert "ort-fp16" not in res.consensus["anchor/00/a"][0]
    res2 = _judge(["ort", "openvino", "onnx-reference", "ort-fp16"],
                  {"ort-fp16": (2, lambda t, r: 0.5 * t, 1.0)}, cfg)
    assert res2.verdicts["ort-fp16"].flagged and res2.verdicts["ort-fp16"].origin_stage == 2


def test_nan_is_flagged_and_counted():
    def nan_fault(t, r):
        d = np.zeros_like(t)
        d[:3] = np.nan
        return d

    res = _judge(FP32, {"onnx-reference": (3, nan_fault, 1.0)})
    cell = next(c for c in res.cells if c.backend == "onnx-reference" and c.anchor == "output/y")
    assert cell.flagged and cell.nonfinite == 3 * 8 and cell.stats.nan == 24
    assert math.isfinite(cell.primary)
    assert res.verdicts["onnx-reference"].origin_anchor == "output/y"
    assert not res.verdicts["ort"].flagged  # the NaN did not leak into the consensus


def test_two_families_fall_back_to_named_reference():
    res = _judge(["ort", "openvino"], {"openvino": (1, lambda t, r: 1e-3 * t, 1.0)}, reference="ort")
    assert res.consensus["anchor/00/a"] == ["reference:ort"]
    assert any("reference:ort" in n for n in res.notes)
    # the reference is the consensus: not a gap (its verdict says so), not "unjudged"
    ref = res.verdicts["ort"]
    assert ref.reference_at == [a.name for a in ANCHORS] and ref.unjudged == {} and ref.status == "reference"
    v = res.verdicts["openvino"]
    assert v.flagged and v.origin_stage == 1


def test_missing_anchor_and_all_nan_anchor_are_reported():
    names = ["ort", "openvino", "onnx-reference"]
    o = Oracle(ANCHORS, _backends(names))
    for s in _population(names, n=3):
        del s["anchor/01/b"]["openvino"]
        for b in names:
            s["anchor/02/c"][b] = np.full(512, np.nan)
        o.add(s)
    res = o.finish()
    assert "missing" in res.verdicts["openvino"].unjudged["anchor/01/b"]
    # every family returns NaN at anchor/02/c: they agree on it (issue 17: non-finite values are voted
    # on), a note says no finite value was compared there
    assert "anchor/02/c" not in res.unjudged_anchors
    assert any("anchor/02/c: the voting families agreed on NaN/Inf" in n for n in res.notes)
    assert not any(v.flagged for v in res.verdicts.values())
    # openvino is incomplete (its anchor/01/b is missing), the others judged everywhere
    assert {b: v.status for b, v in res.verdicts.items()} == {"ort": "consistent", "openvino": "incomplete",
                                                             "onnx-reference": "consistent"}


def test_missing_samples_make_a_verdict_incomplete():
    """Regression (review): a backend judged on 4 of 6 samples was reported plainly consistent."""
    names = ["ort", "openvino", "onnx-reference", "torch"]
    o = Oracle(ANCHORS, _backends(names))
    for i, s in enumerate(_population(names, n=6)):
        absent = {}
        if i >= 4:
            for a in s:
                del s[a]["openvino"]
            absent = {"openvino": "no tensors stored for this sample"}
        o.add(s, sample_id=f"s{i:04d}", absent=absent)
    res = o.finish()
    v = res.verdicts["openvino"]
    assert v.status == "incomplete" and not v.flagged and v.samples == 4 and v.unjudged == {}
    assert set(v.partial) == {a.name for a in ANCHORS}
    assert v.partial["anchor/00/a"] == ("judged on 4 of 6 samples; no tensors stored for this sample "
                                        "(in 2 of 6 samples: s0004, s0005)")
    assert res.verdicts["ort"].status == "consistent" and res.verdicts["ort"].complete


def test_shape_mismatch_is_named_not_none():
    """Regression (review): every backend stored the anchor with a wrong shape, and the message said
    'fewer than two backends produced it (none)'."""
    names = ["ort", "openvino", "onnx-reference"]
    o = Oracle(ANCHORS, _backends(names))
    for s in _population(names, n=2):
        s["anchor/01/b"] = {"ort": np.zeros(512), "openvino": np.zeros(256), "onnx-reference": np.zeros((2, 3))}
        o.add(s, unaligned={("anchor/01/b", "torch"): "not in this run"})
    res = o.finish()
    why = res.unjudged_anchors["anchor/01/b"]
    assert why == ("fewer than two backends produced it (ort); openvino: shape [256] differs from the other "
                   "backends' shape [512]; onnx-reference: shape [2, 3] differs from the other backends' shape [512]")
    assert "shape [2, 3] differs" in res.verdicts["onnx-reference"].unjudged["anchor/01/b"]
    assert res.verdicts["ort"].unjudged["anchor/01/b"] == "no other backend to compare with here"


def _shared_deviation(names, scale, identical=True, seed=3):
    """Samples where openvino and tf share one deviation (``scale`` x noise from anchor 1 on): tf a copy
    of openvino's tensor (``identical``) or with fp32-level noise of its own."""
    for s in _population(names, {"openvino": (1, lambda t, r: scale * r.standard_normal(t.shape), 1.0)}, seed=seed):
        for a in s:
            if identical:
                s[a]["tf"] = s[a]["openvino"].copy()
            else:
                s[a]["tf"] = s[a]["openvino"] * (1 + 3e-7 * np.random.default_rng(7).standard_normal(512))
        yield s


def test_a_shared_material_deviation_splits_the_vote_and_the_count_of_families_decides():
    """Issue 33: agreement is no evidence of shared kernels, so families are first split into camps that
    agree within the floor; the camp with more *families* (not merged groups) is the consensus. openvino
    and tf (bit-identical, one deviation of 1e-3 > the floor) against ort, onnx-reference and torch: a
    split of 3 against 2, decided by the count; the pair is flagged and merged into one vote within its
    own camp; the report names the split."""
    names = ["ort", "onnx-reference", "torch", "openvino", "tf"]
    o = Oracle(ANCHORS, _backends(names))
    for s in _shared_deviation(names, 1e-3):
        o.add(s)
    res = o.finish()
    assert {b for b, v in res.verdicts.items() if v.flagged} == {"openvino", "tf"}
    assert [c["families"] for c in res.correlated] == [["openvino", "tensorflow"]]
    assert res.consensus["anchor/01/b"] == [
        "median:onnx-reference,onnxruntime,torch (split: decided by count against openvino,tensorflow)"]
    split = next(x for x in res.splits if x["anchor"] == "anchor/01/b")
    assert split["camps"] == [["onnx-reference", "onnxruntime", "torch"], ["openvino", "tensorflow"]]
    assert split["decided_for"] == ["onnx-reference", "onnxruntime", "torch"] and split["basis"] == "count"
    assert split["samples"] == 8 and not any(x["anchor"] == "anchor/00/a" for x in res.splits)
    assert any("split vote" in n and "by the count of families (3 against 2)" in n for n in res.notes)
    cell = next(c for c in res.cells if c.backend == "tf" and c.anchor == "anchor/01/b")
    assert cell.primary == pytest.approx(1e-3, rel=0.1) and cell.peer_level < 1e-6


def test_a_tie_between_camps_is_reported_and_decided_by_float64():
    """Two families against two (openvino + tf sharing 1e-3): no count decides, so no consensus there:
    nothing is flagged, the anchors are not judged and the note says it is a tie. With the float64
    execution in the run, it decides for the camp that equals it: the pair is flagged."""
    names = ["ort", "onnx-reference", "openvino", "tf"]
    o = Oracle(ANCHORS, _backends(names))
    for s in _shared_deviation(names, 1e-3):
        o.add(s)
    res = o.finish()
    assert not any(v.flagged for v in res.verdicts.values())
    assert {x["anchor"] for x in res.splits if x["basis"] == "tie"} == {"anchor/01/b", "anchor/02/c", "output/y"}
    assert set(res.unjudged_anchors) == {"anchor/01/b", "anchor/02/c", "output/y"}
    assert any("a tie" in n and "onnx-reference-fp64" in n for n in res.notes)
    o2 = Oracle(ANCHORS, _backends(names) + [BackendInfo.make("onnx-reference-fp64", precision="fp64")])
    rng = np.random.default_rng(11)
    for s in _shared_deviation(names, 1e-3):
        for a in s:  # the truth: the clean families' tensor without their fp32-level noise
            s[a]["onnx-reference-fp64"] = s[a]["ort"] * (1 + 1e-9 * rng.standard_normal(512))
        o2.add(s)
    res2 = o2.finish()
    assert {b for b, v in res2.verdicts.items() if v.flagged} == {"openvino", "tf"}
    split = next(x for x in res2.splits if x["anchor"] == "output/y")
    assert split["basis"] == "float64" and split["decided_for"] == ["onnx-reference", "onnxruntime"]
    assert split["truth_error"][0] < 1e-6 < 5e-4 < split["truth_error"][1]


def test_bit_identical_families_are_merged_within_a_camp():
    """The merge's job (shared kernels, e.g. TF and OpenVINO both on oneDNN) within one camp: a shared
    deviation of 8e-6, below the floor, pulls the median of four families halfway when the pair counts
    twice; merged into one vote, the consensus stays with the other two and the pair departs from its
    peers at three anchors in a row (the sustained rule flags it)."""
    names = ["ort", "onnx-reference", "openvino", "tf"]
    o = Oracle(ANCHORS, _backends(names))
    for s in _shared_deviation(names, 8e-6):
        o.add(s)
    res = o.finish()
    assert res.splits == []
    assert [c["families"] for c in res.correlated] == [["openvino", "tensorflow"]]
    assert res.correlated[0]["anchors"] == {a.name: 8 for a in ANCHORS} and res.correlated[0]["differ"] == []
    assert res.consensus["anchor/01/b"] == ["median:onnx-reference,onnxruntime,openvino+tensorflow"]
    assert {b for b, v in res.verdicts.items() if v.flagged} == {"openvino", "tf"}
    assert res.verdicts["openvino"].origin_anchor == "anchor/01/b"
    assert any("correlated backends: openvino and tf" in n for n in res.notes)
    # not bit-identical (the tf copy has its own fp32-level noise): with the error-correlation merge off
    # (correlated_rho = 1) four separate votes, and the shared deviation pulls the element-wise median of
    # four halfway: ort and onnx-reference then deviate as much as the pair
    o2 = Oracle(ANCHORS, _backends(names), OracleConfig(correlated_rho=1.0))
    for s in _shared_deviation(names, 8e-6, identical=False):
        o2.add(s)
    res2 = o2.finish()
    assert res2.correlated == []
    c_ort = next(c for c in res2.cells if c.backend == "ort" and c.anchor == "anchor/01/b")
    c_ov = next(c for c in res2.cells if c.backend == "openvino" and c.anchor == "anchor/01/b")
    assert c_ort.primary > 0.2 * c_ov.primary
    # by default the pair's shared error is measured (three-cornered hat within the camp: the pair's
    # distance 3e-7 relative is far below the sum of their own error variances) and merged
    o3 = Oracle(ANCHORS, _backends(names))
    for s in _shared_deviation(names, 8e-6, identical=False):
        o3.add(s)
    res3 = o3.finish()
    assert [(c["families"], c["kind"]) for c in res3.correlated] == [(["openvino", "tensorflow"], "error-correlated")]
    assert res3.correlated[0]["rho"]["anchor/01/b"] > 0.99 and res3.correlated[0]["anchors"]["anchor/01/b"] == 8
    assert {b for b, v in res3.verdicts.items() if v.flagged} == {"openvino", "tf"}
    assert res3.independence["merged"]["openvino+tensorflow"] >= 3


def test_all_identical_votes_are_not_merged():
    """Agreement everywhere is not evidence of shared kernels: nothing merged, the median is unchanged."""
    names = ["ort", "openvino", "onnx-reference"]
    o = Oracle(ANCHORS, _backends(names))
    x = np.linspace(-1, 1, 64)
    for _ in range(2):
        o.add({a.name: {b: x.copy() for b in names} for a in ANCHORS})
    res = o.finish()
    assert res.correlated == [] and res.consensus["anchor/00/a"] == ["median:onnx-reference,onnxruntime,openvino"]
    assert all(v.status == "consistent" and v.worst_primary == 0.0 for v in res.verdicts.values())


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 9, 11])
def test_median_of_equals_numpy(n):
    from anpred.judge import median_of

    rng = np.random.default_rng(n)
    arrs = [rng.standard_normal(1000) for _ in range(n)]
    arrs[0][:5] = arrs[1][:5]  # ties
    assert np.array_equal(median_of(arrs), np.median(np.stack(arrs), axis=0))
    arrs[1][7] = np.nan
    assert np.array_equal(median_of(arrs), np.nanmedian(np.stack(arrs), axis=0))


def test_threshold_baseline_matches_polygraphy_rule():
    t = ThresholdCheck(["output/y"], ["ort", "openvino"], "ort", atol=1e-5, rtol=1e-5)
    r = np.array([1.0, 100.0, 0.0, 2.0])
    x = np.array([1.0 + 5e-6, 100.0 + 5e-4, 2e-5, np.nan])  # ok (abs), ok (rel), fail, fail (NaN)
    t.add({"output/y": {"ort": r, "openvino": x}})
    res = t.finish()["openvino"]
    assert not res.passed and res.failed_elements == 2 and res.total_elements == 4
    assert res.max_abs == pytest.approx(5e-4)


def test_config_file_overrides_defaults(tmp_path):
    p = tmp_path / "anpred.toml"
    p.write_text("[oracle]\nmin_voters = 4\n[oracle.floor]\nfp32 = 2e-4\n")
    cfg = load_config(p)
    assert cfg.floor["fp32"] == 2e-4 and cfg.floor["fp16"] == OracleConfig().floor["fp16"]
    assert cfg.min_voters == 4 and cfg.floor_at("fp32", 3) == pytest.approx(2e-4 * 2.0)
    j = tmp_path / "c.json"
    j.write_text('{"k": {"fp8": 3}}')
    with pytest.raises(AnpredError, match="unknown precision"):
        load_config(j)
    j.write_text('{"kk": 1}')
    with pytest.raises(AnpredError, match="unknown oracle config key 'kk'"):
        load_config(j)


@pytest.mark.parametrize("text, message", [
    ('{"min_voters": "abc"}', "min_voters must be an integer >= 2, got 'abc'"),
    ('{"min_voters": 2.5}', "min_voters must be an integer >= 2, got 2.5"),
    ('{"threshold_atol": "x"}', "threshold_atol must be a finite number >= 0, got 'x'"),
    ('{"propagation_band": 0}', "propagation_band must be a finite number > 1, got 0"),
    ('{"floor": {"fp32": true}}', "floor.fp32 must be a finite number > 0, got True"),
    ('{"floor": {"fp16": -1}}', "floor.fp16 must be a finite number > 0, got -1"),
    ('{"k": {"int8": 0.5}}', "k.int8 must be a finite number >= 1, got 0.5"),
    ('{"reservoir": -3}', "reservoir must be an integer >= 0, got -3"),
    ('{"primary": "psnr"}', "unknown primary statistic 'psnr'"),
    ('{"reduced_precision": {"ort-fp16": "fp8"}}', "unknown precision 'fp8'"),
    ('{"oracle": 3}', "must be a table"),
])
def test_bad_config_values_are_one_clear_error(tmp_path, text, message):
    """Regression (review): {"min_voters": "abc"} raised a ValueError traceback (exit 1); band 0 and
    floor true were accepted."""
    j = tmp_path / "c.json"
    j.write_text(text)
    with pytest.raises(AnpredError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(j)


# ---- propagation along the data flow: parallel branches ---------------------------------------------
# manifest (topological) order interleaves two branches: A1 -> A2 -> O and B -> O
BRANCHES = [AnchorInfo("anchor/00/A1", 0), AnchorInfo("anchor/01/B", 1), AnchorInfo("anchor/01/A2", 1),
            AnchorInfo("output/O", 2, kind="output")]
BRANCH_DOWN = {"anchor/00/A1": {"anchor/01/A2", "output/O"}, "anchor/01/B": {"output/O"},
               "anchor/01/A2": {"output/O"}, "output/O": set()}


def _judge_branches(dev, descendants, n=8, config=None, deviant="openvino", seed=4):
    """``dev[anchor]``: deviation of backend ``deviant`` there, added to the fp32-like noise (3e-7)
    every backend has; ``deviant`` may be a reduced-precision variant outside FP32."""
    rng = np.random.default_rng(seed)
    names = FP32 + ([deviant] if deviant not in FP32 else [])
    o = Oracle(BRANCHES, _backends(names), config, descendants=descendants)
    for _ in range(n):
        sample = {}
        for a in BRANCHES:
            true = rng.standard_normal(512)
            sample[a.name] = {b: true * (1 + 3e-7 * rng.standard_normal(512)) for b in names}
            sample[a.name][deviant] = sample[a.name][deviant] + dev.get(a.name, 0.0) * rng.standard_normal(512)
        o.add(sample)
    return o.finish()


def test_propagation_profile_follows_descendants_of_the_origin():
    dev = {"anchor/00/A1": 1e-3, "anchor/01/B": 1e-4, "anchor/01/A2": 1e-3, "output/O": 1e-3}
    v = _judge_branches(dev, BRANCH_DOWN).verdicts["openvino"]
    assert v.origin_anchor == "anchor/00/A1" and v.profile_basis == "dataflow"
    assert v.profile_anchors == ["anchor/00/A1", "anchor/01/A2", "output/O"]
    assert [s.kind for s in v.steps] == ["stable", "stable"] and not v.non_monotonic
    assert v.steps[0].ratio == pytest.approx(1.0, rel=0.15)
    assert v.propagation == "stable"
    # in manifest order the unrelated branch B makes a dip (x0.1) and a rise (x10): non-monotonic
    res = _judge_branches(dev, None)
    old = res.verdicts["openvino"]
    assert old.profile_basis == "manifest" and len(old.profile_anchors) == 4
    assert [s.kind for s in old.steps] == ["attenuated", "amplified", "stable"] and old.non_monotonic
    assert old.steps[0].ratio == pytest.approx(0.1, rel=0.15)
    assert any("manifest order" in n for n in res.notes)


def test_masked_along_the_data_flow():
    dev = {"anchor/00/A1": 1e-3, "anchor/01/A2": 1e-3}  # the output downstream is clean
    res = _judge_branches(dev, BRANCH_DOWN)
    v = res.verdicts["openvino"]
    assert v.flagged and not v.output_flagged and v.propagation == "masked"
    assert v.profile_anchors == ["anchor/00/A1", "anchor/01/A2", "output/O"]
    assert [s.kind for s in v.steps] == ["stable", "vanished"]
    assert not any("manifest order" in n for n in res.notes)


def test_anchor_descendants_on_a_real_graph():
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    from anpred.errors import GraphError
    from anpred.judge import anchor_descendants

    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Neg", ["r"], ["a"]), h.make_node("Exp", ["r"], ["b"]),
             h.make_node("Abs", ["a"], ["a2"]), h.make_node("Add", ["a2", "b"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    d = anchor_descendants(m, {"in": "x", "A": "a", "B": "b", "A2": "a2", "Y": "y"})
    assert d == {"in": {"A", "B", "A2", "Y"}, "A": {"A2", "Y"}, "B": {"Y"}, "A2": {"Y"}, "Y": set()}
    with pytest.raises(GraphError, match="not in the model"):
        anchor_descendants(m, {"Z": "zz"})


# ---- localization: tracing the origin back from the first flagged anchor ----------------------------
def test_origin_traced_back_to_where_a_subfloor_deviation_departs():
    """A deviation born at A1 below the fp32 floor (2e-5) but 10-100x the peers' level, flagged only at
    the output where it has grown: origin A1 (stage 0), not the output; the first flagged anchor and
    how the origin was traced are reported. (Sustained-departure flagging off: A1, A2, O would be a
    run of three departures, which flags A1 and A2 themselves; see the next tests.)"""
    dev = {"anchor/00/A1": 1e-5, "anchor/01/A2": 1e-5, "output/O": 1e-3}
    v = _judge_branches(dev, BRANCH_DOWN, config=OracleConfig(sustained_anchors=0)).verdicts["openvino"]
    assert v.flagged and v.flagged_anchors == ["output/O"] and v.first_flagged_anchor == "output/O"
    assert (v.origin_anchor, v.origin_stage) == ("anchor/00/A1", 0)
    assert v.origin_traced.startswith("traced back from output/O: departs from its peers from anchor/00/A1 on")
    assert v.profile_anchors == ["anchor/00/A1", "anchor/01/A2", "output/O"]
    assert v.steps[-1].ratio == pytest.approx(100, rel=0.15) and v.propagation == "amplified"


def test_sustained_departure_is_flagged_below_the_floor():
    """1e-5 (about 30x the peers, half the floor) at A1, A2 and O, a run of three along the data flow:
    flagged at all three by the sustained rule, origin A1; two in a row are not enough, and B (a
    parallel branch, not on the path) does not extend a run."""
    dev = {"anchor/00/A1": 1e-5, "anchor/01/A2": 1e-5, "output/O": 1e-5}
    res = _judge_branches(dev, BRANCH_DOWN)
    v = res.verdicts["openvino"]
    assert v.flagged and v.flagged_anchors == ["anchor/00/A1", "anchor/01/A2", "output/O"]
    assert v.origin_anchor == "anchor/00/A1" and v.origin_traced == ""
    c = next(c for c in res.cells if c.backend == "openvino" and c.anchor == "anchor/01/A2")
    assert c.primary < c.floor and c.reason.startswith("sustained departure: > 4 x peers' median at 3 anchors in a row")
    assert not any(x.flagged for b, x in res.verdicts.items() if b != "openvino")
    # two departures in a row (A1, A2; O clean): not flagged
    assert not _judge_branches({"anchor/00/A1": 1e-5, "anchor/01/A2": 1e-5}, BRANCH_DOWN).verdicts["openvino"].flagged
    # B -> O is a path of two; A1 -> A2 is broken at A2: no run of three
    assert not _judge_branches({"anchor/00/A1": 1e-5, "anchor/01/B": 1e-5, "output/O": 1e-5},
                               BRANCH_DOWN).verdicts["openvino"].flagged
    # in manifest order A1, B, A2, O are consecutive: the same deviations make a run of four there
    assert _judge_branches({"anchor/00/A1": 1e-5, "anchor/01/B": 1e-5, "anchor/01/A2": 1e-5, "output/O": 1e-5},
                           None).verdicts["openvino"].flagged
    # off: sustained_anchors = 0
    assert not _judge_branches(dev, BRANCH_DOWN, config=OracleConfig(sustained_anchors=0)).verdicts["openvino"].flagged


def test_origin_trace_stops_at_a_break_in_the_data_flow_chain():
    # A2 (between A1 and O on the data flow) agrees with the peers: the chain from A1 is broken
    v = _judge_branches({"anchor/00/A1": 1e-5, "output/O": 1e-3}, BRANCH_DOWN).verdicts["openvino"]
    assert v.origin_anchor == "output/O" and v.origin_traced == ""
    # B lies between A1 and O in manifest order but not on the data flow A1 -> A2 -> O: not a break
    dev = {"anchor/00/A1": 1e-5, "anchor/01/A2": 1e-5, "output/O": 1e-3}
    assert _judge_branches(dev, BRANCH_DOWN).verdicts["openvino"].origin_anchor == "anchor/00/A1"
    # without the data flow, B (clean, before O in manifest order) breaks the chain: origin A2
    assert _judge_branches(dev, None).verdicts["openvino"].origin_anchor == "anchor/01/A2"


def test_origin_needs_a_departure_above_the_fraction_of_the_floor_and_k():
    # 1e-6 at A1 is ~5-10x the peers (fp32 noise 3e-7) but below 0.1 x floor (2e-6): not a departure
    dev = {"anchor/00/A1": 1e-6, "anchor/01/A2": 1e-5, "output/O": 1e-3}
    assert _judge_branches(dev, BRANCH_DOWN).verdicts["openvino"].origin_anchor == "anchor/01/A2"
    # origin_k large: tracing never leaves the first flagged anchor
    dev = {"anchor/00/A1": 1e-5, "anchor/01/A2": 1e-5, "output/O": 1e-3}
    cfg = OracleConfig(origin_k=1e9, sustained_anchors=0)
    v = _judge_branches(dev, BRANCH_DOWN, config=cfg).verdicts["openvino"]
    assert v.origin_anchor == "output/O"


@pytest.mark.parametrize("bad", [{"origin_k": 0.5}, {"origin_floor_fraction": 0}, {"origin_floor_fraction": 2.0},
                                 {"sustained_anchors": 1}, {"sustained_anchors": -1}, {"sustained_anchors": 2.5}])
def test_origin_config_is_validated(bad):
    with pytest.raises(AnpredError, match="origin_|sustained_anchors"):
        OracleConfig.from_dict(bad)


def test_reduced_precision_origin_is_not_traced_back():
    """A reduced-precision variant deviates from its fp32 peers everywhere by design (fp16 rounding,
    here 5e-3 at every anchor, below its floor 0.03): flagged at the output only, its origin stays
    the output; tracing back would put every fp16 defect at stage 0."""
    dev = {"anchor/00/A1": 5e-3, "anchor/01/B": 5e-3, "anchor/01/A2": 5e-3, "output/O": 0.5}
    v = _judge_branches(dev, BRANCH_DOWN, deviant="ort-fp16", seed=5).verdicts["ort-fp16"]
    assert v.flagged and v.flagged_anchors == ["output/O"]
    assert v.origin_anchor == "output/O" and v.first_flagged_anchor == "output/O" and v.origin_traced == ""


def test_signal_lost_flags_a_zeroed_tensor_under_any_floor():
    """ort-int8 (floor 2, above the nRMSE 1 of a zero tensor) returning all zeros at one anchor is
    flagged there ("signal lost"); its ordinary int8 deviation elsewhere is not; off with
    ``signal_lost = false``. An anti-correlated tensor (cosine < 0) is lost too."""
    names = FP32 + ["ort-int8", "ort-fp16"]

    def run(cfg=None, at_c=lambda x: np.zeros_like(x)):
        o = Oracle(ANCHORS, _backends(names), cfg)
        for i, s in enumerate(_population(names, noise=3e-7)):
            rng = np.random.default_rng(i)
            for a, per in s.items():  # int8-like deviation: 10% relative
                per["ort-int8"] = per["ort-int8"] * (1 + 0.1 * rng.standard_normal(512))
            s["anchor/02/c"]["ort-int8"] = at_c(s["anchor/02/c"]["torch"])
            o.add(s)
        return o.finish()

    res = run()
    v = res.verdicts["ort-int8"]
    assert v.flagged_anchors == ["anchor/02/c"] and v.origin_anchor == "anchor/02/c"
    c = next(c for c in res.cells if c.backend == "ort-int8" and c.anchor == "anchor/02/c")
    assert c.primary == 1.0 and c.stats.cosine == 0.0 and c.primary < c.floor
    assert c.reason.startswith("signal lost: cosine similarity 0 with the consensus (every value 0")
    b = next(c for c in res.cells if c.backend == "ort-int8" and c.anchor == "anchor/01/b")
    assert not b.flagged and 0.05 < b.primary < 0.2  # ordinary int8 rounding: judged by its floor
    assert not res.verdicts["ort-fp16"].flagged and not any(res.verdicts[x].flagged for x in FP32)
    assert not run(OracleConfig(signal_lost=False)).verdicts["ort-int8"].flagged
    res = run(at_c=lambda x: -0.5 * x)  # anti-correlated: nRMSE 1.5, under the floor
    c = next(c for c in res.cells if c.backend == "ort-int8" and c.anchor == "anchor/02/c")
    assert c.flagged and c.stats.cosine < -0.99 and c.primary < c.floor and "no positive correlation" in c.reason


def test_int8_one_step_rule_and_a_shifted_zero_point():
    """An int8 backend on the grid of step 0.05 (every anchor): rounding to the grid and moving a few
    elements one step more is within the grid's resolution (max 1.5 steps from the consensus, mean
    within half a step) and is not flagged; every element one step off (a shifted zero point: mean 1
    step) is not exempted by the rule (its verdict then rests on the precision's floor)."""
    names = ["ort", "openvino", "onnx-reference"]
    step = 0.05
    steps = {a.name: step for a in ANCHORS}

    def run(shift_all):
        infos = _backends(names) + [BackendInfo.make("ort-int8", "onnxruntime", "int8")]
        o = Oracle(ANCHORS, infos, steps=steps)
        rng = np.random.default_rng(5)
        for s in _population(names, n=4):
            for a in s:
                q = np.round(s[a]["ort"] / step) * step
                if shift_all:
                    q = q + step
                else:
                    q[rng.choice(q.size, 8, replace=False)] += step  # a few elements one step further
                s[a]["ort-int8"] = q
            o.add(s)
        return o.finish()

    res = run(False)
    cells = [c for c in res.cells if c.backend == "ort-int8"]
    assert not res.verdicts["ort-int8"].flagged
    assert all(c.units["max"] <= 1.5 + 1e-9 for c in cells)
    assert any("one-step rule" in c.reason for c in cells) or all(c.primary <= c.threshold for c in cells)
    shifted = run(True)  # max 1.5 steps too, but biased: the rule does not exempt it
    sc = [c for c in shifted.cells if c.backend == "ort-int8"]
    assert all(c.units["max"] <= 1.5 + 1e-9 for c in sc) and not any("one-step rule" in c.reason for c in sc)
    assert all(c.stats.mean_signed > 0.5 * step for c in sc)


def test_reference_with_a_known_library_defect_is_the_last_choice():
    """Two families (below min_voters): the consensus falls back to one reference backend; a backend
    whose library has a known defect the model reaches (``defects``) is passed over for it."""
    infos = _backends(["ort", "onnx-reference"])
    infos[1].defects = "onnx.reference BatchNormalization with momentum (test)"
    o = Oracle(ANCHORS, infos)
    for s in _population(["ort", "onnx-reference"], n=2):
        o.add(s)
    res = o.finish()
    assert res.consensus["anchor/00/a"] == ["reference:ort"]
    o2 = Oracle(ANCHORS, _backends(["ort", "onnx-reference"]))
    for s in _population(["ort", "onnx-reference"], n=2):
        o2.add(s)
    assert o2.finish().consensus["anchor/00/a"] == ["reference:onnx-reference"]  # the default priority


def _majority_error(torch_extra=None, fp64=True, n=6, seed=3, shared_scale=1e-4, config=None):
    """ort, openvino and tvm share one error (``shared_scale`` x a fixed pattern, as a sequential float32
    sum they all compute); torch is accurate (noise 3e-7) unless ``torch_extra`` (relative scale of its
    own, independent error); onnx-reference-fp64 returns the truth."""
    names = ["ort", "openvino", "tvm", "torch"]
    o = Oracle(ANCHORS,
               _backends(names) + ([BackendInfo.make("onnx-reference-fp64", precision="fp64")] if fp64 else []),
               config)
    rng = np.random.default_rng(seed)
    shared = {a.name: rng.standard_normal(512) for a in ANCHORS}
    for _ in range(n):
        sample = {}
        for a in ANCHORS:
            true = rng.standard_normal(512)
            sample[a.name] = {b: true * (1 + 3e-7 * rng.standard_normal(512)) + shared_scale * shared[a.name]
                              for b in ("ort", "openvino", "tvm")}
            sample[a.name]["torch"] = true * (1 + 3e-7 * rng.standard_normal(512)) + \
                (torch_extra * rng.standard_normal(512) if torch_extra else 0.0)
            if fp64:
                sample[a.name]["onnx-reference-fp64"] = true.astype(np.float64)
        o.add(sample)
    return o.finish()


def test_float64_execution_decides_a_split_against_a_majority_sharing_one_error():
    """Three families share an error of 1e-4 (above the floor), torch is accurate: without the float64
    execution the count decides (torch flagged, the note suggests the float64 execution); with it, the
    split is decided for torch, which equals it within the floor, and the three are flagged (ground truth
    beats agreement), with the split and each camp's error against the truth in the report. When torch
    has an error of its own (1e-3), no camp equals the truth within the floor: the count decides again."""
    without = _majority_error(fp64=False)
    assert [b for b, v in without.verdicts.items() if v.flagged] == ["torch"]
    assert any("add onnx-reference-fp64" in n for n in without.notes)
    res = _majority_error()
    assert sorted(b for b, v in res.verdicts.items() if v.flagged) == ["openvino", "ort", "tvm"]
    split = next(x for x in res.splits if x["anchor"] == "output/y")
    assert split["basis"] == "float64" and split["decided_for"] == ["torch"] and split["samples"] == 6
    assert split["truth_error"][1] < 1e-6 < 5e-5 < split["truth_error"][0]
    bad = _majority_error(torch_extra=1e-3)
    assert [b for b, v in bad.verdicts.items() if v.flagged and v.votes] == ["torch"]
    assert all(x["basis"] == "count" for x in bad.splits)


def test_float64_execution_measures_a_shared_error_below_the_floor():
    """The majority's shared error (5e-6) is below the floor: no split. Without the float64 execution the
    consensus is theirs and the accurate torch departs from it at every anchor (16x its peers): the
    sustained rule flags it. With it, the three families' errors against the truth correlate fully
    (rho 1): merged into one vote, the consensus lies between them and torch, and nobody is flagged.
    With the merge off (correlated_rho = 1) the arbitration is the second line: torch is closer to the
    truth than the consensus at every anchor, not flagged, with a note. A backend *further* from float64
    than the consensus (an error of its own, 1e-3) stays flagged."""
    without = _majority_error(fp64=False, shared_scale=5e-6)
    assert [b for b, v in without.verdicts.items() if v.flagged] == ["torch"]
    res = _majority_error(shared_scale=5e-6)
    assert res.splits == [] and not any(v.flagged for v in res.verdicts.values())
    assert [(c["families"], c["kind"])
            for c in res.correlated] == [(["onnxruntime", "openvino", "tvm"], "error-correlated")]
    assert min(res.correlated[0]["rho"].values()) > 0.99
    off = OracleConfig(correlated_rho=1.0)
    res = _majority_error(shared_scale=5e-6, config=off)
    assert res.correlated == [] and not any(v.flagged for v in res.verdicts.values())
    notes = [x for x in res.notes if x.startswith("torch: departs from the consensus") and "float64" in x]
    assert len(notes) == 1 and "the majority shares an error" in notes[0]
    cells = [c for c in res.cells if c.backend == "torch"]
    assert all("closer to the float64 execution than the consensus" in c.reason for c in cells)
    bad = _majority_error(torch_extra=1e-3, shared_scale=5e-6, config=off)
    assert bad.verdicts["torch"].flagged and not any(x.startswith("torch: departs") for x in bad.notes)


def _wrong_arbiter(seed: int, voters: list[str], sharing: tuple[str, ...] = ()):
    """The oracle's result where the float64 execution is off by 1e-3 (a fixed pattern per anchor):
    ``voters`` are clean (noise 3e-7), those in ``sharing`` carry the arbiter's error too (a defect of its
    library); 6 samples of 512 values per anchor."""
    rng = np.random.default_rng(seed)
    o = Oracle(ANCHORS, _backends(voters) + [BackendInfo.make("onnx-reference-fp64", precision="fp64")])
    shared = {a.name: rng.standard_normal(512) for a in ANCHORS}
    for _ in range(6):
        sample = {}
        for a in ANCHORS:
            true = rng.standard_normal(512)
            sample[a.name] = {b: true * (1 + 3e-7 * rng.standard_normal(512))
                              + (1e-3 * shared[a.name] if b in sharing else 0.0) for b in voters}
            sample[a.name]["onnx-reference-fp64"] = true.astype(np.float64) + 1e-3 * shared[a.name]
        o.add(sample)
    return o.finish()


def test_float64_arbiter_cannot_clear_its_own_library():
    """The float64 execution runs on onnx.reference: where that library is wrong (an error shared by
    onnx-reference and onnx-reference-fp64, 1e-3) and ort, openvino, tvm agree, onnx-reference is closer
    to the (equally wrong) float64 execution than the consensus, yet it stays flagged (a voter on the
    arbiter's library is never arbitrated), and the float64 execution itself stays flagged (no
    independent voter backs it)."""
    res = _wrong_arbiter(5, ["ort", "openvino", "tvm", "onnx-reference"], sharing=("onnx-reference",))
    assert sorted(b for b, v in res.verdicts.items() if v.flagged) == ["onnx-reference", "onnx-reference-fp64"]
    assert not any("closer to the float64 execution" in n for n in res.notes)


def test_clean_voters_do_not_back_a_wrong_float64_arbiter():
    """A wrong float64 execution (off by 1e-3) among clean voters ort, openvino, tvm: every voter and the
    consensus sit at about the arbiter's own error, and one of them is nearer by float32 noise; that
    backs nothing (only a voter that departs from the consensus itself can): the arbiter stays flagged at
    every anchor, over several seeds."""
    for seed in range(4):
        res = _wrong_arbiter(seed, ["ort", "openvino", "tvm"])
        assert res.verdicts["onnx-reference-fp64"].flagged, seed
        assert all(c.flagged for c in res.cells if c.backend == "onnx-reference-fp64"), seed
        assert not any("closer to the float64 execution" in n for n in res.notes), seed


@pytest.mark.isa_independent(SAME_DATA)
def test_latest_output_consensus_and_nrmse_are_offered_for_reuse():
    """After each sample, the oracle offers its consensus of every output anchor and each backend's
    (nRMSE, non-finite count) there (a streamed run reuses them for its task metrics and its most
    deviating samples instead of voting again): the consensus equals Oracle.consensus of the same
    tensors, the nRMSE equals error_stats against it, a NaN where the consensus is finite is counted,
    and neither outlives the next sample nor a pickle (a checkpoint)."""
    import pickle

    from anpred.judge import error_stats
    from anpred.pipeline.stream_kept import output_deviation

    names = ["ort", "openvino", "torch", "ort-fp16"]
    o = Oracle(ANCHORS, _backends(names))
    samples = list(_population(names, n=2))
    samples[1]["output/y"]["torch"] = samples[1]["output/y"]["torch"].copy()
    samples[1]["output/y"]["torch"][3] = np.nan
    o.add(samples[0])
    c = o.consensus(samples[0]["output/y"])[0]
    assert set(o.last_consensus) == {"output/y"} and np.array_equal(o.last_consensus["output/y"], c)
    for b in names:
        nrmse, nonfinite = o.last_nrmse[("output/y", b)]
        assert nrmse == pytest.approx(error_stats(samples[0]["output/y"][b], c).nrmse, rel=1e-12) and nonfinite == 0
    dev = output_deviation(["output/y"], o.last_nrmse)
    assert dev == {b: o.last_nrmse[("output/y", b)][0] for b in names}
    o.add(samples[1])
    assert o.last_nrmse[("output/y", "torch")][1] == 1
    assert output_deviation(["output/y"], o.last_nrmse)["torch"] == math.inf
    assert not np.array_equal(o.last_consensus["output/y"], c)
    restored = pickle.loads(pickle.dumps(o))
    assert restored.last_consensus == {} and restored.last_nrmse == {} and restored.samples == 2


def test_independence_line_says_merged_or_not_and_from_how_many_anchors():
    """A new user's Resize run printed "merged at rho >= 0.8: mnn~onnxruntime 1.00" while nothing was
    merged (report.json: ``"merged": {}``) and the rho came from one anchor. The line now names the
    pairs the oracle merged (and at how many anchors), then the pairs at the threshold it did not merge,
    each with the number of anchors its rho was measured at."""
    from anpred.judge.oracle_notes import independence_line

    names = ["ort", "onnx-reference", "openvino", "tf"]
    runs = {}
    for rho in (0.8, 1.0):  # 1.0: the error-correlation merge off
        o = Oracle(ANCHORS, _backends(names), OracleConfig(correlated_rho=rho))
        for s in _shared_deviation(names, 8e-6, identical=False):
            o.add(s)
        runs[rho] = o.finish()
    # merged at the three anchors after the deviation starts: said so, and no "not merged"
    assert [len(c["anchors"]) for c in runs[0.8].correlated] == [3]
    line = independence_line(runs[0.8].independence, runs[0.8].correlated, 0.8)
    assert "openvino~tensorflow merged into one vote at 3 anchors" in line and "not merged" not in line, line
    # the same pair correlated at every anchor, but this run merged nothing: the line must not say merged
    pair = runs[1.0].independence["pairs"]["openvino|tensorflow"]
    assert runs[1.0].correlated == [] and pair["anchors"] == 4 and pair["rho_median"] > 0.99
    line = independence_line(runs[1.0].independence, runs[1.0].correlated, 0.8)
    assert "openvino~tensorflow 1.00 from 4 anchors, not merged" in line and "merged into" not in line, line
    # the user's case, one anchor: singular; above every pair: the highest, with its anchor count
    one = {"pairs": {"mnn|onnxruntime": {"rho_median": 1.0, "rho_max": 1.0, "anchors": 1},
                     "mnn|ncnn": {"rho_median": -0.4, "rho_max": -0.4, "anchors": 1}}, "merged": {}}
    assert "): mnn~onnxruntime 1.00 from 1 anchor, not merged (" in independence_line(one, [], 0.8)
    assert "no pair at or above it; highest mnn~onnxruntime 1.00 from 1 anchor" in independence_line(one, [], 1.01)


def test_finite_values_where_the_consensus_is_nan_are_never_arbitrated():
    """ONNX's attention_4d..._causal_expanded on litert (a review of issue 33): every other family returns
    NaN at the fully masked rows, litert finite values there, and over the finite positions it was closer
    to the float64 execution than the consensus, so the arbitration cleared its flag (a miss against the
    expected outputs). A non-finite disagreement either way is no accuracy question: litert stays
    flagged, for the finite values where the consensus is NaN."""
    rng = np.random.default_rng(2)
    truth = rng.standard_normal(64)
    truth[:8] = np.nan  # the masked rows: NaN in the expected output and the float64 execution
    t = {b: truth + 1e-6 * rng.standard_normal(64) for b in ("ort", "openvino", "torch")}
    lit = truth.copy()
    lit[:8] = 0.0  # finite where everyone else (and the truth) is NaN; exact elsewhere
    t["litert"] = lit
    t["onnx-reference-fp64"] = truth.copy()
    infos = [BackendInfo.make(b) for b in ("ort", "openvino", "torch", "litert")]
    infos.append(BackendInfo.make("onnx-reference-fp64", precision="fp64"))
    o = Oracle([AnchorInfo("output/y", 0, kind="output")], infos)
    o.add({"output/y": t})
    res = o.finish()
    cell = next(c for c in res.cells if c.backend == "litert")
    assert res.verdicts["litert"].flagged and cell.suppressed == 8, cell.reason
    assert "closer to the float64 execution" not in cell.reason
    assert o.fp64_error[("output/y", "litert")] < o.fp64_consensus_error["output/y"]  # it was closer


def test_an_all_zero_consensus_gives_inf_without_warnings_or_nan_ratios():
    """A new user's Softplus far below zero: three families returning 0 outvote two returning the tiny
    true values, so the consensus is all zero and the others' nRMSE is inf at every anchor. The per-sample
    percentiles interpolated between infinities (numpy's "invalid value encountered in scalar subtract"
    leaked to the user) and the propagation read "x nan". Now: p90 inf, no warning, the step inf -> inf
    "stable" at ratio 1."""
    import warnings

    rng = np.random.default_rng(0)
    anchors = [AnchorInfo("anchor/00/a", 0), AnchorInfo("anchor/01/b", 1), AnchorInfo("output/y", 2, kind="output")]
    fams = ["tvm", "mnn", "ncnn", "ort", "torch"]
    o = Oracle(anchors, [BackendInfo.make(b) for b in fams])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            x = rng.random(64) * 1e-9
            o.add({a.name: {b: (np.zeros(64) if b in ("tvm", "mnn", "ncnn") else x.copy()) for b in fams}
                   for a in anchors})
        res = o.finish()
    v = res.verdicts["ort"]
    assert v.flagged and v.worst_primary == math.inf
    assert [(s.ratio, s.kind) for s in v.steps] == [(1.0, "stable"), (1.0, "stable")]
    c = next(c for c in res.cells if c.backend == "ort")
    assert c.per_sample == {"p50": math.inf, "p90": math.inf, "max": math.inf}
