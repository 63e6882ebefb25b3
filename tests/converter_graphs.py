"""Small ONNX graphs for the converter tests (tests/test_converter_gaps.py, test_reference_defects.py,
test_converter_coverage.py, test_converter_rewrites.py): a graph from nodes, int64/float32 initializers, a
graph anchored at its outputs, and the fp32 tolerance the tests compare with ONNX Runtime within.

Tolerance (fp32): ``max |y - ort| <= RTOL * max(1, max |ort|)`` per anchor, ``RTOL = 64 * eps32``
(eps32 = 2^-23, about 7.6e-6 relative).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EPS32 = float(np.finfo(np.float32).eps)
RTOL = 64 * EPS32


# ---- helpers -------------------------------------------------------------------------------------
def gap_model(nodes, inputs, outputs, inits, opset=15):
    g = helper.make_graph(
        nodes, "gap", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def f32(name, a):
    return numpy_helper.from_array(np.asarray(a, np.float32), name)


def anchor_outputs(model, path: Path) -> Path:
    from anpred.instrument import instrument_model

    am, man = instrument_model(model, stages=3, anchors=[o.name for o in model.graph.output])
    man.to_model(am)
    onnx.save(am, str(path))
    return path
