"""A departure that equals a neighbouring node's value (issue 34, item 5): MNN 3.6.1's converter fuses a
Relu/Tanh into the Gemm before it and returns, for the Gemm's output declared as an anchor, the value
after the activation. The oracle flags MNN there; the drill-down must say what happened: "mnn returns
Relu(x) for anchor x". Real runtimes: ort, mnn, onnx-reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from anpred.instrument import instrument_model
from anpred.judge import check_run
from check_runs import make_run
from isa_reasons import DEFECT_BOUND

BACKENDS = ["ort", "mnn", "onnx-reference"]


def gemm_mlp():
    """x[1, 16] -> Gemm fc0 (h0) -> Relu act0 -> Gemm fc1 (h1) -> Tanh act1 -> Gemm fc2 (y); h0 and h1
    are anchors (the intermediate outputs a user declares)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for name, x, y, i, o in [("fc0", "x", "h0", 16, 32), ("fc1", "a0", "h1", 32, 32), ("fc2", "a1", "y", 32, 8)]:
        inits += [
            nh.from_array((rng.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32), name + ".w"),
            nh.from_array((0.1 * rng.standard_normal(o)).astype(np.float32), name + ".b"),
        ]
        nodes.append(h.make_node("Gemm", [x, name + ".w", name + ".b"], [y], name=name))
        if name == "fc0":
            nodes.append(h.make_node("Relu", ["h0"], ["a0"], name="act0"))
        if name == "fc1":
            nodes.append(h.make_node("Tanh", ["h1"], ["a1"], name="act1"))
    g = h.make_graph(
        nodes,
        "gemm_mlp",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 16])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 8])],
        inits,
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return instrument_model(m, anchors=["h0", "h1"], stages=3), rng


@pytest.mark.isa_independent(DEFECT_BOUND)
def test_mnn_returns_the_activation_for_the_gemm_anchor(tmp_path):
    from anpred.drill import drill_run
    from anpred.report.text import drill_lines

    (am, man), rng = gemm_mlp()
    run = make_run(
        tmp_path, am, man, [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(3)], backends=BACKENDS
    )
    rep = check_run(run)
    assert rep.flagged_backends == ["mnn"] and rep.verdicts["mnn"].origin_anchor == "anchor/00/h0"
    # MNN returns the Gemm anchors as [1, 32, 1, 1] (its 1x1 convolution) for [1, 32]: unit axes at an inner
    # anchor are aligned by a reshape, not called a wrong shape (that is kept for the model's outputs)
    assert rep.cell("anchor/01/h1", "mnn").deviation != "shape"
    assert np.isfinite(rep.cell("anchor/01/h1", "mnn").primary)
    res = drill_run(run, rep)
    m = res["neighbours"]["mnn"]
    assert set(res["neighbours"]) == {"mnn"}  # ort and the reference return their own anchors
    assert (m["anchor"], m["node"], m["op_type"], m["value"], m["side"], m["distance"]) == (
        "anchor/00/h0",
        "act0",
        "Relu",
        "a0",
        "downstream",
        1,
    )
    assert (m["producer"], m["producer_op"]) == ("fc0", "Gemm")
    cell = rep.cell("anchor/00/h0", "mnn")
    # as close to Relu(x) as a consistent backend is to the consensus, far from x itself
    assert m["to_neighbour"] <= m["threshold"] == cell.threshold and m["to_consensus"] == cell.primary > 0.1
    text = "\n".join(drill_lines(rep))
    assert "mnn returns Relu(x) for anchor x = anchor/00/h0: its tensor there equals the output of Relu 'act0'" in text


def test_neighbour_nodes_distance_and_side():
    from anpred.drill.neighbours import neighbour_nodes

    (am, _), _ = gemm_mlp()
    got = [(n.name, d, s) for n, d, s in neighbour_nodes(am, "h1", 2)]
    assert got == [("fc0", 2, "upstream"), ("act0", 1, "upstream"), ("act1", 1, "downstream"), ("fc2", 2, "downstream")]
    assert [(n.name, d, s) for n, d, s in neighbour_nodes(am, "h1", 1)] == [
        ("act0", 1, "upstream"),
        ("act1", 1, "downstream"),
    ]
    assert neighbour_nodes(am, "no-such-value", 2) == []
