"""A content-addressed cache for expensive conversions (onnx2tf, onnx2torch, exports, zoo builds).

Keys are derived from the sha256 of the input model file plus the converter's name, version and
options, so a cache hit is always the same conversion. Location: ``$ANPRED_CACHE`` or
``~/.cache/anpred``. Entries are folders written atomically (build in a temporary folder, rename).
Concurrent builders of one entry (backend runs side by side in a campaign, :mod:`anpred.campaign`;
processes on several machines sharing the folder) take a file lock (``filelock``) per entry: one
builds, the others wait for it and use its result.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable


def cache_root() -> Path:
    root = Path(os.environ.get("ANPRED_CACHE") or Path.home() / ".cache" / "anpred")
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_key(*parts: Any) -> str:
    """A stable hex key from JSON-serialisable parts (file paths are hashed by content)."""
    from anpred.onnx_io import sha256_file

    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, Path):
            h.update(sha256_file(p).encode())
        else:
            h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def cached_dir(kind: str, key: str, build: Callable[[Path], None]) -> Path:
    """Return the cache folder ``<root>/<kind>/<key>``, calling ``build(tmpdir)`` to fill it when it
    does not exist yet. A failed build leaves nothing behind."""
    from filelock import FileLock

    final = cache_root() / kind / key
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    locks = cache_root() / ".locks"  # apart from the entries: a failed build leaves no file among them
    locks.mkdir(exist_ok=True)
    with FileLock(str(locks / f"{kind.replace('/', '_')}-{key}.lock")):
        if final.is_dir():  # built by another process while this one waited
            return final
        return _build(final, key, build)


def _build(final: Path, key: str, build: Callable[[Path], None]) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=final.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, final)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
