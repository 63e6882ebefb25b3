"""Issue 33, class 1: the consensus is right when the majority is right.

Correct independent implementations of an exact operator are bit-identical *because* they are
correct, so agreement is no evidence of shared kernels: the families are split into camps that agree
within the floor (:mod:`anpred.judge.camps`), a split is decided by the float64 execution where it ran
and by the count of families otherwise, and merging happens within a camp only. Cases: ONNX's
``mod_mixed_sign_float32`` node test (``Mod`` with ``fmod=1``: the expected ``[-0.1, 0.4, 5, 0.1, -0.4,
3]``; tf, litert and mnn return the floor-mod) built here from the same inputs, synthetic and on real
runtimes, and a small CNN with one ``Resize`` (nearest, ``round_prefer_ceil``, asymmetric: a tie at every
other pixel) which onnx2torch and MNN round down.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from anpred.judge import AnchorInfo, BackendInfo, Oracle, check_run
from anpred.judge.camps import camp_distances, decide, form_camps
from anpred.report.text import format_text

# the inputs of ONNX 1.22's node test mod_mixed_sign_float32 (test_data_set_0)
MOD_X = np.array([-4.3, 7.2, 5.0, 4.3, -7.2, 8.0], np.float32)
MOD_Y = np.array([2.1, -3.4, 8.0, -2.1, 3.4, 5.0], np.float32)
CORRECT = ["ort", "openvino", "torch", "tvm", "ncnn", "onnx-reference"]


def _mod_case(fp64: bool):
    """The observed Mod case as the oracle sees it: the six correct families bit-identical (np.fmod in
    float32), tf and litert (one onnx2tf conversion) bit-identical with the floor-mod, mnn the floor-mod
    one float32 ULP off at one element (its own kernel), and the float64 execution."""
    fmod = np.fmod(MOD_X, MOD_Y).astype(np.float64)
    floor = np.mod(MOD_X, MOD_Y).astype(np.float64)
    mnn = floor.copy()
    mnn[1] = float(np.nextafter(np.float32(mnn[1]), np.float32(0)))
    tensors = {b: fmod.copy() for b in CORRECT}
    tensors.update({"tf": floor.copy(), "litert": floor.copy(), "mnn": mnn})
    infos = [BackendInfo.make(b) for b in tensors]
    if fp64:
        tensors["onnx-reference-fp64"] = np.fmod(MOD_X.astype(np.float64), MOD_Y.astype(np.float64))
        infos.append(BackendInfo.make("onnx-reference-fp64", precision="fp64"))
    o = Oracle([AnchorInfo("output/z", 0, kind="output")], infos)
    o.add({"output/z": tensors})
    return o.finish()


@pytest.mark.parametrize("fp64", [True, False])
def test_mod_correct_majority_is_the_consensus(fp64):
    """The issue's report: onnx-reference flagged; tf, litert, mnn consistent at nRMSE 0; the correct
    ones "consistent at nRMSE 0.73" (all six flagged without the float64 execution). Now: tf, litert and
    mnn are flagged, the six correct families are consistent at nRMSE 0, with and without the float64
    execution, and the split is reported (decided by the float64 execution, else by 6 families to 3)."""
    res = _mod_case(fp64)
    flagged = sorted(b for b, v in res.verdicts.items() if v.flagged)
    assert flagged == ["litert", "mnn", "tf"], flagged
    for b in CORRECT:
        assert res.verdicts[b].status == "consistent" and res.verdicts[b].worst_primary == 0.0
    cell = next(c for c in res.cells if c.backend == "tf")
    assert cell.primary == pytest.approx(
        np.linalg.norm(np.mod(MOD_X, MOD_Y) - np.fmod(MOD_X, MOD_Y)) / np.linalg.norm(np.fmod(MOD_X, MOD_Y)), rel=1e-6
    )
    (split,) = res.splits
    assert split["camps"] == [
        ["ncnn", "onnx-reference", "onnxruntime", "openvino", "torch", "tvm"],
        ["litert", "mnn", "tensorflow"],
    ]
    assert split["decided_for"] == split["camps"][0] and split["basis"] == ("float64" if fp64 else "count")
    # the six bit-identical correct families are not "correlated": agreement is not shared kernels
    assert not any("onnxruntime" in c["families"] for c in res.correlated)


def test_camps_form_by_complete_linkage_at_the_floor_and_a_tie_is_undecided():
    """Camp distances are nRMSE against the median of all votes; families within the floor of every other
    member form one camp; the largest camp wins by count, two equal camps tie unless the truth (within
    the floor) decides; a camp made only of the arbiter's own library is never decided for by it."""
    base = np.linspace(-1, 1, 64)
    votes = {"a": base, "b": base + 1e-7, "c": base + 1e-3, "d": base + 1e-3 + 1e-7}
    fams, d, scale = camp_distances(votes)
    assert fams == ["a", "b", "c", "d"] and scale == pytest.approx(np.linalg.norm(base + 5e-4), rel=1e-3)
    camps = form_camps(fams, d, 2e-5)
    assert camps == [["a", "b"], ["c", "d"]]
    assert decide(camps, votes, 2e-5).basis == "tie"
    dec = decide(camps, votes, 2e-5, truth=base + 1e-3)
    assert dec.basis == "float64" and dec.winner == 1 and dec.truth_error[1] == 0.0
    # a truth near no camp (its error above the floor) decides nothing
    assert decide(camps, votes, 2e-5, truth=base + 0.5).basis == "tie"
    # the arbiter's library alone in a camp: its closeness to the truth does not count
    lone = form_camps(
        ["a", "onnx-reference", "z"], camp_distances({"a": base, "onnx-reference": base + 1e-3, "z": base})[1], 2e-5
    )
    assert lone == [["a", "z"], ["onnx-reference"]]
    v3 = {"a": base, "onnx-reference": base + 1e-3, "z": base}
    dec = decide(lone, v3, 2e-5, truth=base + 1e-3, arbiter_library="onnx-reference")
    assert dec.basis == "count" and dec.winner == 0 and dec.truth_error[1] is None
    # within the floor everything is one camp (no split: the ordinary median decides)
    assert form_camps(fams, d, 1e-2) == [fams]


