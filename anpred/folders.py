"""Result folders built beside their final place and renamed into it when complete (the one
partial-folder commit used by ``anpred run`` and ``anpred test``).

A folder ``OUT`` is built as the hidden sibling ``.OUT.partial-<pid>`` (same filesystem, so the final
``os.replace`` is atomic) and renamed to ``OUT`` only when everything is written; an interrupted
command leaves no half-written ``OUT``. Siblings left by a process that no longer runs (SIGKILL, power
loss) are removed the next time the same ``OUT`` is built.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["partial_dir", "remove_stale_partials", "commit_partial"]


def partial_dir(out: str | Path) -> Path:
    """The hidden sibling folder of ``out`` this process builds in (created empty; an earlier one of
    this pid is removed first). Stale siblings of dead processes are removed too."""
    out = Path(out).absolute()
    remove_stale_partials(out)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def remove_stale_partials(out: str | Path) -> None:
    """Remove ``.NAME.partial-PID`` siblings of ``out`` whose PID is no longer a running process."""
    out = Path(out).absolute()
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


def commit_partial(tmp: str | Path, out: str | Path) -> Path:
    """Rename the finished ``tmp`` to ``out``; an existing ``out`` is replaced only after ``tmp`` is
    complete (moved aside, then removed). Returns ``out``.

    Raises:
        OSError: the rename failed (``tmp`` is left in place, ``out`` unchanged).
    """
    tmp, out = Path(tmp), Path(out).absolute()
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(out, old)
        try:
            os.replace(tmp, out)
        except OSError:
            os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
    return out
