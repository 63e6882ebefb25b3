"""Files shipped inside installed packages (trained ONNX models, configurations, real files), found
without importing the package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from anpred.errors import AnpredError

__all__ = ["package_file"]


def package_file(package: str, relpath: str) -> Path:
    """Path of a file shipped inside an installed package, found with ``importlib.util.find_spec``
    (the package is not imported).

    Raises:
        AnpredError: the package is not installed or the file is missing.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise AnpredError(f"package {package!r} is not installed; it ships {relpath} (see requirements-nodeps.txt)")
    path = Path(list(spec.submodule_search_locations)[0]) / relpath
    if not path.is_file():
        raise AnpredError(f"{path}: file missing from the installed {package!r} package")
    return path
