"""Issue 33, classes 2-5: ONNX-layout backends aligned by identity and first, a wrong shape or a missing
output flagged as a deviation, torch captures mapped by structure.

Cases built here from the inputs of ONNX 1.22's node tests ``lstm_defaults`` (weights as graph inputs,
which the converters cannot take), ``roialign_aligned_true`` and
``layer_normalization_3d_axis_negative_1_epsilon``, run on real runtimes; the aligner and the oracle's
deviation rule also on arrays.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from anpred.align import Aligner
from anpred.backends.base import AnchorCapture, BackendStatus
from anpred.backends.torch_onnx import map_outputs
from anpred.judge import AnchorInfo, BackendInfo, Oracle, check_run
from anpred.manifest import Anchor, AnchorManifest
from anpred.report.text import format_text
from tests.test_camps import _run
from isa_reasons import EXACT_OPS, FP32_BOUND, NOT_A_KERNEL_VALUE


def _status(name: str, family: str, **cap) -> BackendStatus:
    return BackendStatus(name=name, family=family, status="ok", captures={"output/Y_h": AnchorCapture(**cap).__dict__})


def _one_anchor(name: str, value: str, shape: list[int], layout: str) -> AnchorManifest:
    a = Anchor(
        name=name,
        value=value,
        stage=0,
        order=0,
        producer="n0",
        op_type="Op",
        kind="output",
        shape=shape,
        dtype="float32",
        layout=layout,
    )
    return AnchorManifest(anchors=[a])


def _manifest(shape=(1, 3, 3)) -> AnchorManifest:
    return _one_anchor("output/Y_h", "Y_h", list(shape), "unknown")


def test_onnx_layout_backends_are_aligned_by_identity_never_ambiguous():
    """Class 2: a [1, 3, 3] anchor of unknown layout fits two candidates (identity, permute [0, 2, 1]);
    for a backend that executes the ONNX graph that is no question: identity, source ``onnx-graph``,
    even when it is the only backend of the sample. A converter (tf) with no reported rule is decided
    by the data against the ONNX-layout backends; one of them returning another shape is a wrong shape."""
    man = _manifest()
    x = np.arange(9, dtype=np.float32).reshape(1, 3, 3)
    st = {
        b: _status(b, f, status="exact")
        for b, f in (("ort", "onnxruntime"), ("mnn", "mnn"), ("tvm", "tvm"), ("tf", "tensorflow"))
    }
    al = Aligner(man, {"ort": st["ort"]})
    res = al.align("s0", {"ort": {"output/Y_h": x}})
    assert res.unaligned == {} and res.decisions[("output/Y_h", "ort")].source == "onnx-graph"
    al = Aligner(man, st)
    res = al.align(
        "s0",
        {
            "ort": {"output/Y_h": x},
            "mnn": {"output/Y_h": x},
            "tvm": {"output/Y_h": x},
            "tf": {"output/Y_h": np.swapaxes(x, 1, 2).copy()},
        },
    )
    assert {b: d.source for (_, b), d in res.decisions.items()} == {
        "ort": "onnx-graph",
        "mnn": "onnx-graph",
        "tvm": "onnx-graph",
        "tf": "data",
    }
    assert res.decisions[("output/Y_h", "tf")].rule == {"permute": [0, 2, 1]}
    # another shape, an extra batch of 1 included (MNN returned [1, 1, 3, 3] on lstm_defaults), is a wrong shape
    res = Aligner(man, st).align(
        "s0", {"ort": {"output/Y_h": x}, "mnn": {"output/Y_h": x[:, :2]}, "tvm": {"output/Y_h": x[None]}}
    )
    assert res.unaligned["output/Y_h"]["mnn"].startswith("wrong shape: mnn executes the ONNX graph")
    assert res.unaligned["output/Y_h"]["tvm"].startswith(
        "wrong shape: tvm executes the ONNX graph in its layout "
        "and returned shape [1, 1, 3, 3] (9 elements) "
        "for the ONNX shape [1, 3, 3]"
    )


def test_a_scalar_output_is_aligned():
    """Regression (ONNX's softmax-cross-entropy node cases, a scalar loss): the identity rule turned a
    0-d tensor into shape [1] and nothing was judged (exit 2)."""
    man = _one_anchor("output/z", "z", [], "unknown")
    st = {
        b: BackendStatus(b, f, captures={"output/z": AnchorCapture("exact").__dict__})
        for b, f in (("ort", "onnxruntime"), ("openvino", "openvino"))
    }
    res = Aligner(man, st).align("s0", {"ort": {"output/z": np.float32(1.5)}, "openvino": {"output/z": np.array(1.5)}})
    z = res.tensors["output/z"]
    assert res.unaligned == {} and z["ort"].shape == () and z["openvino"] == 1.5


@pytest.mark.isa_independent(EXACT_OPS)
def test_a_converters_reported_layout_is_checked_against_the_onnx_layout_backends():
    """Class 3: tf reports NHWC (permute [0, 3, 1, 2]) but returns the tensor with H and W swapped on a
    square map. The ONNX-layout backends are aligned first and never against tf; tf's reported rule
    stands (its values deviate and are judged) and the check names the candidate that matches."""
    man = _one_anchor("output/Y", "Y", [1, 2, 4, 4], "NCHW")
    y = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)
    caps = {"output/Y": AnchorCapture("exact", "NHWC", {"permute": [0, 3, 1, 2]}).__dict__}
    st = {
        "ort": BackendStatus("ort", "onnxruntime", captures={"output/Y": AnchorCapture("exact", "NCHW").__dict__}),
        "openvino": BackendStatus(
            "openvino", "openvino", captures={"output/Y": AnchorCapture("exact", "NCHW").__dict__}
        ),
        "tf": BackendStatus("tf", "tensorflow", captures=caps),
    }
    swapped = np.transpose(y, (0, 3, 2, 1)).copy()  # NHWC of y with H and W swapped
    res = Aligner(man, st).align(
        "s0", {"ort": {"output/Y": y}, "openvino": {"output/Y": y}, "tf": {"output/Y": swapped}}
    )
    d = res.decisions[("output/Y", "tf")]
    assert d.rule == {"permute": [0, 3, 1, 2]} and d.source == "capture"
    assert "does not match the ONNX-layout backends" in d.layout_check and "permute [0, 3, 2, 1]" in d.layout_check
    assert not np.array_equal(res.tensors["output/Y"]["tf"], y)  # judged as it claims to be: it deviates
    assert res.decisions[("output/Y", "ort")].source == "onnx-graph"


def test_wrong_shape_and_missing_output_where_peers_agree_are_flagged_deviations():
    """Class 4: at an output where three voting families agree, a backend with another shape and one
    with no value are flagged at that anchor with their own wording (``deviation`` shape / missing);
    a backend that did not run for the sample stays a gap; with only one family agreeing nothing is
    decided (a gap)."""
    a = AnchorInfo("output/y", 0, kind="output")
    names = ["ort", "openvino", "onnx-reference", "torch", "tvm", "mnn"]
    o = Oracle([a], [BackendInfo.make(b) for b in names])
    y = np.linspace(-1, 1, 30)
    o.add(
        {"output/y": {"ort": y, "openvino": y, "onnx-reference": y, "torch": y[:15]}},
        unaligned={("output/y", "mnn"): "not captured: onnx2torch's X returns one tensor"},
        absent={"tvm": "backend failed"},
    )
    res = o.finish()
    assert sorted(b for b, v in res.verdicts.items() if v.flagged) == ["mnn", "torch"]
    t = next(c for c in res.cells if c.backend == "torch")
    assert t.deviation == "shape"
    assert t.reason.startswith("wrong shape: shape [15] differs from the other backends' shape [30]")
    m = next(c for c in res.cells if c.backend == "mnn")
    assert m.deviation == "missing" and m.reason.startswith("missing output: not captured: onnx2torch's X")
    assert res.verdicts["tvm"].status == "unjudged" and "backend failed" in res.verdicts["tvm"].unjudged["output/y"]
    o2 = Oracle([a], [BackendInfo.make(b) for b in ("ort", "ort-noopt", "torch")])
    o2.add({"output/y": {"ort": y, "ort-noopt": y}}, unaligned={("output/y", "torch"): "no alignment fits: x"})
    assert not o2.finish().verdicts["torch"].flagged


def test_torch_outputs_are_mapped_by_structure():
    """Class 5: a tuple of as many values as the node has outputs maps one per output; a lone tensor is
    the first output only (never split along its first axis); another structure maps nothing."""
    import torch

    y = torch.arange(6.0).reshape(2, 3)
    assert list(map_outputs(("Y", "Mean", "InvStdDev"), y)) == ["Y"] and map_outputs(("Y", "Mean"), y)["Y"] is y
    a, b = torch.zeros(1), torch.ones(1)
    assert map_outputs(("p", "q"), (a, b)) == {"p": a, "q": b}
    assert map_outputs(("p", "q", "r"), (a, b)) == {}


def _layer_norm() -> onnx.ModelProto:
    node = helper.make_node("LayerNormalization", ["X", "W", "B"], ["Y", "Mean", "InvStdDev"], axis=-1, epsilon=0.1)
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), n) for n in ("W", "B")]
    g = helper.make_graph(
        [node],
        "ln",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 5])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3, 5]),
            helper.make_tensor_value_info("Mean", TensorProto.FLOAT, [2, 3, 1]),
            helper.make_tensor_value_info("InvStdDev", TensorProto.FLOAT, [2, 3, 1]),
        ],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.isa_independent(FP32_BOUND)
def test_layer_normalization_torch_capture_and_missing_outputs(tmp_path):
    """Classes 4 and 5 on the observed case (layer_normalization_3d_axis_negative_1_epsilon, weights as
    initializers): onnx2torch's LayerNormalization returns Y alone. Before, Y's capture was ``Y[0]`` and
    Mean's ``Y[1]``, both "exact". Now Y is Y (consistent with ONNX Runtime, OpenVINO and the reference
    evaluator), Mean and InvStdDev are captured as missing with the reason, and torch is flagged there
    as a missing output."""
    names = ["ort", "openvino", "onnx-reference", "torch"]
    run, man = _run(_layer_norm(), names, "random:normal:seed=0:n=2", tmp_path)
    rep = check_run(run)
    assert rep.flagged_backends == ["torch"], format_text(rep)
    import json

    caps = json.loads((run / "run.json").read_text())["backends"]["torch"]["captures"]
    assert caps["output/Y"]["status"] == "exact" and caps["output/Mean"]["status"] == "missing"
    y = rep.cell("output/Y", "torch")
    assert y is not None and not y.flagged and y.primary < 1e-6
    for out in ("output/Mean", "output/InvStdDev"):
        c = rep.cell(out, "torch")
        assert c.flagged and c.deviation == "missing" and "returns one tensor for the 3 outputs" in c.reason, c.reason


def _pool_same_upper(op: str) -> onnx.ModelProto:
    """ONNX's averagepool_2d_same_upper / maxpool_2d_same_upper: x [1, 3, 32, 32], kernel 2x2, SAME_UPPER."""
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[2, 2], auto_pad="SAME_UPPER")
    g = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 32, 32])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    m.ir_version = 8
    return m


