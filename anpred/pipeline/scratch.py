"""Where a streamed run keeps its transient files (:mod:`anpred.pipeline.stream`).

A streamed dataset writes, per chunk, its inputs and every backend's anchor tensors, reads them back
at once in the judge and deletes them: on DocLayNet pages about 18 MB a page, 6.7 GB written to the
device in a 200-page run. On a disk those writes go back to the device (the kernel's writeback, beside
the backends), and a memory-backed file system (``tmpfs``: ``/dev/shm`` on Linux) keeps them in memory:
the same 200 pages with four backends on 2 cores took 169.3 s on ``/dev/shm`` against 190.8 s on the
disk (backends' inference inside the stream 138.9 s against 155.2 s; docs/task.md, "Where the chunks
live"). The final run folder, the checkpoint and the int8 calibration files stay beside ``-o``.

:func:`scratch_folder` picks the memory-backed folder where it has room for the chunks (a bound from the
model's static shapes, :func:`scratch_bytes`) and that bound is at most
:data:`MEMORY_SHARE` of the memory available, else the folder beside ``-o``. ``ANPRED_STREAM_SCRATCH``
overrides: ``disk`` (beside ``-o``) or a folder. The memory one is named after the process
(``anpred-stream-<pid>-<random>``), and a later stream removes those whose process is gone (a run
killed with SIGKILL cannot remove its own).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["scratch_folder", "scratch_bytes", "sample_anchor_bytes", "memory_backed", "remove_stale", "MEMORY_FOLDERS",
           "MEMORY_SHARE", "PREFIX"]

#: memory-backed folders tried in order (Linux: the POSIX shared-memory tmpfs)
MEMORY_FOLDERS = ("/dev/shm",)

#: the chunks go to memory only where their bound is at most this share of ``MemAvailable`` at the start:
#: the rest stays for the backends' processes and the judge (on DocLayNet with four backends they peak at
#: 5.4 GiB and the bound is 3.8 GiB: a 24 GiB machine with 22 GiB available uses memory, a 8 GiB one does
#: not). A documented default, not a measurement of the run: the backends' own peak is not known before
#: they run
MEMORY_SHARE = 0.25

PREFIX = "anpred-stream-"


def memory_backed(folder: str | Path) -> bool:
    """Whether ``folder`` lies on a ``tmpfs`` or ``ramfs`` mount (the longest mount point of
    ``/proc/mounts`` above it). False where ``/proc/mounts`` cannot be read (another OS)."""
    path = os.path.realpath(folder)
    best, kind = "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        return False
    return kind in ("tmpfs", "ramfs")


def _mem_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes, or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def remove_stale(root: str | Path) -> list[Path]:
    """Remove the ``anpred-stream-<pid>-*`` folders of ``root`` whose process no longer exists (or
    is not ours to signal as the same user: left alone). Returns the folders removed."""
    gone = []
    try:
        entries = list(Path(root).glob(PREFIX + "*"))
    except OSError:
        return gone
    for p in entries:
        try:
            pid = int(p.name[len(PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        try:
            os.kill(pid, 0)
            continue  # alive
        except ProcessLookupError:
            pass
        except (PermissionError, OSError):
            continue  # another user's process, or unknown: not ours
        shutil.rmtree(p, ignore_errors=True)
        gone.append(p)
    return gone


def scratch_folder(beside: Path, need: int, *, candidates=None) -> tuple[Path, str]:
    """A new empty folder for a streamed run's chunks and its kind (``"memory"`` or ``"disk"``).

    Args:
        beside: the folder used on disk (created, emptied first).
        need: bytes the chunks may hold at once (:func:`scratch_bytes`).
        candidates: memory-backed folders to try (default :data:`MEMORY_FOLDERS`).

    ``ANPRED_STREAM_SCRATCH=disk`` always returns ``beside``; another value is a folder used as given
    (kind ``"memory"`` where it is memory-backed). Otherwise the first candidate that is memory-backed,
    writable and has ``need`` bytes free, where ``need`` is at most :data:`MEMORY_SHARE` of
    ``MemAvailable``; else ``beside``. Raises OSError where ``beside`` (or the folder given) cannot be
    created."""
    env = os.environ.get("ANPRED_STREAM_SCRATCH", "").strip()
    if env and env != "disk":
        root = Path(env)
        root.mkdir(parents=True, exist_ok=True)
        remove_stale(root)
        return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root)), \
            ("memory" if memory_backed(root) else "disk")
    if not env:
        avail = _mem_available()
        for c in MEMORY_FOLDERS if candidates is None else candidates:
            try:
                if not (os.path.isdir(c) and os.access(c, os.W_OK) and memory_backed(c)):
                    continue
                remove_stale(c)
                free = shutil.disk_usage(c).free
                if avail is None or need > free or need > MEMORY_SHARE * avail:
                    continue
                return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=c)), "memory"
            except OSError:
                continue
    shutil.rmtree(beside, ignore_errors=True)
    beside.mkdir(parents=True)
    return beside, "disk"


def sample_anchor_bytes(manifest, n_backends: int) -> int:
    """Bytes of anchor tensors one sample writes for ``n_backends`` backends, from the manifest's static
    shapes (an unknown dimension counts as 1; an unknown dtype as float32)."""
    import numpy as np

    per = 0
    for a in manifest.anchors:
        n = 1
        for d in a.shape or []:
            n *= d if isinstance(d, int) and d > 0 else 1
        per += n * np.dtype(a.dtype if a.dtype in np.sctypeDict else "float32").itemsize
    return per * max(1, n_backends)


def scratch_bytes(anchored, n_backends: int, chunk: int, later: int, head: list) -> int:
    """Bytes a streamed run's chunk folder may hold at once (an upper bound): three chunks of anchor
    tensors stored in full (the one being judged, the one queued, the one running; where positions
    are sampled only the first is full, so this overestimates) and three chunks of inputs of the larger
    chunk size. ``anchored``: the anchored model (its manifest's static shapes,
    :func:`sample_anchor_bytes`); ``head``: ``[(source, {input name: array})]``, the first sample
    (its inputs' bytes stand for every sample's; empty: 0)."""
    import numpy as np

    from anpred.run.model import load_anchored

    per_input = sum(np.asarray(a).nbytes for a in head[0][1].values()) if head else 0
    return 3 * chunk * sample_anchor_bytes(load_anchored(Path(anchored))[1], n_backends) \
        + 3 * max(chunk, later) * per_input
