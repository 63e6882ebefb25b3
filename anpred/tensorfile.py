"""Array files of the run store (:mod:`anpred.run.store`): safetensors written with direct I/O, and
the one reader of every array file a run holds (:func:`read_array_file`: ``.safetensors`` or ``.npz``).

This module sits below both the run package and the backends (``ort-int8`` reads its calibration
inputs with :func:`read_array_file`), and imports neither.

Format: safetensors (https://github.com/huggingface/safetensors, "Format" section of its README): an
8-byte little-endian header length ``N``, ``N`` bytes of UTF-8 JSON ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {str: str}}`` padded with spaces, then the tensors'
bytes, contiguous, little-endian, C order. Files are read with the ``safetensors`` package
(:func:`read_safetensors`); they are written here (:func:`write_safetensors`) for speed only:

Why not ``safetensors.numpy.save_file`` or ``np.savez``: a run stores every anchor of every sample
(tens of megabytes per sample for YOLOv8n at 640x640). Buffered writes allocate that much fresh page cache per
sample, and fresh pages cost nearly as much as the inference (docs/run.md, 'Measurements: page
faults'; ``np.savez`` also CRC-32s every byte). The writer therefore copies the
sample into one reused, page-aligned buffer and writes it with ``O_DIRECT`` (Linux ``open(2)``), which
bypasses the page cache; the file is then truncated to its exact length. Where ``O_DIRECT`` is
unavailable or refused (tmpfs, macOS, ``ANPRED_DIRECT_IO=0``) the same bytes are written buffered.
Measured in docs/run.md (benchmarks/bench_run.py).

Tensors are laid out by decreasing item size (then name), so every tensor starts at an offset aligned
to its item size; the original key order is kept in ``__metadata__["anpred.order"]`` and restored on
reading.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import struct
import threading
from pathlib import Path

import numpy as np

__all__ = [
    "SAFETENSORS_DTYPES",
    "c_contiguous",
    "storable",
    "write_safetensors",
    "read_safetensors",
    "array_file_keys",
    "read_array_file",
]

#: numpy dtype -> safetensors dtype string (safetensors spec; little-endian only; bfloat16 as an
#: ``ml_dtypes`` array). Arrays of any other dtype (big-endian, float8, complex, strings, objects)
#: are not stored this way (the run store falls back to ``.npz`` for them).
SAFETENSORS_DTYPES: dict[np.dtype, str] = {
    np.dtype("<f8"): "F64",
    np.dtype("<f4"): "F32",
    np.dtype("<f2"): "F16",
    np.dtype("<i8"): "I64",
    np.dtype("<u8"): "U64",
    np.dtype("<i4"): "I32",
    np.dtype("<u4"): "U32",
    np.dtype("<i2"): "I16",
    np.dtype("<u2"): "U16",
    np.dtype("i1"): "I8",
    np.dtype("u1"): "U8",
    np.dtype("?"): "BOOL",
}
try:  # bfloat16 arrays (ml_dtypes, which onnx depends on): safetensors reads "BF16" back as such.
    # (Its numpy reader has no float8 types, so float8 arrays stay on the .npz fallback.)
    import ml_dtypes as _ml

    SAFETENSORS_DTYPES[np.dtype(_ml.bfloat16)] = "BF16"
except ImportError:  # pragma: no cover - onnx requires ml_dtypes
    pass
_ALIGN = 4096  # O_DIRECT: buffer address, file offset and length multiples of the logical block size
_ORDER_KEY = "anpred.order"
_CACHE_MAX = 256 << 20  # larger staging buffers are not kept after the write
_local = threading.local()
_direct_refused: set[int] = set()  # st_dev of file systems that refused O_DIRECT


def c_contiguous(a, dtype=None) -> np.ndarray:
    """``a`` as a C-contiguous ndarray (of ``dtype`` when given) **of the same rank**: a 0-d (scalar)
    array stays 0-d. Use it instead of ``np.ascontiguousarray``, which returns at least 1-d (numpy's
    documented behaviour): a scalar graph input fed as ``[1]`` fails on every runtime that checks the
    input's shape (OpenVINO, TVM, ncnn, TensorFlow, LiteRT on ONNX's ``clip_splitbounds``)."""
    return np.require(np.asarray(a, dtype=dtype), requirements="C")


def storable(arrays: dict[str, np.ndarray]) -> bool:
    """True when every array's dtype has a safetensors dtype (see :data:`SAFETENSORS_DTYPES`)."""
    return all(np.asarray(a).dtype in SAFETENSORS_DTYPES for a in arrays.values())


