"""Streaming accumulators of the consensus oracle: what survives a sample per (anchor, backend).

Contract: :class:`Accumulator` receives one :class:`anpred.judge.stats.Comparison` per sample and keeps
pooled float64 sums (``sum d^2``, ``sum c^2``, ``sum x^2``, ``sum x c``), maxima, counts, the
per-sample primary statistic and a bounded :class:`Reservoir` of values for the plots; nothing else of
a sample's tensors is kept. :meth:`Accumulator.pooled` gives the population's :class:`ErrorStats`
(nRMSE, SNR and cosine from the pooled sums; max_abs, max_ulp and the ULP-error quantile ``ulp_q``
maxima over the samples; mean_abs, mean_signed over all elements; wasserstein the mean of per-sample
values).
"""

from __future__ import annotations

import math

import numpy as np

from anpred.judge.stats import Comparison, ErrorStats

__all__ = ["Accumulator", "Reservoir"]


class Reservoir:
    """An approximately uniform sample of at most ``size`` values of a stream of arrays: each merge
    keeps old and new values in proportion to how many each stands for."""

    def __init__(self, size: int, rng: np.random.Generator):
        self.size, self.rng, self.seen = size, rng, 0
        self.data: dict[str, np.ndarray] = {}

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        n = next(iter(arrays.values())).size
        if n == 0 or self.size <= 0:
            return
        if not self.data:
            take = min(n, self.size)
            idx = self.rng.choice(n, take, replace=False) if take < n else np.arange(n)
            self.data, self.seen = {k: v[idx] for k, v in arrays.items()}, n
            return
        total = self.seen + n
        held = len(next(iter(self.data.values())))
        keep_old = min(held, round(self.size * self.seen / total))
        keep_new = min(n, self.size - keep_old)
        # a uniform sample of each side, drawn directly from its values (no intermediate sample)
        io = self.rng.choice(held, keep_old, replace=False) if keep_old < held else slice(None)
        inew = self.rng.choice(n, keep_new, replace=False)
        self.data = {k: np.concatenate([self.data[k][io], arrays[k][inew]]) for k in self.data}
        self.seen = total


class Accumulator:
    """Small per-(anchor, backend) accumulator: pooled sums, maxima, per-sample primary values."""

    def __init__(self, primary: str, reservoir: Reservoir):
        self.primary = primary
        self.samples = 0
        self.n = 0
        self.dd = self.cc = self.xx = self.xc = 0.0
        self.sum_abs = self.sum_signed = 0.0
        self.max_abs = 0.0
        self.max_ulp = 0.0
        self.ulp_q = self.ulp_median = 0.0  # the largest per-sample ULP-error quantile, median (NaN: not computed)
        self.w = []
        self.per_sample: list[float] = []
        self.nan = self.inf = self.nan_ref = self.inf_ref = 0
        self.nonfinite = 0
        self.suppressed = self.mismatched = self.undecided = 0
        self.res = reservoir

    def add(self, cmp: Comparison) -> None:
        s = cmp.stats
        self.samples += 1
        self.nan += s.nan
        self.inf += s.inf
        self.nan_ref += s.nan_ref
        self.inf_ref += s.inf_ref
        self.nonfinite += cmp.nonfinite
        self.suppressed += cmp.suppressed
        self.mismatched += cmp.mismatched
        self.undecided += cmp.undecided
        if s.n == 0:
            return
        self.n += s.n
        self.dd += cmp.dd
        self.cc += cmp.cc
        self.xx += cmp.xx
        self.xc += cmp.xc
        self.sum_abs += s.mean_abs * s.n
        self.sum_signed += s.mean_signed * s.n
        self.max_abs = max(self.max_abs, s.max_abs)
        # NaN: not computed (a population oracle's comparison, Reference.compare(distribution=False))
        self.max_ulp = s.max_ulp if math.isnan(s.max_ulp) else max(self.max_ulp, s.max_ulp)
        self.ulp_q = s.ulp_q if math.isnan(s.ulp_q) else max(self.ulp_q, s.ulp_q)
        self.ulp_median = s.ulp_median if math.isnan(s.ulp_median) else max(self.ulp_median, s.ulp_median)
        self.w.append(s.wasserstein)
        self.per_sample.append(float(getattr(s, self.primary)))
        if self.res.size > 0:
            self.res.add({"err": cmp.d, "x": cmp.x, "c": cmp.c})

    def pooled(self) -> ErrorStats:
        nan = float("nan")
        counts = dict(nan=self.nan, inf=self.inf, nan_ref=self.nan_ref, inf_ref=self.inf_ref)
        if self.n == 0:
            return ErrorStats(0, nan, nan, nan, nan, nan, nan, nan, nan, **counts)
        if self.dd == 0.0:
            nrmse, snr = 0.0, float("inf")
        elif self.cc == 0.0:
            nrmse, snr = float("inf"), float("-inf")
        else:
            nrmse, snr = math.sqrt(self.dd / self.cc), 10 * math.log10(self.cc / self.dd)
        if self.xx == 0.0 and self.cc == 0.0:
            cos = 1.0
        elif self.xx == 0.0 or self.cc == 0.0:
            cos = 0.0
        else:
            cos = max(-1.0, min(1.0, self.xc / math.sqrt(self.xx * self.cc)))
        return ErrorStats(
            n=self.n,
            max_abs=self.max_abs,
            mean_abs=self.sum_abs / self.n,
            mean_signed=self.sum_signed / self.n,
            nrmse=nrmse,
            snr_db=snr,
            cosine=cos,
            wasserstein=float(np.mean(self.w)),
            max_ulp=self.max_ulp,
            ulp_q=self.ulp_q,
            ulp_median=self.ulp_median,
            **counts,
        )
