"""Runtime versions of a campaign: one wheel set per (package, version), prepared once and shared.

A version is installed with pip into its own folder, ``pip install --no-deps --target
<cache>/envs/<package>-<version>-<key> <package>==<version>`` (with ``--no-index --find-links DIR``
when the campaign names a local wheel folder), through the conversion cache
(:func:`anpred.cache.cached_dir`: built once, atomically, under a file lock, so concurrent tasks and
machines sharing the cache folder wait for one install). ``--no-deps``: the version runs with the
venv's other packages (numpy, protobuf), the way a runtime release is tested against a fixed stack;
a version that cannot run with them fails in its backend process with its import error, as any
backend failure.

A backend run of that configuration puts the folder first on its worker's ``PYTHONPATH``
(:func:`version_path`), so the worker imports that version and not the venv's; the worker records
the versions it imported (``BackendStatus.versions``: the report and the history name them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from anpred.errors import AnpredError

__all__ = ["prepare_version", "version_path"]


def prepare_version(
    package: str, version: str, *, find_links: str | None = None, path: str | None = None, timeout_s: float = 900
) -> Path:
    """The folder holding ``package==version`` (installed when not cached; ``path``: an existing
    folder, used as is).

    Raises:
        AnpredError: ``path`` does not exist; pip failed (its last lines: no such version, no wheel for
            this Python, no network and no ``find_links``) or ran past ``timeout_s``.
    """
    from anpred.cache import cache_key, cached_dir

    if path is not None:
        if not Path(path).is_dir():
            raise AnpredError(f"{package} {version}: environment folder {path} does not exist")
        return Path(path)

    def build(tmp: Path) -> None:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "--target",
            str(tmp),
            f"{package}=={version}",
        ]
        if find_links:
            cmd[4:4] = ["--no-index", "--find-links", str(find_links)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            raise AnpredError(f"installing {package}=={version} ran past {timeout_s:g} s") from err
        if proc.returncode != 0:
            tail = " | ".join(
                ln
                for ln in (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                if "is ignored: it is neither" not in ln
            )
            raise AnpredError(f"cannot install {package}=={version}: {tail}")

    key = cache_key(package, version, find_links or "", sys.version_info[:2])
    return cached_dir("envs", f"{package}-{version}-{key[:12]}", build)


def version_path(folders: list[str | os.PathLike]) -> str | None:
    """The ``PYTHONPATH`` prefix for a backend run (folders joined, first wins); None for none."""
    return os.pathsep.join(str(f) for f in folders) if folders else None
