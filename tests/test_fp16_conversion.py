"""The fp16 conversion's failure classes (issue 17): networks built here on which onnxconverter-common
1.16's plain float32 -> float16 conversion fails (each an ONNX Runtime ``Type Error``), loaded, run and
matched by the shared float16 model of the fp16 members; when every converter fails both are named; and
torch's fp16 member names the op that has no half kernel. The fp16 and int8 members themselves:
tests/test_populations.py.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.helper as h
import onnx.numpy_helper as nh
import pytest
from onnx import TensorProto as TP

from anpred.errors import BackendError

from float16_ulp import fp16_ulp
from ort_session import ort_outputs

# every test here touches a runtime's kernel arithmetic (tests/test_kernel_markers.py)
pytestmark = pytest.mark.kernels


# ---- fp16 conversion failure classes -------------------------------------------------------------


def _model(nodes, inits, name, value_info=False, opset=17):
    g = h.make_graph(
        nodes,
        name,
        [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 8, 8])],
        [h.make_tensor_value_info("y", TP.FLOAT, None)],
        inits,
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    m = onnx.shape_inference.infer_shapes(m)
    if value_info:  # a shipped file's duplicated value_info (yolov8n-doclaynet has 483 entries, many twice)
        m.graph.value_info.extend([onnx.ValueInfoProto.FromString(v.SerializeToString()) for v in m.graph.value_info])
    else:
        del m.graph.value_info[:]
    return m


def _w(seed=0):
    return nh.from_array((np.random.default_rng(seed).standard_normal((4, 4, 3, 3)) / 6).astype(np.float32), "w")


def _conv():
    return h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv")


FAILURE_CLASSES = {
    # Shape -> Gather -> Cast(to=FLOAT) -> Div: the converter retypes the Cast's output, not its `to`
    "cast-chain": (
        lambda: _model(
            [
                _conv(),
                h.make_node("Shape", ["c"], ["s"], name="shape"),
                h.make_node("Gather", ["s", "i2"], ["hw"], axis=0, name="gather"),
                h.make_node("Cast", ["hw"], ["hwf"], to=TP.FLOAT, name="cast"),
                h.make_node("Div", ["c", "hwf"], ["y"], name="div"),
            ],
            [_w(), nh.from_array(np.array(2, np.int64), "i2")],
            "cast",
        ),
        "cast",
    ),
    # Cast(Shape) -> Range (float ramp) -> Mul -> Add
    "range-cast": (
        lambda: _model(
            [
                h.make_node("Shape", ["x"], ["s"], name="shape"),
                h.make_node("Gather", ["s", "i3"], ["n"], axis=0, name="gather"),
                h.make_node("Cast", ["n"], ["nf"], to=TP.FLOAT, name="cast"),
                h.make_node("Range", ["zero", "nf", "one"], ["ramp"], name="range"),
                h.make_node("Mul", ["ramp", "k"], ["ramp2"], name="mulk"),
                h.make_node("Add", ["x", "ramp2"], ["y"], name="add"),
            ],
            [
                nh.from_array(np.array(3, np.int64), "i3"),
                nh.from_array(np.array(0, np.float32), "zero"),
                nh.from_array(np.array(1, np.float32), "one"),
                nh.from_array(np.array(0.1, np.float32), "k"),
            ],
            "range",
        ),
        "cast",
    ),
    # an op with integer outputs feeding float math: TopK indices -> Cast(to=FLOAT) -> Mul
    "integer-op": (
        lambda: _model(
            [
                _conv(),
                h.make_node("TopK", ["c", "kk"], ["v", "ix"], axis=3, name="topk"),
                h.make_node("Cast", ["ix"], ["ixf"], to=TP.FLOAT, name="castix"),
                h.make_node("Mul", ["v", "ixf"], ["y"], name="mul"),
            ],
            [_w(), nh.from_array(np.array([3], np.int64), "kk")],
            "intop",
        ),
        "castix",
    ),
    # an initializer shared by a blocked op (Max) and a converted op (Add)
    "shared-initializer": (
        lambda: _model(
            [
                _conv(),
                h.make_node("Max", ["c", "t"], ["m"], name="max"),
                h.make_node("Add", ["m", "t"], ["y"], name="add"),
            ],
            [_w(), nh.from_array(np.array(0.5, np.float32), "t")],
            "shared",
        ),
        "add",
    ),
    # a weight DequantizeLinear (opset 17: float scale only) in a float model
    "dequantize-weight": (
        lambda: _model(
            [
                h.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="dq"),
                h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv"),
            ],
            [
                nh.from_array(np.random.default_rng(3).integers(-127, 128, (4, 4, 3, 3)).astype(np.int8), "wq"),
                nh.from_array(np.array(0.01, np.float32), "ws"),
                nh.from_array(np.array(0, np.int8), "wz"),
            ],
            "dq",
        ),
        "dq",
    ),
    # duplicated value_info of a blocked Resize's output
    "duplicated-value-info": (
        lambda: _model(
            [
                _conv(),
                h.make_node("Resize", ["c", "", "sc"], ["r"], mode="nearest", name="resize"),
                h.make_node("Concat", ["r", "r"], ["y"], axis=1, name="cat"),
            ],
            [_w(), nh.from_array(np.array([1, 1, 2, 2], np.float32), "sc")],
            "rs",
            value_info=True,
        ),
        None,
    ),
    # weights held in Constant nodes, Resize scales from a Constant: converts on the first attempt
    "constant-weight": (
        lambda: _model(
            [
                h.make_node("Constant", [], ["w"], value=_w(), name="cw"),
                _conv(),
                h.make_node(
                    "Constant", [], ["sc"], value=nh.from_array(np.array([1, 1, 2, 2], np.float32)), name="csc"
                ),
                h.make_node("Resize", ["c", "", "sc"], ["y"], mode="nearest", name="resize"),
            ],
            [],
            "cw",
        ),
        None,
    ),
}


@pytest.mark.parametrize("case", list(FAILURE_CLASSES))
def test_fp16_conversion_failure_classes_load_run_and_match(case, tmp_path, monkeypatch):
    """Each class: onnxconverter-common's plain conversion (today's recipe, value_info kept as the file
    has it) fails to load in ONNX Runtime where the class breaks it; fp16_model's ladder produces a
    model that loads, runs and matches ORT fp32 within 4 float16 ULPs of the output's largest value
    (measured <= 0.47 ULPs on these one- to three-op networks), and the record says what stayed float32."""
    import onnxruntime as ort
    from onnxconverter_common import float16

    from anpred.backends.lowp_fp16 import fp16_model

    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))  # convert here, not a cache hit
    build, blocked_node = FAILURE_CLASSES[case]
    model = build()
    path = tmp_path / f"{case}.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(5).standard_normal((1, 4, 8, 8)).astype(np.float32)
    ref = ort_outputs(str(path), {"x": x})["y"]
    plain = float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
    if case != "constant-weight":
        with pytest.raises(Exception, match="Type Error|INVALID_GRAPH|type"):
            ort.InferenceSession(plain.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.savez(tmp_path / "sample.npz", x=x)
    p16, record = fp16_model(path, tmp_path / "sample.npz")
    m16 = onnx.load(str(p16))
    assert (
        any(t.data_type == TP.FLOAT16 for t in m16.graph.initializer)
        or any(n.op_type == "Constant" and n.attribute[0].t.data_type == TP.FLOAT16 for n in m16.graph.node)
        or case in ("range-cast", "dequantize-weight")
    )
    y = ort_outputs(str(p16), {"x": x})["y"]
    err = float(np.abs(y.astype(np.float64) - ref).max()) / fp16_ulp(ref)
    assert err <= 4.0, (case, err, record)
    assert record["fp16_converter"].startswith("onnxconverter-common")
    if blocked_node is not None:
        kept = record["fp16_nodes_kept_float32"].split(",")
        assert blocked_node in kept or record["fp16_op_block_list"] != "default", record
        assert int(record["fp16_attempts"]) >= 2 and json.loads(record["fp16_failed_attempts"])
    else:
        assert record["fp16_attempts"] == "1", record
    # a second call is a cache hit on the same file with the same record
    p2, r2 = fp16_model(path, tmp_path / "sample.npz")
    assert p2 == p16 and r2 == record


def test_fp16_conversion_names_both_converters_when_all_fail(tmp_path, monkeypatch):
    """A node ONNX Runtime cannot run in any precision (an unknown custom-domain op): every attempt
    fails and the BackendError names the last failure of each converter."""
    from anpred.backends.lowp_fp16 import fp16_model

    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))
    g = h.make_graph(
        [
            h.make_node("Relu", ["x"], ["r"], name="relu"),
            h.make_node("Mystery", ["r"], ["y"], domain="com.example", name="mystery"),
        ],
        "bad",
        [h.make_tensor_value_info("x", TP.FLOAT, [1, 4])],
        [h.make_tensor_value_info("y", TP.FLOAT, [1, 4])],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.example", 1)])
    onnx.save(m, str(tmp_path / "bad.onnx"))
    with pytest.raises(BackendError) as e:
        fp16_model(tmp_path / "bad.onnx")
    msg = str(e.value)
    assert "onnxconverter-common" in msg and "onnxruntime.transformers.float16" in msg and "Mystery" in msg
    assert not (tmp_path / "cache" / "lowp-fp16").exists() or not any((tmp_path / "cache" / "lowp-fp16").iterdir())


def test_torch_fp16_names_the_op_without_a_half_kernel(tmp_path):
    """torch 2.13's CPU LocalResponseNorm (onnx2torch's LRN) pools with avg_pool3d, which has no Half
    kernel: torch-fp16 fails in prepare with a BackendError naming the ONNX node and the torch module,
    while the float16 model itself is valid (ORT runs it: ort-fp16 prepares)."""
    from anpred.backends import backend_class
    from anpred.instrument import instrument_model

    g = h.make_graph(
        [_conv(), h.make_node("LRN", ["c"], ["y"], size=3, name="lrn")],
        "lrn",
        [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 8, 8])],
        [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 8, 8])],
        [_w()],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    anchored, man = instrument_model(m)
    onnx.save(anchored, str(tmp_path / "lrn.onnx"))
    backend_class("ort-fp16")().prepare(tmp_path / "lrn.onnx", man, tmp_path / "o")
    with pytest.raises(BackendError, match=r"module lrn \(.*\) has no float16 kernel in torch .*Half"):
        backend_class("torch-fp16")().prepare(tmp_path / "lrn.onnx", man, tmp_path / "t")
