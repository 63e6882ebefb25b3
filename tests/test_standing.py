"""Where each backend stands: a failure's first words are what a reader acts on (a new user saw
``unsupported: not run: the pre-run coverage found 2 operator(s) or inpu`` and ``ncnn failed: prepare:
BackendError: ncnn: pnnx could not lower ONNX op(s) T``, cut before the operator)."""

import pytest
from isa_reasons import NOT_A_KERNEL_VALUE

from anpred.backends.coverage import refusal
from anpred.pipeline.result import STANDING_WIDTH, standing_cell

pytestmark = [pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)]  # text lengths, no runtime runs


def test_a_coverage_refusal_shows_the_operators_first():
    row = {
        "ops": {
            "GridSample": "onnx2torch has no converter for GridSample",
            "Clip": "onnx2torch: Dynamic value of min/max is not implemented",
        },
        "nodes": ["grid", "clip"],
        "basis": "onnx2torch's converters",
    }
    cell = standing_cell("torch", "unsupported: " + refusal(row))
    assert cell.startswith("unsupported: refused by the pre-run coverage: GridSample: onnx2torch has no converter")
    assert len(cell) <= STANDING_WIDTH
    row = {"ops": {"Foo": ""}, "basis": "OpenVINO's ONNX frontend"}
    want = "unsupported: refused by the pre-run coverage: Foo"
    assert standing_cell("openvino", "unsupported: " + refusal(row)) == want


def test_a_failure_drops_the_exception_class_and_the_repeated_backend_name():
    reason = (
        "failed: prepare: BackendError: ncnn: pnnx could not lower ONNX op(s) Tensor.to onto ncnn layers "
        "(pnnx log 'todo <op>'; layer types ncnn does not know: Tensor.to)"
    )
    cell = standing_cell("ncnn", reason)
    assert cell.startswith("failed: prepare: pnnx could not lower ONNX op(s) Tensor.to onto ncnn layers")
    assert len(cell) == STANDING_WIDTH and cell.endswith("...")
    assert standing_cell("ort", "consistent (max nRMSE 3.2e-06)") == "consistent (max nRMSE 3.2e-06)"