def _buffer(size: int) -> np.ndarray:
    """A page-aligned staging buffer (an anonymous mmap) of at least ``size`` bytes. Up to 256 MiB it
    is this thread's buffer, grown as needed and kept for reuse (re-touching the same pages is cheap,
    fresh ones are not: module docstring); a larger one is made for this write only and unmapped when
    the caller drops it."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < size:
        cap = max(size, 1 << 20)
        cap = (cap + _ALIGN - 1) // _ALIGN * _ALIGN
        m = mmap.mmap(-1, cap)
        buf = np.frombuffer(m, dtype=np.uint8)
        if cap <= _CACHE_MAX:
            _local.buf = buf
    return buf


def _direct_wanted(dirpath: Path) -> bool:
    if not getattr(os, "O_DIRECT", 0) or os.environ.get("ANPRED_DIRECT_IO", "1") == "0":
        return False
    try:
        return os.stat(dirpath).st_dev not in _direct_refused
    except OSError:
        return False


def _write_all(fd: int, view: memoryview) -> None:
    off = 0
    while off < len(view):
        off += os.write(fd, view[off:])


def write_safetensors(path: str | Path, arrays: dict[str, np.ndarray], *, direct: bool = True) -> int:
    """Write ``arrays`` (name -> array of a dtype in :data:`SAFETENSORS_DTYPES`, any shape incl. 0-d
    and empty) to ``path`` as one safetensors file; returns its size in bytes. ``direct``: write with
    ``O_DIRECT`` where possible (for files written once and read rarely: the page cache is bypassed,
    so a later read comes from the device); False for files read again soon (a run's inputs, read by
    every backend). Not atomic: write to a temporary name and ``os.replace`` it. Raises ValueError for
    a dtype safetensors cannot hold and OSError from the file system."""
    path = Path(path)
    arrs = {k: np.asarray(v, order="C") for k, v in arrays.items()}  # (ascontiguousarray makes 0-d 1-d)
    order = sorted(arrs, key=lambda k: (-arrs[k].dtype.itemsize, k))
    header: dict[str, object] = {"__metadata__": {_ORDER_KEY: json.dumps(list(arrs))}}
    off = 0
    for k in order:
        a = arrs[k]
        if a.dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"{k}: dtype {a.dtype} has no safetensors dtype")
        header[k] = {
            "dtype": SAFETENSORS_DTYPES[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [off, off + a.nbytes],
        }
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 8)  # data start 8-aligned (what safetensors itself writes)
    start = 8 + len(h)
    total = start + off
    padded = (total + _ALIGN - 1) // _ALIGN * _ALIGN
    buf = _buffer(padded)
    buf[:8] = np.frombuffer(struct.pack("<Q", len(h)), dtype=np.uint8)
    buf[8:start] = np.frombuffer(h, dtype=np.uint8)
    pos = start
    for k in order:
        a = arrs[k]
        n = a.nbytes
        if n:
            buf[pos : pos + n] = a.reshape(-1).view(np.uint8)
        pos += n
    buf[total:padded] = 0
    view = memoryview(buf)
    try:
        if direct and _direct_wanted(path.parent):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
                _direct_refused.add(os.stat(path.parent).st_dev)
            else:
                try:
                    _write_all(fd, view[:padded])
                    os.ftruncate(fd, total)
                    return total
                except OSError as err:
                    if err.errno != errno.EINVAL:
                        raise
                    _direct_refused.add(os.fstat(fd).st_dev)
                finally:
                    os.close(fd)
        with open(path, "wb") as f:
            f.write(view[:total])
        return total
    finally:
        view.release()


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file, in the order they were written (``__metadata__
    ["anpred.order"]`` when present, else the file's order). Raises ValueError for a corrupt or
    truncated file, OSError when it cannot be read."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np", backend="pread") as f:
            keys = list(f.keys())
            meta = f.metadata() or {}
            if _ORDER_KEY in meta:
                try:
                    wanted = json.loads(meta[_ORDER_KEY])
                    if sorted(wanted) == sorted(keys):
                        keys = wanted
                except ValueError:
                    pass
            return {k: f.get_tensor(k) for k in keys}
    except SafetensorError as err:
        raise ValueError(f"{path}: not a readable safetensors file ({err})") from err


def array_file_keys(path: str | Path) -> list[str]:
    """The tensor names of a ``.safetensors`` file (its header only) or an ``.npz`` archive (member
    names). Raises ValueError/OSError/zipfile.BadZipFile for unreadable files."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="np", backend="pread") as f:
                return list(f.keys())
        except SafetensorError as err:
            raise ValueError(f"{path}: not a readable safetensors file ({err})") from err
    with np.load(path) as z:
        return list(z.files)


def read_array_file(path: str | Path, keys=None) -> dict[str, np.ndarray]:
    """Arrays of a ``.safetensors`` file (:func:`read_safetensors`) or an ``.npz`` archive (member
    names mapped through ``keys`` when given: the run store's .npz anchor files use
    :func:`anpred.naming.file_key`). Raises ValueError/OSError/zipfile.BadZipFile for unreadable files."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    with np.load(path) as z:
        return {(keys(k) if keys else k): z[k] for k in z.files}
