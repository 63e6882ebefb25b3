"""Write the findings ledger (docs/findings.md) from a findings folder of committed files: conformance
results (*.conformance.json), one repro case per defect (repros/), their re-run (confirm.json) and
the notes (notes.json: tracker search, first bad release, cause). See anpred/conformance/findings.py.

examples:
  anpred findings benchmarks/results/findings -o docs/findings.md                     # render only
  anpred findings benchmarks/results/findings --extract --cases-from CASES_FOLDER     # defects + repros
  anpred findings benchmarks/results/findings --confirm                               # re-run the repros

Exit status: 0 written; 2 bad input.
"""

from __future__ import annotations

HELP = "write the findings ledger (docs/findings.md) from committed conformance results, repros and notes"


def add_arguments(parser):
    parser.add_argument("folder", metavar="FOLDER", help="the findings folder (benchmarks/results/findings)")
    parser.add_argument("-o", "--output", metavar="FILE", default=None, help="write the ledger here (Markdown)")
    parser.add_argument(
        "--extract",
        action="store_true",
        help="derive the defects from FOLDER/*.conformance.json and copy each defect's repro case",
    )
    parser.add_argument(
        "--cases-from",
        default=None,
        metavar="DIRS",
        help="with --extract: comma-separated case folders to copy repros from (default: the node suite)",
    )
    parser.add_argument("--confirm", action="store_true", help="re-run every repro on the backends of the results")
    parser.add_argument("--backends", default=None, metavar="LIST", help="with --confirm (default: the fp32 backends)")


def main(args) -> int:
    from pathlib import Path

    from anpred.conformance.findings import confirm, extract, render
    from anpred.errors import AnpredError

    folder = Path(args.folder)
    if not folder.is_dir():
        raise AnpredError(f"findings: no folder {folder}")
    if args.extract:
        from anpred.conformance.cases import default_folder

        roots = [Path(p) for p in args.cases_from.split(",")] if args.cases_from else [default_folder()]
        files = sorted(folder.glob("*.conformance.json"))
        if not files:
            raise AnpredError(f"findings: no *.conformance.json in {folder}")
        d = extract(files, folder, roots)
        print(f"{len(d)} defect entries written to {folder / 'defects.json'}")
    if args.confirm:
        from anpred.conformance.suite import FP32_BACKENDS

        backends = args.backends.split(",") if args.backends else list(FP32_BACKENDS)
        doc = confirm(folder, backends)
        print(f"{sum(1 for v in doc['defects'].values() if v['confirmed'])} of {len(doc['defects'])} defects confirmed")
    if args.output:
        if not (folder / "defects.json").is_file():
            raise AnpredError(f"findings: {folder / 'defects.json'} is missing (run with --extract first)")
        Path(args.output).write_text(render(folder))
        print(f"written: {args.output}")
    return 0
