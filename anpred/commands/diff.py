"""Diff two ONNX graphs structurally, or two run folders numerically.

  anpred diff a.onnx b.onnx [--json F] [--html F]
      match nodes (names, then dataflow structure), report nodes only in A / only in B, matched but
      changed nodes (op type, attributes, arity, dtype, shape, constants with max difference),
      fused/split regions and inserted Cast/Q/DQ/Transpose nodes, grouped by ANPRED stage when a
      graph carries an anchor manifest, and where A's anchors are in B.

  anpred diff RUN_A RUN_B [--json F] [--html F]
      compare two run folders anchor by anchor (B against A, samples with identical inputs) with the
      oracle's statistics per backend; name the first anchor that moved beyond the noise floor.

Exit status: 0 no difference (graphs identical / no anchor moved), 1 differences found, 2 bad input.
"""

from __future__ import annotations

HELP = "diff two ONNX graphs (structure) or two run folders (numbers, anchor by anchor)"


def add_arguments(parser):
    parser.add_argument("a", metavar="A", help="an .onnx file or a run folder")
    parser.add_argument("b", metavar="B", help="an .onnx file or a run folder (same kind as A)")
    parser.add_argument("--json", metavar="F", help="write the diff as JSON (schema anpred.graphdiff/1 or anpred.rundiff/1)")
    parser.add_argument("--html", metavar="F", help="write the HTML page (stages side by side)")
    parser.add_argument("--config", metavar="F", help="TOML/JSON file overriding the oracle defaults (runs only)")
    parser.add_argument("--backends", metavar="LIST", help="comma-separated backends to compare (runs only)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")


def _clean(o):
    """JSON has no NaN/Inf: encode them as strings (as anpred.stats does)."""
    import math

    if isinstance(o, float) and not math.isfinite(o):
        return "nan" if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def main(args) -> int:
    import json
    from pathlib import Path

    from anpred.errors import AnpredError
    from anpred.onnx_io import _check_writable_dir, atomic_write_text

    a, b = Path(args.a), Path(args.b)
    for p in (a, b):
        if not p.exists():
            raise AnpredError(f"{p}: no such file or folder")
    if a.is_dir() != b.is_dir():
        raise AnpredError("A and B must both be .onnx files or both be run folders")
    for out in (args.json, args.html):  # fail before the work, write nothing half-done
        if out:
            _check_writable_dir(Path(out))
    graph = runs = None
    if a.is_dir():
        from anpred.defaults import load_config
        from anpred.rundiff import diff_runs

        backends = [x.strip() for x in args.backends.split(",") if x.strip()] if args.backends else None
        runs = diff_runs(a, b, config=load_config(args.config), backends=backends)
        result, differs = runs, runs.moved
    else:
        from anpred.graphdiff import diff_files

        graph = diff_files(a, b)
        result, differs = graph, not graph.identical
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(_clean(result.to_dict()), indent=1))
    if args.html:
        from anpred.report.diff_html import write_diff_html

        write_diff_html(args.html, graph=graph, runs=runs, title=f"anpred diff {a.name} {b.name}")
    if not args.quiet:
        print(result.summary())
    return 1 if differs else 0
