"""Align a run's anchors onto the canonical ONNX representation and report how.

Reads RUN_DIR (written by `anpred run`), aligns every sample of every usable backend (streaming, one
sample in memory) and prints each non-identity alignment per anchor and backend with how it was
decided (manifest pin, capture = reported by the backend, native mapping, layout, shape, data with
its error and margin), then every anchor left unaligned and why. See docs/alignment.md.

examples:
  anpred align runs/yolov8n
  anpred align runs/yolov8n --json align.json --backends ort,tf
"""

from __future__ import annotations

HELP = "align a run's anchors (layouts, reshapes, dtypes, segment order) and report every non-identity alignment"


def add_arguments(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run folder written by `anpred run`")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the alignment report as JSON (schema anpred.alignment/1)")
    parser.add_argument("--backends", metavar="LIST", default=None,
                        help="comma-separated backends to align (default: every backend whose status is ok)")
    parser.add_argument("--close-tol", type=float, default=0.5, metavar="E",
                        help="largest normalised error a data-decided candidate may have (default 0.5)")
    parser.add_argument("--min-margin", type=float, default=4.0, metavar="M",
                        help="runner-up must be this many times farther than the chosen candidate (default 4)")
    parser.add_argument("--no-segment-search", action="store_true",
                        help="do not look for channel/segment permutations")


def main(args) -> int:
    from pathlib import Path

    from anpred.align import Aligner
    from anpred.errors import AnpredError
    from anpred.onnx_io import atomic_write_text
    from anpred.runstore import RunStore

    store = RunStore.open(args.run_dir)
    if store.meta.get("mode", "tensors") != "tensors":
        raise AnpredError(f"{args.run_dir}: run mode {store.meta.get('mode')!r} stored no tensors; "
                          "re-run with tensors to align")
    statuses = store.statuses()
    if args.backends:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        unknown = [b for b in backends if b not in statuses]
        if unknown:
            raise AnpredError(f"backend(s) {', '.join(unknown)} not in this run; it has: {', '.join(statuses) or '(none)'}")
    else:
        backends = store.ok_backends()
    if not backends:
        raise AnpredError(f"{args.run_dir}: no backend with status ok to align")
    if args.json:
        out = Path(args.json)
        if not out.parent.is_dir():
            raise AnpredError(f"{out}: folder {out.parent} does not exist; nothing was written")
    aligner = Aligner(store.manifest, {b: statuses[b] for b in backends}, close_tol=args.close_tol,
                      min_margin=args.min_margin, segment_search=not args.no_segment_search)
    for sid, raw in store.iter_samples(backends):
        aligner.align(sid, raw)
    report = aligner.report()
    print(report.format_text())
    if args.json:
        atomic_write_text(Path(args.json), report.to_json())
    return 0
