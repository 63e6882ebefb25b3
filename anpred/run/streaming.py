"""Streaming statistics of ``stats``-mode runs: per anchor summaries over all samples in O(1) memory.

Files (per backend, in the run folder; see :mod:`anpred.run.store` for the whole layout)::

    stats/<label>.json           # {"schema": "anpred.stats/1", "backend": label, "samples": n,
                                 #  "anchors": {anchor: StreamingStats.to_dict()}} (written at the end)
    stats/<label>.samples.jsonl  # one line per sample, as it goes:
                                 # {"sample": id, "anchors": {anchor: sample_summary(...)}}

:class:`StreamingStats` folds one sample at a time (Chan et al.'s pairwise update);
:func:`sample_summary` is one anchor's entry of a ``samples.jsonl`` line; :func:`read_stats` reads
``stats/<label>.json`` back (``anpred check`` and ``anpred diff`` read these files).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from anpred.errors import AnpredError

__all__ = ["STATS_SCHEMA", "StreamingStats", "sample_summary", "read_stats"]

STATS_SCHEMA = "anpred.stats/1"


class StreamingStats:
    """Summary statistics of one anchor over all samples, updated one sample at a time in O(1) memory.

    Over the finite elements of all samples (float64 accumulation): ``count``, ``mean``, ``std``
    (population), ``min``, ``max``, ``abs_mean`` (mean of |x|), ``rms`` (sqrt of the mean of x**2);
    plus ``samples``, ``elements`` (all elements), ``nan``, ``posinf``, ``neginf``, the first sample's
    ``shape`` and ``dtype``. Mean and variance of batches are merged with Chan, Golub & LeVeque's
    pairwise update (Chan et al. 1979, "Updating formulae and a pairwise algorithm for computing sample
    variances"): ``delta = mean_b - mean_a; mean = mean_a + delta * n_b / n;
    M2 = M2_a + M2_b + delta**2 * n_a * n_b / n``.
    """

    def __init__(self):
        self.samples = self.elements = self.count = self.nan = self.posinf = self.neginf = 0
        self.mean = self.m2 = self.sum_abs = self.sum_sq = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.shape: list[int] | None = None
        self.dtype: str | None = None

    #: elements per chunk of :meth:`summarize` (512 KiB of float64: stays in L2 cache)
    CHUNK = 1 << 16

    @staticmethod
    def summarize(x: np.ndarray) -> dict[str, Any]:
        """Per-sample summary of one array (any shape; float, int or bool): over its finite elements
        ``count``, ``mean``, ``m2`` (sum of squared deviations), ``min``, ``max``, ``sum_abs``,
        ``sum_sq``, all float64; and ``elements``, ``nan``, ``posinf``, ``neginf`` counts.

        One pass over memory: the array is cast to float64 one cache-sized chunk at a time
        (:attr:`CHUNK` elements) and each chunk's (count, mean, M2) is merged with Chan et al.'s
        pairwise update (see the class docstring), so no full-size temporary is allocated. A chunk
        whose float64 sum is finite holds no NaN/Inf (a sum of at most 2**16 finite float32 values
        cannot overflow float64); only other chunks are masked."""
        a = np.asarray(x)
        if a.dtype.kind == "c":
            a = a.real
        flat = a.reshape(-1)
        size = int(flat.size)
        count, mean, m2 = 0, 0.0, 0.0
        mn, mx, sum_abs, sum_sq = math.inf, -math.inf, 0.0, 0.0
        nan = posinf = 0
        step = StreamingStats.CHUNK
        buf = np.empty(min(size, step), dtype=np.float64)
        sq = np.empty_like(buf)
        for s0 in range(0, size, step):
            c = flat[s0 : s0 + step]
            b = buf[: c.size]
            np.copyto(b, c, casting="unsafe")
            tot = float(b.sum())
            if not math.isfinite(tot):
                fin = np.isfinite(b)
                nan += int(np.isnan(b).sum())
                posinf += int(np.isposinf(b).sum())
                b = b[fin]
                tot = float(b.sum())
            k = int(b.size)
            if not k:
                continue
            mn = min(mn, float(b.min()))
            mx = max(mx, float(b.max()))
            t = sq[:k]
            np.abs(b, out=t)
            sum_abs += float(t.sum())
            cm = tot / k
            np.subtract(b, cm, out=t)
            np.square(t, out=t)
            cm2 = float(t.sum())
            sum_sq += cm2 + k * cm * cm
            n = count + k
            delta = cm - mean
            mean += delta * k / n
            m2 += cm2 + delta * delta * count * k / n
            count = n
        return {
            "elements": size,
            "count": count,
            "nan": nan,
            "posinf": posinf,
            "neginf": size - count - nan - posinf,
            "mean": mean if count else 0.0,
            "m2": m2,
            "min": mn,
            "max": mx,
            "sum_abs": sum_abs,
            "sum_sq": sum_sq,
        }

    def update(self, x: np.ndarray) -> dict[str, Any]:
        """Add one sample; returns that sample's summary (see :meth:`summarize`)."""
        if self.shape is None:
            self.shape, self.dtype = list(np.shape(x)), str(np.asarray(x).dtype)
        s = self.summarize(x)
        self.samples += 1
        self.elements += s["elements"]
        self.nan += s["nan"]
        self.posinf += s["posinf"]
        self.neginf += s["neginf"]
        nb = s["count"]
        if nb:
            n = self.count + nb
            delta = s["mean"] - self.mean
            self.mean += delta * nb / n
            self.m2 += s["m2"] + delta * delta * self.count * nb / n
            self.count = n
            self.min, self.max = min(self.min, s["min"]), max(self.max, s["max"])
            self.sum_abs += s["sum_abs"]
            self.sum_sq += s["sum_sq"]
        return s

    def to_dict(self) -> dict[str, Any]:
        c = self.count
        return {
            "samples": self.samples,
            "elements": self.elements,
            "count": c,
            "nan": self.nan,
            "posinf": self.posinf,
            "neginf": self.neginf,
            "mean": self.mean if c else None,
            "std": math.sqrt(self.m2 / c) if c else None,
            "min": self.min if c else None,
            "max": self.max if c else None,
            "abs_mean": self.sum_abs / c if c else None,
            "rms": math.sqrt(self.sum_sq / c) if c else None,
            "shape": self.shape,
            "dtype": self.dtype,
        }


def sample_summary(s: dict[str, Any]) -> dict[str, Any]:
    """The per-sample line of ``stats/<label>.samples.jsonl`` for one anchor: mean, std, min, max,
    rms over finite elements, and the nan/inf counts."""
    c = s["count"]
    return {
        "mean": s["mean"] if c else None,
        "std": math.sqrt(s["m2"] / c) if c else None,
        "min": s["min"] if c else None,
        "max": s["max"] if c else None,
        "rms": math.sqrt(s["sum_sq"] / c) if c else None,
        "nan": s["nan"],
        "inf": s["posinf"] + s["neginf"],
    }


def read_stats(run_dir: str | Path, label: str) -> dict[str, Any]:
    """Read ``stats/<label>.json`` of a ``stats``-mode run (schema ``anpred.stats/1``)."""
    p = Path(run_dir) / "stats" / f"{label}.json"
    try:
        d = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise AnpredError(f"cannot read {p}: {err}") from err
    if d.get("schema") != STATS_SCHEMA:
        raise AnpredError(f"{p}: unsupported stats schema {d.get('schema')!r}")
    return d
