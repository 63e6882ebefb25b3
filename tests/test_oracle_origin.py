"""anpred.judge.consensus on synthetic populations: propagation along the data flow (parallel
branches), the origin traced back from the first flagged anchor, the signal-lost rule, the int8
one-step rule and the choice of a reference with a known library defect.
"""

import numpy as np
import pytest

from anpred.defaults import OracleConfig
from anpred.errors import AnpredError
from anpred.judge import AnchorInfo, BackendInfo, Oracle

from oracle_populations import ANCHORS, FP32, backend_infos, population


# ---- propagation along the data flow: parallel branches ---------------------------------------------
# manifest (topological) order interleaves two branches: A1 -> A2 -> O and B -> O
BRANCHES = [
    AnchorInfo("anchor/00/A1", 0),
    AnchorInfo("anchor/01/B", 1),
    AnchorInfo("anchor/01/A2", 1),
    AnchorInfo("output/O", 2, kind="output"),
]
BRANCH_DOWN = {
    "anchor/00/A1": {"anchor/01/A2", "output/O"},
    "anchor/01/B": {"output/O"},
    "anchor/01/A2": {"output/O"},
    "output/O": set(),
}


def _judge_branches(dev, descendants, n=8, config=None, deviant="openvino", seed=4):
    """``dev[anchor]``: deviation of backend ``deviant`` there, added to the fp32-like noise (3e-7)
    every backend has; ``deviant`` may be a reduced-precision variant outside FP32."""
    rng = np.random.default_rng(seed)
    names = FP32 + ([deviant] if deviant not in FP32 else [])
    o = Oracle(BRANCHES, backend_infos(names), config, descendants=descendants)
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

    nodes = [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("Neg", ["r"], ["a"]),
        h.make_node("Exp", ["r"], ["b"]),
        h.make_node("Abs", ["a"], ["a2"]),
        h.make_node("Add", ["a2", "b"], ["y"]),
    ]
    g = h.make_graph(
        nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2])], [h.make_tensor_value_info("y", T.FLOAT, [2])]
    )
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
    assert (
        not _judge_branches({"anchor/00/A1": 1e-5, "anchor/01/B": 1e-5, "output/O": 1e-5}, BRANCH_DOWN)
        .verdicts["openvino"]
        .flagged
    )
    # in manifest order A1, B, A2, O are consecutive: the same deviations make a run of four there
    assert (
        _judge_branches({"anchor/00/A1": 1e-5, "anchor/01/B": 1e-5, "anchor/01/A2": 1e-5, "output/O": 1e-5}, None)
        .verdicts["openvino"]
        .flagged
    )
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


@pytest.mark.parametrize(
    "bad",
    [
        {"origin_k": 0.5},
        {"origin_floor_fraction": 0},
        {"origin_floor_fraction": 2.0},
        {"sustained_anchors": 1},
        {"sustained_anchors": -1},
        {"sustained_anchors": 2.5},
    ],
)
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
        o = Oracle(ANCHORS, backend_infos(names), cfg)
        for i, s in enumerate(population(names, noise=3e-7)):
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
        infos = backend_infos(names) + [BackendInfo.make("ort-int8", "onnxruntime", "int8")]
        o = Oracle(ANCHORS, infos, steps=steps)
        rng = np.random.default_rng(5)
        for s in population(names, n=4):
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
    infos = backend_infos(["ort", "onnx-reference"])
    infos[1].defects = "onnx.reference BatchNormalization with momentum (test)"
    o = Oracle(ANCHORS, infos)
    for s in population(["ort", "onnx-reference"], n=2):
        o.add(s)
    res = o.finish()
    assert res.consensus["anchor/00/a"] == ["reference:ort"]
    o2 = Oracle(ANCHORS, backend_infos(["ort", "onnx-reference"]))
    for s in population(["ort", "onnx-reference"], n=2):
        o2.add(s)
    assert o2.finish().consensus["anchor/00/a"] == ["reference:onnx-reference"]  # the default priority
