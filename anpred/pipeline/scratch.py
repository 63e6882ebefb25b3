"""Where a streamed run keeps its transient files (:mod:`anpred.pipeline.stream`).

A streamed dataset writes, per chunk, its inputs and every backend's anchor tensors, reads them back
at once in the judge and deletes them. On a disk the kernel writes them back to the device beside
the backends, and a memory-backed file system (``tmpfs``: ``/dev/shm`` on Linux) keeps them in memory,
which makes the stream faster (docs/task.md, "Where the chunks live").
The final run folder, the checkpoint, the int8 calibration files, the workers' prepared models
and the kept samples' re-run stay beside ``-o``.

:func:`scratch_folder` picks the memory-backed folder where it has room for the chunks (the estimate
:func:`scratch_bytes`, from the model's static shapes) and that estimate is at most
:data:`MEMORY_SHARE` of the memory available (``MemAvailable``, and the memory cgroup's limit where
one is set), else the folder beside ``-o``. ``ANPRED_STREAM_SCRATCH`` overrides: ``disk`` (beside
``-o``), ``memory`` (a memory-backed folder with room, whatever the share; else the disk, with a
warning) or a folder. A
memory-backed folder holds a lock file for the life of the run (``flock``); every stream first
removes the ``anpred-stream-*`` folders whose lock is free (a run killed with SIGKILL or by the OOM
killer could not remove its own; a live run in another container sharing ``/dev/shm`` holds its
lock). If the tmpfs fills up during a run anyway (another program's files), a worker's write fails
with "No space left on device" and that backend is failed for the rest of the run, as on a full disk:
``ANPRED_STREAM_SCRATCH=disk`` avoids it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = [
    "scratch_folder",
    "static_size",
    "remove_scratch",
    "scratch_bytes",
    "sample_anchor_bytes",
    "memory_backed",
    "remove_stale",
    "MEMORY_FOLDERS",
    "MEMORY_SHARE",
    "PREFIX",
    "LOCK",
]

#: memory-backed folders tried in order (Linux: the POSIX shared-memory tmpfs)
MEMORY_FOLDERS = ("/dev/shm",)

#: the chunks go to memory only where their estimate is at most this share of the memory available at
#: the start: the rest stays for the backends' processes and the judge. A documented default, not a
#: measurement of the run (the backends' own peak is not known before they run); its source, the
#: processes' peak and the chunks' estimate on DocLayNet with four backends: docs/task.md, "Where the
#: chunks live"
MEMORY_SHARE = 0.25

PREFIX = "anpred-stream-"
#: the lock file a run holds in its memory-backed folder
LOCK = ".lock"
_held: dict[str, int] = {}  # folder -> the open descriptor of its lock (this process)


def memory_backed(folder: str | Path) -> bool:
    """Whether ``folder`` lies on a ``tmpfs`` mount (the longest mount point of ``/proc/mounts`` above
    it). False where ``/proc/mounts`` cannot be read (another OS)."""
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
    return kind == "tmpfs"


def _cgroup_room() -> int | None:
    """Bytes the process' memory cgroup (v2 ``memory.max - memory.current``, v1
    ``memory.limit_in_bytes - memory.usage_in_bytes``) may still take, or None where no limit is set
    or none can be read (tmpfs pages are charged to the cgroup that writes them)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, ctrl, path = (line.split(":", 2) + ["", ""])[:3]
        if hid == "0" and ctrl == "":
            pairs = [(f"/sys/fs/cgroup{path}/memory.max", f"/sys/fs/cgroup{path}/memory.current")]
        elif "memory" in ctrl.split(","):
            base = f"/sys/fs/cgroup/memory{path}"
            pairs = [(f"{base}/memory.limit_in_bytes", f"{base}/memory.usage_in_bytes")]
        else:
            continue
        for lim, cur in pairs:
            try:
                raw = Path(lim).read_text().strip()
                if raw == "max" or int(raw) >= 1 << 60:
                    return None
                return int(raw) - int(Path(cur).read_text().strip())
            except (OSError, ValueError):
                continue
    return None


