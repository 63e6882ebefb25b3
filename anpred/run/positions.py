"""Sampled positions of large anchors, gathered inside a backend's worker (streamed datasets).

A streamed run (:mod:`anpred.pipeline.stream`) judges an intermediate anchor on a fixed set of ``K``
element positions of its canonical (ONNX) layout (:mod:`anpred.judge.positions`). Once the judge has
taken its alignment decisions (the first chunk, stored in full), the driver maps those canonical
positions through each backend's alignment rule onto flat indices into the tensor *as that backend
returns it* (:func:`backend_indices`), writes them to a file per backend (:func:`save_gather`), and the
backend's worker stores only those ``K`` values of each such anchor (:func:`gather`), under the key
``<anchor>`` + :data:`GATHERED_SUFFIX`: ``K`` values instead of millions per anchor and sample, so
writing, reading and judging an anchor cost the same whatever its size.

Only pure data movement is mapped (``view``, ``permute``, ``reshape``, ``segments`` of
:mod:`anpred.align.rules`); element-wise steps (``cast``, per-tensor ``dequantize``) are applied by the
judge to the gathered values. A rule with a per-axis ``dequantize`` or an ``exclude`` is not gathered
(the anchor is stored in full), and neither is a returned tensor whose shape is not the one the
decision was taken on (a dynamic shape): the judge aligns and samples it as usual.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["GATHERED_SUFFIX", "STRUCTURAL_STEPS", "backend_indices", "save_gather", "load_gather", "gather"]

#: key suffix of an anchor stored as its gathered positions (a 1-D array of ``K`` values in canonical order)
GATHERED_SUFFIX = "@positions"
#: the rule steps that only move elements (mapped onto indices); the others act on values
STRUCTURAL_STEPS = ("view", "permute", "reshape", "segments")


def backend_indices(
    rule: dict[str, Any], backend_shape: list[int], canonical_shape: list[int], positions: np.ndarray
) -> np.ndarray | None:
    """Flat indices into a backend tensor of ``backend_shape`` whose values, once ``rule`` is applied,
    sit at the flat ``positions`` of the canonical tensor (``canonical_shape``, C order).

    Returns an int64 array of ``positions``' length, or None where the rule cannot be mapped onto
    indices (``exclude``; a per-axis ``dequantize``, which depends on where a value sits).

    Raises:
        ValueError: the rule does not fit ``backend_shape`` (as :func:`anpred.align.rules.apply_rule`).
    """
    from anpred.align.rules import apply_rule

    if "exclude" in rule or ("dequantize" in rule and rule["dequantize"].get("axis") is not None):
        return None
    n = math.prod(backend_shape)
    if n >= 1 << 53:  # the indices travel through apply_rule's float64: exact below 2**53
        return None
    idx = np.arange(n, dtype=np.float64).reshape(backend_shape)
    moved = apply_rule({k: v for k, v in rule.items() if k in STRUCTURAL_STEPS}, idx, tuple(canonical_shape))
    if moved.size != math.prod(canonical_shape):
        raise ValueError(f"rule maps {list(backend_shape)} onto {list(moved.shape)}, not {list(canonical_shape)}")
    return moved.reshape(-1)[np.asarray(positions, np.int64)].astype(np.int64)


def save_gather(path: str | Path, spec: dict[str, tuple[list[int], np.ndarray]]) -> Path:
    """Write ``{anchor: (backend shape, flat indices)}`` for one backend's worker (one ``.npz``:
    ``i0, i1, ...`` and a JSON ``index`` of names and shapes); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = sorted(spec)
    index = [{"anchor": a, "shape": [int(d) for d in spec[a][0]], "key": f"i{i}"} for i, a in enumerate(names)]
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(
        tmp,
        index=np.array(json.dumps(index)),
        **{f"i{i}": np.asarray(spec[a][1], np.int64) for i, a in enumerate(names)},
    )
    tmp.replace(path)
    return path


def load_gather(path: str | Path) -> dict[str, tuple[tuple[int, ...], np.ndarray]]:
    """Read :func:`save_gather`'s file: ``{anchor: (backend shape, flat indices)}``."""
    with np.load(path, allow_pickle=False) as z:
        index = json.loads(str(z["index"]))
        return {e["anchor"]: (tuple(e["shape"]), z[e["key"]]) for e in index}


def gather(res: dict[str, Any], spec: dict[str, tuple[tuple[int, ...], np.ndarray]] | None) -> dict[str, Any]:
    """``res`` (a backend's ``{anchor: array}``) with every anchor of ``spec`` whose shape is the one
    recorded replaced by ``{anchor + GATHERED_SUFFIX: its values at the indices}`` (a contiguous 1-D
    copy, the backend's dtype); other anchors as they are."""
    if not spec:
        return res
    out: dict[str, Any] = {}
    for k, v in res.items():
        s = spec.get(k)
        a = np.asarray(v)
        if s is not None and tuple(a.shape) == s[0]:
            out[k + GATHERED_SUFFIX] = np.ascontiguousarray(a.reshape(-1)[s[1]])
        else:
            out[k] = v
    return out
