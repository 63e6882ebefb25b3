"""Benchmark of ``anpred run`` (issue 3). Prints a table of numbers quoted in docs/run.md.

1. Overhead: ``ort`` on anchored YOLOv8n (224x224, all anchors) over N=20 random-image inputs. The
   driver's per-sample time (``seconds_run`` measured around ``Backend.run`` plus the wall time of the
   sample loop: reading inputs, writing the anchors' .npz) against the same ``InferenceSession.run``
   calls alone, in a process of their own. "Loop" wall = worker wall minus prepare minus the process
   start (import) time; one-time loading and conversion excluded as the issue asks.
2. Conversion/prepare time per backend (first run fills the cache; the second is a cache hit).
3. Peak RSS of the backend process, full tensors vs streaming statistics, N=20 and N=80.

Run: .venv/bin/python benchmarks/bench_run.py [--size 224] [--n 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import run_models  # noqa: E402

from anpred.runner import run_model  # noqa: E402

PLAIN = r"""
import sys, time, numpy as np, onnxruntime as ort
from anpred.runstore import RunStore
st = RunStore.open(sys.argv[2])
xs = [st.read_inputs(s) for s in st.sample_ids]
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
s.run(None, xs[0])  # warm-up, as the driver's first sample is not special either
t = time.perf_counter()
for x in xs:
    s.run(None, x)
print(time.perf_counter() - t)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--n", type=int, default=20)
    a = ap.parse_args()
    model = run_models.anchored_yolo(a.size)
    tmp = Path(tempfile.mkdtemp(prefix="anpred-bench-"))
    # 1. overhead
    t0 = time.perf_counter()
    store = run_model(model, ["ort"], f"random:images:seed=0:n={a.n}", tmp / "ort", progress=False)
    st = store.statuses()["ort"]
    wall = store.meta["resources"]["ort"]["seconds_wall"]
    # process start + imports, measured the same way: an empty worker run
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import anpred.runner, anpred.backends.ort, onnxruntime"], check=True)
    start_s = time.perf_counter() - t
    loop = wall - st.seconds_prepare - start_s
    plains = [float(subprocess.run([sys.executable, "-c", PLAIN, str(model), str(store.root)], check=True,
                                   capture_output=True, text=True).stdout) for _ in range(3)]
    plain = min(plains)
    print(f"YOLOv8n {a.size}px, {a.n} inputs, {len(store.manifest.anchors)} anchors")
    print(f"plain InferenceSession.run total        {plain:.3f} s (best of 3)")
    print(f"driver: Backend.run total                {st.seconds_run:.3f} s  ratio {st.seconds_run / plain:.2f}x")
    print(f"driver: sample loop incl. I/O (est.)     {loop:.3f} s  ratio {loop / plain:.2f}x")
    print(f"driver: process start+imports / prepare  {start_s:.2f} s / {st.seconds_prepare:.2f} s; "
          f"whole run_model {time.perf_counter() - t0:.2f} s")
    # 2. conversion / prepare per backend (twice: cold cache for this input set, then warm)
    backends = ["ort", "ort-noopt", "openvino", "openvino-bf16", "onnx-reference", "ort-fp16", "ort-int8", "torch", "tf"]
    for rep in ("first", "second"):
        s = run_model(model, backends, "random:images:seed=5:n=2", tmp / f"conv-{rep}", progress=False)
        print(f"prepare seconds ({rep} run): " + ", ".join(
            f"{k} {v.seconds_prepare:.2f}" + ("" if v.status == "ok" else f" [{v.status}]") for k, v in s.statuses().items()))
        print(f"process wall seconds ({rep} run): " + ", ".join(
            f"{k} {v['seconds_wall']:.1f}" for k, v in s.meta["resources"].items()))
    # 3. memory
    for n in (20, 80):
        for mode in ("tensors", "stats"):
            s = run_model(model, ["ort"], f"random:normal:seed=1:n={n}", tmp / f"m-{mode}-{n}", mode=mode, progress=False)
            print(f"peak RSS ort worker, {mode:7s} n={n}: {s.meta['resources']['ort']['peak_rss_bytes'] / 2**20:.0f} MiB")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
