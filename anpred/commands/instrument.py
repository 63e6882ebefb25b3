"""Instrument an ONNX model with stage anchors.

Partitions the graph into stages closed by narrow cuts (single-tensor dominators first, up to
--max-cut-width tensors where branches run in parallel), balanced by estimated FLOPs, and exposes each
boundary tensor as an extra graph output named anchor/<stage>/<module or tensor>. Writes the anchored
model and an anchor manifest (JSON, also stored in the model's metadata). With --list, prints the
partition table and writes nothing.

External weights (a .onnx.data file beside the model) are never loaded. Write the output in the same
folder as the source model and it refers to the same weight files. ONNX Runtime, OpenVINO and onnx
refuse weight paths that leave the model's folder, so an output in another folder needs
--copy-external-data (the weight files are copied next to the output, streamed); without it such a
run stops with exit status 2 and writes nothing.

examples:
  anpred-instrument model.onnx -o anchored.onnx
  anpred-instrument model.onnx -o anchored.onnx --stages 6 --max-cut-width 3 --anchor /model.4/Concat_output_0
  anpred-instrument model.onnx --list
  anpred-instrument exported/model.onnx -o /tmp/anchored.onnx --copy-external-data
"""

from __future__ import annotations

HELP = "partition an ONNX model into stages and expose the stage boundaries as anchor outputs"


def add_arguments(parser):
    parser.add_argument("model", help="input .onnx file (external weights are referenced, never loaded)")
    parser.add_argument("-o", "--output", help="anchored .onnx file to write (required unless --list)")
    parser.add_argument(
        "--stages", type=int, default=None, metavar="K", help="number of stages (default: automatic, about 8)"
    )
    parser.add_argument(
        "--max-cut-width", type=int, default=4, metavar="W", help="most tensors a stage boundary may hold (default: 4)"
    )
    parser.add_argument(
        "--anchor",
        action="append",
        default=[],
        metavar="NAME",
        help="also expose this tensor (ONNX value name); repeatable",
    )
    parser.add_argument(
        "--manifest",
        default=None,
        metavar="PATH",
        help="anchor manifest JSON to write (default: <output stem>.anchors.json)",
    )
    parser.add_argument(
        "--copy-external-data",
        action="store_true",
        help="the model keeps its weights in external files and the output goes to another "
        "folder: copy the weight files next to the output (runtimes refuse weight paths "
        "outside the model's folder; without this option such a run is refused)",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="print the partition table (stage, boundary tensors, shapes, node count, cost) and write nothing",
    )


def main(args) -> int:
    from anpred.errors import AnpredError
    from anpred.instrument import default_manifest_path, format_partition_table, instrument_file, instrument_model
    from anpred.onnx_io import load_model

    if args.list:
        model = load_model(args.model, load_external=False)
        _, manifest = instrument_model(
            model, stages=args.stages, max_cut_width=args.max_cut_width, anchors=args.anchor, source_path=args.model
        )
        p = manifest.partition
        print(
            f"{args.model}: {p['num_nodes']} nodes, {manifest.counts()} "
            f"(exporter: {p['framework']}, cost: {p['cost_unit']}, {p['candidate_cuts']} admissible cuts)"
        )
        for note in p.get("notes", []):
            print(f"note: {note}")
        print(format_partition_table(manifest))
        return 0
    if not args.output:
        raise AnpredError("missing -o/--output (or use --list to only print the partition)")
    manifest = instrument_file(
        args.model,
        args.output,
        stages=args.stages,
        max_cut_width=args.max_cut_width,
        anchors=args.anchor,
        manifest_path=args.manifest,
        copy_external_data=args.copy_external_data,
    )
    man = args.manifest or default_manifest_path(args.output)
    print(f"wrote {args.output} ({manifest.counts()} = {len(manifest.anchors)} in the manifest) and {man}")
    for note in manifest.partition.get("notes", []):
        print(f"note: {note}")
    return 0
