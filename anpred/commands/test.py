"""Test a model end to end in one command: export (when needed), instrument, map the anchors onto the
native graph, run every backend in its own process, align, judge against the consensus, and write
the report folder (anchored model, manifest, run store, report.json, report.html). Prints where each
backend stands, the verdict table and the report's path.

MODEL is an .onnx file, a zoo name (`anpred zoo` lists them), a factory module:function returning
(torch.nn.Module or keras.Model, example_inputs), or `demo` (the trained YOLOv8n-DocLayNet on a
rendered page and ultralytics' two photographs, and the trained PP-OCRv4 detector on rendered pages).

Defaults: backends ort, openvino, torch, mnn, ncnn (five fp32 families, the quickest by measured cost),
+ torch-native for PyTorch origin, tf-native for Keras origin; a default backend that is not installed
or whose operator table lacks an operator of the model is skipped with its reason. --precision fp16,int8
adds the reduced-precision populations (one converted model per precision, several implementations,
each judged against the fp32 consensus and against its population); --all runs every fp32 family
(also tf, tvm, litert) and both populations. Inputs: a zoo model's real images, ultralytics'
photographs (seeded crops) for other image models, seeded uniform arrays otherwise.

Witnesses: when the backends under test give fewer than three voting fp32 families (-b ort,openvino),
the cheapest installed independent families that take the model (by the cost measured on this
machine) join as witnesses, with the float64 arbiter onnx-reference-fp64, so that both are judged
against a real consensus; the report lists them apart, and a witness's verdict does not change the
status. --no-witnesses: none (one of the two is then the reference, not judged).

Shapes: given .npz/.npy inputs fix the model's dynamic dimensions (batch included); samples of
several shapes run in shape buckets (one converted model per shape set) and are judged together;
--input-shapes ids:1x45 states them without inputs.

examples:
  anpred test demo -o out/demo --overwrite
  anpred test yolov8n --imgsz 320 -o out/yolov8n
  anpred test model.onnx -b ort,openvino -o out/m
  anpred test model.onnx --backends ort,openvino,torch --inputs random:normal:n=5 -o out/m
  anpred test text.onnx -b ort,openvino --inputs sentences/ -o out/text
  anpred test yolov8n --precision fp16,int8 -o out/yolov8n-lowp
  anpred test mypkg.nets:small_cnn --samples 4 -o out/cnn --history history.sqlite
  anpred test silero_vad.onnx --bind sr=16000 -o out/vad

--bind NAME=VALUE fixes a configuration input (a sample rate, a mode flag) to a constant before
instrumentation: the If nodes it decides are inlined, so anchors reach the network inside them, and
the samples no longer feed it. VALUE is JSON (16000, 0.5, true, [1,2]); repeat for several inputs.
Zoo models bind their own configuration inputs (silero-vad: sr=16000).

Exit status: 0 every backend consistent, 1 a backend flagged or something not judged (a backend that
failed, unaligned anchors; 0 with --allow-incomplete), 2 bad input (unknown model, unreadable file,
bad option, a single backend, a native backend that does not fit the model: one line on stderr,
nothing written) or a run that cannot be judged.
"""

from __future__ import annotations

HELP = "one shot: export, instrument, map, run, align, judge and report a model (or `demo`)"


def add_arguments(parser):
    from anpred.options import JudgeOptions, OutputOptions, RunOptions, StreamOptions, add_memory_bound

    parser.add_argument(
        "model", metavar="MODEL", help="an .onnx file, a zoo name, a factory module:function, or 'demo'"
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        default=None,
        help="report folder to create (default anpred-test/<model>, anpred-demo for the demo)",
    )
    parser.add_argument(
        "--inputs",
        "-i",
        metavar="SPEC",
        default=None,
        help="image folder/file, .npz/.npy, or random:uniform|normal|images[:seed=S][:n=N]",
    )
    parser.add_argument(
        "--input-shapes",
        metavar="NAME:DIMS,...",
        default=None,
        help="the dynamic input dimensions, batch included, e.g. ids:1x45,mask:1x45 (default: from "
        "the given .npz/.npy inputs, else batch 1 and --imgsz)",
    )
    parser.add_argument(
        "--samples", "-n", type=int, default=None, metavar="N", help="number of generated or real samples (default 3)"
    )
    parser.add_argument("--stages", type=int, default=None, metavar="K", help="number of stages (default ~8)")
    parser.add_argument(
        "--max-cut-width", type=int, default=4, metavar="W", help="most tensors per stage boundary (default 4)"
    )
    parser.add_argument(
        "--imgsz",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="input size N or H W (resizable zoo models, dynamic image inputs; default 640)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of generated inputs and seeded zoo weights")
    parser.add_argument(
        "--bind",
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="bind a configuration input to a constant (JSON value, e.g. sr=16000); repeatable",
    )
    parser.add_argument("--kwargs", metavar="JSON", default=None, help="keyword arguments for a factory, as JSON")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier test (or demo) in OUT, once the new one is complete",
    )
    OutputOptions.add_arguments(parser, quiet_help="no progress output", explorer_into="OUT/model-explorer")
    add_memory_bound(parser)
    RunOptions.add_arguments(parser)
    JudgeOptions.add_arguments(
        parser,
        task_help="task metrics against the consensus: detect | classify | dense | "
        "module:function | none (default: the zoo entry's task)",
    )
    StreamOptions.add_arguments(parser)


