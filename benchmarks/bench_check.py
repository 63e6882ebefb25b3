"""Benchmark of `anpred check` (alignment, consensus, statistics, verdicts) and of its inner kernels.

1. End to end: ``check_run`` on a run folder (``--run DIR``; default: YOLOv8n 320x320 from the zoo on
   2 photographs + 20 seeded random inputs, run on ort, ort-noopt, openvino, torch, tf, onnx-reference,
   built once under ``--work``), ``--repeat`` times: wall and CPU seconds, and with ``--profile`` the
   functions with the largest cumulative time (cProfile).
2. Kernels on YOLO-sized tensors (102,400 float64 values): element-wise median of 5 votes (network of
   minimum/maximum vs ``np.median`` over axis 0), W1 (sorted differences vs
   ``scipy.stats.wasserstein_distance``), sums of products (``einsum`` vs BLAS ``@``).

Usage: .venv/bin/python benchmarks/bench_check.py [--run DIR] [--work /tmp/anpred-bench-check] [--repeat 3] [--profile]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def _t(f, n):
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e3


def kernels():
    from scipy.stats import wasserstein_distance

    from anpred.judge import median_of

    rng = np.random.default_rng(0)
    votes = [rng.standard_normal(102400) for _ in range(5)]
    d, c = votes[0], votes[1]
    stack = np.stack(votes)
    print("kernels on 102,400 float64 values (ms per call):")
    print(
        f"  median of 5 votes: network {_t(lambda: median_of(votes), 20):.2f}   np.median(axis=0) "
        f"{_t(lambda: np.median(stack, axis=0), 20):.2f}   identical: "
        f"{np.array_equal(median_of(votes), np.median(stack, axis=0))}"
    )
    print(
        f"  W1: sorted differences {_t(lambda: np.abs(np.sort(d) - np.sort(c)).mean(), 20):.2f}   "
        f"(consensus sorted once: {_t(lambda: np.abs(np.sort(d) - c).mean(), 20):.2f})   scipy "
        f"{_t(lambda: wasserstein_distance(d, c), 5):.2f}"
    )
    print(f"  sum d*d: einsum {_t(lambda: np.einsum('i,i->', d, d), 200):.3f}   BLAS @ {_t(lambda: d @ d, 200):.3f}")


def build_run(work: Path) -> Path:
    from evaluation import prepare_model

    clean = work / "yolov8n-320" / "clean"
    if not (clean / "run.json").exists():
        t0 = time.monotonic()
        prepare_model(
            "yolov8n",
            work / "yolov8n-320",
            imgsz=320,
            n_real=2,
            n_random=20,
            backends=("ort", "ort-noopt", "openvino", "torch", "tf", "onnx-reference"),
            lowp=(),
        )
        print(f"built {clean} in {time.monotonic() - t0:.0f} s")
    return clean


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=None)
    ap.add_argument("--work", default="/tmp/anpred-bench-check")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    from anpred.judge import check_run

    run = Path(args.run) if args.run else build_run(Path(args.work))
    for i in range(args.repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        rep = check_run(run)
        print(
            f"check_run {run}: {rep.samples} samples x {len(rep.verdicts)} backends x {len(rep.anchors)} anchors: "
            f"wall {time.perf_counter() - w0:.2f} s, CPU {time.process_time() - c0:.2f} s, status {rep.status}"
        )
    if args.profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        check_run(run)
        pr.disable()
        pstats.Stats(pr).sort_stats("cumulative").print_stats(18)
    kernels()


if __name__ == "__main__":
    main()
