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


def main(workdir: str) -> None:
    from anpred.backends.openvino import OpenVinoBf16Backend
    from anpred.backends.ort_lowp import OrtInt8Backend
    from anpred.judge import precision_notes
    from anpred.machine import machine_info
    from anpred.manifest import Anchor, AnchorManifest
    from anpred.judge import BackendInfo

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    d = Path(workdir)
    onnx.save(model, str(d / "m.onnx"))
    man = AnchorManifest(anchors=[Anchor(name="output/y", value="y", stage=0, order=0, producer="", op_type="Conv",
                                         shape=[1, 8, 16, 16], dtype="float32", kind="output")])
    x = rng.normal(size=(1, 3, 16, 16)).astype(np.float32)
    np.savez(d / "x.npz", x=x)
    ov = OpenVinoBf16Backend({})
    ov.prepare(d / "m.onnx", man, d / "ov")
    y_ov = ov.run({"x": x})["output/y"]
    q = OrtInt8Backend({"calibration": [str(d / "x.npz")]})
    q.prepare(d / "m.onnx", man, d / "q")
    info = BackendInfo.make("openvino-bf16", "openvino", ov.effective_precision(), requested=ov.precision)
    mi = machine_info()
    table = {"openvino-bf16": {"precision": info.precision, "precision_requested": info.requested, "versions": {}},
             "ort-int8": {"precision": "int8", "precision_requested": "int8", "versions": q.versions()}}
    print(json.dumps({"cpu_flags": mi["cpu_flags"], "kernels": mi["kernels"],
                      "ov_hint": ov.versions()["openvino_compiled_precision_hint"],
                      "ov_effective": ov.effective_precision(), "ov_finite": bool(np.isfinite(y_ov).all()),
                      "judged_as": info.precision, "requested": info.requested, "votes": info.votes,
                      "u8s8": q.versions()["mlas_u8s8_kernel"], "notes": precision_notes(table, mi)}))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(sys.argv[1] if len(sys.argv) > 1 else tmp)