def test_one_conversion_counts_once_in_a_split():
    """litert runs the tf backend's onnx2tf conversion: where the conversion is wrong both are
    bit-identical and wrong. Counted as two families, ort and openvino against tf and litert was a tie
    (nothing judged, a new user's Clip with tensor bounds); counted by conversion it is 2 against 1."""
    from anpred.defaults import CONVERSION_UNITS

    base = np.linspace(-1, 1, 64)
    votes = {"onnxruntime": base, "openvino": base + 1e-9, "tensorflow": base + 0.5, "litert": base + 0.5}
    fams, d, _ = camp_distances(votes)
    camps = form_camps(fams, d, 2e-5)
    assert decide(camps, votes, 2e-5).basis == "tie"
    dec = decide(camps, votes, 2e-5, units=CONVERSION_UNITS)
    assert dec.basis == "count" and camps[dec.winner] == ["onnxruntime", "openvino"]
    assert dict(zip(map(tuple, camps), dec.counts)) == {("onnxruntime", "openvino"): 2, ("litert", "tensorflow"): 1}


@pytest.mark.parametrize("fp64", [False, True])
def test_independent_rounding_near_the_floor_forms_no_camps(fp64):
    """Six correct families whose float32 results differ by independent noise at 0.9x the floor (e.g.
    sequential sums in a LayerNormalization) and a seventh, wrong one: the correct families stay one
    camp and consistent (before: cut at the floor alone, the noise broke them into camps of one, a tie,
    every family unjudged; with the float64 execution, three of them flagged), the wrong one is flagged."""
    from anpred.judge.camps import camp_cut

    rng = np.random.default_rng(3)
    truth = rng.standard_normal(4096)
    fams = ["ort", "openvino", "torch", "tvm", "ncnn", "onnx-reference"]
    o0 = Oracle([AnchorInfo("output/z", 0, kind="output")], [BackendInfo.make(b) for b in fams])
    floor = o0.voter_floor(AnchorInfo("output/z", 0, kind="output"))
    sigma = 0.9 * floor * np.sqrt(np.mean(truth**2))
    tensors = {b: truth + rng.normal(0, sigma, truth.shape) for b in fams}
    tensors["mnn"] = truth * 1.01  # an error of 1e-2: a defect
    infos = [BackendInfo.make(b) for b in tensors]
    if fp64:
        tensors["onnx-reference-fp64"] = truth.copy()
        infos.append(BackendInfo.make("onnx-reference-fp64", precision="fp64"))
    o = Oracle([AnchorInfo("output/z", 0, kind="output")], infos)
    o.add({"output/z": tensors})
    res = o.finish()
    assert sorted(b for b, v in res.verdicts.items() if v.flagged) == ["mnn"], format_text(res)
    for b in fams:
        assert res.verdicts[b].status == "consistent", (b, format_text(res))
    # at most one split: the six correct families (one camp) against mnn
    assert all(sp["camps"] == [sp["decided_for"], ["mnn"]] and len(sp["decided_for"]) == 6 for sp in res.splits)
    names, d, _ = camp_distances({b: tensors[b] for b in fams})
    assert floor < d[d > 0].min() and camp_cut(d, floor, 10.0) > d.max()  # noise past the floor, under the cut


