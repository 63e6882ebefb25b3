"""anpred check on real runtimes: small CNNs holding real OpenVINO 2026.4.1 defects (Softplus below -10,
AveragePool ceil_mode/count_include_pad), ONNX Runtime's sigmoid flushing tiny probabilities, an injected
bf16-rounding fault, a clean run, and a fault in one branch propagated along that branch only.

Runs are written with the real backends (ort, ort-noopt, openvino, onnx-reference, torch via
onnx2torch, tf via onnx2tf) into a RunStore, one backend at a time, as the run driver does
(tests/check_runs.py).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from anpred.judge import CheckReport, check_run
from anpred.onnx_io import save_model
from anpred.run import RunStore

from isa_reasons import DEFECT_BOUND, FP32_BOUND
from check_runs import branch_cnn, make_run, plain_cnn, random_inputs, sigmoid_cnn


# ---- acceptance ------------------------------------------------------------------------------------
@pytest.mark.isa_independent(FP32_BOUND)
def test_clean_fp32_flags_nothing(clean_run):
    run, man = clean_run
    rep = check_run(run, oracle="both")
    assert rep.samples == 12 and rep.status == "consistent" and bool(rep)
    assert rep.flagged_backends == []
    worst = max(c.primary for c in rep.cells)
    assert 0 < worst < 1e-5  # fp32 noise, measured, well under the floor
    assert all(t.passed for t in rep.threshold.values())


@pytest.mark.isa_independent(DEFECT_BOUND)
def test_openvino_softplus_defect_flagged_at_its_stage(softplus_run):
    run, man = softplus_run
    rep = check_run(run, oracle="both")
    assert rep.status == "flagged" and rep.exit_code == 1
    flagged = [b for b, v in rep.verdicts.items() if v.flagged]
    assert flagged == ["openvino"]  # tf (onnx2tf, oneDNN kernels like OpenVINO's) computes Softplus right
    assert rep.verdicts["tf"].status == "consistent" and rep.verdicts["tf"].judged_anchors == len(man.anchors)
    v = rep.verdicts["openvino"]
    sp = next(a for a in man.anchors if a.op_type == "Softplus")
    assert v.origin_anchor == sp.name and v.origin_stage == sp.stage
    cell = rep.cell(sp.name, "openvino")
    assert cell.primary > 0.05 and cell.stats.mean_signed < 0  # OpenVINO returns values too low
    peer = rep.cell(sp.name, "torch").primary
    assert peer < 1e-5


@pytest.mark.kernels
def test_ort_sigmoid_flushes_tiny_probabilities_and_is_flagged(tmp_path):
    """A real ONNX Runtime 1.32 CPU behaviour found by judging a detector's class scores part by part:
    its Sigmoid loses relative accuracy below x = -10 (2e-4 there, 17 % at -15, 116 % at -17) and
    returns exactly 0 for x <= -18 (true 1.5e-8). OpenVINO, torch (onnx2torch) and the reference
    evaluator are right. The oracle flags ort only, origin at the Sigmoid's anchor, ort-noopt too (the
    same kernel), and the next conv hides it (masked: 9.3e-2 there, 5.9e-7 after it)."""
    import onnxruntime as ort

    x = np.array([-10, -15, -17, -18, -20], np.float32)
    g = h.make_graph(
        [h.make_node("Sigmoid", ["x"], ["y"])],
        "s",
        [h.make_tensor_value_info("x", T.FLOAT, [5])],
        [h.make_tensor_value_info("y", T.FLOAT, [5])],
    )
    y = ort.InferenceSession(
        h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, {"x": x})[0]
    true = 1 / (1 + np.exp(-x.astype(np.float64)))
    rel = (y - true) / true
    assert abs(rel[0]) > 1e-4 and rel[2] > 0.5 and y[3] == 0 and y[4] == 0
    am, man = sigmoid_cnn()
    run = make_run(
        tmp_path,
        am,
        man,
        random_inputs([1, 3, 16, 16], 4, 3),
        backends=["ort", "ort-noopt", "openvino", "onnx-reference", "torch"],
    )
    rep = check_run(run)
    assert sorted(b for b, v in rep.verdicts.items() if v.flagged) == ["ort", "ort-noopt"]
    sg = next(a for a in man.anchors if a.op_type == "Sigmoid")
    v = rep.verdicts["ort"]
    assert v.origin_anchor == sg.name and v.origin_stage == sg.stage
    c = rep.cell(sg.name, "ort")
    assert c.primary > 1e-3 and c.primary > 100 * c.peer_level


@pytest.mark.isa_independent(DEFECT_BOUND)
def test_openvino_avgpool_defect_flagged_at_its_stage(avgpool_run):
    run, man = avgpool_run
    rep = check_run(run)
    assert [b for b, v in rep.verdicts.items() if v.flagged] == ["openvino"]
    assert rep.verdicts["tf"].status == "consistent" and rep.verdicts["tf"].judged_anchors == len(man.anchors)
    pool = next(a for a in man.anchors if a.op_type == "AveragePool")
    v = rep.verdicts["openvino"]
    assert v.origin_anchor == pool.name and v.origin_stage == pool.stage
    c = rep.cell(pool.name, "openvino")
    assert c.stats.mean_signed < 0 and c.primary > 0.1  # border windows divided by 9, not by the real count
    assert v.output_flagged and v.propagation in ("stable", "attenuated", "amplified")


def test_injected_bf16_rounding_flagged_at_injection_stage(tmp_path):
    am, man = plain_cnn()
    target = "c2"  # the conv feeding anchor t2
    faulty = onnx.ModelProto()
    faulty.CopyFrom(am)
    for init in faulty.graph.initializer:
        if init.name == f"{target}.w":
            w = nh.to_array(init).copy()
            bits = w.view(np.uint32)
            bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even at bfloat16 precision
            bits &= 0xFFFF0000
            init.CopyFrom(nh.from_array(bits.view(np.float32), init.name))
    fpath = tmp_path / "faulty.onnx"
    save_model(faulty, fpath)
    run = make_run(
        tmp_path,
        am,
        man,
        random_inputs([1, 3, 32, 32], 4, 5),
        backends=["ort", "ort-noopt", "openvino", "onnx-reference"],
        models={"ort": fpath},
    )
    rep = check_run(run)
    stage = next(a.stage for a in man.anchors if a.producer == target)
    assert [b for b, v in rep.verdicts.items() if v.flagged] == ["ort"]
    assert rep.verdicts["ort"].origin_stage == stage


@pytest.mark.isa_independent(DEFECT_BOUND)
def test_propagation_follows_the_faulty_branch_only(tmp_path):
    am, man = branch_cnn()
    names = [a.name for a in man.anchors]
    assert names.index("anchor/03/tb1") < names.index("anchor/03/ra1")  # the manifest interleaves the branches
    faulty = onnx.ModelProto()
    faulty.CopyFrom(am)
    for init in faulty.graph.initializer:
        if init.name == "a1.w":  # branch A's first conv: weights rounded to bfloat16 (nearest even)
            bits = nh.to_array(init).copy().view(np.uint32)
            bits += 0x7FFF + ((bits >> 16) & 1)
            bits &= 0xFFFF0000
            init.CopyFrom(nh.from_array(bits.view(np.float32), init.name))
    fpath = tmp_path / "faulty.onnx"
    save_model(faulty, fpath)
    run = make_run(
        tmp_path,
        am,
        man,
        random_inputs([1, 3, 16, 16], 4, 7),
        backends=["ort", "ort-noopt", "openvino", "onnx-reference"],
        models={"ort": fpath},
    )
    shutil.copyfile(tmp_path / "model.onnx", run / "model.onnx")  # as the run driver stores it
    rep = check_run(run)
    v = rep.verdicts["ort"]
    assert [b for b, x in rep.verdicts.items() if x.flagged] == ["ort"]
    assert v.origin_anchor == "anchor/02/ta1"
    assert v.profile_basis == "dataflow"
    assert v.profile_anchors == ["anchor/02/ta1", "anchor/03/ra1", "anchor/04/ta2", "anchor/04/cat", "output/y"]
    assert [(s.src, s.dst) for s in v.steps] == list(zip(v.profile_anchors, v.profile_anchors[1:]))
    prim = {c.anchor: c.primary for c in rep.cells if c.backend == "ort"}
    assert prim["anchor/03/tb1"] < 1e-3 * prim["anchor/02/ta1"]  # branch B is clean
    # measured: nRMSE 1.45e-3 at ta1, then x0.88 x0.90 x0.73 x0.85 (all "stable"), tb1 ~1e-7
    assert [s.kind for s in v.steps] == ["stable"] * 4 and not v.non_monotonic
    assert prim["output/y"] == pytest.approx(prim["anchor/02/ta1"] * np.prod([s.ratio for s in v.steps]))
    assert v.output_flagged and v.propagation != "masked"
    back = CheckReport.from_dict(json.loads(json.dumps(rep.to_dict()))).verdicts["ort"]
    assert back.profile_anchors == v.profile_anchors and back.profile_basis == "dataflow"

    # without the model the profile follows the manifest order, dips at tb1, and says so
    store = RunStore.open(run)
    (run / "model.onnx").unlink()
    store.meta["model"]["path"] = str(tmp_path / "gone.onnx")
    store.save_meta()
    rep2 = check_run(run)
    v2 = rep2.verdicts["ort"]
    assert v2.profile_basis == "manifest" and "anchor/03/tb1" in v2.profile_anchors
    kinds = {s.dst: s.kind for s in v2.steps}
    assert kinds["anchor/03/tb1"] == "vanished" and kinds["anchor/03/ra1"] == "amplified"  # a dip and a rise
    assert any("no model.onnx" in n for n in rep2.notes)
    assert any("manifest order" in n for n in rep2.notes)
