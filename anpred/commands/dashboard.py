"""Write the dashboard over one or more history databases ('anpred check/test --history', a
campaign's OUT/history.sqlite): a static, self-contained site (SITE/index.html, nothing fetched from
the network) with a grid of models x backends, each cell the latest verdict with a sparkline of its
trend (nRMSE at the origin anchor, the task metric where there is one) and the runtime versions on
its time axis; regressions marked (a verdict changed, or a task metric fell by more than --margin
against the previous run on the same inputs) with the first bad version where a bisection found it
and the culprit operator where the drill-down named one; every cell linked to its report; filters
by model, backend, precision and library version. docs/dashboard.md.

examples:
  anpred dashboard history.sqlite -o site/
  anpred dashboard out/campaign/history.sqlite out/bisect/history.sqlite -o site/ --serve
"""

from __future__ import annotations

HELP = "write a static dashboard site (models x backends, trends, regressions) over history databases"


def add_arguments(parser):
    parser.add_argument("db", metavar="DB", nargs="+", help="SQLite history database(s)")
    parser.add_argument("-o", "--output", metavar="SITE", required=True, help="site folder to write (index.html)")
    parser.add_argument(
        "--margin",
        type=float,
        default=None,
        metavar="M",
        help="task-metric drop that counts as a regression (absolute; default 0.01, as anpred history)",
    )
    parser.add_argument("--campaign", default=None, metavar="NAME", help="only the runs of this campaign")
    parser.add_argument("--title", default=None, help="the page's title (default: ANPRED dashboard)")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="then serve SITE and the reports it links (their common folder) on 127.0.0.1 until Ctrl-C",
    )
    parser.add_argument(
        "--port", type=int, default=8000, metavar="N", help="with --serve: the port (default 8000; 0: any)"
    )


def main(args) -> int:
    import sys
    import time

    from anpred.dashboard import SiteOptions, collect, write_site
    from anpred.report.history import DEFAULT_MARGIN

    t0 = time.perf_counter()
    hist = collect(
        list(dict.fromkeys(args.db)),
        margin=DEFAULT_MARGIN if args.margin is None else args.margin,
        campaign=args.campaign,
    )
    page = write_site(hist, args.output, SiteOptions(title=args.title or "ANPRED dashboard"))
    print(f"dashboard: {page} ({page.stat().st_size / 1e6:.2f} MB, {time.perf_counter() - t0:.1f} s)")
    if not hist.runs:
        print(
            f"anpred: note: {', '.join(args.db)} hold(s) no run"
            + (f" of campaign {args.campaign!r}" if args.campaign else "")
            + ": the grid is empty (runs are added by 'anpred test/check --history DB' or a campaign)",
            file=sys.stderr,
        )
    if args.serve:
        from anpred.dashboard.serve import serve

        serve(args.output, args.port, ready=lambda url: print(f"serving {url} (Ctrl-C stops)", flush=True))
    return 0
