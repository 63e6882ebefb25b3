"""Run an anchored model on several backends, each in its own process, and store every backend's
anchors (or streaming statistics of them) in a run folder.

Examples:
  anpred run anchored.onnx --backends ort,openvino,torch,tf --inputs photos/ -o runs/yolo
  anpred run anchored.onnx --backends ort,ort-fp16 --inputs random:normal:seed=1:n=200 -o runs/s --mode stats
  anpred run anchored.onnx --backends ort,onnx-reference --inputs x.npz -o runs/r --overwrite

--inputs: a folder (images and/or .npy/.npz files), one .npz/.npy/image file, or
random:uniform|normal|images[:seed=S][:n=N][:shape=1x3x224x224][:dir=DIR].
A backend that fails, crashes, lacks an operator or times out is recorded with its reason; the
others' results are kept. Exit status: 0 when every backend is ok, 1 when some backend is not,
2 on bad input (nothing written). See docs/run.md.
"""

from __future__ import annotations

HELP = "run an anchored model on several backends (isolated processes) and store the anchors"


def add_arguments(parser):
    from anpred.backends import REGISTRY
    from anpred.options import add_memory_bound, add_timeout

    parser.add_argument("model", help="anchored ONNX model (from anpred instrument)")
    parser.add_argument("--backends", "-b", required=True, help="comma-separated backend names: " + ", ".join(REGISTRY))
    parser.add_argument("--inputs", "-i", required=True, help="folder, .npz/.npy/image file, or random:...")
    parser.add_argument("-o", "--output", required=True, help="run folder to create")
    parser.add_argument(
        "--mode",
        choices=("tensors", "stats"),
        default="tensors",
        help="tensors: store every anchor tensor; stats: streaming statistics only",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    add_timeout(parser)
    parser.add_argument(
        "--preprocess",
        choices=("auto", "yolo", "imagenet", "unit"),
        default=None,
        help="image preprocessing (default auto: yolo letterbox for YOLO models, else imagenet)",
    )
    parser.add_argument(
        "--no-precheck",
        action="store_true",
        help="start every backend, even one whose operator table lacks an operator of the model "
        "(default: such a backend is not started, its status is 'unsupported' naming the "
        "operators)",
    )
    add_memory_bound(parser)
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bars")


def main(args) -> int:
    from anpred.backends import parse_backends
    from anpred.run import format_summary, run_model
    from anpred.run.limits import RunGuards, parse_gib

    names = parse_backends(args.backends)
    guards = RunGuards(
        backend_memory=parse_gib(args.memory_bound, "--memory-bound") if args.memory_bound is not None else None
    )
    store = run_model(
        args.model,
        names,
        args.inputs,
        args.output,
        mode=args.mode,
        timeout_s=args.timeout_s,
        overwrite=args.overwrite,
        progress=False if args.quiet else True,
        preprocess=args.preprocess,
        precheck=not args.no_precheck,
        guards=guards,
    )
    if args.quiet:
        print(format_summary(store))
    print(f"run stored in {store.root}")
    return 0 if all(s.status == "ok" for s in store.statuses().values()) else 1
