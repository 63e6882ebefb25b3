"""The repro grown from the culprit (issue 34, item 8): a small CNN with a lossy Cast pair (float32 ->
float16 -> float32) that OpenVINO 2026.4's graph transformations fold away (its output keeps the float32
values), so OpenVINO departs from its peers at the second Cast; the second Cast alone (fed the float16
values it received) computes alike everywhere. The drill-down grows the repro to the smallest connected
subgraph that still reproduces, the pair, says which operators it kept, and the repro folder re-run
flags OpenVINO alone. Real runtimes: ort, openvino, torch (onnx2torch), onnx-reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from anpred.drill import drill_run
from anpred.instrument import instrument_model
from anpred.judge import check_run
from check_runs import cnn_model as _model, conv_layer as _conv, make_run, random_inputs as _inputs

BACKENDS = ["ort", "openvino", "torch", "onnx-reference"]


def cast_pair_cnn():
    """conv -> relu -> conv (bias 3000: values where float16's step is 2) -> Cast(float16) ``mid.cast16``
    -> Cast(float32) ``mid.cast32`` -> conv -> relu -> conv; 2 stages, the first ending at the pair."""
    rng = np.random.default_rng(5)
    chain = [
        _conv("c0", "x", "t0", 3, 8, rng),
        (h.make_node("Relu", ["t0"], ["r0"], name="relu0"), []),
        _conv("c1", "r0", "t1", 8, 8, rng, bias=3000.0, scale=0.3),
        (h.make_node("Cast", ["t1"], ["h16"], name="mid.cast16", to=T.FLOAT16), []),
        (h.make_node("Cast", ["h16"], ["h32"], name="mid.cast32", to=T.FLOAT), []),
        _conv("c2", "h32", "t2", 8, 8, rng),
        (h.make_node("Relu", ["t2"], ["r2"], name="relu2"), []),
        _conv("c3", "r2", "y", 8, 4, rng),
    ]
    am, _ = _model("cast_pair_cnn", chain, [1, 3, 16, 16], [1, 4, 16, 16], 7)
    return instrument_model(am, stages=2)


@pytest.mark.kernels  # OpenVINO's handling of a float16 Cast pair may depend on the CPU's fp16 support
def test_cast_pair_repro_grows_to_the_two_operators(tmp_path):
    from anpred.run import run_model

    am, man = cast_pair_cnn()
    run = make_run(tmp_path, am, man, _inputs([1, 3, 16, 16], 3, 0), backends=BACKENDS)
    rep = check_run(run)
    assert rep.flagged_backends == ["openvino"]
    res = drill_run(run, rep)
    c = rep.verdicts["openvino"].culprit
    assert c["node"] == "mid.cast32" and c["op_type"] == "Cast" and c["stage"] == 0
    # the operator alone computes alike everywhere; the pair reproduces; nothing smaller does
    assert c["repro_search"][0] == {"nodes": 1, "kept": ["mid.cast32"], "reproduced": False}
    assert c["reproduced"] and c["scope"] == "subgraph" and c["repro_nodes"] == ["mid.cast16", "mid.cast32"]
    assert c["flagged_in_repro"]
    assert res["culprits"]["openvino"] is c
    repro = Path(c["repro"])
    m = onnx.load(repro / "model.onnx")
    assert [n.op_type for n in m.graph.node] == ["Cast", "Cast"]
    assert [i.name for i in m.graph.input] == ["t1"] and [o.name for o in m.graph.output] == ["h32"]
    x = np.load(repro / "inputs.npz")["t1"]
    assert x.dtype == np.float32 and x.shape == (1, 8, 16, 16) and np.abs(x).min() > 2048  # float16 step 2
    expected = np.load(repro / "expected.npz")["h32"]
    ov = np.load(repro / "outputs" / "openvino.npz")["h32"]
    np.testing.assert_array_equal(expected, x.astype(np.float16).astype(np.float32))  # the peers round
    np.testing.assert_array_equal(ov, x)  # OpenVINO keeps the float32 values: the pair folded
    readme = (repro / "README.md").read_text()
    assert "Scope: subgraph (2 operator(s): mid.cast16, mid.cast32; grown from the culprit" in readme
    # re-run: the repro folder's model on its inputs flags OpenVINO alone, through the API and its script
    store = run_model(repro / "model.onnx", BACKENDS, repro / "inputs.npz", tmp_path / "again", progress=False)
    assert check_run(store.root).flagged_backends == ["openvino"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    p = subprocess.run(["sh", str(repro / "reproduce.sh")], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 1 and "FLAGGED" in p.stdout, (p.stdout[-1000:], p.stderr[-1000:])


def _chain_model(ops):
    """x -> ops[0] -> ops[1] ... (unary float ops named n0, n1, ...) plus a side branch off n1."""
    nodes = []
    prev = "x"
    for i, op in enumerate(ops):
        nodes.append(h.make_node(op, [prev], [f"v{i}"], name=f"n{i}"))
        prev = f"v{i}"
    nodes.append(h.make_node("Neg", ["v1"], ["side"], name="side"))
    g = h.make_graph(
        nodes,
        "chain",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [h.make_tensor_value_info(prev, T.FLOAT, [2, 3]), h.make_tensor_value_info("side", T.FLOAT, [2, 3])],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "needed,kept,runs",
    [
        ({"n2", "n3"}, {"n2", "n3"}, 2),  # ring 1 reproduces; without n1 too; without n3 is the culprit alone
        ({"n1", "n2"}, {"n1", "n2"}, 3),
        ({"n1", "n3"}, {"n1", "n2", "n3"}, 3),  # the culprit stays, with both neighbours
        ({"n0", "n1", "n2"}, {"n0", "n1", "n2"}, 6),  # ring 2, then its far operators dropped one by one
    ],
)
def test_growth_rings_and_minimising(needed, kept, runs):
    """The growth and minimising steps on a chain n0..n4 with a side branch off n1, the culprit n2: a
    subgraph 'reproduces' when it holds the operators ``needed`` (the rule a runtime would apply is
    replaced by a set test: what is checked here is the search). The result is the smallest connected
    set holding them, the culprit included; the culprit alone, known to fail, is never run again; a
    set that would disconnect the culprit (n0 without n1) is never tried."""
    from anpred.drill.grow import Growth

    m = _chain_model(["Relu", "Neg", "Exp", "Abs", "Sigmoid"])
    g = Growth(m, m.graph.node[2], "v2", max_nodes=64)
    assert g.dist == {"n2": 0, "n1": 1, "n3": 1, "n0": 2, "side": 2, "n4": 2}
    assert g.rings() == [["n2"], ["n1", "n2", "n3"], ["n0", "n1", "n2", "n3", "n4", "side"]]
    assert g.cut(["n1", "n2", "n3"]) == (["v0"], ["v2", "v3"])
    assert g.cut(["n0", "n1", "n2"]) == (["x"], ["v2"])
    assert g.connected(["n1", "n2", "n3"]) and not g.connected(["n0", "n2"])
    seen = []

    def attempt(keys):
        seen.append(keys)
        return needed <= set(keys)

    got, n, log = g.search(attempt, budget=10, known_bad=[["n2"]])
    assert set(got) == kept and n == runs == len(seen) == len(log)
    assert ["n2"] not in seen and all(g.connected(k) for k in seen)
    assert log[-1]["reproduced"] or set(got) != set(log[-1]["kept"])
    # a budget of one run: ring 1 only
    got, n, _ = g.search(lambda k: needed <= set(k), budget=1, known_bad=[["n2"]])
    assert n == 1 and (got is None) == (not needed <= {"n1", "n2", "n3"})
