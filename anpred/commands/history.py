"""Show the precision trend per model and backend from an SQLite history written by
'anpred check --history DB': one line per run (versions, verdict, worst statistic, change)."""

from __future__ import annotations

HELP = "show the trend of verdicts per model and backend from a history database"


def add_arguments(parser):
    parser.add_argument("db", metavar="DB", help="SQLite database written by 'anpred check --history'")
    parser.add_argument("--model", help="only this model (name as recorded)")
    parser.add_argument("--plot", metavar="PNG", help="write a trend plot here (precision and task metrics)")
    parser.add_argument(
        "--since",
        type=int,
        default=None,
        metavar="RUN",
        help="compare each model's latest run with run id RUN (default: the previous run on the "
        "same inputs); a task metric that dropped by more than --margin exits 1",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=None,
        metavar="M",
        help="task-metric drop that counts as a regression (absolute; default 0.01)",
    )


def main(args) -> int:
    from anpred.report.history import (
        DEFAULT_MARGIN,
        format_task_trend,
        format_trend,
        plot_trend,
        task_regressions,
        task_trend,
        trend,
    )

    rows = trend(args.db, args.model)
    print(format_trend(rows))
    trows = task_trend(args.db, args.model)
    if trows:
        print()
        print(format_task_trend(trows))
    if args.plot:
        plot_trend(rows, args.plot, trows)
    margin = DEFAULT_MARGIN if args.margin is None else args.margin
    if margin < 0:
        from anpred.errors import AnpredError

        raise AnpredError(f"--margin must be >= 0 (got {margin:g})")
    regs = task_regressions(trows, args.since, margin)
    for r in regs:
        print(
            f"REGRESSION {r['model']} {r['backend']} {r['metric']}: {r['before']:.4g} -> {r['after']:.4g} "
            f"(-{r['drop']:.4g} > margin {margin:g}; run {r['run']} against run {r['against']})"
        )
    if trows and not regs:
        compared = _compared(trows, args.since)
        print(
            f"no task metric dropped by more than {margin:g}"
            if compared
            else "no task metrics to compare: each model has one run with task metrics on its inputs "
            "(give --since RUN to compare with another)"
        )
    return 1 if regs else 0


def _compared(rows, since) -> bool:
    """Whether some model's latest run had a run to be compared with (``--since`` or the previous one
    on the same inputs)."""
    runs: dict[str, dict[int, str | None]] = {}
    for r in rows:
        runs.setdefault(r.model, {})[r.run_id] = r.inputs_sha256
    for m, rs in runs.items():
        last = max(rs)
        if since is not None and since in rs and since != last:
            return True
        if since is None and any(k < last and v == rs[last] for k, v in rs.items()):
            return True
    return False
