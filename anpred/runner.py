"""The run driver: execute an anchored model on several backends, each in its own process, and store
what every backend saw in a run folder (:mod:`anpred.runstore`).

Isolation: every backend runs in a fresh ``python -m anpred.runner --worker JOB`` subprocess in its own
session (process group). A segfault or abort (negative exit status), a timeout (the whole process
group is killed), an unsupported operator, a Python exception, or a converter calling ``sys.exit``
becomes that backend's :class:`~anpred.backends.base.BackendStatus` (``ok`` | ``failed`` |
``unsupported`` | ``crashed`` | ``timeout`` with a reason); the other backends' results are kept.
Backends run one after the other (they use all cores each). The worker's stdout/stderr go to
``logs/<label>.log`` in the run folder (with ``PYTHONFAULTHANDLER`` tracebacks on crashes).

The run is built in a hidden sibling folder ``.<name>.partial-<pid>`` and renamed to ``out_dir`` at the
end, so a bad input, an interrupt or an error leaves nothing half-written and an existing run is only
replaced (with ``overwrite``) once the new one is complete.

Modes:

- ``tensors``: every anchor of every sample and backend in ``tensors/<label>/<sample>.safetensors``
  (``.npz`` for dtypes safetensors lacks; :mod:`anpred.tensorfile`) in the backend's own dtype and layout.
- ``stats``: no tensors; per backend ``stats/<label>.json`` holds streaming summaries per anchor over
  all samples, and ``stats/<label>.samples.jsonl`` one line of per-sample summaries per sample
  (written as it goes). Memory stays constant in the number of samples. See
  :class:`StreamingStats` for the statistics; ``anpred check`` reads these files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from anpred.backends import REGISTRY, backend_class
from anpred.backends.base import AnchorCapture, BackendStatus
from anpred.errors import AnpredError, BackendError, OutputPathError
from anpred.manifest import Anchor, AnchorManifest

STATS_SCHEMA = "anpred.stats/1"
MODES = ("tensors", "stats")
FAULTS = ("segfault", "abort", "exit", "hang", "raise")
_LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_UNSUPPORTED_RE = re.compile(r"not implemented|unsupported|not supported|NOT_IMPLEMENTED|No Op registered|"
                             r"could not find an implementation|no converter|is not available", re.I)
# Families of backends whose module cannot be imported (recorded status still needs one).
_FAMILY_GUESS = {"ort": "onnxruntime", "openvino": "openvino", "onnx-reference": "onnx-reference",
                 "torch": "torch", "tf": "tensorflow"}


@dataclass
class BackendSpec:
    """One backend of a run.

    Attributes:
        name: registry name (:data:`anpred.backends.REGISTRY`).
        label: the backend's identity in the run (folder names, statuses); default ``name``. Two specs
            of one run must have different labels. Characters: ``[A-Za-z0-9_.+-]``.
        options: passed to the backend constructor, except the runner's own keys:
            ``model`` (path of an alternative anchored ONNX run by this backend only, e.g. a
            fault-injected copy), ``family`` (overrides the backend's family in the status),
            ``_fault``/``_fault_at`` (testing hook: ``segfault`` | ``abort`` | ``exit`` | ``hang`` |
            ``raise`` in the worker at ``prepare`` or ``run`` (default), a real crash of that process).
    """

    name: str
    label: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.name not in REGISTRY:
            raise BackendError(f"unknown backend {self.name!r}; known backends: {', '.join(REGISTRY)}")
        self.label = self.label or self.name
        if not _LABEL_RE.match(self.label):
            raise BackendError(f"backend label {self.label!r} may hold only letters, digits and _ . + -")
        self.options = dict(self.options or {})
        fault = self.options.get("_fault")
        if fault is not None and fault not in FAULTS:
            raise BackendError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        if "model" in self.options and not Path(self.options["model"]).is_file():
            raise BackendError(f"backend {self.label}: alternative model {self.options['model']} does not exist")

    @classmethod
    def coerce(cls, b: "str | BackendSpec") -> "BackendSpec":
        return b if isinstance(b, BackendSpec) else cls(name=str(b).strip())

    def family(self) -> str:
        if self.options.get("family"):
            return str(self.options["family"])
        try:
            return backend_class(self.name).family
        except BackendError:
            return _FAMILY_GUESS.get(self.name.split("-")[0], self.name)


# ---- streaming statistics ------------------------------------------------------------------------
class StreamingStats:
    """Summary statistics of one anchor over all samples, updated one sample at a time in O(1) memory.

    Over the finite elements of all samples (float64 accumulation): ``count``, ``mean``, ``std``
    (population), ``min``, ``max``, ``abs_mean`` (mean of |x|), ``rms`` (sqrt of the mean of x**2);
    plus ``samples``, ``elements`` (all elements), ``nan``, ``posinf``, ``neginf``, the first sample's
    ``shape`` and ``dtype``. Mean and variance of batches are merged with Chan, Golub & LeVeque's
    pairwise update (Chan et al. 1979, "Updating formulae and a pairwise algorithm for computing sample
    variances"): ``delta = mean_b - mean_a; mean = mean_a + delta * n_b / n;
    M2 = M2_a + M2_b + delta**2 * n_a * n_b / n``.
    """

    def __init__(self):
        self.samples = self.elements = self.count = self.nan = self.posinf = self.neginf = 0
        self.mean = self.m2 = self.sum_abs = self.sum_sq = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.shape: list[int] | None = None
        self.dtype: str | None = None

    #: elements per chunk of :meth:`summarize` (512 KiB of float64: stays in L2 cache)
    CHUNK = 1 << 16

    @staticmethod
    def summarize(x: np.ndarray) -> dict[str, Any]:
        """Per-sample summary of one array (any shape; float, int or bool): over its finite elements
        ``count``, ``mean``, ``m2`` (sum of squared deviations), ``min``, ``max``, ``sum_abs``,
        ``sum_sq``, all float64; and ``elements``, ``nan``, ``posinf``, ``neginf`` counts.

        One pass over memory: the array is cast to float64 one cache-sized chunk at a time
        (:attr:`CHUNK` elements) and each chunk's (count, mean, M2) is merged with Chan et al.'s
        pairwise update (see the class docstring), so no full-size temporary is allocated. A chunk
        whose float64 sum is finite holds no NaN/Inf (a sum of at most 2**16 finite float32 values
        cannot overflow float64); only other chunks are masked."""
        a = np.asarray(x)
        if a.dtype.kind == "c":
            a = a.real
        flat = a.reshape(-1)
        size = int(flat.size)
        count, mean, m2 = 0, 0.0, 0.0
        mn, mx, sum_abs, sum_sq = math.inf, -math.inf, 0.0, 0.0
        nan = posinf = 0
        step = StreamingStats.CHUNK
        buf = np.empty(min(size, step), dtype=np.float64)
        sq = np.empty_like(buf)
        for s0 in range(0, size, step):
            c = flat[s0:s0 + step]
            b = buf[:c.size]
            np.copyto(b, c, casting="unsafe")
            tot = float(b.sum())
            if not math.isfinite(tot):
                fin = np.isfinite(b)
                nan += int(np.isnan(b).sum())
                posinf += int(np.isposinf(b).sum())
                b = b[fin]
                tot = float(b.sum())
            k = int(b.size)
            if not k:
                continue
            mn = min(mn, float(b.min()))
            mx = max(mx, float(b.max()))
            t = sq[:k]
            np.abs(b, out=t)
            sum_abs += float(t.sum())
            cm = tot / k
            np.subtract(b, cm, out=t)
            np.square(t, out=t)
            cm2 = float(t.sum())
            sum_sq += cm2 + k * cm * cm
            n = count + k
            delta = cm - mean
            mean += delta * k / n
            m2 += cm2 + delta * delta * count * k / n
            count = n
        return {"elements": size, "count": count, "nan": nan, "posinf": posinf,
                "neginf": size - count - nan - posinf, "mean": mean if count else 0.0,
                "m2": m2, "min": mn, "max": mx, "sum_abs": sum_abs, "sum_sq": sum_sq}

    def update(self, x: np.ndarray) -> dict[str, Any]:
        """Add one sample; returns that sample's summary (see :meth:`summarize`)."""
        if self.shape is None:
            self.shape, self.dtype = list(np.shape(x)), str(np.asarray(x).dtype)
        s = self.summarize(x)
        self.samples += 1
        self.elements += s["elements"]
        self.nan += s["nan"]
        self.posinf += s["posinf"]
        self.neginf += s["neginf"]
        nb = s["count"]
        if nb:
            n = self.count + nb
            delta = s["mean"] - self.mean
            self.mean += delta * nb / n
            self.m2 += s["m2"] + delta * delta * self.count * nb / n
            self.count = n
            self.min, self.max = min(self.min, s["min"]), max(self.max, s["max"])
            self.sum_abs += s["sum_abs"]
            self.sum_sq += s["sum_sq"]
        return s

    def to_dict(self) -> dict[str, Any]:
        c = self.count
        return {"samples": self.samples, "elements": self.elements, "count": c, "nan": self.nan,
                "posinf": self.posinf, "neginf": self.neginf, "mean": self.mean if c else None,
                "std": math.sqrt(self.m2 / c) if c else None, "min": self.min if c else None,
                "max": self.max if c else None, "abs_mean": self.sum_abs / c if c else None,
                "rms": math.sqrt(self.sum_sq / c) if c else None, "shape": self.shape, "dtype": self.dtype}


def sample_summary(s: dict[str, Any]) -> dict[str, Any]:
    """The per-sample line of ``stats/<label>.samples.jsonl`` for one anchor: mean, std, min, max,
    rms over finite elements, and the nan/inf counts."""
    c = s["count"]
    return {"mean": s["mean"] if c else None, "std": math.sqrt(s["m2"] / c) if c else None,
            "min": s["min"] if c else None, "max": s["max"] if c else None,
            "rms": math.sqrt(s["sum_sq"] / c) if c else None, "nan": s["nan"], "inf": s["posinf"] + s["neginf"]}


def read_stats(run_dir: str | Path, label: str) -> dict[str, Any]:
    """Read ``stats/<label>.json`` of a ``stats``-mode run (schema ``anpred.stats/1``)."""
    p = Path(run_dir) / "stats" / f"{label}.json"
    try:
        d = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise AnpredError(f"cannot read {p}: {err}") from err
    if d.get("schema") != STATS_SCHEMA:
        raise AnpredError(f"{p}: unsupported stats schema {d.get('schema')!r}")
    return d


# ---- driver --------------------------------------------------------------------------------------
def load_anchored(model_path: str | Path) -> tuple[Any, AnchorManifest, str]:
    """Load an anchored model and its manifest: from ``metadata_props``, else ``<stem>.anchors.json``
    next to it, else a manifest holding only the graph outputs (source ``outputs-only``).
    Returns ``(ModelProto, manifest, source)``. Raises ModelLoadError."""
    from anpred.onnx_io import load_model

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
    import onnx

    for o in model.graph.output:
        tt = o.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "float32"
        anchors.append(Anchor(name=output_anchor_name(o.name), value=o.name, stage=0, order=n - 1, producer="",
                              op_type="", shape=shape, dtype=dtype, kind="output"))
    return model, AnchorManifest(anchors=anchors, model={"source": str(p)}), "outputs-only"


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists():
        if not out.is_dir():
            raise OutputPathError(f"{out} exists and is not a folder; nothing was written")
        if any(out.iterdir()):
            if not (out / "run.json").exists():
                raise OutputPathError(f"{out} exists and is not empty (and is not a run); nothing was written")
            if not overwrite:
                raise OutputPathError(f"{out} already holds a run; choose another -o or pass --overwrite "
                                      "(nothing was written)")


def _missing_note(captures: dict[str, dict], manifest) -> str:
    """A short status reason for an ``ok`` backend that did not capture every anchor:
    ``"k of n anchors missing: <anchor>: <its reason>"`` (empty when all were captured)."""
    missing = [a.name for a in manifest.anchors if (captures.get(a.name) or {}).get("status") == "missing"]
    if not missing:
        return ""
    why = ((captures.get(missing[0]) or {}).get("reason") or "no reason given").strip().splitlines()[0]
    return f"{len(missing)} of {len(manifest.anchors)} anchors missing: {missing[0]}: {why[:160]}"


def run_model(model_path: str | Path, backends: Iterable["str | BackendSpec"], inputs: Any, out_dir: str | Path,
              *, mode: str = "tensors", timeout_s: float = 600, overwrite: bool = False, progress: bool = True,
              preprocess: str | None = None):
    """Run the anchored model on every backend and return the :class:`~anpred.runstore.RunStore`.

    Args:
        model_path: an anchored ``.onnx`` (manifest in its metadata, or ``<stem>.anchors.json`` beside
            it; a model without one is run with its graph outputs as the only anchors).
        backends: registry names or :class:`BackendSpec` objects, run in this order.
        inputs: an :class:`anpred.inputs.InputSpec`, or its text form (a folder, a ``.npz``/``.npy``/
            image file, or ``random:uniform|normal|images[:seed=S][:n=N][:shape=...]``).
        out_dir: the run folder to create (its parent folders are created).
        mode: ``tensors`` (store every anchor tensor) or ``stats`` (streaming statistics only).
        timeout_s: per backend limit in seconds for preparing and running all samples.
        overwrite: replace ``out_dir`` if it holds a run (only once the new run is complete).
        progress: show a tqdm bar per backend and print the summary table (stderr).
        preprocess: image preprocessing override (``yolo`` | ``imagenet`` | ``unit``).

    Raises:
        BackendError: unknown backend or duplicate labels (before anything is written).
        InputError: missing/unreadable inputs, inputs that do not fit the model.
        OutputPathError: ``out_dir`` holds another run (without ``overwrite``) or other files.
        ModelLoadError: the model is not readable ONNX.
    A backend that fails, crashes or times out does not raise: see the statuses in the store.
    """
    from anpred.inputs import InputSpec, check_shapes_fit, model_inputs
    from anpred.onnx_io import sha256_file
    from anpred.runstore import RunStore

    if mode not in MODES:
        raise AnpredError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    specs = [BackendSpec.coerce(b) for b in backends]
    if not specs:
        raise BackendError("no backend given; known backends: " + ", ".join(REGISTRY))
    labels = [s.label for s in specs]
    dups = sorted({x for x in labels if labels.count(x) > 1})
    if dups:
        raise BackendError(f"backend label(s) used twice: {', '.join(dups)} (give each spec its own label)")
    if not timeout_s or timeout_s <= 0:
        raise AnpredError(f"timeout must be positive (got {timeout_s})")
    model_path = Path(model_path).resolve()
    model, manifest, man_source = load_anchored(model_path)
    in_spec = InputSpec.parse(inputs, preprocess=preprocess)
    out = Path(out_dir).absolute()
    _check_out_dir(out, overwrite)
    for anc in [out.parent, *out.parent.parents]:
        if anc.exists():
            if not anc.is_dir():
                raise OutputPathError(f"cannot create {out}: {anc} is a file, not a folder (nothing was written)")
            break
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputPathError(f"cannot create {out.parent}: {err.strerror or err}") from err
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    _remove_stale_partials(out)
    hint = " ".join([model_path.name, model.producer_name, model.doc_string] +
                    [f"{p.key} {p.value}" for p in model.metadata_props if p.key != "anpred.manifest"] +
                    [str(manifest.model.get("source", ""))])
    restore_sigterm = _sigterm_raises()
    try:
        store = RunStore.create(tmp, manifest, mode=mode, inputs=in_spec.describe(hint), model={
            "path": str(model_path), "name": model_path.stem,
            "producer": f"{model.producer_name} {model.producer_version}".strip(),
            "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
            "manifest_source": man_source})
        store.meta["model"].update(copy_model(model_path, model, tmp))
        run_model_path = tmp / "model.onnx"
        minputs = model_inputs(model)
        checked: set = set()
        first_shapes: dict[str, list[int]] | None = None
        same_shapes = True
        for i, (src, arrays) in enumerate(in_spec.samples(minputs, hint)):
            key = tuple((k, tuple(v.shape)) for k, v in sorted(arrays.items()))
            if key not in checked:
                check_shapes_fit(model, {k: tuple(v.shape) for k, v in arrays.items()})
                checked.add(key)
            shapes = {k: list(v.shape) for k, v in arrays.items()}
            if first_shapes is None:
                first_shapes = shapes
            same_shapes = same_shapes and shapes == first_shapes
            store.add_sample(f"s{i:04d}", arrays, source=src)
        # the shapes actually fed (``size`` in the spec only applies to dynamic dims)
        store.meta["inputs"]["input_shapes"] = first_shapes if same_shapes else "varies by sample"
        store.meta["backend_specs"] = {s.label: {"name": s.name, "options": _json_safe(s.options)} for s in specs}
        for s in specs:
            if "model" in s.options:
                store.meta["backend_specs"][s.label]["model_sha256"] = sha256_file(s.options["model"])
        store.save_meta()
        shape_hint = first_shapes if same_shapes else None
        for spec in specs:
            store.set_status(_run_backend(store, spec, run_model_path, mode, timeout_s, progress, shape_hint))
        _raise_if_all_failed_on_shapes(store)
        shutil.rmtree(tmp / ".work", ignore_errors=True)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        restore_sigterm()
    result = RunStore.open(out)
    if progress:
        print(format_summary(result), file=sys.stderr)
    return result


class Terminated(KeyboardInterrupt):
    """SIGTERM received by the driver during :func:`run_model` (raised by its handler so that the
    worker process groups are killed and the partial run folder removed, as for Ctrl-C)."""


def _sigterm_raises():
    """While a run is in progress, make SIGTERM raise :class:`Terminated` in the driver (only from the
    main thread, and only when SIGTERM has its default action: an application's own handler is
    kept). Returns the function that restores the previous handler."""
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None

    def handler(signum, frame):
        raise Terminated(f"terminated by signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _remove_stale_partials(out: Path) -> None:
    """Remove ``.NAME.partial-PID`` siblings of ``out`` left by a driver that was killed (SIGKILL,
    power loss): those whose PID is no longer a running process."""
    for p in out.parent.glob(f".{out.name}.partial-*"):
        try:
            pid = int(p.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:
            pass  # another user's live process


def _die_with_parent(ppid: int) -> None:
    """Linux: have the kernel SIGKILL this worker when the driver process ``ppid`` dies
    (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, prctl(2)), so a driver killed even by SIGKILL leaves no
    orphan writing into a removed folder; no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != ppid:  # the driver died before the request took effect
        os._exit(1)


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


_SHAPE_FAIL_RE = re.compile(r"shape|dimension|Incompatible|broadcast|size mismatch|Sizes of tensors|"
                            r"must match|invalid size|cannot reshape", re.I)


def _raise_if_all_failed_on_shapes(store) -> None:
    """Bad input detected by the backends themselves: when *every* backend failed (not crashed) while
    running the same sample and every reason is a shape error, the sample does not fit the model.
    Raises InputError (one line) instead of storing a run in which nothing ran."""
    from anpred.errors import InputError

    sts = list(store.statuses().values())
    if not sts or any(s.status not in ("failed", "unsupported") for s in sts):
        return
    where = {s.reason.split(":", 1)[0] for s in sts}
    if len(where) != 1 or not next(iter(where)).startswith("sample ") or \
            not all(_SHAPE_FAIL_RE.search(s.reason) for s in sts):
        return
    sid = next(iter(where)).split()[1]
    src = next((x.get("source", "") for x in store.meta["samples"] if x["id"] == sid), "")
    first = sts[0].reason.split(":", 1)[1].strip().splitlines()[0][:240]
    raise InputError(f"the inputs do not fit the model: every backend ({', '.join(s.name for s in sts)}) failed on "
                     f"sample {sid} ({src}) with a shape error, e.g. {sts[0].name}: {first}")


_ARRAY_DUMP = re.compile(r"array\((?:[^()]|\([^()]*\))*\)", re.S)


def short_reason(err: BaseException, limit: int = 600) -> str:
    """``Type: message`` of an exception for a status reason: numpy array dumps inside the message
    (TensorFlow prints the arguments it received) become ``array(...)``, whitespace runs collapse,
    and the text is cut at ``limit`` characters (the full traceback is in the backend's log)."""
    text = _ARRAY_DUMP.sub("array(...)", str(err).strip())
    text = re.sub(r"<tf\.Tensor: shape=(\([^)]*\)), dtype=(\w+), numpy=\s*array\(\.\.\.\)>", r"<tf.Tensor \1 \2>", text)
    text = re.sub(r"\s+", " ", text)
    if len(text) > limit:
        text = text[: limit - 4].rstrip() + " ..."
    return f"{type(err).__name__}: {text}"


def format_summary(store) -> str:
    """The end-of-run table: backend, family, status, precision, samples, seconds (prepare / run),
    anchors captured of the manifest's, and the reason when not ok."""
    total = len(store.manifest.anchors)
    rows = [("backend", "family", "status", "precision", "samples", "prepare s", "run s", "anchors", "reason")]
    for label, st in store.statuses().items():
        prec = f"{st.precision} ({st.precision_requested} asked)" if st.precision_differs else st.precision
        rows.append((label, st.family, st.status, prec, str(st.samples), f"{st.seconds_prepare:.2f}",
                     f"{st.seconds_run:.2f}", f"{st.anchors_captured}/{total}", st.reason.splitlines()[0][:80] if st.reason else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _json_safe(d: dict) -> dict:
    return json.loads(json.dumps(d, default=str))


def _tail(path: Path, n: int = 6) -> str:
    """The last ``n`` non-empty lines of a worker log, led by Python's fatal-error line if any."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
    return " | ".join(fatal[-1:] + lines[-n:])[-800:]


def _run_backend(store, spec: BackendSpec, model_path: Path, mode: str, timeout_s: float, progress: bool,
                 input_shapes: dict[str, list[int]] | None = None) -> BackendStatus:
    from tqdm import tqdm

    root = store.root
    work = root / ".work" / spec.label
    work.mkdir(parents=True, exist_ok=True)
    (root / "logs").mkdir(exist_ok=True)
    log_path = root / "logs" / f"{spec.label}.log"
    status_path = work / "status.json"
    options = dict(spec.options)
    model = Path(options.pop("model", model_path)).resolve()
    family = spec.family()
    options.pop("family", None)
    try:
        cls = backend_class(spec.name)
    except BackendError:
        cls = None
    if getattr(cls, "needs_calibration", False) and "calibration" not in options:
        options["calibration"] = [str(store.input_file(sid)) for sid in store.sample_ids]
    if getattr(cls, "needs_input_shapes", False) and input_shapes and "input_shapes" not in options:
        options["input_shapes"] = input_shapes  # the run's concrete input shapes (all samples share them)
    job = {"store": str(root), "name": spec.name, "label": spec.label, "family": family, "options": options,
           "model": str(model), "mode": mode, "samples": store.sample_ids, "status_path": str(status_path)}
    job_path = work / "job.json"
    job_path.write_text(json.dumps(job, default=str))
    env = dict(os.environ)
    env["PYTHONFAULTHANDLER"] = "1"
    env["GLIBC_TUNABLES"] = worker_malloc_tunables(env.get("GLIBC_TUNABLES", ""))
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    n = len(store.sample_ids)
    rfd, wfd = os.pipe()
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "anpred.runner", "--worker", str(job_path), "--fd", str(wfd),
                                 "--parent", str(os.getpid())],
                                pass_fds=(wfd,), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(work), env=env, start_new_session=True)
    os.close(wfd)
    done, prepared, timed_out, buf = 0, False, False, b""
    bar = tqdm(total=n, desc=f"{spec.label:>14}", unit="sample", disable=not progress, leave=True, file=sys.stderr)
    bar.set_postfix_str("preparing")
    try:
        while True:
            remaining = start + timeout_s - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([rfd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = os.read(rfd, 4096)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                if ln == b"prepared":
                    prepared = True
                    bar.set_postfix_str("running")
                elif ln.startswith(b"sample "):
                    k = int(ln.split()[1])
                    bar.update(k - done)
                    done = k
        if not timed_out:
            try:
                proc.wait(timeout=max(start + timeout_s - time.monotonic(), 5.0))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        os.close(rfd)
        if timed_out or proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        bar.close()
    elapsed = time.monotonic() - start
    st = None
    if status_path.is_file():
        try:
            st = BackendStatus.from_dict(json.loads(status_path.read_text()))
        except (OSError, json.JSONDecodeError, TypeError):
            st = None
    if st is None:
        st = BackendStatus(name=spec.label, family=family)
    final = st.status in ("ok", "failed", "unsupported")
    if timed_out:
        stage = "running samples" if prepared else "preparing"
        st.status = "timeout"
        st.reason = f"no result within {timeout_s:g} s (killed while {stage}; {done}/{n} samples done)"
        st.samples = done
    elif not final:
        rc = proc.returncode
        if rc is not None and rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = f"signal {-rc}"
            st.status, what = "crashed", f"process killed by {sig}"
        else:
            st.status, what = "failed", f"process exited with status {rc} without a result"
        stage = "running samples" if prepared else "preparing"
        st.reason = f"{what} while {stage} ({done}/{n} samples done); log: {_tail(log_path, 4)}"
        st.samples = done
    res_path = status_path.with_name("resources.json")
    resources = json.loads(res_path.read_text()) if res_path.is_file() else {}
    resources["seconds_wall"] = round(elapsed, 3)  # process start to exit, as seen by the driver
    store.meta.setdefault("resources", {})[spec.label] = resources
    if st.status != "ok" and not prepared:
        st.seconds_prepare = st.seconds_prepare or elapsed
    return st


# ---- worker (runs in the backend's own process) --------------------------------------------------
def _fault(options: dict, where: str) -> None:
    kind = options.get("_fault")
    if not kind or options.get("_fault_at", "run") != where:
        return
    if kind == "segfault":
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    elif kind == "abort":
        os.abort()
    elif kind == "exit":
        sys.exit(3)
    elif kind == "hang":
        time.sleep(10**6)
    elif kind == "raise":
        raise RuntimeError("fault injected by the _fault option")


def _classify(err: BaseException) -> str:
    if isinstance(err, NotImplementedError) or _UNSUPPORTED_RE.search(str(err)):
        return "unsupported"
    return "failed"


#: glibc malloc settings of every backend worker (see :func:`worker_malloc_tunables`)
WORKER_MALLOC_TUNABLES = {"glibc.malloc.mmap_threshold": str(256 << 20), "glibc.malloc.trim_threshold": str(1 << 30)}


def worker_malloc_tunables(existing: str = "") -> str:
    """``GLIBC_TUNABLES`` for a backend worker: ``existing`` plus :data:`WORKER_MALLOC_TUNABLES` for
    the malloc settings it does not set itself (a user's own settings win).

    Why: every sample allocates the same large arrays again (inputs, the backend's outputs: 19 MB per
    sample for YOLOv8n at 640x640). With glibc's defaults, blocks above the dynamic mmap threshold
    (at most 32 MiB) are ``mmap``-ed and freed blocks at the top of the heap are trimmed, so each
    sample faults in fresh pages again: measured 5 ms per 19 MB sample on the 2-core VM of
    docs/run.md, where a fresh page costs ~2-4 us. A fixed 256 MiB mmap threshold and a 1 GiB trim
    threshold keep those blocks in the heap for reuse; memory stays bounded by one sample's working
    set (peak RSS in docs/run.md). Other C libraries ignore the variable."""
    have = {kv.split("=", 1)[0] for kv in existing.split(":") if "=" in kv}
    add = [f"{k}={v}" for k, v in WORKER_MALLOC_TUNABLES.items() if k not in have]
    return ":".join([x for x in [existing] if x] + add)


def _write_summaries(stats: dict[str, StreamingStats], jsonl, sid: str, res: dict[str, np.ndarray]) -> None:
    """Mode ``stats``: fold one sample into the per-anchor :class:`StreamingStats` and append its line
    to ``stats/<label>.samples.jsonl`` (runs in the worker's writer thread)."""
    line = {k: sample_summary(stats[k].update(v)) for k, v in res.items() if k in stats}
    jsonl.write(json.dumps({"sample": sid, "anchors": line}) + "\n")
    jsonl.flush()


def _worker(job_path: str, fd: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from anpred.runstore import RunStore

    job = json.loads(Path(job_path).read_text())
    pipe = os.fdopen(fd, "wb", buffering=0)
    label, options = job["label"], dict(job["options"])
    fault_opts = {k: options.pop(k) for k in list(options) if k.startswith("_")}
    root = Path(job["store"])
    manifest = AnchorManifest.load(root / "manifest.json")
    store = RunStore(root, {}, manifest)
    st = BackendStatus(name=label, family=job["family"])
    status_path = Path(job["status_path"])

    def save():
        from anpred.onnx_io import atomic_write_text

        atomic_write_text(status_path, json.dumps(st.to_dict(), default=str))

    def emit(line: str):
        try:
            pipe.write(line.encode() + b"\n")
        except OSError:
            pass

    stage = "preparing"
    sid = None
    # one writer thread: storing sample i (tensors, or summaries in stats mode) overlaps running i+1
    writer = ThreadPoolExecutor(max_workers=1)
    pending = None
    try:
        backend = backend_class(job["name"])(options)
        st.versions = backend.versions()
        _fault(fault_opts, "prepare")
        t0 = time.perf_counter()
        backend.prepare(job["model"], manifest, Path(job_path).parent / "scratch")
        st.seconds_prepare = time.perf_counter() - t0
        st.precision, st.precision_requested = backend.effective_precision(), backend.precision
        st.versions = backend.versions()
        info = backend.anchor_info()
        st.captures = {k: asdict(v) for k, v in info.items()}
        st.status = "running"
        save()
        emit("prepared")
        stage = "running"
        stats = {a.name: StreamingStats() for a in manifest.anchors} if job["mode"] == "stats" else None
        jsonl = None
        if stats is not None:
            (root / "stats").mkdir(exist_ok=True)
            jsonl = open(root / "stats" / f"{label}.samples.jsonl", "w")
        returned: set[str] | None = None
        run_s = 0.0
        loop_t0 = time.perf_counter()
        for i, sid in enumerate(job["samples"]):
            inputs = store.read_inputs(sid)
            t = time.perf_counter()
            res = backend.run(inputs)
            run_s += time.perf_counter() - t
            _fault(fault_opts, "run")
            returned = set(res) if returned is None else returned & set(res)
            if i == 0:
                st.dtypes = {k: str(np.asarray(v).dtype) for k, v in res.items()}
            if pending is not None:
                pending.result()
            if stats is None:
                pending = writer.submit(store.write_anchors, label, sid, res)
            else:
                pending = writer.submit(_write_summaries, stats, jsonl, sid, res)
            st.samples = i + 1
            emit(f"sample {i + 1}")
        if pending is not None:
            pending.result()
        loop_s = time.perf_counter() - loop_t0
        st.seconds_run = run_s
        returned = returned or set()
        for a in manifest.anchors:
            cap = st.captures.setdefault(a.name, asdict(AnchorCapture(layout=a.layout)))
            if a.name not in returned and cap.get("status") != "missing":
                cap["status"] = "missing"
                cap["reason"] = cap.get("reason") or "announced by the backend but not returned by run()"
        st.anchors_captured = sum(1 for a in manifest.anchors if a.name in returned)
        if stats is not None:
            from anpred.onnx_io import atomic_write_text

            jsonl.close()
            atomic_write_text(root / "stats" / f"{label}.json", json.dumps(
                {"schema": STATS_SCHEMA, "backend": label, "samples": st.samples,
                 "anchors": {k: s.to_dict() for k, s in stats.items() if s.samples}}, indent=1))
        st.status, st.reason = "ok", _missing_note(st.captures, manifest)
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        from anpred.onnx_io import atomic_write_text

        # seconds_loop: the sample loop as the worker saw it (reading inputs, Backend.run, storing
        # anchors or statistics, waiting for the last write), one-time start/prepare excluded
        atomic_write_text(status_path.with_name("resources.json"), json.dumps(
            {"peak_rss_bytes": peak, "seconds_loop": round(loop_s, 4), "seconds_prepare": round(st.seconds_prepare, 4),
             "glibc_tunables": os.environ.get("GLIBC_TUNABLES")}))
    except SystemExit as err:
        st.status = "failed"
        st.reason = (f"sys.exit({err.code}) called while {stage}" + (f" sample {sid}" if stage == "running" else "")
                     + " (a converter exiting the process; see logs/" + label + ".log)")
    except BaseException as err:  # noqa: BLE001 - every failure becomes this backend's status
        st.status = _classify(err)
        where = f"sample {sid}" if stage == "running" else "prepare"
        st.reason = f"{where}: {short_reason(err)}"
        import traceback

        traceback.print_exc()
    finally:
        try:
            save()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            pipe.close()
            os._exit(0)  # skip interpreter teardown (some runtimes crash there)


def _main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m anpred.runner", description="ANPRED backend worker (internal)")
    p.add_argument("--worker", required=True, help="job JSON written by run_model")
    p.add_argument("--fd", type=int, required=True, help="pipe for progress lines")
    p.add_argument("--parent", type=int, default=0, help="the driver's pid (the worker dies with it)")
    a = p.parse_args(argv)
    if a.parent:
        _die_with_parent(a.parent)
    _worker(a.worker, a.fd)


if __name__ == "__main__":
    _main()
