"""The instrumentation compiler: partition an ONNX model into stages and expose the stage boundaries
as named graph outputs ("anchors"), with a manifest describing each.

    model, manifest = instrument_model(onnx_model, stages=8, max_cut_width=4)
    manifest = instrument_file("model.onnx", "anchored.onnx")   # + anchored.anchors.json

Runs :class:`passes.partition.StagePartitionPass` then :class:`passes.anchors.AnchorInsertionPass`
(see those modules for the cut definition and cost model). Weights are never loaded: a model with
external data is instrumented from its graph alone and the output refers to the original weight
files (relative paths rebased, nothing copied).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError, GraphError, OutputPathError
from anpred.manifest import AnchorManifest

__all__ = ["instrument_model", "instrument_file", "default_manifest_path", "partition_model",
           "format_partition_table"]


def default_manifest_path(out_path: str | Path) -> Path:
    """``anchored.onnx`` -> ``anchored.anchors.json`` (same folder)."""
    p = Path(out_path)
    return p.with_name(p.stem + ".anchors.json") if p.suffix else p.with_name(p.name + ".anchors.json")


def _model_info(model, source_path) -> dict[str, Any]:
    import onnx

    info: dict[str, Any] = {
        "source": str(source_path) if source_path is not None else None,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "ir_version": int(model.ir_version),
        "opset": {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        "inputs": [], "outputs": [],
    }
    if source_path is not None and Path(source_path).is_file():
        from anpred.onnx_io import sha256_file

        info["sha256"] = sha256_file(source_path)
    inits = {t.name for t in model.graph.initializer}
    for key, vis in (("inputs", [i for i in model.graph.input if i.name not in inits]),
                     ("outputs", model.graph.output)):
        for vi in vis:
            tt = vi.type.tensor_type
            shape = ([d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
                     if tt.HasField("shape") else None)
            try:
                dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "unknown"
            except (KeyError, ValueError, TypeError):
                dt = str(tt.elem_type)
            info[key].append({"name": vi.name, "dtype": dt, "shape": shape})
    return info


def partition_model(model, *, stages: int | None = None, max_cut_width: int = 4, anchors=()):
    """Run only the partition (nothing written or modified); returns a
    :class:`passes.partition.Partition`."""
    from passes.partition import StagePartitionPass

    return StagePartitionPass(stages, max_cut_width, anchors)(model).info["partition"]


def instrument_model(model, *, stages: int | None = None, max_cut_width: int = 4, anchors=(),
                     source_path=None):
    """Instrument an ``onnx.ModelProto`` (pure: the input is not modified).

    Args:
        model: the ONNX model; external weights need not be loaded.
        stages: number of stages K (None: automatic, about 8).
        max_cut_width: most tensors per cut (1 = single-tensor dominator cuts only).
        anchors: extra tensor names to expose (``--anchor``).
        source_path: the model's file, recorded in ``manifest.model`` (with its sha256).

    Returns:
        ``(anchored_model, manifest)``. Re-instrumenting an instrumented model with the same options
        returns an equal model; its earlier ``manifest.model`` entries (e.g. ``origin``) are kept.

    Raises:
        GraphError: no inputs, a cycle, a dangling value, an unknown/constant anchor name.
    """
    from passes.anchors import AnchorInsertionPass
    from passes.base import PassManager
    from passes.partition import StagePartitionPass

    stored = None
    try:
        stored = AnchorManifest.from_model(model)
    except AnpredError:
        stored = None
    info = dict(stored.model) if stored is not None and stored.model else _model_info(model, source_path)
    part = StagePartitionPass(stages, max_cut_width, list(anchors))(model).info["partition"]
    res = PassManager([AnchorInsertionPass(part, info)])(model)
    return res.model, res.info["AnchorInsertionPass"]["manifest"]


def _check_out(path: Path) -> None:
    d = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise OutputPathError(f"{path}: is a folder, not a file path")
    if not d.is_dir():
        raise OutputPathError(f"{path}: folder {d} does not exist")
    if not os.access(d, os.W_OK):
        raise OutputPathError(f"{path}: folder {d} is not writable")


def instrument_file(model_path, out_path, *, stages: int | None = None, max_cut_width: int = 4,
                    anchors=(), manifest_path=None) -> AnchorManifest:
    """Instrument ``model_path`` and write ``out_path`` plus the manifest JSON
    (``manifest_path``, default :func:`default_manifest_path` of ``out_path``).

    Both writes are atomic; if the second fails the first is removed, so a failed run leaves
    nothing. External weights are never loaded or copied: written next to the source they are
    referenced as they are; written elsewhere, each weight file is hard-linked into the output folder
    (ONNX Runtime refuses locations outside the model's folder; see :func:`_link_external_data`).

    Raises:
        ModelLoadError: not ONNX, truncated, missing external data.
        GraphError: see :func:`instrument_model`.
        OutputPathError: an output folder that does not exist or cannot be written; ``out_path`` equal
            to ``model_path`` while it has external data in another folder is fine (rebased).
    """
    from anpred.onnx_io import atomic_write_text, load_model, save_model

    model_path, out_path = Path(model_path), Path(out_path)
    man_path = Path(manifest_path) if manifest_path is not None else default_manifest_path(out_path)
    _check_out(out_path)
    _check_out(man_path)
    if man_path.resolve() == out_path.resolve():
        raise OutputPathError(f"{man_path}: the manifest path equals the model output path")
    model = load_model(model_path, load_external=False)
    anchored, manifest = instrument_model(model, stages=stages, max_cut_width=max_cut_width,
                                          anchors=anchors, source_path=model_path)
    existed = out_path.exists()
    links: list[Path] = []
    try:
        links = _link_external_data(anchored, model_path.parent, out_path)
        save_model(anchored, out_path, source_path=model_path)
        atomic_write_text(man_path, manifest.to_json())
    except BaseException:
        if not existed and out_path.exists():
            out_path.unlink()
        for p in links:
            p.unlink(missing_ok=True)
        raise
    return manifest


def _link_external_data(model, src_dir: Path, out_path: Path) -> list[Path]:
    """Make the external weights reachable from ``out_path``'s folder without copying them.

    ONNX Runtime 1.32, OpenVINO and onnx 1.23 all refuse external-data locations that leave the
    model's folder (``..``, absolute paths, symlinks), so a relative reference to the source folder
    would not load. Each weight file is therefore *hard-linked* into the output folder (same inode: no
    bytes copied) and the model's ``location`` entries point at the link: ONNX Runtime and OpenVINO
    load it; ``onnx.load``/``onnx.checker`` with external data refuse hard links ("potential hardlink
    attack"), so for onnx-based tools write the output next to the source model. Where a hard link is impossible
    (another file system), the location is left for :func:`anpred.onnx_io.save_model` to rebase to a
    relative path, and a warning says ONNX Runtime may refuse it. Returns the links created."""
    import warnings

    from anpred.onnx_io import external_data_files

    src_dir, out_dir = src_dir.resolve(), out_path.parent.resolve()
    files = external_data_files(model)
    if not files or src_dir == out_dir:
        return []
    created: list[Path] = []
    mapping: dict[str, str] = {}
    for loc in files:
        src = (src_dir / loc).resolve()
        if src.is_relative_to(out_dir):  # already inside the output folder
            mapping[loc] = os.path.relpath(src, out_dir)
            continue
        target = out_dir / Path(loc).name
        if target.exists() and not target.samefile(src):
            target = out_dir / f"{out_path.stem}.{Path(loc).name}"
        try:
            if not target.exists():
                os.link(src, target)
                created.append(target)
            elif not target.samefile(src):
                raise OSError(f"{target} exists and is another file")
        except OSError as err:
            warnings.warn(f"cannot hard-link external weights {src} into {out_dir} ({err}); the output refers "
                          f"to them by a relative path, which ONNX Runtime may refuse (write the output next "
                          f"to the source model instead)", stacklevel=3)
            continue
        mapping[loc] = target.name
    if mapping:
        from onnx.external_data_helper import _get_all_tensors, uses_external_data

        for t in _get_all_tensors(model):
            if uses_external_data(t):
                for e in t.external_data:
                    if e.key == "location" and e.value in mapping:
                        # save_model rebases locations from src_dir to out_dir: give the path from src_dir
                        e.value = os.path.relpath(out_dir / mapping[e.value], src_dir)
    return created


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
    rows = [("stage", "nodes", "slice", f"cost ({'GFLOPs' if unit == 'flops' else 'nodes'})", "share",
             "boundary anchor", "tensor", "shape", "dtype")]
    for s in manifest.stages:
        cost = f"{s.cost / 1e9:.4g}" if unit == "flops" else f"{s.cost:.0f}"
        head = (str(s.index), str(s.num_nodes), f"{s.first}..{s.last}", cost, f"{100 * s.cost / total:.1f}%")
        bnd = s.boundary or ["(none)"]
        for i, b in enumerate(bnd):
            a = by_name.get(b)
            tail = (b, a.value if a else "", _fmt_shape(a.shape) if a else "", a.dtype if a else "")
            rows.append((head if i == 0 else ("",) * 5) + tail)
    extra = [a for a in manifest.anchors if a.kind == "explicit" and not any(a.name in s.boundary for s in manifest.stages)]
    for a in extra:
        rows.append((str(a.stage), "", "", "", "", a.name + " (explicit)", a.value, _fmt_shape(a.shape), a.dtype))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
