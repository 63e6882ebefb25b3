"""Loading and saving ONNX models with clear errors and atomic writes.

``load_model`` never loads external weights unless asked (``load_external=False`` by default for
graph passes). Writes go to temporary files in the destination folder that are renamed into place
only when everything is written (:class:`AtomicFiles`), so a failed run leaves no half-written file;
files get mode ``0o666 & ~umask`` like any file the user creates.

External data: ONNX Runtime 1.32, OpenVINO 2026.4 and onnx 1.23 refuse external-data ``location``
entries that leave the model's folder (``../``, absolute paths, symlinks; onnx also hard links), so a
model is never saved with weights referenced from another folder. :func:`save_model` writes a model
that refers to external weights either next to those weights (referenced as they are, never loaded
or copied) or, with ``copy_external_data=True``, elsewhere with the weight files streamed into the
new folder (``shutil.copyfile``: never read into Python memory); otherwise it raises
:class:`ExternalDataPlacementError`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from anpred.errors import ModelLoadError, OutputPathError

__all__ = [
    "sha256_file",
    "load_model",
    "external_data_files",
    "save_model",
    "AtomicFiles",
    "atomic_write_bytes",
    "atomic_write_text",
    "file_mode",
    "check_writable_dir",
    "ExternalDataPlacementError",
    "json_default",
    "to_json",
    "json_safe",
    "json_float",
    "from_json_float",
    "elem_type_name",
    "iter_graphs",
    "model_ops",
    "op_key",
    "real_inputs",
]


class ExternalDataPlacementError(OutputPathError):
    """A model with external weights would be written to a folder other than the weights' folder
    without copying them (no runtime would load it)."""


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
        ModelLoadError: the path is missing or a folder, the file is not ONNX or truncated, or it
            refers to external data files that do not exist.
    """
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a folder, not an ONNX model file")
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


_GRAPH, _GRAPHS, _TENSOR, _TENSORS = 5, 10, 4, 9  # onnx.AttributeProto types
_EXTERNAL = 1  # onnx.TensorProto.EXTERNAL
#: the default-domain ops whose attributes can hold tensors or sub-graphs (ops of other domains,
#: e.g. ai.onnx.ml, are always looked at)
_ATTR_TENSOR_OPS = frozenset({"Constant", "ConstantOfShape", "If", "Loop", "Scan", "SequenceMap"})


def _external_tensors(model) -> list:
    """Every TensorProto stored as external data: initializers and tensor attributes, in the main
    graph, its sub-graphs and the model's functions (iterative). Only nodes that can carry tensor or
    graph attributes are opened (:data:`_ATTR_TENSOR_OPS`, other domains), which keeps this cheap per node
    (docs/instrument.md, 'Measurements: graph walks')."""
    found = []
    stack = [model.graph]
    funcs = list(model.functions)
    # a node of another domain needs that domain in opset_import (or a model-local function's domain)
    other = bool(funcs) or any(o.domain not in ("", "ai.onnx") for o in model.opset_import)
    while stack or funcs:
        if stack:
            g = stack.pop()
            found.extend(t for t in g.initializer if t.data_location == _EXTERNAL)
            found.extend(t.values for t in g.sparse_initializer if t.values.data_location == _EXTERNAL)
            nodes = g.node
        else:
            nodes = funcs.pop().node
        for n in nodes:
            if n.op_type not in _ATTR_TENSOR_OPS and (not other or n.domain in ("", "ai.onnx")):
                continue
            for a in n.attribute:
                ty = a.type
                if ty == _TENSOR:
                    if a.t.data_location == _EXTERNAL:
                        found.append(a.t)
                elif ty == _TENSORS:
                    found.extend(t for t in a.tensors if t.data_location == _EXTERNAL)
                elif ty == _GRAPH:
                    stack.append(a.g)
                elif ty == _GRAPHS:
                    stack.extend(a.graphs)
    return found


def _location(t) -> str | None:
    for e in t.external_data:
        if e.key == "location":
            return e.value
    return None


def external_data_files(model) -> list[str]:
    """Locations (as written in the model, relative to its folder) of the external-data files an ONNX
    model refers to: unique, sorted. One pass over initializers and tensor attributes."""
    return sorted({loc for t in _external_tensors(model) if (loc := _location(t)) is not None})


