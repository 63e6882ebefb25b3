"""Align a run's anchors onto the canonical ONNX representation and report how.

Reads RUN_DIR (written by `anpred run`), aligns every sample of every usable backend (streaming, one
sample in memory) and prints each non-identity alignment per anchor and backend with how it was
decided (manifest pin, capture = reported by the backend, native mapping, layout, shape, data with
its error and margin), every segment order found by the data, then every anchor left unaligned and
why. Every anchor is listed. Pins live in RUN_DIR/manifest.json under anchors[i].alignment[backend].
See docs/alignment.md.

examples:
  anpred align runs/yolov8n
  anpred align runs/yolov8n --json align.json --backends ort,tf
"""

from __future__ import annotations

HELP = "align a run's anchors (layouts, reshapes, dtypes, segment order) and report every non-identity alignment"


def add_arguments(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run folder written by `anpred run`")
    parser.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="also write the alignment report as JSON (schema anpred.alignment/1)",
    )
    parser.add_argument(
        "--backends",
        metavar="LIST",
        default=None,
        help="comma-separated backends to align (default: every backend whose status is ok)",
    )
    parser.add_argument(
        "--close-tol",
        type=float,
        default=0.5,
        metavar="E",
        help="largest normalised error a data-decided candidate may have, 0 < E < 1 (default 0.5)",
    )
    parser.add_argument(
        "--min-margin",
        type=float,
        default=4.0,
        metavar="M",
        help="runner-up must be this many times farther than the chosen candidate, finite M > 1 (default 4)",
    )
    parser.add_argument("--no-segment-search", action="store_true", help="do not look for channel/segment permutations")


def main(args) -> int:
    import math
    from pathlib import Path

    from anpred.align import Aligner
    from anpred.errors import AnpredError
    from anpred.onnx_io import atomic_write_text
    from anpred.run import RunStore

    # bad options fail before any work (nothing printed, nothing written)
    if not 0 < args.close_tol < 1:
        raise AnpredError(
            f"--close-tol must be in (0, 1) (a normalised error; 1 is what the constant mean "
            f"already scores), got {args.close_tol}"
        )
    if not 1 < args.min_margin < math.inf:
        raise AnpredError(f"--min-margin must be a finite number > 1, got {args.min_margin}")
    out = Path(args.json) if args.json else None
    if out is not None:
        if out.is_dir():
            raise AnpredError(f"--json {out}: is a folder; give a file path (e.g. {out / 'align.json'})")
        if not out.parent.is_dir():
            raise AnpredError(f"--json {out}: folder {out.parent} does not exist; nothing was written")
    store = RunStore.open(args.run_dir)
    if store.meta.get("mode", "tensors") != "tensors":
        raise AnpredError(
            f"{args.run_dir}: run mode {store.meta.get('mode')!r} stored no tensors; re-run with tensors to align"
        )
    statuses = store.statuses()
    if args.backends is not None:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        if not backends:
            raise AnpredError(
                f"--backends {args.backends!r} names no backend; this run has: {', '.join(statuses) or '(none)'}"
            )
        unknown = [b for b in backends if b not in statuses]
        if unknown:
            raise AnpredError(
                f"backend(s) {', '.join(unknown)} not in this run; it has: {', '.join(statuses) or '(none)'}"
            )
    else:
        backends = store.ok_backends()
    if not backends:
        raise AnpredError(f"{args.run_dir}: no backend with status ok to align")
    aligner = Aligner(
        store.manifest,
        {b: statuses[b] for b in backends},
        close_tol=args.close_tol,
        min_margin=args.min_margin,
        segment_search=not args.no_segment_search,
    )
    for sid, raw in store.iter_samples(backends):
        aligner.align(sid, raw)
    report = aligner.report()
    if out is not None:
        atomic_write_text(out, report.to_json())
    print(report.format_text())
    return 0
