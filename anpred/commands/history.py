"""Show the precision trend per model and backend from an SQLite history written by
'anpred check --history DB': one line per run (versions, verdict, worst statistic, change)."""

from __future__ import annotations

HELP = "show the trend of verdicts per model and backend from a history database"


def add_arguments(parser):
    parser.add_argument("db", metavar="DB", help="SQLite database written by 'anpred check --history'")
    parser.add_argument("--model", help="only this model (name as recorded)")
    parser.add_argument("--plot", metavar="PNG", help="write a trend plot here")


def main(args) -> int:
    from anpred.history import format_trend, plot_trend, trend

    rows = trend(args.db, args.model)
    print(format_trend(rows))
    if args.plot:
        plot_trend(rows, args.plot)
    return 0
