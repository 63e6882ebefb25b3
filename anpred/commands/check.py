"""Judge a run folder: consensus population-deviation oracle (and/or the threshold baseline),
origin stage and propagation per backend; terminal summary, JSON and HTML reports, history.

Exit status: 0 all backends consistent, 1 a backend flagged, 2 bad input (the run cannot be judged;
the reports still say what could not be judged)."""

from __future__ import annotations

HELP = "judge a run folder against the consensus of its backends; write reports"


def add_arguments(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by 'anpred run'")
    parser.add_argument("--report", metavar="HTML", help="write the HTML report (plots embedded) here")
    parser.add_argument("--json", metavar="JSON", help="write the JSON report (schema anpred.check/1) here")
    parser.add_argument("--oracle", choices=("consensus", "threshold", "both"), default="consensus",
                        help="consensus (default), threshold baseline, or both side by side")
    parser.add_argument("--atol", type=float, default=None, help="threshold baseline absolute tolerance (1e-5)")
    parser.add_argument("--rtol", type=float, default=None, help="threshold baseline relative tolerance (1e-5)")
    parser.add_argument("--reference", default=None,
                        help="reference backend (threshold baseline; consensus with fewer than 3 voting families)")
    parser.add_argument("--config", metavar="F", help="TOML/JSON file overriding the oracle defaults")
    parser.add_argument("--history", metavar="DB", help="append the verdict to this SQLite history database")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")


def main(args) -> int:
    import sys

    from anpred.check import check_run
    from anpred.report import format_text, write_html, write_json

    rep = check_run(args.run_dir, oracle=args.oracle, atol=args.atol, rtol=args.rtol,
                    reference=args.reference, config=args.config)
    if args.json:
        write_json(rep, args.json)
    if args.report:
        write_html(rep, args.report)
    if args.history and rep.status != "error":
        from anpred.history import append

        append(args.history, rep)
    if not args.quiet:
        print(format_text(rep))
    if rep.status == "error":
        print(f"anpred: error: {args.run_dir} cannot be judged: " + "; ".join(rep.problems), file=sys.stderr)
    return rep.exit_code
