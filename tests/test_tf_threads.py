"""Regression: the tf backend accepted a ``threads`` option only when the conversion came from the
cache; on a fresh onnx2tf conversion TensorFlow had already started its runtime and refused the
setting, so the backend failed. A model with fresh random weights forces a conversion."""

import os

import numpy as np
import pytest

from isa_reasons import FP32_BOUND


@pytest.mark.isa_independent(FP32_BOUND)
@pytest.mark.slow
def test_tf_threads_option_on_fresh_conversion(tmp_path):
    import onnx
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from anpred.instrument import instrument_file
    from anpred.run import BackendSpec, run_model

    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))  # never in the cache
    w = nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    g = h.make_graph(
        [
            h.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            h.make_node("Relu", ["c"], ["y"], name="relu"),
        ],
        "g",
        [h.make_tensor_value_info("x", 1, [1, 3, 16, 16])],
        [h.make_tensor_value_info("y", 1, [1, 4, 16, 16])],
        [w],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    instrument_file(tmp_path / "m.onnx", tmp_path / "a.onnx")
    store = run_model(
        tmp_path / "a.onnx",
        [BackendSpec("tf", options={"threads": 1}), "ort"],
        "random:uniform:n=1",
        tmp_path / "run",
        progress=False,
    )
    st = store.statuses()
    assert st["tf"].status == "ok", st["tf"].reason
    sid = store.sample_ids[0]
    a = store.read_anchors("tf", sid)["output/y"]
    b = store.read_anchors("ort", sid)["output/y"]
    if a.shape != b.shape:  # onnx2tf keeps 4-D outputs NHWC
        a = np.transpose(a, (0, 3, 1, 2))
    assert float(np.abs(a - b).max()) < 1e-4
