"""Diff two ONNX graphs structurally, or two run folders numerically.

  anpred diff a.onnx b.onnx [--json F] [--html F]
      match nodes (names, then dataflow structure), report nodes only in A / only in B, matched but
      changed nodes (op type, attributes, arity, dtype, shape, constants with max difference),
      fused/split regions and inserted Cast/Q/DQ/Transpose nodes, grouped by ANPRED stage when a
      graph carries an anchor manifest, and where A's anchors are in B.

  anpred diff RUN_A RUN_B [--json F] [--html F] [--config F] [--backends LIST] [--pair X=Y ...]
      compare two run folders anchor by anchor (B against A, samples with identical inputs) with the
      oracle's statistics per backend (stats-mode runs: a lower bound of the nRMSE from the stored
      per-sample summaries); name the first anchor that moved beyond the noise floor, and every
      anchor that could not be compared with its reason. --pair ort=ort-fp16 compares backend ort of
      run A with backend ort-fp16 of run B.

Exit status: 0 no difference (graphs identical / no compared anchor moved), 1 differences found,
2 bad input or nothing comparable (run-only options on two graphs, no anchor compared).
"""

from __future__ import annotations

HELP = "diff two ONNX graphs (structure) or two run folders (numbers, anchor by anchor)"


def add_arguments(parser):
    parser.add_argument("a", metavar="A", help="an .onnx file or a run folder")
    parser.add_argument("b", metavar="B", help="an .onnx file or a run folder (same kind as A)")
    parser.add_argument(
        "--json", metavar="F", help="write the diff as JSON (schema anpred.graphdiff/1 or anpred.rundiff/1)"
    )
    parser.add_argument("--html", metavar="F", help="write the HTML page (stages side by side)")
    parser.add_argument("--config", metavar="F", help="TOML/JSON file overriding the oracle defaults (runs only)")
    parser.add_argument("--backends", metavar="LIST", help="comma-separated backends to compare (runs only)")
    parser.add_argument(
        "--pair",
        metavar="X=Y",
        action="append",
        default=[],
        help="compare backend X of run A with backend Y of run B (repeatable or "
        "comma-separated, e.g. ort=ort-fp16; runs only)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")


def _parse_pairs(items: list[str]) -> dict[str, str]:
    from anpred.errors import AnpredError

    out: dict[str, str] = {}
    for item in (x.strip() for it in items for x in it.split(",")):
        if not item:
            continue
        x, sep, y = item.partition("=")
        if not sep or not x.strip() or not y.strip():
            raise AnpredError(f"--pair expects X=Y (backend of run A = backend of run B), got {item!r}")
        if x.strip() in out:
            raise AnpredError(f"--pair: backend {x.strip()!r} of run A is paired twice")
        out[x.strip()] = y.strip()
    return out


def _write(path, text: str) -> None:
    """Atomic write, then the permissions an ordinary file gets (0666 minus the umask; the
    temporary file behind the atomic write is created 0600)."""
    import os
    from pathlib import Path

    from anpred.onnx_io import atomic_write_text

    atomic_write_text(Path(path), text)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def main(args) -> int:
    import json
    from pathlib import Path

    from anpred.errors import AnpredError
    from anpred.onnx_io import check_writable_dir

    a, b = Path(args.a), Path(args.b)
    for p in (a, b):
        if not p.exists():
            raise AnpredError(f"{p}: no such file or folder")
    if a.is_dir() != b.is_dir():
        raise AnpredError("A and B must both be .onnx files or both be run folders")
    if not a.is_dir():
        given = [o for o, v in (("--config", args.config), ("--backends", args.backends), ("--pair", args.pair)) if v]
        if given:
            raise AnpredError(f"{', '.join(given)} only apply to a diff of two run folders, not of two graphs")
    for out in (args.json, args.html):  # fail before the work, write nothing half-done
        if out:
            check_writable_dir(Path(out))
    graph = runs = None
    if a.is_dir():
        from anpred.defaults import load_config
        from anpred.diff import diff_runs

        backends = [x.strip() for x in args.backends.split(",") if x.strip()] if args.backends else None
        runs = diff_runs(
            a, b, config=load_config(args.config), backends=backends, pairs=_parse_pairs(args.pair) or None
        )
        result, differs = runs, runs.moved
    else:
        from anpred.diff import diff_files

        graph = diff_files(a, b)
        result, differs = graph, not graph.identical
    page = None
    if args.html:
        from anpred.report.diff_html import render_diff_html

        page = render_diff_html(graph=graph, runs=runs, title=f"anpred diff {a.name} {b.name}")
    if args.json:
        from anpred.onnx_io import json_safe

        _write(args.json, json.dumps(json_safe(result.to_dict()), indent=1))
    if page is not None:
        _write(args.html, page)
    if not args.quiet:
        print(result.summary())
    return 1 if differs else 0