def file_mode() -> int:
    """The mode a new file gets from the process umask: ``0o666 & ~umask`` (read from
    ``/proc/self/status`` on Linux, so the umask is never changed, not even briefly)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return 0o666 & ~old


def check_writable_dir(path: str | Path) -> None:
    """Raise OutputPathError unless a file can be created in ``path``'s folder: the folder exists and a
    probe file can really be created there (``os.access`` says yes to root even on ``/proc``)."""
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{path}: is a folder, not a file path")
    d = path.parent if str(path.parent) else Path(".")
    if not d.is_dir():
        raise OutputPathError(f"{path}: folder {d} does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=d)
    except OSError as err:
        raise OutputPathError(f"{path}: cannot create a file in folder {d} ({err.strerror or err})") from err
    os.close(fd)
    os.unlink(probe)


class AtomicFiles:
    """Write several files all-or-nothing: each is staged as a temporary file in its destination
    folder and renamed into place by :meth:`commit`; on an error (or :meth:`discard`) every staged
    file is removed, and files already renamed into place that did not exist before are removed.

        with AtomicFiles() as out:
            out.write_bytes(model_path, data)
            out.copy_file(weights_path, source_weights)   # streamed, never in Python memory
        # committed here; an exception inside the block leaves nothing

    Raises:
        OutputPathError: a folder that does not exist or cannot be written, a full disk (any OSError
            while creating, writing or renaming; the message names the file).
    """

    def __init__(self):
        self._staged: list[tuple[str, Path]] = []
        self._mode = file_mode()

    def _tmp(self, path: Path) -> tuple[int, str]:
        d = path.parent if str(path.parent) else Path(".")
        try:
            if path.is_dir():
                raise OutputPathError(f"{path}: is a folder, not a file path")
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=d)
        except OSError as err:
            raise OutputPathError(f"cannot write {path}: {err.strerror or err} (folder {d})") from err
        self._staged.append((tmp, path))
        return fd, tmp

    def write_bytes(self, path: str | Path, data: bytes) -> None:
        path = Path(path)
        fd, tmp = self._tmp(path)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                os.fchmod(f.fileno(), self._mode)
        except OSError as err:
            raise OutputPathError(f"cannot write {path}: {err.strerror or err}") from err

    def copy_file(self, path: str | Path, src: str | Path) -> None:
        """Stage a copy of ``src`` at ``path`` (``shutil.copyfile``: kernel copy, constant memory)."""
        path = Path(path)
        fd, tmp = self._tmp(path)
        os.close(fd)
        try:
            shutil.copyfile(src, tmp)
            os.chmod(tmp, self._mode)
        except OSError as err:
            raise OutputPathError(f"cannot copy {src} to {path}: {err.strerror or err}") from err

    def commit(self) -> None:
        done: list[tuple[Path, bool]] = []
        try:
            for tmp, path in self._staged:
                existed = path.exists()
                os.replace(tmp, path)
                done.append((path, existed))
        except OSError as err:
            for path, existed in done:
                if not existed:
                    path.unlink(missing_ok=True)
            self.discard()
            raise OutputPathError(f"cannot write {path}: {err.strerror or err}") from err
        self._staged = []

    def discard(self) -> None:
        for tmp, _ in self._staged:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        self._staged = []

    def __enter__(self) -> "AtomicFiles":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + rename, mode ``0o666 & ~umask``).

    Raises:
        OutputPathError: the folder does not exist or cannot be written (the whole write, temporary
            file creation included, is checked; nothing is left behind).
    """
    path = Path(path)
    d = path.parent if str(path.parent) else Path(".")
    if not d.is_dir():
        raise OutputPathError(f"{path}: folder {d} does not exist")
    with AtomicFiles() as out:
        out.write_bytes(path, data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(Path(path), text.encode())


def _placement_message(src_dir: Path, dst_dir: Path, locs: list[str]) -> str:
    return (
        f"the model keeps its weights in external file(s) {', '.join(locs)} in {src_dir}; ONNX Runtime, "
        f"OpenVINO and onnx refuse weight paths outside the model's folder, so a model written to {dst_dir} "
        "could not load them: write the output in the same folder as the source model, or copy the "
        "weight files into the output folder (anpred-instrument --copy-external-data)"
    )


def plan_external_data(
    model, path: Path, source_path: Path | None, copy_external_data: bool, locations: list[str] | None = None
) -> dict[str, tuple[Path, str]]:
    """Decide where the external weights of ``model`` (read from ``source_path``'s folder) go when
    the model is written to ``path``. Returns ``{old location: (source file, new location)}`` for the
    files to copy (empty: nothing to copy, the locations stay as they are).

    Raises:
        ExternalDataPlacementError: ``path`` is in another folder and ``copy_external_data`` is false.
    """
    locs = external_data_files(model) if locations is None else locations
    if not locs or source_path is None:
        return {}
    src_dir, dst_dir = Path(source_path).parent.resolve(), Path(path).parent.resolve()
    if src_dir == dst_dir:
        return {}
    if not copy_external_data:
        raise ExternalDataPlacementError(_placement_message(src_dir, dst_dir, locs))
    plan: dict[str, tuple[Path, str]] = {}
    base = Path(path).name
    used: set[str] = set()
    for k, loc in enumerate(locs):
        new = f"{base}.data" if len(locs) == 1 else f"{base}.{Path(loc).name}"
        if new in used:
            new = f"{base}.{k}.{Path(loc).name}"
        used.add(new)
        plan[loc] = (src_dir / loc, new)
    return plan


def save_model(
    model,
    path: str | Path,
    source_path: str | Path | None = None,
    *,
    copy_external_data: bool = False,
    extra_files: dict | None = None,
    external_locations: list[str] | None = None,
) -> list[Path]:
    """Save ``model`` to ``path`` atomically (with ``extra_files``, ``{path: bytes}``, in the same
    all-or-nothing write).

    A model with external data read from ``source_path``: written in the same folder, its
    ``location`` entries are kept (weights referenced, never loaded or copied); written to another
    folder, the weight files are copied next to ``path`` as ``<path name>.data`` (several:
    ``<path name>.<file name>``) when ``copy_external_data`` is true (streamed, byte-identical, so
    offsets stay valid), else :class:`ExternalDataPlacementError` is raised before anything is
    written. Without ``source_path`` the locations are written as they are. The model passed in is
    not modified. ``external_locations``: :func:`external_data_files` of ``model`` when the caller
    has it (saves a pass over the graph). Models over 2 GB must use external data (protobuf limit).

    Returns:
        the weight files written (empty when none were copied).

    Raises:
        ExternalDataPlacementError: see above (an OutputPathError, CLI exit 2).
        OutputPathError: the folder does not exist or cannot be written.
    """
    path = Path(path)
    d = path.parent if str(path.parent) else Path(".")
    if not d.is_dir():
        raise OutputPathError(f"{path}: folder {d} does not exist")
    plan = plan_external_data(
        model, path, Path(source_path) if source_path is not None else None, copy_external_data, external_locations
    )
    if plan:
        import onnx

        relocated = onnx.ModelProto()
        relocated.CopyFrom(model)
        for t in _external_tensors(relocated):
            for e in t.external_data:
                if e.key == "location" and e.value in plan:
                    e.value = plan[e.value][1]
        model = relocated
    written: list[Path] = []
    with AtomicFiles() as out:
        for src, new in plan.values():
            out.copy_file(path.parent / new, src)
            written.append(path.parent / new)
        out.write_bytes(path, model.SerializeToString())
        for p, data in (extra_files or {}).items():
            out.write_bytes(Path(p), data)
    return written


# ---- the one JSON encoder and the one ONNX element-type name ------------------------------------------
def json_default(o):
    """``json.dumps(..., default=json_default)``: numpy scalars that are not Python numbers already as
    Python numbers (non-finite numpy float32/float16 as the strings ``"nan"``, ``"inf"``, ``"-inf"``;
    Python floats and float64 never reach a ``default`` and follow ``json.dumps``' own rules), numpy
    arrays as lists, sets as sorted lists, paths and anything else as ``str`` (never raises)."""
    import math

    import numpy as np

    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        v = float(o)
        return v if math.isfinite(v) else str(v)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    return str(o)


def to_json(obj, *, indent: int | None = None) -> str:
    """``json.dumps(obj, indent=indent, default=json_default)``."""
    import json

    return json.dumps(obj, indent=indent, default=json_default)


def json_float(v):
    """JSON has no inf/nan: encode them as the strings ``"inf"``, ``"-inf"``, ``"nan"`` (other values
    as they are). Inverse: :func:`from_json_float`."""
    import math

    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def from_json_float(v):
    """The inverse of :func:`json_float`: a string (``"inf"``, ``"-inf"``, ``"nan"``) back to a float."""
    return float(v) if isinstance(v, str) else v


def json_safe(o, *, nan="nan"):
    """``o`` (dicts, lists, tuples, scalars) with every non-finite float encoded as :func:`json_float`
    does (NaN as ``nan``: ``"nan"`` by default, ``None`` for readers that want ``null``) and numpy
    integers/floats as Python numbers, recursively; other values as they are."""
    import math

    import numpy as np

    if isinstance(o, dict):
        return {k: json_safe(v, nan=nan) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v, nan=nan) for v in o]
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, (float, np.floating)):
        f = float(o)
        return nan if math.isnan(f) else json_float(f)
    return o


