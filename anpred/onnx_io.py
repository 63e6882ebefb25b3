"""Loading and saving ONNX models with clear errors and atomic writes.

``load_model`` never loads external weights unless asked (``load_external=False`` by default for
graph passes); ``save_model`` writes to a temporary file in the destination folder and renames it,
so a failed run leaves no half-written file. Models with external data are saved so that their
``location`` entries still point to the original weight files (no copy), relative to the new file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from anpred.errors import ModelLoadError, OutputPathError


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def load_model(path: str | Path, load_external: bool = False):
    """Load an ONNX ``ModelProto`` from ``path``.

    Args:
        path: an ``.onnx`` file.
        load_external: also read external-data weight files into memory.

    Raises:
        ModelLoadError: the file is missing, not ONNX, truncated, or refers to external data files
            that do not exist.
    """
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as err:
        raise ModelLoadError(f"{path}: not a readable ONNX model ({type(err).__name__}: {err})") from err
    if not model.HasField("graph") or (len(model.graph.node) == 0 and len(model.graph.output) == 0):
        raise ModelLoadError(f"{path}: not an ONNX model (no graph in the file; truncated or another format?)")
    missing = [f for f in external_data_files(model) if not (path.parent / f).is_file()]
    if missing:
        raise ModelLoadError(f"{path}: external data file(s) missing next to the model: {', '.join(missing)}")
    if load_external:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, str(path.parent))
    return model


def external_data_files(model) -> list[str]:
    """Relative locations of the external-data files an ONNX model refers to (unique, sorted)."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    locs = set()
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            for e in t.external_data:
                if e.key == "location":
                    locs.add(e.value)
    return sorted(locs)


def rebase_external_data(model, src_dir: Path, dst_dir: Path) -> None:
    """Rewrite external-data ``location`` entries so they resolve from ``dst_dir`` to the same files
    they resolved to from ``src_dir`` (weights are referenced, never copied)."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    src_dir, dst_dir = Path(src_dir).resolve(), Path(dst_dir).resolve()
    if src_dir == dst_dir:
        return
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            for e in t.external_data:
                if e.key == "location":
                    e.value = os.path.relpath(src_dir / e.value, dst_dir)


def _check_writable_dir(path: Path) -> None:
    d = path.parent if str(path.parent) else Path(".")
    if not d.is_dir():
        raise OutputPathError(f"{path}: folder {d} does not exist")
    if not os.access(d, os.W_OK):
        raise OutputPathError(f"{path}: folder {d} is not writable")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + rename). Raises OutputPathError."""
    path = Path(path)
    _check_writable_dir(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise OutputPathError(f"cannot write {path}: {err.strerror or err}") from err
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(Path(path), text.encode())


def save_model(model, path: str | Path, source_path: str | Path | None = None) -> None:
    """Save ``model`` atomically. If the model refers to external data, the references are rebased
    from ``source_path``'s folder so that they still reach the original weights. Models over 2 GB
    must use external data (protobuf limit)."""
    path = Path(path)
    if source_path is not None:
        rebase_external_data(model, Path(source_path).parent, path.parent)
    atomic_write_bytes(path, model.SerializeToString())
