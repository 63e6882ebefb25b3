"""anpred.judge.consensus on synthetic populations: consensus by family, outlier + floor rule, masking,
NaN handling, reference fallback, missing anchors and samples, shape mismatches, camps of families that
share a deviation, merged bit-identical families, config overrides (anpred.defaults).
Origin and propagation: tests/test_oracle_origin.py; the float64 arbiter: tests/test_oracle_arbitration.py.
"""

import math

import numpy as np
import pytest

from anpred.defaults import OracleConfig, load_config
from anpred.errors import AnpredError
from anpred.judge import BackendInfo, Oracle, ThresholdCheck

from oracle_populations import ANCHORS, FP32, backend_infos, judged, population, shared_deviation


def test_clean_population_flags_nothing():
    res = judged(FP32)
    assert not any(v.flagged for v in res.verdicts.values())
    c = next(c for c in res.cells if c.backend == "openvino" and c.anchor == "output/y")
    assert 1e-8 < c.primary < 1e-6 < c.floor
    assert res.consensus["anchor/00/a"] == ["median:onnx-reference,onnxruntime,openvino,torch"]


def test_fault_flagged_with_origin_and_propagation():
    bias = (1, lambda t, r: 1e-3 * r.standard_normal(t.shape), 4.0)
    res = judged(FP32, {"openvino": bias})
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
    res = judged(FP32, {"torch": (0, lambda t, r: 1e-3 * r.standard_normal(t.shape), 1e-6)})
    v = res.verdicts["torch"]
    assert v.flagged and v.origin_stage == 0 and v.propagation == "masked" and not v.output_flagged


def test_one_family_cannot_outvote_others():
    # both onnxruntime members deviate identically: still one vote, so they are flagged, not the others
    dev = {}
    for b in ("ort", "ort-noopt"):
        dev[b] = (2, lambda t, r: 0.01 * t, 1.0)
    res = judged(["ort", "ort-noopt", "openvino", "onnx-reference"], dev)
    assert res.verdicts["ort"].flagged and res.verdicts["ort-noopt"].flagged
    assert not res.verdicts["openvino"].flagged and not res.verdicts["onnx-reference"].flagged


def test_reduced_precision_does_not_vote_and_uses_its_floor():
    cfg = OracleConfig()
    fp16 = (0, lambda t, r: t * 4.9e-4 * r.standard_normal(t.shape), 1.0)  # ~ half-precision rounding
    res = judged(["ort", "openvino", "onnx-reference", "ort-fp16"], {"ort-fp16": fp16}, cfg)
    v = res.verdicts["ort-fp16"]
    assert not v.votes and v.precision == "fp16" and not v.flagged
    assert "ort-fp16" not in res.consensus["anchor/00/a"][0]
    res2 = judged(["ort", "openvino", "onnx-reference", "ort-fp16"], {"ort-fp16": (2, lambda t, r: 0.5 * t, 1.0)}, cfg)
    assert res2.verdicts["ort-fp16"].flagged and res2.verdicts["ort-fp16"].origin_stage == 2


def test_nan_is_flagged_and_counted():
    def nan_fault(t, r):
        d = np.zeros_like(t)
        d[:3] = np.nan
        return d

    res = judged(FP32, {"onnx-reference": (3, nan_fault, 1.0)})
    cell = next(c for c in res.cells if c.backend == "onnx-reference" and c.anchor == "output/y")
    assert cell.flagged and cell.nonfinite == 3 * 8 and cell.stats.nan == 24
    assert math.isfinite(cell.primary)
    assert res.verdicts["onnx-reference"].origin_anchor == "output/y"
    assert not res.verdicts["ort"].flagged  # the NaN did not leak into the consensus


def test_two_families_fall_back_to_named_reference():
    res = judged(["ort", "openvino"], {"openvino": (1, lambda t, r: 1e-3 * t, 1.0)}, reference="ort")
    assert res.consensus["anchor/00/a"] == ["reference:ort"]
    assert any("reference:ort" in n for n in res.notes)
    # the reference is the consensus: not a gap (its verdict says so), not "unjudged"
    ref = res.verdicts["ort"]
    assert ref.reference_at == [a.name for a in ANCHORS] and ref.unjudged == {} and ref.status == "reference"
    v = res.verdicts["openvino"]
    assert v.flagged and v.origin_stage == 1


def test_missing_anchor_and_all_nan_anchor_are_reported():
    names = ["ort", "openvino", "onnx-reference"]
    o = Oracle(ANCHORS, backend_infos(names))
    for s in population(names, n=3):
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
    assert {b: v.status for b, v in res.verdicts.items()} == {
        "ort": "consistent",
        "openvino": "incomplete",
        "onnx-reference": "consistent",
    }


def test_missing_samples_make_a_verdict_incomplete():
    """Regression (review): a backend judged on 4 of 6 samples was reported plainly consistent."""
    names = ["ort", "openvino", "onnx-reference", "torch"]
    o = Oracle(ANCHORS, backend_infos(names))
    for i, s in enumerate(population(names, n=6)):
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
    assert v.partial["anchor/00/a"] == (
        "judged on 4 of 6 samples; no tensors stored for this sample (in 2 of 6 samples: s0004, s0005)"
    )
    assert res.verdicts["ort"].status == "consistent" and res.verdicts["ort"].complete