@pytest.mark.parametrize("fp64", [True, False])
def test_every_family_off_in_its_own_way_is_not_one_camp(fp64):
    """A new user's Resize (cubic, half_pixel_symmetric, exclude_outside): ONNX Runtime correct, tf, mnn and
    ncnn off by 7-30 % each in its own way. Cut by the voters' spread they formed one camp and the
    threshold (10 x the peers' median error) passed everyone, even with the float64 execution in the run.
    Now with it the three are flagged and ort is consistent; without it the vote is a tie (no two agree
    to rounding, nothing tells who is right: no consensus, unjudged, never "consistent")."""
    rng = np.random.default_rng(5)
    truth = rng.standard_normal(2048)
    tensors = {"ort": truth + 3e-7 * rng.standard_normal(truth.shape)}
    for b, e in (("tf", 0.07), ("mnn", 0.2), ("ncnn", 0.17)):
        tensors[b] = truth + e * rng.standard_normal(truth.shape)
    infos = [BackendInfo.make(b) for b in tensors]
    if fp64:
        tensors["onnx-reference-fp64"] = truth.copy()
        infos.append(BackendInfo.make("onnx-reference-fp64", precision="fp64"))
    o = Oracle([AnchorInfo("output/y", 0, kind="output")], infos)
    o.add({"output/y": tensors})
    res = o.finish()
    if fp64:
        assert sorted(b for b, v in res.verdicts.items() if v.flagged) == ["mnn", "ncnn", "tf"], format_text(res)
        assert res.verdicts["ort"].status == "consistent"
        (split,) = res.splits
        assert split["basis"] == "float64" and split["decided_for"] == ["onnxruntime"]
    else:
        assert not any(v.flagged for v in res.verdicts.values())
        assert all(res.verdicts[b].status != "consistent" for b in ("ort", "tf", "mnn", "ncnn")), format_text(res)
        assert [sp["basis"] for sp in res.splits] == ["tie"]


@pytest.mark.parametrize("errors", [(0.1, 0.15, 0.2), (0.05, 0.1, 0.3)])
def test_three_correct_families_outvote_three_each_off_in_its_own_way(errors):
    """A review's case: three bit-identical correct families and tf, mnn, ncnn each off in its own way
    (nRMSE 5-30 %), no float64 execution. Cut by the voters' spread (median nearest distance 0.05) the
    six were one camp and nobody was flagged, or tf and mnn joined the correct camp; cut at the floor
    (the spread beyond 2 x the floor) the correct camp wins by count, 3 against 1 each: the three are
    flagged, the correct ones consistent."""
    rng = np.random.default_rng(11)
    truth = rng.standard_normal(2048)
    tensors = {b: truth.copy() for b in ("ort", "openvino", "torch")}
    for b, e in zip(("tf", "mnn", "ncnn"), errors):
        tensors[b] = truth + e * rng.standard_normal(truth.shape)
    o = Oracle([AnchorInfo("output/y", 0, kind="output")], [BackendInfo.make(b) for b in tensors])
    o.add({"output/y": tensors})
    res = o.finish()
    assert sorted(b for b, v in res.verdicts.items() if v.flagged) == ["mnn", "ncnn", "tf"], format_text(res)
    for b in ("ort", "openvino", "torch"):
        assert res.verdicts[b].status == "consistent" and res.verdicts[b].worst_primary == 0.0
    (split,) = res.splits
    assert split["basis"] == "count" and split["decided_for"] == ["onnxruntime", "openvino", "torch"]


