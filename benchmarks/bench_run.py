"""Benchmark of ``anpred run`` (issue 3). Prints a table of numbers quoted in docs/run.md.

Model: the zoo's YOLOv8n (``models.get("yolov8n", imgsz=SIZE)``, torch dynamo export, which both
onnx2torch and onnx2tf convert), anchored with ``anpred.instrument``.

1. Overhead: ``ort`` over N=20 random-image inputs, in both modes (``tensors``, ``stats``). The worker times the sample
loop itself
   (``resources.json`` ``seconds_loop``: reading inputs, ``Backend.run``, storing every anchor, waiting
   for the last write; one-time start and prepare excluded) and ``Backend.run`` alone
   (``seconds_run``); both against the same ``InferenceSession.run`` calls alone in a process of their
   own (best of 3).
2. Conversion: onnx2torch (in this process, ``TorchOnnxBackend.seconds_convert``) and onnx2tf with an
   empty cache (a temporary ``ANPRED_CACHE``: convert + SavedModel export) and then on a cache hit;
   prepare seconds of every backend from a cold and a warm run.
3. Peak RSS of the backend process, full tensors vs streaming statistics, N=20 and N=80.

Run: .venv/bin/python benchmarks/bench_run.py [--size 640] [--n 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np  # noqa: E402
import run_models  # noqa: E402

from anpred.run import run_model  # noqa: E402

PLAIN = r"""
import sys, time, numpy as np, onnxruntime as ort
from anpred.run import RunStore
st = RunStore.open(sys.argv[2])
xs = [st.read_inputs(s) for s in st.sample_ids]
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
s.run(None, xs[0])  # warm-up, as the driver's first sample is not special either
t = time.perf_counter()
for x in xs:
    s.run(None, x)
