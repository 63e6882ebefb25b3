"""Judge a run folder: consensus population-deviation oracle (and/or the threshold baseline),
origin stage and propagation per backend; terminal summary, JSON and HTML reports, history.

Exit status: 0 every backend judged at every anchor on every sample and consistent; 1 a backend
flagged, or the verdict INCOMPLETE (nothing flagged, but something could not be judged: a backend
that did not run, an anchor missing or unaligned, samples missing; each gap is printed; exit 0
instead with --allow-incomplete); 2 bad input (the run cannot be judged, unreadable run data or
config; the reports still say what could not be judged); 3 internal error.

Reduced precision (fp16, bf16, int8): the backends that computed the same reduced model form a
population (families counted as for fp32). Each gets two verdicts: budget, against the fp32
consensus, flagged above 10 x the median deviation of the population's other families (what the
precision costs on this run) or where it carries none of the fp32 signal (cosine <= 0 or nRMSE >= 1)
while the fp32 voters agree on it;
implementation, against its population's own consensus, flagged above population_k (10) x its
peers' spread and above sqrt(2) x the precision's own cost at that anchor. Floors come from the model: one
rounding in the precision's natural unit (an int8 quantization step / sqrt(12), relative; float16 /
bfloat16 unit roundoff / sqrt(3)); a population of one falls back to the measured constant floor of
its precision; a float16 tensor of the model itself is judged on float16's scale. Each cell's basis
is in the JSON report. Non-finite values are voted on: where most families return NaN (or the same
Inf) that is the consensus, and a backend returning a finite value there is flagged (NaN
suppressed); ties are undecided.
Sources and measurements: docs/oracle.md."""

from __future__ import annotations

HELP = "judge a run folder against the consensus of its backends; write reports"


def add_arguments(parser):
    from anpred.options import JudgeOptions, OutputOptions

    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by 'anpred run'")
    parser.add_argument("--report", metavar="HTML", help="write the HTML report (plots embedded) here")
    parser.add_argument("--json", metavar="JSON", help="write the JSON report (schema anpred.check/1) here")
    OutputOptions.add_arguments(parser, quiet_help="print nothing but errors")
    JudgeOptions.add_arguments(parser)
    parser.add_argument(
        "--task-layout",
        default=None,
        choices=("yolov8", "yolov5"),
        help="detector output layout for --task detect (default yolov8)",
    )
    parser.add_argument(
        "--task-output", default=None, metavar="NAME", help="the output the task reads (several outputs)"
    )


def main(args) -> int:
    import sys
    from pathlib import Path

    from anpred.judge import check_run
    from anpred.options import JudgeOptions
    from anpred.report import format_text, write_html, write_json

    judge = JudgeOptions.from_args(args)
    judge.validate()
    if args.model_explorer:  # before any work: a bad DIR costs nothing
        from anpred.report.model_explorer import check_export_folder

        check_export_folder(args.model_explorer)
    rep = check_run(args.run_dir, **judge.check_kwargs())
    if args.task and rep.status != "error":
        from anpred.task import load_adapter, task_impact

        rep.task = task_impact(
            args.run_dir,
            load_adapter(args.task, layout=args.task_layout, output=args.task_output),
            labels=args.labels,
            config=args.config,
        )
    elif args.labels:
        from anpred.errors import AnpredError

        raise AnpredError("--labels needs --task")
    if args.drill and rep.status != "error" and rep.oracle in ("consensus", "both"):
        from anpred.drill import drill_run

        drill_run(args.run_dir, rep, progress=not args.quiet)
    if args.json:
        write_json(rep, args.json)
    if args.report:
        write_html(rep, args.report)
    if args.history and rep.status != "error":
        from anpred.report.history import append

        append(args.history, rep, report_html=args.report)
    elif args.history:
        print(
            f"anpred: history: {args.history} not appended: the run could not be judged (status error)", file=sys.stderr
        )
    if args.model_explorer and rep.status != "error":  # after the history: an export failure loses no verdict
        from anpred.report.model_explorer import export_model_explorer

        export_model_explorer(rep, Path(args.run_dir) / "model.onnx", args.model_explorer)
    if not args.quiet:
        print(format_text(rep))
    if rep.status == "error":
        print(f"anpred: error: {args.run_dir} cannot be judged: " + "; ".join(rep.problems), file=sys.stderr)
    elif rep.status == "incomplete":
        print(
            f"anpred: {args.run_dir}: INCOMPLETE: nothing flagged, but {len(rep.incomplete)} thing(s) could not "
            f"be judged (listed above){'; --allow-incomplete: exit 0' if args.allow_incomplete else ''}",
            file=sys.stderr,
        )
    return rep.exit_code
