"""The acceptance run of issue 37 on YOLOv8n (docs/executorch.md): ExecuTorch's fp32 backends from both
origins beside the other libraries, LiteRT's XNNPACK path among them, the PT2E int8 and the fp16
populations; prints what ran where, the observer effect, the capture used, the verdicts and the
measured independence of every pair with ``xnnpack`` (the oracle's ``report.independence`` and its
merges, ``report.correlated``).

The zoo's ``yolov8n`` at 320 is a seeded native PyTorch model with its ONNX export: the ONNX-origin
backends (``executorch``, ``executorch-xnnpack``) convert the exported ONNX through onnx2torch, the
native ones (``executorch-native``, ``executorch-xnnpack-native``) export the factory's ``nn.Module``.

Usage::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/executorch_yolo.py --out /tmp/et-yolo [--model yolov8n] [--imgsz 320]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

FP32 = [
    "ort",
    "openvino",
    "torch",
    "litert",
    "torch-native",
    "executorch",
    "executorch-xnnpack",
    "executorch-native",
    "executorch-xnnpack-native",
    "onnx-reference-fp64",
]
FP16 = ["ort-fp16", "torch-fp16", "executorch-fp16", "executorch-xnnpack-fp16"]
INT8 = ["torch-pt2e-int8", "executorch-int8", "executorch-xnnpack-int8"]


def summarize(folder: Path) -> dict:
    """What the run and its report say about the ExecuTorch backends."""
    rep = json.loads((folder / "report.json").read_text())
    run = json.loads((folder / "run" / "run.json").read_text())
    out: dict = {"status": rep["status"], "backends": {}}
    for name, st in run["backends"].items():
        v = st.get("versions", {})
        row = {
            "status": st["status"],
            "reason": st.get("reason", "")[:300],
            "precision": st.get("precision"),
            "seconds_prepare": round(st.get("seconds_prepare", 0), 1),
            "seconds_run": round(st.get("seconds_run", 0), 2),
        }
        for k in ("executorch_partitions", "executorch_outside_ops", "executorch_observer", "executorch_capture"):
            if k in v:
                row[k] = (
                    v[k]
                    if k != "executorch_capture"
                    else json.loads(v[k]).get("kind")
                    + ": "
                    + str(json.loads(v[k]).get("reason") or json.loads(v[k]).get("vs_extra_outputs"))
                )
        verdict = rep["verdicts"].get(name) or {}
        row["verdict"] = ("flagged" if verdict.get("flagged") else verdict.get("status")) if verdict else None
        row["worst_nrmse"] = verdict.get("worst_primary")
        imp = verdict.get("implementation") or {}
        if imp:
            row["implementation"] = "flagged" if imp.get("flagged") else imp.get("status")
        out["backends"][name] = row
    ind = rep.get("independence") or {}
    out["independence"] = {p: v for p, v in (ind.get("pairs") or {}).items() if "xnnpack" in p or "litert" in p}
    out["merged"] = ind.get("merged")
    out["correlated"] = [
        {k: c[k] for k in ("families", "kind", "anchors", "rho") if k in c} for c in rep.get("correlated") or []
    ]
    out["task"] = {b: t.get("headline") for b, t in ((rep.get("task") or {}).get("backends") or {}).items()}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="yolov8n")
    ap.add_argument("--imgsz", default="320")
    ap.add_argument("--samples", default="3")
    ap.add_argument("--backends", default=",".join(FP32 + FP16 + INT8))
    args = ap.parse_args(argv)
    out = Path(args.out)
    cmd = [
        sys.executable,
        "-m",
        "anpred",
        "test",
        args.model,
        "--imgsz",
        args.imgsz,
        "--samples",
        args.samples,
        "--backends",
        args.backends,
        "-o",
        str(out),
        "--overwrite",
        "--allow-incomplete",
        "--quiet",
        "--timeout",
        "1800",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    res = {"command": " ".join(cmd), "rc": proc.returncode, "seconds": round(time.perf_counter() - t0, 1)}
    if not (out / "report.json").is_file():
        print(proc.stderr[-3000:])
        return 1
    res.update(summarize(out))
    (out / "executorch-summary.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
