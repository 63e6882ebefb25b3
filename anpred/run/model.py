"""The anchored model of a run: loading it with its anchor manifest (:func:`load_anchored`) and copying
it with its external weights into the run folder (:func:`copy_model`), so that the backends run the
copy and later edits of the original cannot change what the run ran.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from anpred.manifest import Anchor, AnchorManifest

__all__ = ["load_anchored", "copy_model"]


def load_anchored(model_path: str | Path) -> tuple[Any, AnchorManifest, str]:
    """Load an anchored model and its manifest: from ``metadata_props``, else ``<stem>.anchors.json``
    next to it, else a manifest holding only the graph outputs (source ``outputs-only``).
    Returns ``(ModelProto, manifest, source)``. Raises ModelLoadError."""
    from anpred.onnx_io import elem_type_name, load_model

    model = load_model(model_path)
    man = AnchorManifest.from_model(model)
    if man is not None:
        return model, man, "metadata"
    p = Path(model_path)
    side = p.with_name(p.stem + ".anchors.json")
    if side.is_file():
        return model, AnchorManifest.load(side), str(side)
    from anpred.naming import output_anchor_name

    anchors = []
    n = len(model.graph.node)
    for o in model.graph.output:
        tt = o.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        dtype = elem_type_name(tt.elem_type) if tt.elem_type else "float32"
        anchors.append(
            Anchor(
                name=output_anchor_name(o.name),
                value=o.name,
                stage=0,
                order=n - 1,
                producer="",
                op_type="",
                shape=shape,
                dtype=dtype,
                kind="output",
            )
        )
    return model, AnchorManifest(anchors=anchors, model={"source": str(p)}), "outputs-only"


def copy_model(model_path: Path, model, dest: Path) -> dict[str, Any]:
    """Copy the model and its external-data files into the run folder ``dest`` (``model.onnx``, the
    weight files at their relative locations) so that later edits of the original cannot change
    what the run ran; backends run this copy. A location outside the model's folder (``../w.bin``) is
    copied as its file name and the copy's location entries are rewritten (then ``model.onnx`` is a
    re-serialised copy, and ``sha256_source`` is the original file's hash).

    Returns the ``run.json["model"]`` fields: ``sha256`` (of ``model.onnx`` as copied),
    ``external_data`` ({location: sha256} of every weight file, as copied), ``sha256_all`` (sha256
    over ``model.onnx`` and the weight files' hashes in location order: the identity of everything
    the backends ran). Raises ModelLoadError when a weight file cannot be read.
    """
    import hashlib

    from anpred.errors import ModelLoadError
    from anpred.onnx_io import external_data_files, sha256_file

    locs = external_data_files(model)
    src_dir = model_path.parent
    escaping = [loc for loc in locs if Path(loc).is_absolute() or ".." in Path(loc).parts]
    try:
        if escaping:
            import onnx
            from onnx.external_data_helper import _get_all_tensors, uses_external_data

            m = onnx.ModelProto()
            m.CopyFrom(model)
            for t in _get_all_tensors(m):
                if uses_external_data(t):
                    for e in t.external_data:
                        if e.key == "location" and e.value in escaping:
                            e.value = Path(e.value).name
            (dest / "model.onnx").write_bytes(m.SerializeToString())
        else:
            shutil.copyfile(model_path, dest / "model.onnx")
        ext = {}
        for loc in locs:
            target = dest / (Path(loc).name if loc in escaping else loc)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src_dir / loc, target)
            ext[target.relative_to(dest).as_posix()] = sha256_file(target)
    except OSError as err:
        raise ModelLoadError(f"cannot copy {model_path} (or its external data) into the run: {err}") from err
    info: dict[str, Any] = {"sha256": sha256_file(dest / "model.onnx"), "external_data": ext}
    h = hashlib.sha256(info["sha256"].encode())
    for loc in sorted(ext):
        h.update(f"\0{loc}\0{ext[loc]}".encode())
    info["sha256_all"] = h.hexdigest()
    if escaping:
        info["sha256_source"] = sha256_file(model_path)
    return info
