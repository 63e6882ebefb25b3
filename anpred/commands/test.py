"""Test a model end to end in one command: export (when needed), instrument, map the anchors onto the
native graph, run every backend in its own process, align, judge against the consensus, and write
the report folder (anchored model, manifest, run store, report.json, report.html). Prints where each
backend stands, the verdict table and the report's path.

MODEL is an .onnx file, a zoo name (`anpred zoo` lists them), a factory module:function returning
(torch.nn.Module or keras.Model, example_inputs), or `demo` (the trained YOLOv8n-DocLayNet on a
rendered page and ultralytics' two photographs, and the trained PP-OCRv4 detector on rendered pages).

Defaults: backends ort, openvino, torch, tf, tvm, mnn, ncnn, litert (fp32 voters), the fp16 population ort-fp16,
ort-fp16-noopt, openvino-fp16, torch-fp16 and the int8 population ort-int8, ort-int8-noopt,
openvino-int8, onnx-reference-int8 (one converted model per precision, cached; each member judged
against the fp32 consensus and against its population), + torch-native for PyTorch origin, tf-native
for Keras origin; inputs: a zoo model's real images, ultralytics' photographs (seeded
crops) for other image models, seeded uniform arrays otherwise. Add onnx-reference-fp64 (a float64
execution: it never votes) to let it arbitrate where a majority of the voters shares one error.

examples:
  anpred test demo -o out/demo --overwrite
  anpred test yolov8n --imgsz 320 -o out/yolov8n
  anpred test model.onnx --backends ort,openvino,torch --inputs random:normal:n=5 -o out/m
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
    parser.add_argument("model", metavar="MODEL",
                        help="an .onnx file, a zoo name, a factory module:function, or 'demo'")
    parser.add_argument("-o", "--output", metavar="OUT", default=None,
                        help="report folder to create (default anpred-test/<model>, anpred-demo for the demo)")
    parser.add_argument("--backends", "-b", metavar="LIST", default=None,
                        help="comma-separated backends (default: all that apply to the model's origin)")
    parser.add_argument("--inputs", "-i", metavar="SPEC", default=None,
                        help="image folder/file, .npz/.npy, or random:uniform|normal|images[:seed=S][:n=N]")
    parser.add_argument("--samples", "-n", type=int, default=None, metavar="N",
                        help="number of generated or real samples (default 3)")
    parser.add_argument("--stages", type=int, default=None, metavar="K", help="number of stages (default ~8)")
    parser.add_argument("--max-cut-width", type=int, default=4, metavar="W",
                        help="most tensors per stage boundary (default 4)")
    parser.add_argument("--imgsz", type=int, nargs="+", default=None, metavar="N",
                        help="input size N or H W (resizable zoo models, dynamic ONNX inputs; default 640)")
    parser.add_argument("--seed", type=int, default=0, help="seed of generated inputs and seeded zoo weights")
    parser.add_argument("--bind", action="append", default=None, metavar="NAME=VALUE",
                        help="bind a configuration input to a constant (JSON value, e.g. sr=16000); repeatable")
    parser.add_argument("--kwargs", metavar="JSON", default=None, help="keyword arguments for a factory, as JSON")
    parser.add_argument("--oracle", choices=("consensus", "threshold", "both"), default="consensus",
                        help="consensus (default), threshold baseline, or both")
    parser.add_argument("--config", metavar="F", default=None, help="TOML/JSON file overriding the oracle defaults")
    parser.add_argument("--history", metavar="DB", default=None, help="append the verdict to this SQLite database")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="exit 0 when nothing is flagged but something could not be judged (e.g. a failed backend)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S",
                        help="seconds per backend for preparing and running (default 600)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier test (or demo) in OUT, once the new one is complete")
    parser.add_argument("--drill", action="store_true",
                        help="replay each stage alone from the consensus and drill each flagged backend down to "
                        "the operator, with a standalone repro (OUT/drill/repro/<backend>)")
    parser.add_argument("--task", default=None, metavar="TASK",
                        help="task metrics against the consensus: detect | classify | dense | module:function | none "
                        "(default: the zoo entry's task)")
    parser.add_argument("--labels", default=None, metavar="FILE",
                        help="ground truth for --task: class indices (.json/.txt/'folders') or COCO JSON")
    parser.add_argument("--stream", action="store_true",
                        help="run --inputs (a folder, 1000+ inputs) as a dataset: chunks judged as they come, memory "
                        "flat, only the most deviating samples kept on disk")
    parser.add_argument("--chunk", type=int, default=None, metavar="N",
                        help="samples per chunk with --stream (default: 1 GiB of anchor tensors, at most 64; where "
                             "anchors are sampled, the chunks after the first hold 4x as many, at most 64)")
    parser.add_argument("--keep", type=int, default=4, metavar="K",
                        help="most deviating samples kept per backend with --stream (4)")
    parser.add_argument("--side-by-side", action="store_true",
                        help="with --stream: the backends of a chunk run at once, each in its own long-lived worker, "
                        "the cores divided among them (a backend's threads: cores // backends, at least 1; default: "
                        "one after the other, each with its library's default threads; docs/task.md)")
    parser.add_argument("--positions", type=int, default=None, metavar="K",
                        help="with --stream: judge each intermediate anchor of more than K elements on K sampled "
                        "positions, stored so by the workers (default 65536; 0: every element; docs/task.md)")
    parser.add_argument("--resume", action="store_true",
                        help="with --stream: continue the interrupted streamed run of the same command from its "
                        "checkpoint (.<out name>.stream beside -o), skipping the samples it had judged")
    parser.add_argument("--model-explorer", action="store_true",
                        help="export per-node data for Model Explorer (and Netron metadata) into OUT/model-explorer "
                        "(docs/dashboard.md)")
    parser.add_argument("--memory-bound", type=float, default=None, metavar="GIB",
                        help="GiB of resident memory each backend worker may hold; one that passes it is stopped and "
                             "'failed' (default: 80%% of the memory available at the start; docs/run.md)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def _imgsz(values):
    from anpred.errors import AnpredError

    if not values:
        return None
    if len(values) > 2:
        raise AnpredError(f"--imgsz takes N or H W, got {len(values)} numbers")
    return values[0] if len(values) == 1 else tuple(values)


def main(args) -> int:
    import json

    from anpred.errors import AnpredError
    from anpred.pipeline import demo, format_standing, test

    if args.memory_bound is not None:  # every run of this process (the test's, its drill-down's, a stream's)
        import os

        from anpred.run.limits import MEMORY_ENV, parse_gib

        parse_gib(args.memory_bound, "--memory-bound")
        os.environ[MEMORY_ENV] = str(args.memory_bound)

    if args.model == "demo":
        for opt in ("inputs", "kwargs", "history", "imgsz", "bind", "task", "labels", "stream"):
            if getattr(args, opt):
                raise AnpredError(f"--{opt} does not apply to the demo")
        res = demo(args.output or "anpred-demo", backends=args.backends, samples=args.samples, stages=args.stages,
                   overwrite=args.overwrite, quiet=args.quiet, allow_incomplete=args.allow_incomplete,
                   timeout_s=args.timeout, drill=args.drill)
        for r in res.results:
            print(f"== {r.model}: {r.status.upper()}")
            print(r.format_text())
            print()
        print("where each backend stands:")
        print(format_standing(res.results))
        print(f"\ndemo finished in {res.seconds:.0f} s; reports: " +
              ", ".join(str(r.report_html) for r in res.results))
        return res.exit_code
    kwargs = None
    if args.kwargs:
        try:
            kwargs = json.loads(args.kwargs)
        except json.JSONDecodeError as err:
            raise AnpredError(f"--kwargs is not valid JSON: {err}") from err
        if not isinstance(kwargs, dict):
            raise AnpredError("--kwargs must be a JSON object")
    if args.model_explorer and args.output:  # before any work: OUT/model-explorer must be writable
        from pathlib import Path

        from anpred.report.model_explorer import check_export_folder

        check_export_folder(Path(args.output) / "model-explorer")
    res = test(args.model, out=args.output, backends=args.backends, inputs=args.inputs, samples=args.samples,
               stages=args.stages, max_cut_width=args.max_cut_width, imgsz=_imgsz(args.imgsz), seed=args.seed,
               factory_kwargs=kwargs, oracle=args.oracle, config=args.config, history=args.history,
               allow_incomplete=args.allow_incomplete, timeout_s=args.timeout, overwrite=args.overwrite,
               quiet=args.quiet, bind=args.bind, drill=args.drill, task=args.task, labels=args.labels,
               stream=args.stream, chunk=args.chunk, keep=args.keep, side_by_side=args.side_by_side,
               positions=args.positions, resume=args.resume)
    print(res.format_text())
    print("\nwhere each backend stands:")
    print(format_standing([res]))
    if args.model_explorer and res.report.status != "error":
        from anpred.report.model_explorer import export_model_explorer

        me = export_model_explorer(res.report, res.anchored, res.out / "model-explorer")
        print(f"\nModel Explorer: {me['command']}")
    return res.exit_code
