"""Speed of the pre-run coverage (issue 34, item 3): the operator tables and the converters asked node
by node (:mod:`anpred.backends.converter_probe`), per backend, on the zoo's YOLOv8n (TorchScript export,
320 px) and on a transformer-like stack (``tests/test_partition_wide.shared_stack``: 24 layers, width
256, sequence 64), each cold (an empty probe cache: every node signature converted once) and warm
(answers from ``<cache>/coverage-probe/``), in this process (the run's child process adds its imports,
about 1-1.5 s).

Usage::

    .venv/bin/python benchmarks/bench_coverage.py [--backends torch,ncnn,ort,openvino,tf]

Prints one line per (model, backend): table seconds, node-check seconds cold and warm, the probes run.
docs/backends-converters.md ("Pre-run coverage") quotes it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _models(tmp: Path) -> dict[str, Path]:
    import onnx

    from anpred.pipeline.subject import resolve_model
    from tests.test_partition_wide import shared_stack

    out = {}
    sub = resolve_model("yolov8n", imgsz=320, workdir=tmp / "yolo")
    out["yolov8n-320"] = Path(sub.onnx_path)
    m = shared_stack(layers=24, d=256, s=64, shared=4)
    onnx.save(m, str(tmp / "stack.onnx"))
    out["transformer-like 24x256"] = tmp / "stack.onnx"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="torch,ncnn,ort,openvino,tf")
    args = ap.parse_args(argv)
    from anpred.backends import backend_class
    from anpred.onnx_io import load_model

    with tempfile.TemporaryDirectory(prefix="bench-coverage-") as d:
        tmp = Path(d)
        os.environ["ANPRED_CACHE"] = str(tmp / "cache")  # cold probes: an empty cache
        for label, path in _models(tmp).items():
            model = load_model(path, load_external=True)
            print(f"{label}: {len(model.graph.node)} nodes")
            for b in args.backends.split(","):
                cls = backend_class(b)
                t0 = time.perf_counter()
                ops = cls.unsupported_ops(model) if cls.coverage_basis else {}
                t1 = time.perf_counter()
                cold = cls.refused_nodes(model)
                t2 = time.perf_counter()
                warm = cls.refused_nodes(model)
                t3 = time.perf_counter()
                assert cold == warm
                print(
                    f"  {b:<10} table {t1 - t0:6.2f} s  nodes cold {t2 - t1:6.2f} s  warm {t3 - t2:6.2f} s  "
                    f"refused {sorted(ops) + sorted(cold)}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
