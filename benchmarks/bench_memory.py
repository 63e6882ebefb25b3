"""Memory bounds of backend workers (anpred.run.limits, docs/run.md "Memory bounds"):

1. resident (RSS) against virtual (VMS) memory of each backend's worker on one small CNN: why the bound
   is held on RSS by a watchdog and not with ``RLIMIT_AS`` (virtual address space);
2. how far a worker that grows fast gets past its bound before the watchdog kills it (the overshoot),
   on the dilated Conv that makes ONNX's reference evaluator allocate ~1.6 GB (tests/test_run_guards.py);
3. the driver's cost of one sample of a worker's process tree.

Usage: ``python benchmarks/bench_memory.py [--backends ort,openvino,...] [--repeats 3]`` (prints a table
and writes benchmarks/results/bench_memory.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

DEFAULT = "ort,openvino,onnx-reference,torch,tf,tvm,ncnn,mnn,litert"


def small_cnn(path: Path) -> Path:
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(0)
    w1 = nh.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.2, "w1")
    w2 = nh.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1, "w2")
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        h.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2"),
    ]
    g = h.make_graph(
        nodes,
        "cnn",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 64, 64])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 16, 64, 64])],
        [w1, w2],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def main() -> None:
    from anpred.run import run_model
    from anpred.run.limits import MemoryWatch, RunGuards, gib
    from test_run_guards import dilated_conv

    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default=DEFAULT)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    out: dict = {"rss_vs_vms": {}, "overshoot": [], "poll_ms": None}
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        store = run_model(
            small_cnn(d / "cnn.onnx"), args.backends.split(","), "random:normal:n=2", d / "run", progress=False
        )
        print(f"{'backend':<16}{'status':<10}{'peak RSS':>12}{'peak VMS':>12}{'VMS/RSS':>9}")
        for b, st in store.statuses().items():
            r = store.meta["resources"][b]
            rss, vms = r.get("peak_rss_watched_bytes", 0), r.get("peak_vms_watched_bytes", 0)
            out["rss_vs_vms"][b] = {"status": st.status, "rss": rss, "vms": vms}
            print(f"{b:<16}{st.status:<10}{gib(rss):>12}{gib(vms):>12}{vms / max(rss, 1):>9.1f}")
        bound = 768 << 20
        m = dilated_conv(d / "dilated.onnx")
        for k in range(args.repeats):
            s = run_model(
                m,
                ["onnx-reference"],
                "random:normal:n=1",
                d / f"mem{k}",
                progress=False,
                guards=RunGuards(backend_memory=bound),
                precheck=False,
            )
            st = s.statuses()["onnx-reference"]
            peak = s.meta["resources"]["onnx-reference"]["peak_rss_watched_bytes"]
            hit = re.search(r"RSS ([\d.]+) (GiB|MiB)", st.reason)
            out["overshoot"].append({"status": st.status, "peak_rss": peak, "bound": bound, "reason": st.reason[:200]})
            print(
                f"dilated Conv, bound {gib(bound)}: {st.status}, RSS at the kill {hit.group(0) if hit else '?'} "
                f"(+{(peak - bound) / (1 << 20):.0f} MiB over the bound)"
            )
    w = MemoryWatch(RunGuards(backend_memory=1 << 40, run_memory=1 << 40))
    w.watch("self", os.getpid())
    t = time.perf_counter()
    for _ in range(1000):
        w.check(force=True)
    out["poll_ms"] = time.perf_counter() - t
    print(f"one sample of a process tree: {out['poll_ms']:.3f} ms")
    res = ROOT / "benchmarks" / "results"
    res.mkdir(exist_ok=True)
    (res / "bench_memory.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