@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_a_backend_that_returns_no_value_is_a_missing_output(op, tmp_path):
    """The observed node cases (review of issue 33): MNN runs the SAME_UPPER pools with status ok and
    returns no value at all. Before, it was "not judged: no tensors stored for any sample"; now it is
    flagged at the output as a missing output, and the others are consistent."""
    names = ["ort", "openvino", "onnx-reference", "mnn"]
    run, man = _run(_pool_same_upper(op), names, "random:normal:seed=0:n=2", tmp_path)
    rep = check_run(run)
    assert rep.flagged_backends == ["mnn"], format_text(rep)
    c = rep.cell("output/y", "mnn")
    assert c.flagged and c.deviation == "missing" and c.reason.startswith("missing output: "), c.reason
    assert "mnn" not in rep.unjudged_backends
    for b in ("ort", "openvino", "onnx-reference"):
        assert rep.verdicts[b].status == "consistent", (b, format_text(rep))


def _lstm_defaults() -> onnx.ModelProto:
    node = helper.make_node("LSTM", ["X", "W", "R"], ["", "Y_h"], hidden_size=3)
    g = helper.make_graph(
        [node],
        "lstm",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 2]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [1, 12, 2]),
            helper.make_tensor_value_info("R", TensorProto.FLOAT, [1, 12, 3]),
        ],
        [helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, 3, 3])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m