def _imgsz(values):
    from anpred.errors import AnpredError

    if not values:
        return None
    if len(values) > 2:
        raise AnpredError(f"--imgsz takes N or H W, got {len(values)} numbers")
    return values[0] if len(values) == 1 else tuple(values)


def _kwargs(text):
    import json

    from anpred.errors import AnpredError

    if not text:
        return None
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as err:
        raise AnpredError(f"--kwargs is not valid JSON: {err}") from err
    if not isinstance(kwargs, dict):
        raise AnpredError("--kwargs must be a JSON object")
    return kwargs


def options(args):
    """The :class:`anpred.options.TestOptions` of the parsed command line."""
    from anpred.options import (
        InputOptions,
        JudgeOptions,
        ModelOptions,
        OutputOptions,
        RunOptions,
        StreamOptions,
        TestOptions,
    )

    return TestOptions(
        judge=JudgeOptions.from_args(args),
        run=RunOptions.from_args(args),
        build=ModelOptions(
            imgsz=_imgsz(args.imgsz),
            seed=args.seed,
            factory_kwargs=_kwargs(args.kwargs),
            bind=args.bind,
            stages=args.stages,
            max_cut_width=args.max_cut_width,
        ),
        feed=InputOptions(inputs=args.inputs, samples=args.samples, input_shapes=args.input_shapes),
        output=OutputOptions.from_args(args),
        stream=StreamOptions.from_args(args),
    )


def _demo(args) -> int:
    from anpred.errors import AnpredError
    from anpred.pipeline import demo, format_standing

    for opt in (
        "inputs",
        "kwargs",
        "history",
        "imgsz",
        "bind",
        "task",
        "labels",
        "stream",
        "input_shapes",
        "atol",
        "rtol",
        "reference",
        "config",
    ):
        if getattr(args, opt):
            raise AnpredError(f"--{opt.replace('_', '-')} does not apply to the demo")
    opts = options(args)
    res = demo(
        args.output or "anpred-demo",
        run=opts.run,
        judge=opts.judge,
        samples=args.samples,
        stages=args.stages,
        overwrite=args.overwrite,
        quiet=args.quiet,
    )
    for r in res.results:
        print(f"== {r.model}: {r.status.upper()}")
        print(r.format_text())
        print()
    print("where each backend stands:")
    print(format_standing(res.results))
    print(f"\ndemo finished in {res.seconds:.0f} s; reports: " + ", ".join(str(r.report_html) for r in res.results))
    return res.exit_code


def main(args) -> int:
    from anpred.pipeline import format_standing, test

    if args.memory_bound is not None:  # every run of this process (the test's, its drill-down's, a stream's)
        import os

        from anpred.run.limits import MEMORY_ENV, parse_gib

        parse_gib(args.memory_bound, "--memory-bound")
        os.environ[MEMORY_ENV] = str(args.memory_bound)

    if args.model == "demo":
        return _demo(args)
    opts = options(args)
    if args.model_explorer and args.output:  # before any work: OUT/model-explorer must be writable
        from pathlib import Path

        from anpred.report.model_explorer import check_export_folder

        check_export_folder(Path(args.output) / "model-explorer")
    res = test(
        args.model,
        args.output,
        judge=opts.judge,
        run=opts.run,
        build=opts.build,
        feed=opts.feed,
        output=opts.output,
        stream=opts.stream,
    )
    print(res.format_text())
    print("\nwhere each backend stands:")
    print(format_standing([res]))
    if args.model_explorer and res.report.status != "error":
        from anpred.report.model_explorer import export_model_explorer

        me = export_model_explorer(res.report, res.anchored, res.out / "model-explorer")
        print(f"\nModel Explorer: {me['command']}")
    return res.exit_code
