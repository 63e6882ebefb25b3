"""anpred.judge.consensus on synthetic populations: the float64 execution as arbiter (a split against
a majority sharing one error, a shared error below the floor, a wrong arbiter), non-finite values
never arbitrated, an all-zero consensus, the latest output consensus offered for reuse and the
independence line.
"""

import math

import numpy as np
import pytest

from anpred.defaults import OracleConfig
from anpred.judge import AnchorInfo, BackendInfo, Oracle

from isa_reasons import SAME_DATA
from oracle_populations import ANCHORS, backend_infos, population, shared_deviation


def _majority_error(torch_extra=None, fp64=True, n=6, seed=3, shared_scale=1e-4, config=None):
    """ort, openvino and tvm share one error (``shared_scale`` x a fixed pattern, as a sequential float32
    sum they all compute); torch is accurate (noise 3e-7) unless ``torch_extra`` (relative scale of its
    own, independent error); onnx-reference-fp64 returns the truth."""
    names = ["ort", "openvino", "tvm", "torch"]
    o = Oracle(
        ANCHORS,
        backend_infos(names) + ([BackendInfo.make("onnx-reference-fp64", precision="fp64")] if fp64 else []),
        config,
    )
    rng = np.random.default_rng(seed)
    shared = {a.name: rng.standard_normal(512) for a in ANCHORS}
    for _ in range(n):
        sample = {}
        for a in ANCHORS:
            true = rng.standard_normal(512)
            sample[a.name] = {
                b: true * (1 + 3e-7 * rng.standard_normal(512)) + shared_scale * shared[a.name]
                for b in ("ort", "openvino", "tvm")
            }
            sample[a.name]["torch"] = true * (1 + 3e-7 * rng.standard_normal(512)) + (
                torch_extra * rng.standard_normal(512) if torch_extra else 0.0
            )
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
    assert [(c["families"], c["kind"]) for c in res.correlated] == [
        (["onnxruntime", "openvino", "tvm"], "error-correlated")
    ]
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
    o = Oracle(ANCHORS, backend_infos(voters) + [BackendInfo.make("onnx-reference-fp64", precision="fp64")])
    shared = {a.name: rng.standard_normal(512) for a in ANCHORS}
    for _ in range(6):
        sample = {}
        for a in ANCHORS:
            true = rng.standard_normal(512)
            sample[a.name] = {
                b: true * (1 + 3e-7 * rng.standard_normal(512)) + (1e-3 * shared[a.name] if b in sharing else 0.0)
                for b in voters
            }
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
    o = Oracle(ANCHORS, backend_infos(names))
    samples = list(population(names, n=2))
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
        o = Oracle(ANCHORS, backend_infos(names), OracleConfig(correlated_rho=rho))
        for s in shared_deviation(names, 8e-6, identical=False):
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
    one = {
        "pairs": {
            "mnn|onnxruntime": {"rho_median": 1.0, "rho_max": 1.0, "anchors": 1},
            "mnn|ncnn": {"rho_median": -0.4, "rho_max": -0.4, "anchors": 1},
        },
        "merged": {},
    }
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
            o.add(
                {
                    a.name: {b: (np.zeros(64) if b in ("tvm", "mnn", "ncnn") else x.copy()) for b in fams}
                    for a in anchors
                }
            )
        res = o.finish()
    v = res.verdicts["ort"]
    assert v.flagged and v.worst_primary == math.inf
    assert [(s.ratio, s.kind) for s in v.steps] == [(1.0, "stable"), (1.0, "stable")]
    c = next(c for c in res.cells if c.backend == "ort")
    assert c.per_sample == {"p50": math.inf, "p90": math.inf, "max": math.inf}
