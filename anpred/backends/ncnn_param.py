"""Reading ncnn's ``.param`` files (the layer list pnnx writes), shared by the ncnn backend and its pnnx
probe."""

from __future__ import annotations

from pathlib import Path

__all__ = ["param_layers", "unknown_layers"]


def param_layers(path: Path) -> list[list[str]]:
    """The layer lines of an ncnn/pnnx ``.param`` file (after the magic and count lines), split."""
    return [ln.split() for ln in path.read_text().splitlines()[2:] if ln.strip()]


def unknown_layers(path: Path) -> list[str]:
    """Layer types in an ncnn ``.param`` that ncnn's layer registry does not know."""
    import ncnn

    return sorted({f[0] for f in param_layers(path) if ncnn.layer_to_index(f[0]) < 0})
