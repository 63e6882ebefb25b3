"""Map the anchors of an instrumented model onto the native model it was exported from and onto the
converter backends.

Prints, per backend (the native one, torch-native or tf-native; ort as reference; the converter
backends torch (onnx2torch) and tf (onnx2tf)), how many anchors map exactly (the same tensor, possibly
in another layout: the transform is shown), to an equivalent tensor (e.g. after a folded BatchNorm) or
not at all, with the reason naming the module/layer. The converter columns are computed from the ONNX
graph without converting; --backends prepares the named backends (converting, rebuilding the native
model, one check run) and reports what they really capture, transforms included. The
native model is rebuilt from a factory ``module:function`` returning ``(model, example_inputs)``: from
--factory, else the origin recorded at export (manifest.model["origin"] or the model's anpred.origin
metadata). The current folder is importable. With --write the mapping is stored in the manifest
(inside the model and in its .anchors.json).

examples:
  anpred map anchored.onnx
  anpred map anchored.onnx --factory mymodels:yolov8n --kwargs '{"imgsz": 256}' --write
  anpred map anchored.onnx --backends torch-native,torch,tf    # prepare them and report what they capture
"""

from __future__ import annotations

HELP = "map anchors onto the native model and the converter backends: exact / equivalent / unmapped per backend"


def add_arguments(parser):
    parser.add_argument("model", help="anchored .onnx file (from anpred-instrument)")
    parser.add_argument(
        "--factory", metavar="MODULE:FUNCTION", help="rebuilds the native model: returns (model, example_inputs)"
    )
    parser.add_argument(
        "--kwargs", default=None, metavar="JSON", help="keyword arguments for the factory (JSON object)"
    )
    parser.add_argument(
        "--framework",
        choices=["torch", "tf"],
        default=None,
        help="native framework (default: from the origin or the exporter)",
    )
    parser.add_argument(
        "--manifest", default=None, metavar="PATH", help="anchor manifest JSON (default: the one stored in the model)"
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    parser.add_argument(
        "--write", action="store_true", help="store the mapping in the model's manifest and its .anchors.json"
    )
    parser.add_argument("--brief", action="store_true", help="only the per-backend counts")
    parser.add_argument(
        "--backends",
        default=None,
        metavar="LIST",
        help="comma-separated backends to prepare and report from what they capture "
        "(e.g. torch-native,torch,tf); default: static mapping only",
    )


def main(args) -> int:
    import json
    import os
    import sys
    from pathlib import Path

    from anpred.backends import backend_class, parse_backends
    from anpred.backends.onnx2torch_compat import onnx2torch_missing
    from anpred.errors import InputError
    from anpred.manifest import AnchorManifest
    from anpred.onnx_io import atomic_write_text, load_model, save_model
    from exporters import load_factory, read_origin
    from exporters.mapping import BACKEND_OF, CONVERTER_BACKENDS, map_anchors, prepared_entries
    from passes.exporter import detect_exporter

    path = Path(args.model)
    model = load_model(path)
    manifest = AnchorManifest.load(args.manifest) if args.manifest else AnchorManifest.from_model(model)
    if manifest is None:
        raise InputError(
            f"{path}: no anchor manifest in the model; instrument it first (anpred-instrument) or give --manifest"
        )
    origin = dict(manifest.model.get("origin") or read_origin(model) or {})
    if args.factory:
        origin["factory"] = args.factory
        try:
            origin["kwargs"] = json.loads(args.kwargs) if args.kwargs else {}
        except json.JSONDecodeError as err:
            raise InputError(f"--kwargs is not valid JSON: {err}") from err
        if not isinstance(origin["kwargs"], dict):
            raise InputError("--kwargs must be a JSON object")
    if not origin.get("factory"):
        raise InputError(
            f"{path}: no native model known: the manifest records no origin factory; give "
            "--factory module:function (returning (model, example_inputs))"
        )
    exporter = detect_exporter(model, origin=read_origin(model))
    framework = args.framework or origin.get("framework") or ("tf" if exporter == "tf2onnx" else "torch")
    if framework not in ("torch", "tf"):
        raise InputError(f"origin framework {framework!r} has no native backend (known: torch, tf)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    prepare = parse_backends(args.backends) if args.backends else []
    native, example = load_factory(origin["factory"], origin.get("kwargs"))
    report = map_anchors(
        manifest,
        native,
        framework,
        onnx_model=model,
        example_inputs=example if framework == "torch" else None,
        converters=CONVERTER_BACKENDS,
        converter_checks={"torch": onnx2torch_missing},
    )
    if prepare:
        for name in prepare:
            opts = (
                {"factory": origin["factory"], "factory_kwargs": origin.get("kwargs") or {}}
                if name in ("torch-native", "tf-native")
                else {}
            )
            if name in ("torch-native", "tf-native") and name != BACKEND_OF[framework]:
                raise InputError(f"backend {name!r} needs a {name.split('-')[0]} model; this one is {framework}")
            man = AnchorManifest.from_dict(manifest.to_dict())
            report.entries[name] = prepared_entries(name, path, man, opts, backend_class=backend_class)
    print(report.format_text(verbose=not args.brief))
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(report.to_dict(), indent=2))
    if args.write:
        manifest.model.setdefault("origin", origin)
        manifest.to_model(model)
        save_model(model, path, source_path=path)
        side = path.with_name(path.stem + ".anchors.json")
        if args.manifest:
            manifest.save(args.manifest)
        elif side.is_file():
            manifest.save(side)
    unmapped = sum(report.counts(b)["unmapped"] for b in report.entries)
    if unmapped:
        print(
            f"note: {unmapped} anchor mapping(s) unmapped; those anchors are skipped by that backend (reasons above)",
            file=sys.stderr,
        )
    return 0
