"""A population's shared conversion is attempted once per run: when it fails or hangs, it fails once for
all the members of its population, with its reason.

Every member of a reduced-precision population runs the same converted model (the one float16 model
of the fp16 population, the one QDQ model of the int8 population: :mod:`anpred.backends.lowp_models`),
built once into the conversion cache (:func:`anpred.cache.cached_dir`). Nothing is cached when the
build fails, so without a record each member started it again: a float16 conversion that hung until
``ort-fp16``'s timeout was started again by ``ort-fp16-noopt``, and the default run could not finish
(docs/run.md, 'Shared conversions of a population'). Here the run keeps a record per conversion in
its *shared folder* (the run's ``.work/shared``; a campaign's configuration gives its single-backend
runs one folder,
:class:`anpred.run.limits.RunGuards`):

- ``<kind>-<key>.attempt.json`` (``label``, ``pid``, ``host``) while a worker builds it, under the
  cache's lock;
- ``<kind>-<key>.failed.json`` (``label``, ``reason``) once it failed: written by the worker for an
  exception, by the driver (:func:`settle`) for a worker that ended while building it (timeout,
  memory bound, crash; the reason is that worker's status).

A later member finding a failure record raises :class:`~anpred.errors.BackendError` at once:
``"<what> failed once for the <population> population in this run (in <label>: <reason>); not tried
again"``. An attempt record of a process that is gone, with no failure record after
:data:`SETTLE_WAIT_S` (its driver settles it within a poll interval of the kill; a campaign's members
run side by side and the next one takes the cache's lock the moment the killed one drops it), was
left by a worker whose driver died too (a Ray worker killed from outside, then retried): it is
removed and the conversion attempted again. Outside a worker (no shared folder set with
:func:`set_scope`) the conversion is a plain :func:`anpred.cache.cached_dir`.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Callable

from anpred.errors import BackendError

__all__ = ["set_scope", "shared_cached_dir", "settle", "SETTLE_WAIT_S"]

#: seconds a member waits for the driver of a killed builder to record its failure (the driver's
#: watch loop polls every 0.2 s, anpred.defaults.MEMORY_POLL_S, and settles right after the kill)
SETTLE_WAIT_S = 5.0

_scope: dict[str, str | None] = {"dir": None, "label": None}


def set_scope(folder: str | Path | None, label: str | None) -> None:
    """The shared folder of this worker's run and its backend label (``python -m anpred.run.worker``)."""
    _scope["dir"] = str(folder) if folder else None
    _scope["label"] = label


def _alive(rec: dict) -> bool:
    if rec.get("host") != socket.gethostname():
        return True  # another machine's process: cannot be checked here, taken as still at work
    try:
        os.kill(int(rec.get("pid", 0)), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return int(rec.get("pid", 0)) > 0


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _write(path: Path, rec: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)


def _refuse(what: str, population: str, rec: dict) -> BackendError:
    return BackendError(
        f"{what} failed once for the {population} population in this run (in {rec.get('label')}: "
        f"{rec.get('reason')}); not tried again"
    )


def shared_cached_dir(kind: str, key: str, build: Callable[[Path], None], what: str, population: str) -> Path:
    """:func:`anpred.cache.cached_dir` of a population's shared conversion, attempted once per run
    (module docstring). ``what``: the conversion in words (``"the float16 conversion"``).

    Raises:
        BackendError: it failed earlier in this run (the earlier reason), or ``build`` raised now.
    """
    from anpred.cache import cached_dir

    folder = Path(_scope["dir"]) if _scope["dir"] else None
    if folder is None:
        return cached_dir(kind, key, build)
    folder.mkdir(parents=True, exist_ok=True)
    failed, attempt = folder / f"{kind}-{key}.failed.json", folder / f"{kind}-{key}.attempt.json"

    def check() -> None:
        rec = _read(failed)
        if rec is None and (att := _read(attempt)) is not None and not _alive(att):
            deadline = time.monotonic() + SETTLE_WAIT_S
            while rec is None and time.monotonic() < deadline:  # its driver records why it was killed
                time.sleep(0.1)
                rec = _read(failed)
            if rec is None:  # no driver recorded a failure: a stale record of a process killed from outside
                attempt.unlink(missing_ok=True)
        if rec is not None:
            raise _refuse(what, population, rec)

    def guarded(tmp: Path) -> None:  # runs under the cache's lock, only when the entry is not built
        check()
        _write(attempt, {"label": _scope["label"], "pid": os.getpid(), "host": socket.gethostname()})
        try:
            build(tmp)
        except BaseException as err:
            _write(failed, {"label": _scope["label"], "reason": f"{type(err).__name__}: {str(err)[:400]}"})
            raise
        finally:
            attempt.unlink(missing_ok=True)

    check()
    return cached_dir(kind, key, guarded)


def settle(folder: str | Path | None, label: str, reason: str) -> None:
    """The driver's part, after ``label``'s worker ended without success: a shared conversion it left
    unfinished (its attempt record) failed, with that worker's status ``reason``."""
    if not folder or not Path(folder).is_dir():
        return
    for att in Path(folder).glob("*.attempt.json"):
        rec = _read(att)
        if rec is not None and rec.get("label") == label:
            _write(att.with_name(att.name.replace(".attempt.json", ".failed.json")), {"label": label, "reason": reason})
            att.unlink(missing_ok=True)
