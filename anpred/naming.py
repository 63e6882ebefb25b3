"""Anchor names are generated here and only here, deterministically (STYLE.md habit 3).

An anchor name reads ``anchor/<stage:02d>/<label>`` where ``label`` is the source scope of the tensor
(a torch module path such as ``model.4`` or a Keras layer name) when known, else the ONNX value name.
Characters outside ``[A-Za-z0-9_.:/-]`` are replaced by ``_``. Collisions get a ``#k`` suffix in
topological order, so names are unique and stable for a given graph and partition.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

_BAD = re.compile(r"[^A-Za-z0-9_.:/-]")

OUTPUT_STAGE_LABEL = "output"


def sanitize(label: str) -> str:
    label = _BAD.sub("_", label.strip().strip("/")) or "tensor"
    return label


def anchor_name(stage: int, label: str) -> str:
    """Return the anchor name for a boundary tensor at ``stage`` with ``label``."""
    return f"anchor/{stage:02d}/{sanitize(label)}"


def output_anchor_name(output_name: str) -> str:
    """Return the anchor name for an original graph output ``output_name``."""
    return f"output/{sanitize(output_name)}"


def uniquify(names: list[str]) -> list[str]:
    """Make names unique by suffixing ``#1``, ``#2`` ... to repeats, in order."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        if n in seen:
            seen[n] += 1
            out.append(f"{n}#{seen[n]}")
        else:
            seen[n] = 0
            out.append(n)
    return out


def file_key(anchor: str) -> str:
    """A reversible file-system/npz-safe key for an anchor name (percent-encoding, RFC 3986)."""
    return quote(anchor, safe="")


def from_file_key(key: str) -> str:
    """Inverse of :func:`file_key`."""
    return unquote(key)
