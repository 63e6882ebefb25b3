"""The float64 widening as a graph pass (:class:`passes.float64.Float64Pass`): run by the
:class:`passes.base.PassManager`, it leaves its input alone and returns the widened copy with the
widening's report (the widening itself: tests/test_fp16_models.py)."""

from __future__ import annotations

import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from passes import Float64Pass, PassManager
from isa_reasons import FLOAT64_BOUND


def _model():
    w = numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "w")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["m"]),
        helper.make_node("Resize", ["m", "", "scales"], ["y"], mode="nearest"),
    ]
    scales = numpy_helper.from_array(np.array([2.0], np.float32), "scales")
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])],
        [w, scales],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.isa_independent(FLOAT64_BOUND)
def test_float64_pass_widens_a_copy_and_keeps_the_float_slot():
    model = _model()
    before = model.SerializeToString()
    result = PassManager([Float64Pass()])(model)
    assert model.SerializeToString() == before  # in_place = False, checked by the pass itself too
    copy, info = result.model, result.info["Float64Pass"]
    assert result.modified
    assert copy.graph.input[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    # Resize's scales input is tensor(float) in the spec: a Cast back to float keeps it
    assert info["casts_inserted"] == ["Resize-19 (node 'y'): input 'scales'"]
    assert info["widened_tensors"] == 2 and info["widened_values"] == 2
    onnx.checker.check_model(copy)
    x = np.array([1.0, 2.0, 3.0])
    (y,) = ReferenceEvaluator(copy).run(None, {"x": x})
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, np.repeat(x * np.array([0.1, 0.2, 0.3], np.float32).astype(np.float64), 2))
