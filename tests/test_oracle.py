"""anpred.oracle on synthetic populations: consensus by family, outlier + floor rule, origin,
propagation, NaN handling, reference fallback, config overrides (anpred.defaults)."""

import math

import numpy as np
import pytest

from anpred.defaults import OracleConfig, load_config
from anpred.errors import AnpredError
from anpred.oracle import AnchorInfo, BackendInfo, Oracle, ThresholdCheck

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
    assert "reference" in res.verdicts["ort"].unjudged["anchor/00/a"]
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
    assert "anchor/02/c" in res.unjudged_anchors and "NaN" in res.unjudged_anchors["anchor/02/c"]
    assert not any(v.flagged for v in res.verdicts.values())


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
