"""Versioned JSON report (schema ``anpred.check/1``, see :class:`anpred.judge.CheckReport`).

Non-finite floats are written as the strings ``"inf"``, ``"-inf"``, ``"nan"`` (JSON has none)."""

from __future__ import annotations

import json as _json
from pathlib import Path


def write_json(report, path: str | Path) -> None:
    """Write ``report`` atomically to ``path``. Raises OutputPathError when it cannot be written."""
    from anpred.onnx_io import atomic_write_text

    atomic_write_text(Path(path), report.to_json(indent=2))


def read_json(path: str | Path):
    """Read a report written by :func:`write_json`. Raises AnpredError when unreadable or another schema."""
    from anpred.judge import CheckReport
    from anpred.errors import AnpredError

    try:
        d = _json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise AnpredError(f"cannot read check report {path}: {err}") from err
    return CheckReport.from_dict(d)
