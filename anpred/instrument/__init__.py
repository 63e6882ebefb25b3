"""The instrumentation compiler: partition an ONNX model into stages and expose the stage boundaries
as named graph outputs ("anchors"), with a manifest describing each.

    model, manifest = instrument_model(onnx_model, stages=8, max_cut_width=4)
    manifest = instrument_file("model.onnx", "anchored.onnx")   # + anchored.anchors.json

Runs the analysis :class:`passes.partition.StagePartitioner` (proposes the stages) then the pass
:class:`passes.anchors.AnchorInsertionPass` (rewrites the graph from the proposal; see those modules
for the cut definition and cost model). Weights are never loaded: a model with
external data is instrumented from its graph alone; written next to the source it refers to the
same weight files, written elsewhere the weights are copied (``copy_external_data=True``) or the
write is refused (see :func:`instrument_file`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anpred.errors import AnpredError, OutputPathError
from anpred.manifest import AnchorManifest

__all__ = ["instrument_model", "instrument_file", "default_manifest_path", "partition_model", "format_partition_table"]


def default_manifest_path(out_path: str | Path) -> Path:
    """``anchored.onnx`` -> ``anchored.anchors.json`` (same folder)."""
    p = Path(out_path)
    return p.with_name(p.stem + ".anchors.json") if p.suffix else p.with_name(p.name + ".anchors.json")


def _model_info(model, source_path) -> dict[str, Any]:
    from anpred.onnx_io import elem_type_name

    info: dict[str, Any] = {
        "source": str(source_path) if source_path is not None else None,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "ir_version": int(model.ir_version),
        "opset": {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        "inputs": [],
        "outputs": [],
    }
    if source_path is not None and Path(source_path).is_file():
        from anpred.onnx_io import sha256_file

        info["sha256"] = sha256_file(source_path)
    inits = {t.name for t in model.graph.initializer}
    for key, vis in (
        ("inputs", [i for i in model.graph.input if i.name not in inits]),
        ("outputs", model.graph.output),
    ):
        for vi in vis:
            tt = vi.type.tensor_type
            shape = (
                [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
                if tt.HasField("shape")
                else None
            )
            dt = elem_type_name(tt.elem_type)
            info[key].append({"name": vi.name, "dtype": dt, "shape": shape})
    return info


def partition_model(model, *, stages: int | None = None, max_cut_width: int = 4, anchors=()):
    """Run only the partition (nothing written or modified); returns a
    :class:`passes.plan.Partition`."""
    from passes.partition import StagePartitioner

    return StagePartitioner(stages, max_cut_width, anchors).propose(model)


def instrument_model(
    model,
    *,
    stages: int | None = None,
    max_cut_width: int = 4,
    anchors=(),
    source_path=None,
    wide_cut_width: int | None = None,
):
    """Instrument an ``onnx.ModelProto`` (pure: the input is not modified).

    Args:
        model: the ONNX model; external weights need not be loaded.
        stages: number of stages K (None: automatic, about 8).
        max_cut_width: most tensors per cut (1 = single-tensor dominator cuts only).
        anchors: extra tensor names to expose (``--anchor``).
        source_path: the model's file, recorded in ``manifest.model`` (with its sha256).
        wide_cut_width: most tensors per cut inside a long block no cut of ``max_cut_width`` splits
            (:mod:`passes.wide_cuts`; None: :data:`passes.wide_cuts.WIDE_CUT_WIDTH`; ``max_cut_width``
            or less: no wide cuts).

    Returns:
        ``(anchored_model, manifest)``. Re-instrumenting an instrumented model with the same options
        returns an equal model; its earlier ``manifest.model`` entries (e.g. ``origin``) are kept.

    Raises:
        GraphError: no inputs, a cycle, a dangling value, an unknown/constant anchor name.
    """
    from passes.anchors import AnchorInsertionPass
    from passes.base import PassManager, gc_paused
    from passes.partition import StagePartitioner

    stored = None
    try:
        stored = AnchorManifest.from_model(model)
    except AnpredError:
        stored = None
    info = dict(stored.model) if stored is not None and stored.model else _model_info(model, source_path)
    with gc_paused():  # see passes.base.gc_paused
        wide = {} if wide_cut_width is None else {"wide_cut_width": wide_cut_width}
        part = StagePartitioner(stages, max_cut_width, list(anchors), **wide).propose(model)
        res = PassManager([AnchorInsertionPass(part, info)])(model)
    return res.model, res.info["AnchorInsertionPass"]["manifest"]


def instrument_file(
    model_path,
    out_path,
    *,
    stages: int | None = None,
    max_cut_width: int = 4,
    anchors=(),
    manifest_path=None,
    copy_external_data: bool = False,
) -> AnchorManifest:
    """Instrument ``model_path`` and write ``out_path`` plus the manifest JSON
    (``manifest_path``, default :func:`default_manifest_path` of ``out_path``).

    All writes are one all-or-nothing step (:class:`anpred.onnx_io.AtomicFiles`): a failed run
    leaves nothing. External weights are never loaded. Written in the folder of the source model
    they are referenced as they are (no copy). ONNX Runtime, OpenVINO and onnx refuse weight paths
    outside the model's folder (``../``, absolute, symlinks, hard links), so an output in another
    folder needs ``copy_external_data=True``: the weight files are then streamed into the output
    folder as ``<output name>.data`` (``shutil.copyfile``, constant memory).

    Raises:
        ModelLoadError: a folder, not ONNX, truncated, missing external data.
        GraphError: see :func:`instrument_model`.
        OutputPathError: an output folder that does not exist or cannot be written; the manifest
            path equal to the output path; external weights and an output in another folder without
            ``copy_external_data`` (:class:`anpred.onnx_io.ExternalDataPlacementError`).
    """
    from anpred.onnx_io import check_writable_dir, external_data_files, load_model, plan_external_data, save_model

    model_path, out_path = Path(model_path), Path(out_path)
    man_path = Path(manifest_path) if manifest_path is not None else default_manifest_path(out_path)
    check_writable_dir(out_path)
    check_writable_dir(man_path)
    if man_path.resolve() == out_path.resolve():
        raise OutputPathError(f"{man_path}: the manifest path equals the model output path")
    model = load_model(model_path, load_external=False)
    # refuse a placement no runtime could load before any work
    locations = external_data_files(model)
    copies = plan_external_data(model, out_path, model_path, copy_external_data, locations)
    weights = {(model_path.parent / loc).resolve() for loc in locations}
    for p in (out_path, man_path):
        if p.resolve() in weights:
            raise OutputPathError(
                f"{p}: this is one of the model's external weight files; writing it would destroy the weights"
            )
    if man_path.resolve() in {(out_path.parent / new).resolve() for _, new in copies.values()}:
        raise OutputPathError(f"{man_path}: the manifest path equals the copied weights' path")
    anchored, manifest = instrument_model(
        model, stages=stages, max_cut_width=max_cut_width, anchors=anchors, source_path=model_path
    )
    save_model(
        anchored,
        out_path,
        source_path=model_path,
        copy_external_data=copy_external_data,
        extra_files={man_path: manifest.to_json().encode()},
        external_locations=locations,
    )
    return manifest


def _fmt_shape(shape) -> str:
    if shape is None:
        return "?"
    return "x".join("?" if d is None else str(d) for d in shape) or "scalar"


def format_partition_table(manifest: AnchorManifest) -> str:
    """The partition as a text table: stage, node slice, node count, cost, boundary tensors and
    their shapes (one line per boundary tensor)."""
    unit = manifest.partition.get("cost_unit", "flops")
    by_name = {a.name: a for a in manifest.anchors}
    total = sum(s.cost for s in manifest.stages) or 1.0
    rows = [
        (
            "stage",
            "nodes",
            "slice",
            f"cost ({'GFLOPs' if unit == 'flops' else 'nodes'})",
            "share",
            "boundary anchor",
            "tensor",
            "shape",
            "dtype",
        )
    ]
    for s in manifest.stages:
        cost = f"{s.cost / 1e9:.4g}" if unit == "flops" else f"{s.cost:.0f}"
        head = (str(s.index), str(s.num_nodes), f"{s.first}..{s.last}", cost, f"{100 * s.cost / total:.1f}%")
        bnd = s.boundary or ["(none)"]
        for i, b in enumerate(bnd):
            a = by_name.get(b)
            tail = (b, a.value if a else "", _fmt_shape(a.shape) if a else "", a.dtype if a else "")
            rows.append((head if i == 0 else ("",) * 5) + tail)
    extra = [
        a for a in manifest.anchors if a.kind == "explicit" and not any(a.name in s.boundary for s in manifest.stages)
    ]
    for a in extra:
        rows.append((str(a.stage), "", "", "", "", a.name + " (explicit)", a.value, _fmt_shape(a.shape), a.dtype))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
