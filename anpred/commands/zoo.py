"""List the model zoo: every model with its origin (torch / tf / onnx), ONNX inputs (NCHW shape of an
image model; name, shape and dtype of each input otherwise),
whether its weights are trained or seeded, and its task. With a NAME, show that model's details; with
``--onnx``, print the path of its ONNX file (exported once and cached for torch/Keras models).

Examples:
  anpred zoo
  anpred zoo yolov8n-doclaynet
  anpred zoo yolov5n --imgsz 320 --onnx
"""

from __future__ import annotations

HELP = "list the model zoo (origin, input shape, trained or seeded); print a model's ONNX path"


def add_arguments(parser):
    parser.add_argument("name", nargs="?", metavar="NAME", help="a zoo model: show its details")
    parser.add_argument("--imgsz", type=int, nargs="+", metavar="N", help="input size: N or H W (resizable models)")
    parser.add_argument(
        "--onnx", action="store_true", help="print the model's ONNX file path (builds/exports if needed)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def main(args) -> int:
    import json

    import models
    from anpred.errors import AnpredError

    imgsz = None
    if args.imgsz:
        if len(args.imgsz) > 2:
            raise AnpredError(f"--imgsz takes N or H W, got {len(args.imgsz)} numbers")
        imgsz = args.imgsz[0] if len(args.imgsz) == 1 else tuple(args.imgsz)
    if args.name is None:
        if args.onnx:
            raise AnpredError("--onnx needs a model NAME")
        zms = [models.get(n, imgsz=imgsz if models.REGISTRY[n].resizable else None) for n in models.REGISTRY]
        rows = [zm.info() for zm in zms]
        if args.json:
            print(json.dumps(rows, indent=1))
            return 0
        head = ("NAME", "ORIGIN", "INPUT", "WEIGHTS", "NATIVE", "TASK")
        table = [head] + [
            (
                r["name"],
                r["origin"],
                zm.inputs_text(),
                "trained" if r["trained"] else "seeded",
                r["native"] or "-",
                r["task"],
            )
            for zm, r in zip(zms, rows)
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        for row in table:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        return 0
    m = models.get(args.name, imgsz=imgsz)
    if args.onnx:
        print(m.onnx_path())
        return 0
    info = m.info()
    info["manifest_origin"] = m.manifest_origin()
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        for k, v in info.items():
            print(f"{k:16s} {v}")
    return 0