@pytest.mark.isa_independent(FP32_BOUND)
def test_lstm_defaults_is_judged_on_the_onnx_layout_backends(tmp_path):
    """Class 2 on the observed case: lstm_defaults with its weights as graph inputs (X = [[1, 2], [3, 4],
    [5, 6]], W and R all 0.1): Y_h [1, 3, 3] fits identity and a transpose. Before, nothing was judged
    (``ort: layout ambiguous ... and no other backend to decide by``, exit 2); now ONNX Runtime, OpenVINO,
    MNN and the reference evaluator are aligned by identity and judged: the three agree, and MNN, which
    returns Y_h as [1, 1, 3, 3] (the Y output's shape, for ONNX's [1, 3, 3]), is flagged as a wrong
    shape (class 4)."""
    inputs = {
        "X": np.arange(1, 7, dtype=np.float32).reshape(1, 3, 2),
        "W": np.full((1, 12, 2), 0.1, np.float32),
        "R": np.full((1, 12, 3), 0.1, np.float32),
    }
    run, man = _run(_lstm_defaults(), ["ort", "openvino", "mnn", "onnx-reference"], inputs, tmp_path)
    rep = check_run(run)
    assert rep.flagged_backends == ["mnn"], format_text(rep)
    assert all(rep.verdicts[b].judged_anchors == len(man.anchors) for b in rep.verdicts)
    for b in ("ort", "openvino", "onnx-reference"):
        assert rep.verdicts[b].status == "consistent" and rep.verdicts[b].worst_primary < 1e-6, format_text(rep)
    c = rep.cell("output/Y_h", "mnn")
    assert c.deviation == "shape"
    assert "returned shape [1, 1, 3, 3] (9 elements) for the ONNX shape [1, 3, 3]" in c.reason
    assert [u["backend"] for u in rep.alignment["unaligned"]] == ["mnn"]