def test_a_backend_outside_a_tie_is_judged_against_the_nearest_candidate():
    """OpenVINO 2026.4.1's Softplus far below zero (tests/test_wider_population.py), as the oracle saw it
    on eight families: the correct ones split 3 to 3 on the tiny values (three log1p-accurate, three
    ``log(1 + exp(x))`` in float32, 10 % apart), litert 20 % off, openvino returning 0. The tie left the
    anchor unjudged and openvino's origin moved to the next anchor. Now the two outside the tie are
    judged against the nearest tied camp with the camps' distance (0.1) as the peers' level: openvino
    (nRMSE 1 from both candidates) flagged there, litert (0.2: within 10 x 0.1) not; the six in the tie
    stay unjudged at that anchor."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-20, -10, 512)
    exact = np.log1p(np.exp(x))
    coarse = exact * (1 + 0.1 * rng.standard_normal(x.shape))  # 10 % off, element by element
    t = {b: exact.copy() for b in ("ort", "tf", "torch")}
    t.update({b: coarse.copy() for b in ("tvm", "mnn", "ncnn")})
    t["litert"] = exact * (1 + 0.2 * rng.standard_normal(x.shape))
    t["openvino"] = np.zeros_like(exact)
    o = Oracle([AnchorInfo("output/y", 0, kind="output")], [BackendInfo.make(b) for b in t])
    o.add({"output/y": t})
    res = o.finish()
    (split,) = res.splits
    assert split["basis"] == "tie"
    assert split["camps"][:2] == [["mnn", "ncnn", "tvm"], ["onnxruntime", "tensorflow", "torch"]]
    assert sorted(b for b, v in res.verdicts.items() if v.flagged) == ["openvino"], format_text(res)
    ov = next(c for c in res.cells if c.backend == "openvino")
    # against the nearest candidate: all-zero is nRMSE 1 from either; the level, the candidates' distance
    level = np.linalg.norm(coarse - exact) / np.linalg.norm(exact)
    assert ov.primary == pytest.approx(1.0) and ov.peer_level == pytest.approx(level, rel=0.2)
    lit = next(c for c in res.cells if c.backend == "litert")
    assert not lit.flagged and 0.1 < lit.primary < 10 * lit.peer_level
    assert {c.backend for c in res.cells} == {"openvino", "litert"}
    assert res.verdicts["ort"].status != "consistent" and "output/y" in res.verdicts["ort"].unjudged


# ---- real runtimes ---------------------------------------------------------------------------------
def _mod_model() -> onnx.ModelProto:
    node = helper.make_node("Mod", ["x", "y"], ["z"], fmod=1)
    g = helper.make_graph(
        [node],
        "mod",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [6]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [6])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _run(model: onnx.ModelProto, names: list[str], inputs, tmp: Path, stages: int | None = None):
    from anpred.instrument import instrument_model
    from anpred.run import run_model

    m, man = instrument_model(model, stages=stages)
    man.to_model(m)
    path = tmp / "model.onnx"
    onnx.save(m, str(path))
    if isinstance(inputs, dict):
        np.savez(tmp / "inputs.npz", **inputs)
        inputs = str(tmp / "inputs.npz")
    store = run_model(path, names, inputs, tmp / "run", progress=False, timeout_s=300)
    return store.root, man


def _without(run: Path, backend: str, tmp: Path) -> Path:
    """A copy of the run folder without ``backend`` (its record and tensors)."""
    import json

    out = tmp / f"run-without-{backend}"
    shutil.copytree(run, out)
    meta = json.loads((out / "run.json").read_text())
    meta["backends"].pop(backend)
    (out / "run.json").write_text(json.dumps(meta))
    shutil.rmtree(out / "tensors" / backend)
    return out


def _judged(run: Path) -> tuple[list[str], object]:
    rep = check_run(run)
    return sorted(b for b in rep.flagged_backends), rep


def test_mod_on_real_runtimes_with_and_without_float64(tmp_path):
    """The Mod node case on ONNX Runtime, OpenVINO, onnx2torch, MNN and the reference evaluator (+ the
    float64 execution): MNN returns the floor-mod and is the one flagged, with and without the float64
    execution; the others are consistent at nRMSE 0 (the expected output, bit-identical)."""
    names = ["ort", "openvino", "torch", "mnn", "onnx-reference", "onnx-reference-fp64"]
    run, _ = _run(_mod_model(), names, {"x": MOD_X, "y": MOD_Y}, tmp_path)
    for r in (run, _without(run, "onnx-reference-fp64", tmp_path)):
        flagged, rep = _judged(r)
        assert flagged == ["mnn"], format_text(rep)
        for b in ("ort", "openvino", "torch", "onnx-reference"):
            assert rep.verdicts[b].status == "consistent" and rep.verdicts[b].worst_primary == 0.0, b
        assert rep.splits and rep.splits[0]["decided_for"] == ["onnx-reference", "onnxruntime", "openvino", "torch"]


@pytest.mark.slow
def test_mod_observed_case_on_every_fp32_backend(tmp_path):
    """The observed case (issue 33, 1): ort, openvino, torch, tf, tvm, mnn, ncnn, litert, onnx-reference
    and the float64 execution. tf, litert (one onnx2tf conversion) and mnn return the floor-mod: those
    three flagged, the six correct families consistent, with and without the float64 execution."""
    names = ["ort", "openvino", "torch", "tf", "tvm", "mnn", "ncnn", "litert", "onnx-reference", "onnx-reference-fp64"]
    run, _ = _run(_mod_model(), names, {"x": MOD_X, "y": MOD_Y}, tmp_path)
    for r in (run, _without(run, "onnx-reference-fp64", tmp_path)):
        flagged, rep = _judged(r)
        assert flagged == ["litert", "mnn", "tf"], format_text(rep)
        for b in CORRECT:
            assert rep.verdicts[b].status == "consistent", (b, format_text(rep))


def _resize_cnn() -> onnx.ModelProto:
    """Conv -> Relu -> Resize(x2, nearest, round_prefer_ceil, asymmetric) -> Conv on a 1x1x8x8 input.
    The source coordinate of output pixel i is i/2: a tie at every odd i, which the spec rounds up."""
    rng = np.random.default_rng(0)
    w1 = (0.5 * rng.standard_normal((4, 1, 3, 3))).astype(np.float32)
    w2 = (0.3 * rng.standard_normal((2, 4, 3, 3))).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node(
            "Resize",
            ["r1", "", "scales"],
            ["up"],
            mode="nearest",
            nearest_mode="round_prefer_ceil",
            coordinate_transformation_mode="asymmetric",
        ),
        helper.make_node("Conv", ["up", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    g = helper.make_graph(
        nodes,
        "resize_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 16, 16])],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.kernels  # which Resize rounding each runtime's kernel takes decides the camps
def test_resize_rounding_camps_on_real_runtimes(tmp_path):
    """A Resize whose ties onnx2torch and MNN round down (nearest = floor) while ONNX Runtime, OpenVINO
    and the reference evaluator round them up as the spec says: five families, a split of 3 against 2
    at the Resize anchor and the output. torch and mnn are flagged (origin: the Resize's anchor), the
    rest consistent, with and without the float64 execution (which decides the split where it ran)."""
    names = ["ort", "ort-noopt", "openvino", "onnx-reference", "torch", "mnn", "onnx-reference-fp64"]
    run, man = _run(_resize_cnn(), names, "random:normal:seed=0:n=2", tmp_path, stages=2)
    up = next(a.name for a in man.anchors if a.value == "up")
    for r, basis in ((run, "float64"), (_without(run, "onnx-reference-fp64", tmp_path), "count")):
        flagged, rep = _judged(r)
        assert flagged == ["mnn", "torch"], format_text(rep)
        assert rep.verdicts["torch"].origin_anchor == up
        for b in ("ort", "ort-noopt", "openvino", "onnx-reference"):
            assert rep.verdicts[b].status == "consistent", (b, format_text(rep))
        split = next(s for s in rep.splits if s["anchor"] == up)
        assert split["basis"] == basis and split["decided_for"] == ["onnx-reference", "onnxruntime", "openvino"]
        assert rep.cell(up, "torch").primary > 0.1 > 1e-6 > rep.cell(up, "openvino").primary
