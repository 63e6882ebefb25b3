"""Benchmark: ``anpred-instrument`` on a synthetic >10,000-node graph with skip connections, divided by
plain ``onnx.load`` + ``onnx.save`` of the same file (the issue's bar: <= 5x).

    .venv/bin/python benchmarks/bench_instrument.py [--nodes 10500] [--repeat 7] [--kind conv|elementwise|both]
                                                    [--cli-repeat 5]

In-process: both timings are taken in this one process, interleaved, and the median of ``--repeat``
rounds is reported, as wall-clock time and as CPU time of this process (``time.process_time``: on a
shared machine the CPU time is not inflated by other processes' load, the wall time is). "instrument"
is :func:`anpred.instrument.instrument_file`: load (no external data), partition (shape inference,
cost model, cut sweep, boundary choice), insert anchors, save, write the manifest JSON.

End to end (``--cli-repeat`` rounds, 0 to skip): the wall time of the ``anpred-instrument`` process
(interpreter start-up and imports included) against a ``python -c`` process that imports onnx and
does ``onnx.save(onnx.load(src), dst)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bench(kind: str, nodes: int, repeat: int, cli_repeat: int, tmp: Path) -> dict:
    import onnx

    from anpred.instrument import instrument_file
    from passes.synthetic import skip_chain_model

    src = tmp / f"skip_{kind}.onnx"
    onnx.save(skip_chain_model(nodes, kind=kind), str(src))
    base, inst, base_cpu, inst_cpu = [], [], [], []
    instrument_file(src, tmp / "warm.onnx")  # warm-up (first-call imports)
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        onnx.save(onnx.load(str(src)), str(tmp / "copy.onnx"))
        base.append(time.perf_counter() - t)
        base_cpu.append(time.process_time() - c)
        t, c = time.perf_counter(), time.process_time()
        man = instrument_file(src, tmp / "anchored.onnx")
        inst.append(time.perf_counter() - t)
        inst_cpu.append(time.process_time() - c)
    b, i = statistics.median(base), statistics.median(inst)
    bc, ic = statistics.median(base_cpu), statistics.median(inst_cpu)
    res = {
        "kind": kind,
        "nodes": man.partition["num_nodes"],
        "size_mb": src.stat().st_size / 1e6,
        "load_save_s": b,
        "instrument_s": i,
        "ratio": i / b,
        "load_save_cpu_s": bc,
        "instrument_cpu_s": ic,
        "ratio_cpu": ic / bc,
        "stages": len(man.stages),
        "anchors": sum(a.kind != "output" for a in man.anchors),
    }
    if cli_repeat > 0:
        exe = Path(sys.executable).with_name("anpred-instrument")
        cli = (
            [str(exe)]
            if exe.exists()
            else [
                sys.executable,
                "-c",
                "import sys; from anpred.cli import instrument_main; sys.exit(instrument_main())",
            ]
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        plain = [sys.executable, "-c", f"import onnx; onnx.save(onnx.load({str(src)!r}), {str(tmp / 'copy.onnx')!r})"]
        pb, pi = [], []
        for _ in range(cli_repeat):
            t = time.perf_counter()
            subprocess.run(plain, check=True, env=env)
            pb.append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run(
                cli + [str(src), "-o", str(tmp / "cli.onnx")], check=True, env=env, stdout=subprocess.DEVNULL
            )
            pi.append(time.perf_counter() - t)
        res.update(
            cli_load_save_s=statistics.median(pb),
            cli_instrument_s=statistics.median(pi),
            cli_ratio=statistics.median(pi) / statistics.median(pb),
        )
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_500)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--cli-repeat", type=int, default=5)
    ap.add_argument("--kind", choices=["conv", "elementwise", "both"], default="both")
    a = ap.parse_args()
    kinds = ["conv", "elementwise"] if a.kind == "both" else [a.kind]
    with tempfile.TemporaryDirectory() as d:
        for k in kinds:
            r = bench(k, a.nodes, a.repeat, a.cli_repeat, Path(d))
            print(
                f"{r['kind']:>11}: {r['nodes']} nodes, {r['size_mb']:.1f} MB, {r['stages']} stages, "
                f"{r['anchors']} anchors\n"
                f"  in-process wall: onnx load+save {r['load_save_s']:.3f} s | instrument {r['instrument_s']:.3f} s "
                f"| ratio {r['ratio']:.2f}x (bar 5x)\n"
                f"  in-process CPU : onnx load+save {r['load_save_cpu_s']:.3f} s | instrument "
                f"{r['instrument_cpu_s']:.3f} s | "
                f"ratio {r['ratio_cpu']:.2f}x"
            )
            if "cli_ratio" in r:
                print(
                    f"  processes wall : python -c load+save {r['cli_load_save_s']:.3f} s | anpred-instrument "
                    f"{r['cli_instrument_s']:.3f} s | ratio {r['cli_ratio']:.2f}x"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