def iter_graphs(graph):
    """Yield ``graph`` (an ONNX ``GraphProto``) and every sub-graph nested in its nodes' GRAPH/GRAPHS
    attributes (If/Loop/Scan bodies, at any depth), iteratively: a graph is yielded before the
    sub-graphs of its nodes are looked at, and the last sub-graph found is visited first (a stack)."""
    import onnx

    stack = [graph]
    while stack:
        g = stack.pop()
        yield g
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(a.graphs)


def real_inputs(model) -> list[tuple[str, str, list[int | None] | None]]:
    """The real inputs of ``model`` (an ``onnx.ModelProto``) in graph order, initializers listed as
    inputs (older exporters) left out: ``(name, element type name (:func:`elem_type_name`), dims)``,
    dims None for an unknown rank, a dim None where it is dynamic."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = None
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
        out.append((vi.name, elem_type_name(tt.elem_type), dims))
    return out


def op_key(domain: str, op_type: str) -> str:
    """The key an operator is named by in coverage reports: ``op_type`` in the default ONNX domain
    (``""`` or ``ai.onnx``), ``domain::op_type`` otherwise (``com.microsoft::FusedConv``)."""
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


def model_ops(model) -> dict[str, tuple[str, str, int]]:
    """Every operator used in ``model`` (an ``onnx.ModelProto``; If/Loop/Scan bodies included, see
    :func:`iter_graphs`) as ``{op key (:func:`op_key`): (domain, op_type, opset version of its domain)}``,
    in first-seen order. Calls of model-local functions are replaced by the operators of their bodies
    (sub-graphs inside a function body are not walked). The opset version is the model's import for
    that domain (0 when the model imports none)."""
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
    local = {(f.domain, f.name) for f in model.functions}  # model-local functions: their bodies count
    out: dict[str, tuple[str, str, int]] = {}
    nodes = [n for g in iter_graphs(model.graph) for n in g.node]
    for f in model.functions:
        nodes.extend(f.node)
    for n in nodes:
        d = "" if n.domain == "ai.onnx" else n.domain
        if (n.domain, n.op_type) not in local:
            out.setdefault(op_key(d, n.op_type), (d, n.op_type, opsets.get(d, 0)))
    return out


def elem_type_name(elem_type: int) -> str:
    """The one name of an ONNX ``TensorProto`` element type: the numpy dtype name where numpy (with
    ml_dtypes) has one (``float32``, ``float16``, ``bfloat16``, ``int64``, ``float8_e4m3fn`` ...), else
    ONNX's own name in lower case (``string``, and types newer than numpy knows); ``unknown`` for
    ``UNDEFINED`` (0). Never raises."""
    if not elem_type:
        return "unknown"
    from onnx import helper

    try:
        import numpy as np

        dt = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
        if dt.kind != "O":
            return str(dt)
    except Exception:  # noqa: BLE001 - types numpy has no dtype for
        pass
    try:
        return helper.tensor_dtype_to_string(elem_type).removeprefix("TensorProto.").lower()
    except Exception:  # noqa: BLE001 - a number no onnx release knows
        return str(elem_type)