def _mem_available() -> int | None:
    """Bytes of memory available: ``MemAvailable`` of ``/proc/meminfo``, or less where the memory
    cgroup has less room (:func:`_cgroup_room`); None where neither can be read."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        avail = None
    room = _cgroup_room()
    if room is not None:
        avail = room if avail is None else min(avail, room)
    return avail


def remove_stale(root: str | Path) -> list[Path]:
    """Remove the ``anpred-stream-*`` folders of ``root`` whose lock file (:data:`LOCK`) no process
    holds: their run ended without removing them (SIGKILL, the OOM killer). A folder without a lock
    file, or whose lock is held (a live run, in this container or another sharing the folder), is left
    alone (a run's folder gets its name only once its lock is held: :func:`_locked_folder`). Returns
    the folders removed."""
    gone = []
    try:
        entries = list(Path(root).glob(PREFIX + "*"))
    except OSError:
        return gone
    for p in entries:
        try:
            fd = os.open(p / LOCK, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # held: a live run
        try:
            _remove(p)
        finally:
            os.close(fd)
        if not p.exists():
            gone.append(p)
    return gone


def _remove(folder: Path) -> None:
    """Remove ``folder``: everything but its lock file first, the lock file last (a folder that
    survives part-way keeps its lock file, so a later stream can still reap it)."""
    try:
        children = [c for c in folder.iterdir() if c.name != LOCK]
    except OSError:
        return
    for c in children:
        if c.is_dir() and not c.is_symlink():
            shutil.rmtree(c, ignore_errors=True)
        else:
            c.unlink(missing_ok=True)
    if not any(c.name != LOCK for c in folder.iterdir()):
        (folder / LOCK).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


def _locked_folder(root: str | Path) -> Path:
    """A new ``anpred-stream-<pid>-*`` folder under ``root`` holding its lock (until :func:`remove_scratch`):
    made and locked under a hidden name first, then renamed, so that no other stream's
    :func:`remove_stale` sees it before its lock is held."""
    tmp = Path(tempfile.mkdtemp(prefix=f".anpred-new-{os.getpid()}-", dir=root))
    fd = -1
    try:
        fd = os.open(tmp / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        folder = tmp.with_name(PREFIX + tmp.name[len(".anpred-new-") :])
        os.rename(tmp, folder)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _held[str(folder)] = fd
    return folder


def remove_scratch(folder: str | Path | None) -> None:
    """Remove a folder of :func:`scratch_folder` (its files, then its lock released); None: nothing."""
    if folder is None:
        return
    try:
        if str(folder) in _held:
            _remove(Path(folder))
        else:
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        fd = _held.pop(str(folder), None)
        if fd is not None:
            os.close(fd)


def scratch_folder(beside: Path, need: int, *, candidates=None) -> tuple[Path, str]:
    """A new empty folder for a streamed run's chunks and its kind (``"memory"`` or ``"disk"``); remove it
    with :func:`remove_scratch`.

    Args:
        beside: the folder used on disk (created, emptied first).
        need: bytes the chunks may hold at once (:func:`scratch_bytes`).
        candidates: memory-backed folders to try (default :data:`MEMORY_FOLDERS`).

    First the stale folders of every candidate are removed (:func:`remove_stale`).
    ``ANPRED_STREAM_SCRATCH=disk`` returns ``beside``; ``memory``: the first candidate that is
    memory-backed, writable and has ``need`` bytes free, else ``beside``; another value is a folder used
    as given (kind ``"memory"`` where it is memory-backed). Unset: as ``memory``, where ``need`` is also
    at most :data:`MEMORY_SHARE` of the memory available (:func:`_mem_available`). Raises OSError where
    ``beside`` (or the folder given) cannot be created."""
    cands = MEMORY_FOLDERS if candidates is None else candidates
    for c in cands:
        remove_stale(c)
    env = os.environ.get("ANPRED_STREAM_SCRATCH", "").strip()
    if env and env not in ("disk", "memory"):
        root = Path(env)
        root.mkdir(parents=True, exist_ok=True)
        remove_stale(root)
        return _locked_folder(root), ("memory" if memory_backed(root) else "disk")
    if env != "disk":
        avail = _mem_available()
        for c in cands:
            try:
                if not (os.path.isdir(c) and os.access(c, os.W_OK) and memory_backed(c)):
                    continue
                if need > shutil.disk_usage(c).free:
                    continue
                if env != "memory" and (avail is None or need > MEMORY_SHARE * avail):
                    continue
                return _locked_folder(c), "memory"
            except OSError:
                continue
    if env == "memory":
        print(
            f"stream: ANPRED_STREAM_SCRATCH=memory but no memory-backed folder has {need} bytes free: the "
            f"chunks go to {beside}",
            file=sys.stderr,
            flush=True,
        )
    shutil.rmtree(beside, ignore_errors=True)
    beside.mkdir(parents=True)
    return beside, "disk"


def static_size(anchor) -> int:
    """Elements of an anchor by its manifest shape (an unknown dimension counts as 1)."""
    n = 1
    for d in anchor.shape or []:
        n *= d if isinstance(d, int) and d > 0 else 1
    return n


def sample_anchor_bytes(manifest, n_backends: int) -> int:
    """Bytes of anchor tensors one sample writes for ``n_backends`` backends, from the manifest's static
    shapes (an unknown dimension counts as 1; an unknown dtype as float32)."""
    import numpy as np

    per = sum(
        static_size(a) * np.dtype(a.dtype if a.dtype in np.sctypeDict else "float32").itemsize for a in manifest.anchors
    )
    return per * max(1, n_backends)


def scratch_bytes(manifest, n_backends: int, chunk: int, later: int, head: list) -> int:
    """Bytes a streamed run's chunk folder may hold at once (an estimate, not a bound): three chunks of
    anchor tensors stored in full (the one being judged, the one queued, the one running; where
    positions are sampled only the first is full, so this overestimates them) and five chunks of inputs
    of the larger chunk size (three in those runs, one queued by the reader, one being written).
    ``manifest``: the anchored model's (its static shapes, :func:`sample_anchor_bytes`: an unknown
    dimension counts as 1, so a data-dependent shape is underestimated); ``head``:
    ``[(source, {input name: array})]``, the first sample (its inputs' bytes stand for every
    sample's; empty: 0)."""
    import numpy as np

    per_input = sum(np.asarray(a).nbytes for a in head[0][1].values()) if head else 0
    return 3 * chunk * sample_anchor_bytes(manifest, n_backends) + 5 * max(chunk, later) * per_input