print(time.perf_counter() - t)
"""


def overhead(model: Path, tmp: Path, n_inputs: int) -> float:
    """Prints the driver's overhead over a plain InferenceSession loop on ``n_inputs`` inputs in both storage
    modes; returns the plain loop's best total seconds (stats mode)."""
    for mode in ("tensors", "stats"):
        runs = [
            run_model(
                model, ["ort"], f"random:images:seed=0:n={n_inputs}", tmp / f"ort-{mode}{k}", mode=mode, progress=False
            )
            for k in range(3)
        ]  # best of 3, like the plain loop (shared machine)
        store = min(runs, key=lambda r: r.meta["resources"]["ort"]["seconds_loop"])
        st = store.statuses()["ort"]
        res = store.meta["resources"]["ort"]
        loop, wall = res["seconds_loop"], res["seconds_wall"]
        plains = [
            float(
                subprocess.run(
                    [sys.executable, "-c", PLAIN, str(model), str(store.root)],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )
            for _ in range(3)
        ]
        plain = min(plains)
        per = (
            sum(np.asarray(v).nbytes for v in store.read_anchors("ort", store.sample_ids[0]).values())
            if mode == "tensors"
            else None
        )
        print(f"[{mode}] {len(store.manifest.anchors)} anchors" + (f", {per / 1e6:.1f} MB per sample" if per else ""))
        print(
            f"[{mode}] plain InferenceSession.run total        {plain:.3f} s (best of 3: "
            + ", ".join(f"{p:.3f}" for p in plains)
            + ")"
        )
        print(
            f"[{mode}] driver: Backend.run total                {st.seconds_run:.3f} s  ratio "
            f"{st.seconds_run / plain:.2f}x"
        )
        print(
            f"[{mode}] driver: sample loop incl. I/O (worker)   {loop:.3f} s  ratio {loop / plain:.2f}x "
            "(best of 3; all: " + ", ".join(f"{r.meta['resources']['ort']['seconds_loop']:.3f}" for r in runs) + ")"
        )
        print(f"[{mode}] driver: worker process wall / prepare    {wall:.2f} s / {st.seconds_prepare:.2f} s")
    return plain


def whole_call(model: Path, tmp: Path, n_inputs: int, plain: float) -> None:
    """Prints the whole run_model call's cost per sample against ``plain`` (seconds for ``n_inputs`` inputs)."""
    # the whole run_model call per sample, one-time costs removed by difference: (T(n+1) - T(1)) / n
    # includes what the worker loop does not: the driver decoding/letterboxing each input image,
    # hashing it and storing it in the run (inputs/<sample>.safetensors)
    whole = {}
    for n in (1, n_inputs + 1):
        ts = []
        for k in range(3):
            t = time.perf_counter()
            run_model(model, ["ort"], f"random:images:seed=0:n={n}", tmp / f"whole-{n}-{k}", progress=False)
            ts.append(time.perf_counter() - t)
        whole[n] = min(ts)
    per = (whole[n_inputs + 1] - whole[1]) / n_inputs
    print(
        f"[whole] run_model(n=1) {whole[1]:.3f} s, run_model(n={n_inputs + 1}) {whole[n_inputs + 1]:.3f} s "
        f"(best of 3 each): {per * 1e3:.1f} ms per sample vs plain {plain / n_inputs * 1e3:.1f} ms: "
        f"ratio {per * n_inputs / plain:.2f}x"
    )


def memory(model: Path, tmp: Path) -> None:
    """Prints the ort worker's peak RSS in both storage modes for 20 and 80 inputs."""
    # 3. memory (before torch/tf are imported here: a worker's ru_maxrss includes its parent's
    # resident pages at fork)
    for n in (20, 80):
        for mode in ("tensors", "stats"):
            s = run_model(
                model, ["ort"], f"random:normal:seed=1:n={n}", tmp / f"m-{mode}-{n}", mode=mode, progress=False
            )
            print(
                f"peak RSS ort worker, {mode:7s} n={n}: {s.meta['resources']['ort']['peak_rss_bytes'] / 2**20:.0f} MiB"
            )


def conversion(model: Path, tmp: Path) -> None:
    """Prints onnx2torch's conversion and the backends' prepare seconds on an empty cache and a hit."""
    import onnx

    from anpred.backends.tf_onnx import TfOnnxBackend
    from anpred.backends.torch_onnx import TorchOnnxBackend
    from anpred.manifest import AnchorManifest

    man = AnchorManifest.from_model(onnx.load(str(model), load_external_data=False))
    conv = []
    for _ in range(3):
        b = TorchOnnxBackend()
        t = time.perf_counter()
        b.prepare(model, man, tmp / "w-torch")
        conv.append((b.seconds_convert, time.perf_counter() - t))
    print("onnx2torch convert / whole torch prepare (3 runs): " + ", ".join(f"{c:.2f}/{p:.2f} s" for c, p in conv))
    old = os.environ.get("ANPRED_CACHE")
    os.environ["ANPRED_CACHE"] = str(tmp / "cache")  # empty cache: a real onnx2tf conversion
    backends = [
        "ort",
        "ort-noopt",
        "openvino",
        "openvino-bf16",
        "onnx-reference",
        "ort-fp16",
        "ort-int8",
        "torch",
        "tf",
    ]
    try:
        for rep in ("first (empty cache)", "second (cache hit)"):
            s = run_model(model, backends, "random:images:seed=5:n=2", tmp / f"conv-{rep.split()[0]}", progress=False)
            print(
                f"prepare seconds, {rep} run: "
                + ", ".join(
                    f"{k} {v.seconds_prepare:.2f}" + ("" if v.status == "ok" else f" [{v.status}]")
                    for k, v in s.statuses().items()
                )
            )
            print(
                f"process wall seconds, {rep} run: "
                + ", ".join(f"{k} {v['seconds_wall']:.1f}" for k, v in s.meta["resources"].items())
            )
        tb = TfOnnxBackend()
        t = time.perf_counter()
        tb.prepare(model, man, tmp / "w-tf")
        hit_s = time.perf_counter() - t
        print(
            f"onnx2tf: onnx2tf.convert alone {tb._meta['seconds_convert']:.1f} s (cache meta.json); "
            f"tf prepare on a cache hit, in-process (SavedModel load) {hit_s:.2f} s"
        )
    finally:
        if old is None:
            os.environ.pop("ANPRED_CACHE", None)
        else:
            os.environ["ANPRED_CACHE"] = old


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=640)  # YOLOv8n's own input size
    ap.add_argument("--n", type=int, default=20)
    a = ap.parse_args()
    model = run_models.anchored_zoo_yolo(a.size)
    tmp = Path(tempfile.mkdtemp(prefix="anpred-bench-"))
    t0 = time.perf_counter()
    print(f"YOLOv8n {a.size}px, {a.n} inputs")
    # 1. overhead, both storage modes (tensors: every anchor to safetensors; stats: summaries only)
    plain = overhead(model, tmp, a.n)
    whole_call(model, tmp, a.n, plain)
    print(f"overhead part: {time.perf_counter() - t0:.1f} s")
    memory(model, tmp)
    conversion(model, tmp)
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