def test_shape_mismatch_is_named_not_none():
    """Regression (review): every backend stored the anchor with a wrong shape, and the message said
    'fewer than two backends produced it (none)'."""
    names = ["ort", "openvino", "onnx-reference"]
    o = Oracle(ANCHORS, backend_infos(names))
    for s in population(names, n=2):
        s["anchor/01/b"] = {"ort": np.zeros(512), "openvino": np.zeros(256), "onnx-reference": np.zeros((2, 3))}
        o.add(s, unaligned={("anchor/01/b", "torch"): "not in this run"})
    res = o.finish()
    why = res.unjudged_anchors["anchor/01/b"]
    assert why == (
        "fewer than two backends produced it (ort); openvino: shape [256] differs from the other "
        "backends' shape [512]; onnx-reference: shape [2, 3] differs from the other backends' shape [512]"
    )
    assert "shape [2, 3] differs" in res.verdicts["onnx-reference"].unjudged["anchor/01/b"]
    assert res.verdicts["ort"].unjudged["anchor/01/b"] == "no other backend to compare with here"


def test_a_shared_material_deviation_splits_the_vote_and_the_count_of_families_decides():
    """Issue 33: agreement is no evidence of shared kernels, so families are first split into camps that
    agree within the floor; the camp with more *families* (not merged groups) is the consensus. openvino
    and tf (bit-identical, one deviation of 1e-3 > the floor) against ort, onnx-reference and torch: a
    split of 3 against 2, decided by the count; the pair is flagged and merged into one vote within its
    own camp; the report names the split."""
    names = ["ort", "onnx-reference", "torch", "openvino", "tf"]
    o = Oracle(ANCHORS, backend_infos(names))
    for s in shared_deviation(names, 1e-3):
        o.add(s)
    res = o.finish()
    assert {b for b, v in res.verdicts.items() if v.flagged} == {"openvino", "tf"}
    assert [c["families"] for c in res.correlated] == [["openvino", "tensorflow"]]
    assert res.consensus["anchor/01/b"] == [
        "median:onnx-reference,onnxruntime,torch (split: decided by count against openvino,tensorflow)"
    ]
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
    o = Oracle(ANCHORS, backend_infos(names))
    for s in shared_deviation(names, 1e-3):
        o.add(s)
    res = o.finish()
    assert not any(v.flagged for v in res.verdicts.values())
    assert {x["anchor"] for x in res.splits if x["basis"] == "tie"} == {"anchor/01/b", "anchor/02/c", "output/y"}
    assert set(res.unjudged_anchors) == {"anchor/01/b", "anchor/02/c", "output/y"}
    assert any("a tie" in n and "onnx-reference-fp64" in n for n in res.notes)
    o2 = Oracle(ANCHORS, backend_infos(names) + [BackendInfo.make("onnx-reference-fp64", precision="fp64")])
    rng = np.random.default_rng(11)
    for s in shared_deviation(names, 1e-3):
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
    o = Oracle(ANCHORS, backend_infos(names))
    for s in shared_deviation(names, 8e-6):
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
    o2 = Oracle(ANCHORS, backend_infos(names), OracleConfig(correlated_rho=1.0))
    for s in shared_deviation(names, 8e-6, identical=False):
        o2.add(s)
    res2 = o2.finish()
    assert res2.correlated == []
    c_ort = next(c for c in res2.cells if c.backend == "ort" and c.anchor == "anchor/01/b")
    c_ov = next(c for c in res2.cells if c.backend == "openvino" and c.anchor == "anchor/01/b")
    assert c_ort.primary > 0.2 * c_ov.primary
    # by default the pair's shared error is measured (three-cornered hat within the camp: the pair's
    # distance 3e-7 relative is far below the sum of their own error variances) and merged
    o3 = Oracle(ANCHORS, backend_infos(names))
    for s in shared_deviation(names, 8e-6, identical=False):
        o3.add(s)
    res3 = o3.finish()
    assert [(c["families"], c["kind"]) for c in res3.correlated] == [(["openvino", "tensorflow"], "error-correlated")]
    assert res3.correlated[0]["rho"]["anchor/01/b"] > 0.99 and res3.correlated[0]["anchors"]["anchor/01/b"] == 8
    assert {b for b, v in res3.verdicts.items() if v.flagged} == {"openvino", "tf"}
    assert res3.independence["merged"]["openvino+tensorflow"] >= 3


def test_all_identical_votes_are_not_merged():
    """Agreement everywhere is not evidence of shared kernels: nothing merged, the median is unchanged."""
    names = ["ort", "openvino", "onnx-reference"]
    o = Oracle(ANCHORS, backend_infos(names))
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


@pytest.mark.parametrize(
    "text, message",
    [
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
    ],
)
def test_bad_config_values_are_one_clear_error(tmp_path, text, message):
    """Regression (review): {"min_voters": "abc"} raised a ValueError traceback (exit 1); band 0 and
    floor true were accepted."""
    j = tmp_path / "c.json"
    j.write_text(text)
    with pytest.raises(AnpredError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(j)