def _roialign(opset: int = 16) -> onnx.ModelProto:
    node = helper.make_node(
        "RoiAlign",
        ["X", "rois", "batch_indices"],
        ["Y"],
        output_height=5,
        output_width=5,
        sampling_ratio=2,
        spatial_scale=1.0,
        coordinate_transformation_mode="half_pixel",
    )
    g = helper.make_graph(
        [node],
        "roialign",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 10, 10]),
            helper.make_tensor_value_info("rois", TensorProto.FLOAT, [3, 4]),
            helper.make_tensor_value_info("batch_indices", TensorProto.INT64, [3]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 1, 5, 5])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.mark.slow
def test_roialign_tf_is_flagged_and_the_onnx_layout_backends_judged(tmp_path):
    """Class 3 on the observed case (roialign_aligned_true: half_pixel, rois [[0, 0, 9, 9], [0, 5, 4, 9],
    [5, 5, 9, 9]]): onnx2tf's tf is wrong (nRMSE ~0.3-0.9 against the expected output). Before, the
    ONNX-graph backends were checked against tf alone, left unaligned, nothing judged (exit 2). Now they
    are judged (consistent) and tf is flagged."""
    inputs = {
        "X": np.random.default_rng(0).random((1, 1, 10, 10), dtype=np.float32),
        "rois": np.array([[0, 0, 9, 9], [0, 5, 4, 9], [5, 5, 9, 9]], np.float32),
        "batch_indices": np.zeros(3, np.int64),
    }
    run, _ = _run(_roialign(), ["ort", "openvino", "onnx-reference", "tf"], inputs, tmp_path)
    rep = check_run(run)
    assert rep.flagged_backends == ["tf"], format_text(rep)
    for b in ("ort", "openvino", "onnx-reference"):
        assert rep.verdicts[b].status == "consistent", format_text(rep)
