"""Run a campaign: the models x backend sets x input sets x runtime versions of a campaign file, each
configuration an `anpred test`, on Ray (an embedded local Ray by default; --address joins a cluster).
Writes OUT/configs/<id>/ (one report folder per configuration, committed atomically), OUT/history.sqlite
(one run per configuration), OUT/campaign.json, OUT/summary.txt and OUT/index.html (models x backends:
verdict, origin stage, task impact; per runtime version what changed). A re-run skips the
configurations already complete (resume). File format: docs/campaigns.md.

examples:
  anpred campaign campaign.toml -o out/campaign
  anpred campaign campaign.toml -o out/campaign --address auto          # an existing Ray cluster
  anpred campaign campaign.toml -o out/campaign --list                  # the configurations, nothing run
  anpred campaign campaign.toml -o out/bisect --bisect onnxruntime --model yolov8n --backend ort \\
      --good 1.20.0 --bad 1.32.0

Exit status: 0 every configuration complete and consistent; 1 a configuration failed, or a backend
flagged or not judged (bisect: 0 when a first deviating version was found); 2 bad input.
"""

from __future__ import annotations

HELP = "run a campaign of models x backends x inputs x runtime versions on Ray, with resume and bisection"


def add_arguments(parser):
    from anpred.options import add_memory_bound

    parser.add_argument("file", metavar="CAMPAIGN", help="campaign file (TOML, docs/campaigns.md)")
    parser.add_argument("-o", "--output", metavar="OUT", required=True, help="campaign output folder")
    parser.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="join this Ray cluster (auto, host:port, ray://host:port); default: an embedded local Ray",
    )
    parser.add_argument("--cpus", type=int, default=None, metavar="N", help="CPUs of the embedded Ray (default: all)")
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        metavar="N",
        help="configurations per warm-worker batch task (overrides [campaign] batch; 0: one task "
        "per backend run; default: up to 8, fewer to fill the CPUs)",
    )
    parser.add_argument("--list", action="store_true", help="print the configurations and exit")
    parser.add_argument(
        "--bisect",
        metavar="PACKAGE",
        default=None,
        help="bisect the releases of PACKAGE between --good and --bad for --model",
    )
    parser.add_argument("--model", default=None, help="with --bisect: the model (its label in the campaign)")
    parser.add_argument("--backend", default=None, help="with --bisect: the backend whose verdict changes")
    parser.add_argument("--good", default=None, help="with --bisect: a version where the backend is consistent")
    parser.add_argument("--bad", default=None, help="with --bisect: a later version where it deviates")
    parser.add_argument(
        "--versions",
        default=None,
        metavar="LIST",
        help="with --bisect: the candidate versions, comma-separated (default: pip index versions)",
    )
    add_memory_bound(
        parser, detail=" (overrides the file's [campaign] memory_bound; default: 80%% of each node's available memory)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def main(args) -> int:
    from anpred.campaign import load_campaign, run_campaign
    from anpred.campaign.summary import format_table
    from anpred.errors import AnpredError

    campaign = load_campaign(args.file)
    if args.memory_bound is not None:
        from anpred.run.limits import parse_gib

        parse_gib(args.memory_bound, "--memory-bound")  # a malformed value fails before Ray starts
        campaign.memory_bound_gb = float(args.memory_bound)
    if args.batch is not None:
        if args.batch < 0:
            raise AnpredError(f"--batch must be >= 0 (got {args.batch})")
        campaign.batch = args.batch
    if args.list:
        for c in campaign.configurations:
            print(f"{c.id}  {c.model}  [{','.join(c.backends)}]  {c.versions or ''}")
        return 0
    if args.bisect:
        from anpred.campaign.bisect import BisectRequest, bisect_versions, format_bisection

        for opt in ("model", "backend", "good", "bad"):
            if not getattr(args, opt):
                raise AnpredError(f"--bisect needs --{opt}")
        versions = [v.strip() for v in args.versions.split(",")] if args.versions else None
        req = BisectRequest(
            package=args.bisect, model=args.model, backend=args.backend, good=args.good, bad=args.bad, versions=versions
        )
        res = bisect_versions(
            campaign, args.output, req, address=args.address, num_cpus=args.cpus, progress=not args.quiet
        )
        print(format_bisection(res))
        return 0 if res.get("first_bad") else 1
    res = run_campaign(campaign, args.output, address=args.address, num_cpus=args.cpus, progress=not args.quiet)
    print(format_table(res.records))
    print(
        f"\n{len(res.records) - len(res.failed)} of {len(campaign.configurations)} configurations complete, "
        f"{len(res.failed)} failed; {len(res.ran)} run now, {len(res.skipped)} found complete; "
        f"{res.seconds:.0f} s; summary: {res.out / 'index.html'}"
    )
    return res.exit_code
