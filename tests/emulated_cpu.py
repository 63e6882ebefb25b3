"""Run under ``qemu-x86_64 -cpu EPYC-Rome`` (an x86-64 CPU with AVX2 and F16C, without AVX-512, VNNI
or bf16) by tests/test_cpu_portability.py: builds a tiny Conv network, compiles it on the real
``openvino-bf16`` backend and quantizes it on the real ``ort-int8`` backend in this (emulated) process,
and prints as JSON what ANPRED records: the machine's flags and kernels, the precision OpenVINO
compiled, the u8s8 kernel family, and how the oracle would judge the backend."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def saturation_probe(workdir: Path) -> dict[str, float]:
    """ONNX Runtime's u8s8 int8 kernel on inputs that saturate int16 pairs: MatMul of x = 1 (uint8 255,
    scale 1/255) with W = 1 (int8 127, scale 1/127) over K = 64. Exact int32 accumulation (VNNI, AMX,
    or the QDQ model computed in float with graph optimizations off) gives 64; VPMADDUBSW sums each pair
    255*127 + 255*127 = 64770 into a saturating int16 (32767), giving 32 * 32767 / (255 * 127) = 32.38,
    requantized on the output's uint8 grid (step 64/255): 32.376.
    Returns ``{"int8": y, "fakequant": y_float_qdq}`` (first output element)."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    k = 64
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "sat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(np.ones((k, 8), np.float32), "W")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(workdir / "sat.onnx"))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": np.zeros((1, k), np.float32)}, {"x": np.ones((1, k), np.float32)}])

        def get_next(self):
            return next(self.it, None)

    quantize_static(
        str(workdir / "sat.onnx"),
        str(workdir / "sat.q.onnx"),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    out = {}
    for key, level in (
        ("int8", ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
        ("fakequant", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
    ):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        sess = ort.InferenceSession(str(workdir / "sat.q.onnx"), so, providers=["CPUExecutionProvider"])
        out[key] = float(sess.run(None, {"x": np.ones((1, k), np.float32)})[0].ravel()[0])
    return out


def main(workdir: str) -> None:
    from anpred.backends.openvino import OpenVinoBf16Backend
    from anpred.backends.ort_lowp import OrtInt8Backend
    from anpred.judge import precision_notes
    from anpred.machine import machine_info
    from anpred.manifest import Anchor, AnchorManifest
    from anpred.judge import BackendInfo

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [w],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    d = Path(workdir)
    onnx.save(model, str(d / "m.onnx"))
    man = AnchorManifest(
        anchors=[
            Anchor(
                name="output/y",
                value="y",
                stage=0,
                order=0,
                producer="",
                op_type="Conv",
                shape=[1, 8, 16, 16],
                dtype="float32",
                kind="output",
            )
        ]
    )
    x = rng.normal(size=(1, 3, 16, 16)).astype(np.float32)
    np.savez(d / "x.npz", x=x)
    ov = OpenVinoBf16Backend({})
    ov.prepare(d / "m.onnx", man, d / "ov")
    y_ov = ov.run({"x": x})["output/y"]
    q = OrtInt8Backend({"calibration": [str(d / "x.npz")]})
    q.prepare(d / "m.onnx", man, d / "q")
    info = BackendInfo.make("openvino-bf16", "openvino", ov.effective_precision(), requested=ov.precision)
    mi = machine_info()
    table = {
        "openvino-bf16": {"precision": info.precision, "precision_requested": info.requested, "versions": {}},
        "ort-int8": {"precision": "int8", "precision_requested": "int8", "versions": q.versions()},
    }
    print(
        json.dumps(
            {
                "cpu_flags": mi["cpu_flags"],
                "kernels": mi["kernels"],
                "ov_hint": ov.versions()["openvino_compiled_precision_hint"],
                "ov_effective": ov.effective_precision(),
                "ov_finite": bool(np.isfinite(y_ov).all()),
                "judged_as": info.precision,
                "requested": info.requested,
                "votes": info.votes,
                "u8s8": q.versions()["mlas_u8s8_kernel"],
                "notes": precision_notes(table, mi),
                "saturation": saturation_probe(d),
            }
        )
    )


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(sys.argv[1] if len(sys.argv) > 1 else tmp)
