"""Run a folder of cases in ONNX's backend-test layout (default: ONNX's node conformance suite, installed
by scripts/setup.sh) on every chosen backend, and judge each (case, backend) twice: against the expected
outputs with the suite's own tolerance, and by the consensus oracle. Prints the matrix (up to 40
cases; always written to OUT/matrix.tsv and OUT/pairs.tsv), the counts per backend and the oracle's
score against the expected outputs (recall on deviating pairs, false alarms on matching ones, cases
where the consensus itself is wrong and whether the float64 arbiter saved them). Each backend runs in
a warm worker process across cases; batches of cases run as Ray tasks; a re-run resumes
(docs/conformance.md).

examples:
  anpred conformance -o out/conf                                   # the float32 cases, 10 fp32 backends
  anpred conformance -o out/conf --cases 'test_conv*' --backends ort,openvino,torch
  anpred conformance /path/to/onnxruntime/testdata/node -o out/ort-cases --dtype all
  anpred conformance -o out/conf --no-ray                          # the batches in this process

Exit status: 0 every pair judged by the suite matches; 1 some pair deviates or the oracle flagged a
matching pair; 2 bad input.
"""

from __future__ import annotations

HELP = "run ONNX backend-test cases (the node suite by default) on every backend: ground truth and the oracle's score"


def add_arguments(parser):
    parser.add_argument(
        "folder",
        nargs="?",
        default=None,
        metavar="FOLDER",
        help="cases in ONNX's backend-test layout (default: the node suite installed by scripts/setup.sh)",
    )
    parser.add_argument("-o", "--output", metavar="OUT", required=True, help="output folder (resumed when it exists)")
    parser.add_argument(
        "--backends",
        default=None,
        metavar="LIST",
        help="comma-separated backends (default: the 10 fp32 backends, onnx-reference-fp64 included)",
    )
    parser.add_argument(
        "--cases", default=None, metavar="PATTERNS", help="comma-separated shell patterns of case names (default: all)"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "all"),
        help="float32: cases whose inputs and outputs are all float32 (default); all: every tensor case",
    )
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S", help="per case and backend (default 120)")
    parser.add_argument("--batch", type=int, default=100, metavar="N", help="cases per Ray task (default 100)")
    parser.add_argument("--no-ray", action="store_true", help="run the batches in this process")
    parser.add_argument(
        "--address", default=None, metavar="ADDR", help="join this Ray cluster (default: embedded local Ray)"
    )
    parser.add_argument("--cpus", type=int, default=None, metavar="N", help="CPUs per batch and of the embedded Ray")
    parser.add_argument("--keep-runs", action="store_true", help="keep each case's run folder (OUT/runs/<case>)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def main(args) -> int:
    from anpred.conformance.suite import FP32_BACKENDS, ConformanceOptions, run_conformance

    backends = [b.strip() for b in args.backends.split(",") if b.strip()] if args.backends else list(FP32_BACKENDS)
    patterns = [p.strip() for p in args.cases.split(",") if p.strip()] if args.cases else None
    opts = ConformanceOptions(
        backends=backends,
        patterns=patterns,
        dtype=args.dtype,
        timeout_s=args.timeout,
        batch=args.batch,
        ray=not args.no_ray,
        address=args.address,
        num_cpus=args.cpus,
        keep_runs=args.keep_runs,
        progress=not args.quiet,
    )
    res = run_conformance(args.folder, args.output, opts)
    print(res["text"])
    print(
        f"\n{res['summary']['cases']} cases in {res['seconds']:.0f} s; results: {args.output}/conformance.json, "
        f"matrix.tsv, pairs.tsv"
        + (
            f"; {len(res['failed_batches'])} batch(es) lost (re-run to resume): " + "; ".join(res["failed_batches"])
            if res["failed_batches"]
            else ""
        )
    )
    s = res["summary"]["score"]
    return 0 if s["deviating"] == 0 and s["flagged_matching"] == 0 and not res["failed_batches"] else 1
