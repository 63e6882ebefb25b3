"""Judging large intermediate anchors on sampled positions (streamed datasets).

A streamed run judges every sample, and an intermediate anchor of a detector at 1024 px holds millions
of values per backend and sample (YOLOv8n-DocLayNet: 12 M per backend and page over 13 anchors).
Statistics over all of them cost far more than the inference (docs/task.md, 'Measurements: judging in
full'; ``benchmarks/bench_stream.py``). So a streamed run
judges each intermediate anchor of more than ``K`` elements on the same ``K`` element positions of its
canonical (ONNX) layout in every sample and every backend: a uniform random sample without replacement,
drawn once per (anchor, element count) from a generator seeded by the anchor's name (reproducible).

What it changes (docs/task.md, "Sampled positions", has the measured sensitivity):

- sums and means (nRMSE, SNR, cosine similarity, mean absolute and signed error, the Wasserstein
  distance of the value distributions) are estimates of the full tensor's from ``K`` values (a
  simple random sample: the standard error of a mean of squared errors falls as ``1/sqrt(K)``, its
  size set by how unevenly the error is spread; the change it makes at the default ``K`` on
  YOLOv8n-DocLayNet, where no verdict changed, is in that section of docs/task.md);
- maxima (``max_abs``, ``max_ulp``) are maxima over the sampled positions: an error confined to fewer
  than about ``N / K`` positions of an anchor can be missed *at that anchor*; it is still seen where it
  propagates (every later anchor) and at the outputs, which are never sampled;
- the outputs (and their parts) are always judged in full: the task metrics and the verdict at the
  outputs are exact.

The positions are mapped into each backend's own layout so that its worker stores only those values
(:mod:`anpred.run.positions`); :class:`PositionSampler` samples what arrives in full (the first chunk,
anchors whose shape changed).
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["DEFAULT_POSITIONS", "DISTRIBUTION_POSITIONS", "PositionSampler", "sample_positions"]

#: default ``K``: 2**16 positions per anchor (docs/task.md: the sensitivity of the statistics to it)
DEFAULT_POSITIONS = 1 << 16

#: in a run judged on sampled positions, the Wasserstein distance (the one statistic that needs a sort,
#: O(n log n) against O(n) for every other) of every anchor of more elements is computed on this many
#: of them (:func:`sample_positions` of the anchor's tensor as judged): its argsort was the largest part
#: of a streamed page's judging (docs/task.md, "Sampled positions", gives its cost and the change of
#: the pooled Wasserstein distance it makes, ``benchmarks/bench_positions.py``). It is not the primary
#: statistic by default; a run whose ``primary`` is ``wasserstein`` computes it on every judged position.
DISTRIBUTION_POSITIONS = 1 << 13


def sample_positions(anchor: str, size: int, k: int) -> np.ndarray | None:
    """Sorted flat positions (int64, ``k`` of them, without replacement) of an anchor of ``size``
    elements, from a generator seeded by the anchor's name (CRC-32); None where ``size <= k`` (judged in
    full)."""
    if k <= 0 or size <= k:
        return None
    rng = np.random.default_rng(zlib.crc32(anchor.encode()))
    return np.sort(rng.choice(size, size=k, replace=False)).astype(np.int64)


class PositionSampler:
    """The sampled positions of a run's intermediate anchors.

    Args:
        manifest: the run's anchor manifest (its ``output`` anchors are never sampled).
        k: positions per anchor (``K``); 0 or None: nothing is sampled.
    """

    def __init__(self, manifest, k: int | None):
        self.k = int(k or 0)
        self.sampled = {a.name for a in manifest.anchors if a.kind != "output"}
        self._pos: dict[tuple[str, int], np.ndarray | None] = {}

    def __getstate__(self):
        # the positions are drawn again from their seeds after unpickling (a checkpoint stays small:
        # 0.5 MB per anchor otherwise); only which (anchor, size) pairs were sampled is kept
        return {
            "k": self.k,
            "sampled": self.sampled,
            "_pos": {key: None for key in self._pos},
            "_seen": {key for key, pos in self._pos.items() if pos is not None},
        }

    def __setstate__(self, st):
        self.k, self.sampled = st["k"], st["sampled"]
        self._pos = {
            key: sample_positions(key[0], key[1], self.k) if key in st["_seen"] else None for key in st["_pos"]
        }

    def positions(self, anchor: str, size: int) -> np.ndarray | None:
        """The positions of ``anchor`` at ``size`` elements (None: judged in full)."""
        if anchor not in self.sampled or self.k <= 0:
            return None
        key = (anchor, int(size))
        if key not in self._pos:
            self._pos[key] = sample_positions(anchor, int(size), self.k)
        return self._pos[key]

    def sampled_sizes(self) -> dict[str, int]:
        """anchor -> element count, for the anchors judged on sampled positions so far."""
        return {a: n for (a, n), pos in self._pos.items() if pos is not None}

    def apply(self, tensors: dict[str, dict[str, np.ndarray]]) -> None:
        """Replace, in place, the aligned tensors of a sampled anchor that have more than ``K`` elements
        and the shape most of them have by their values at the sampled positions (1-D float64, canonical
        order). Tensors of ``K`` elements or fewer stay (gathered by their worker already, or small
        enough to judge in full), and so does a tensor of another shape: the oracle reports it as a
        shape that differs, as it would without sampling."""
        if self.k <= 0:
            return
        for a, per in tensors.items():
            if a not in self.sampled:
                continue
            shapes: dict[tuple, int] = {}
            for v in per.values():
                if v.size > self.k:
                    shapes[v.shape] = shapes.get(v.shape, 0) + 1
            if not shapes:
                continue
            common = max(shapes, key=shapes.get)
            pos = self.positions(a, int(np.prod(common)))
            if pos is None:
                continue
            for b, v in list(per.items()):
                if v.shape == common:
                    per[b] = np.asarray(v).reshape(-1)[pos]
