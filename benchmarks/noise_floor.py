"""Measure the clean-run noise floor of the oracle's primary statistic (nRMSE vs the consensus).

Exports YOLOv8n (random weights, ultralytics YAML, offline) at 320x320 with the TorchScript exporter,
exposes every Conv/Concat/Add output as a graph output, runs ORT (all optimisations), ORT without
graph optimisations, OpenVINO (f32 hint), the ONNX reference evaluator, and ORT on a float16 copy
(onnxconverter-common), and prints, per depth (topological position of the tensor), the nRMSE of
each backend against the element-wise median of the fp32 families. Output: a table and JSON summary
(used for anpred/defaults.py; see docs/oracle.md).

Usage: .venv/bin/python benchmarks/noise_floor.py [--size 320] [--samples 3]
"""
import argparse
import json
import os
import tempfile

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=320)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--no-reference", action="store_true")
    args = ap.parse_args()
    import onnx
    import onnxruntime as ort
    import openvino as ov
    import torch
    from anpred.compat import import_ultralytics
    from anpred.stats import error_stats

    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp())
    YOLO = import_ultralytics().YOLO
    torch.manual_seed(0)
    net = YOLO("yolov8n.yaml").model.eval()
    for m in net.modules():
        if hasattr(m, "export"):
            m.export = True
    x = torch.zeros(1, 3, args.size, args.size)
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "y.onnx")
    torch.onnx.export(net, (x,), path, dynamo=False, opset_version=17, input_names=["images"])
    model = onnx.load(path)
    model = onnx.shape_inference.infer_shapes(model)
    ftypes = {v.name for v in model.graph.value_info if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    outs = [o.name for o in model.graph.output]
    order = []
    for i, n in enumerate(model.graph.node):
        if n.op_type in ("Conv", "Concat", "Add") and n.output[0] in ftypes and n.output[0] not in outs:
            order.append((i, n.output[0]))
    from onnxconverter_common import float16
    m16 = float16.convert_float_to_float16(model, keep_io_types=True)
    for _, v in order:
        m16.graph.output.append(onnx.helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT16, None))
    for _, v in order:
        model.graph.output.append(onnx.helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, None))
    names = [v for _, v in order] + outs
    depth = {v: i for i, v in order}
    depth.update({o: len(model.graph.node) for o in outs})
    b = model.SerializeToString()

    def ort_run(opt, mb=b):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        if not opt:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        s = ort.InferenceSession(mb, so, providers=["CPUExecutionProvider"])
        return lambda f: dict(zip([o.name for o in s.get_outputs()], s.run(None, f)))

    core = ov.Core()
    cm = core.compile_model(core.read_model(model=b, weights=b""), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})

    def ov_run(f):
        r = cm(f)
        return {o.get_any_name(): r[o] for o in cm.outputs}

    runners = {"ort": ort_run(True), "ort-noopt": ort_run(False), "openvino": ov_run, "ort-fp16": ort_run(True, m16.SerializeToString())}
    if not args.no_reference:
        from onnx.reference import ReferenceEvaluator
        ref = ReferenceEvaluator(model)
        runners["onnx-reference"] = lambda f: dict(zip(names, ref.run(names, f)))
    fam = {"ort": "onnxruntime", "ort-noopt": "onnxruntime", "openvino": "openvino", "onnx-reference": "ref"}
    rng = np.random.default_rng(0)
    res = {k: {v: [] for v in names} for k in runners}
    for s in range(args.samples):
        feeds = {"images": rng.random((1, 3, args.size, args.size), dtype=np.float32)}
        got = {k: r(feeds) for k, r in runners.items()}
        for v in names:
            fams = {}
            for k, f in fam.items():
                if k in got:
                    fams.setdefault(f, []).append(got[k][v].astype(np.float64))
            votes = [np.median(np.stack(a), 0) for a in fams.values()]
            cons = np.median(np.stack(votes), 0)
            for k in runners:
                res[k][v].append(error_stats(got[k][v], cons).nrmse)
    summary = {}
    print(f"{'depth':>5} " + " ".join(f"{k:>14}" for k in runners))
    for v in names:
        row = {k: float(np.max(res[k][v])) for k in runners}
        summary[v] = {"depth": depth[v], **row}
        print(f"{depth[v]:5d} " + " ".join(f"{row[k]:14.3e}" for k in runners))
    for k in runners:
        vals = np.array([summary[v][k] for v in names])
        print(f"{k}: max nRMSE {vals.max():.3e}, median {np.median(vals):.3e}")
    print(json.dumps({"nodes": len(model.graph.node), "per_tensor": summary})[:200])


if __name__ == "__main__":
    main()
