"""The pipeline's progress lines: one line per step on stderr, ``[anpred test] <message>``, unless
``quiet``. Every module of :mod:`anpred.pipeline` reports through :func:`log`."""

from __future__ import annotations

import sys

__all__ = ["log"]


def log(msg: str, quiet: bool) -> None:
    """Print ``[anpred test] msg`` on stderr (flushed) unless ``quiet``."""
    if not quiet:
        print(f"[anpred test] {msg}", file=sys.stderr, flush=True)
