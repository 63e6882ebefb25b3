"""Benchmark of the test suite (issue 15): README's test command and the ``slow`` cases, cold.

Clones the current commit (``git clone`` of this checkout's HEAD into a temporary folder, so nothing
left in the working tree counts), points ``ANPRED_CACHE`` at an empty folder (every export and
conversion is done: onnx2tf, onnx2torch, float16, int8, the zoo's exports) and runs, each in a fresh
process:

1. ``default``: ``python -m pytest -q`` (README's test command minus the set-up; the default run
   deselects ``slow``, see ``pyproject.toml``), with an empty conversion cache;
2. ``slow``: ``python -m pytest -q -m slow`` (the long cases: large conversions, full-resolution
   YOLOs, the evaluation) with its own empty cache;
3. ``emulated`` (issue 32): ``-m "kernels and not slow"`` (what ``.ci/run`` runs under the emulated
   AVX2-only CPU) twice, each with an empty cache: natively (``kernels-native``) and with the emulated
   CPU's python (``--emu``, default ``.venv/bin/python-emu`` from ``scripts/emulated_cpu.sh``); the ratio
   of the two wall times is what the emulation costs;
4. ``workers`` (issue 32): the default run twice, each with an empty cache: in one process (``-n 0``,
   ``serial``) and as README runs it (pytest-xdist's ``-n auto``, sized by tests/conftest.py); the ratio
   of the two wall times is what the workers save on this machine.

For each: wall time (``time.perf_counter``, seconds), CPU time of the process tree (user + system,
``resource.getrusage(RUSAGE_CHILDREN)`` difference, seconds), pytest's closing line, exit status,
and the 1-minute load average before and after (``os.getloadavg``: the machine may be shared). The
ten slowest tests of each run (``--durations``) are printed. The interpreter is this one (the venv
of the checkout; the clone imports its own sources first through ``PYTHONPATH``).

Run: .venv/bin/python benchmarks/bench_tests.py [--only default|slow|emulated|workers] [--emu PYTHON] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(clone: Path, cache: Path, marker_args: list[str], python: str = sys.executable) -> dict:
    env = {**os.environ, "ANPRED_CACHE": str(cache), "PYTHONPATH": str(clone)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    proc = subprocess.run(
        [
            python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--durations=10",
            "--basetemp",
            str(cache.parent / "basetemp"),
            *marker_args,
        ],
        env=env,
        cwd=clone,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = proc.stdout.strip().splitlines()
    closing = next((ln for ln in reversed(lines) if re.search(r"\d+ (passed|failed|error)", ln)), "")
    durations = []
    on = False
    for ln in lines:
        if "slowest" in ln and "durations" in ln:
            on = True
            continue
        if on and re.match(r"^\d+\.\d+s ", ln):
            durations.append(ln)
        elif on and durations:
            break
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "rc": proc.returncode,
        "closing": closing.strip("= "),
        "load_before": round(load0, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "slowest": durations,
        "tail": "" if proc.returncode == 0 else proc.stdout[-4000:] + proc.stderr[-2000:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("default", "slow", "emulated", "workers"), help="run one of the four groups")
    ap.add_argument(
        "--emu",
        default=str(ROOT / ".venv" / "bin" / "python-emu"),
        help="the emulated CPU's python (scripts/emulated_cpu.sh makes it)",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="anpred-bench-tests-"))
    try:
        clone = tmp / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True
        ).stdout.strip()
        results = {"commit": head, "cores": os.cpu_count()}
        kernels = ["-m", "kernels and not slow"]
        runs = (
            ("default", [], sys.executable, "default"),
            ("slow", ["-m", "slow"], sys.executable, "slow"),
            ("kernels-native", kernels, sys.executable, "emulated"),
            ("emulated", kernels, args.emu, "emulated"),
            ("serial", ["-n", "0"], sys.executable, "workers"),
            ("workers", [], sys.executable, "workers"),
        )
        for name, marker, python, group in runs:
            if args.only and args.only != group or (not args.only and group in ("emulated", "workers")):
                continue
            cache = tmp / f"cache-{name}"
            cache.mkdir()
            r = _run(clone, cache, marker, python)
            results[name] = r
            print(
                f"{name:8} wall {r['wall_s']:7.1f} s  cpu {r['cpu_s']:7.1f} s  exit {r['rc']}  "
                f"load {r['load_before']:.2f}->{r['load_after']:.2f}  {r['closing']}"
            )
            for ln in r["slowest"]:
                print(f"           {ln}")
            if r["tail"]:
                print(r["tail"])
        if "emulated" in results:
            ratio = results["emulated"]["wall_s"] / results["kernels-native"]["wall_s"]
            print(f"emulated / native wall time: {ratio:.1f}x")
        if "workers" in results:
            ratio = results["serial"]["wall_s"] / results["workers"]["wall_s"]
            print(f"one process / -n auto wall time: {ratio:.2f}x")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        return (
            0
            if all(
                results[k]["rc"] == 0
                for k in ("default", "slow", "kernels-native", "emulated", "serial", "workers")
                if k in results
            )
            else 1
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
