"""The float64 arbiter: each voter's and the consensus' distance from the float64 execution of the model
(``onnx-reference-fp64``, which never votes), and the accuracy arbitration of flagged cells.

Contract: :class:`Arbiter` is fed one anchor of one sample at a time (:meth:`Arbiter.add`, the aligned
tensors and the consensus) by :class:`anpred.judge.consensus.Oracle`; after the last sample
:meth:`Arbiter.arbitrate` clears the flagged cells of fp32 voters that are closer to the float64
execution than the consensus (``docs/oracle.md``, "A majority sharing one error, and the float64
arbiter"). Splits between camps of families are decided by the float64 execution before the consensus
is formed (:mod:`anpred.judge.camps`); the arbitration remains for what the pooled cells show beyond a
sample's split (a voter that departs from a consensus within its own camp while closer to the truth).
"""

from __future__ import annotations

import math

import numpy as np

from anpred.defaults import OracleConfig
from anpred.judge.stats import Reference
from anpred.judge.struct import BackendInfo, Cell

__all__ = ["Arbiter", "truth_of"]


def truth_of(x: np.ndarray, dtype: str) -> np.ndarray:
    """The float64 execution's tensor ``x`` rounded to the anchor's element type ``dtype`` (float32,
    float16; another type: unchanged), back as float64: what a correct implementation in that type
    returns where the operator is exact (``e_i = v_i - round(t)``, :mod:`anpred.judge.independence`)."""
    name = str(dtype)
    if name in ("float32", "float16"):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(x).astype(name).astype(np.float64)
    if name == "bfloat16":
        import ml_dtypes

        return np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float64)
    return np.asarray(x, dtype=np.float64)


class Arbiter:
    """Distances from the float64 execution, pooled over samples.

    Args:
        backends: the oracle's backends by name.
        fp64: the names of the float64 executions in the run (the first one is the arbiter).
    """

    def __init__(self, backends: dict[str, BackendInfo], fp64: list[str]):
        self.backends = backends
        self.fp64 = list(fp64)
        self.sums: dict[tuple[str, str], list[float]] = {}  # (anchor, voter) -> [sum d^2, sum c^2]
        self.consensus_sums: dict[str, list[float]] = {}  # anchor -> the consensus' (dd, cc) against fp64
        # (anchor, voter) -> [ulp_q, ulp_median] of its error in ULPs of the float64 result rounded to the
        # anchor's type, the largest over the samples (the wrong tail against the truth, :meth:`tails`)
        self.ulps: dict[tuple[str, str], list[float]] = {}

    @property
    def name(self) -> str | None:
        return self.fp64[0] if self.fp64 else None

    @property
    def library(self) -> str | None:
        """The family of the library the float64 execution runs on (its family without ``-fp64``)."""
        return self.backends[self.fp64[0]].family.removesuffix("-fp64") if self.fp64 else None

    def add(
        self,
        anchor: str,
        got: dict[str, np.ndarray],
        consensus: np.ndarray | None = None,
        ulp: tuple[str, str, float] | None = None,
    ) -> None:
        """Each voter's (and the consensus') squared deviation from the float64 execution at ``anchor``
        (finite positions). ``ulp``: ``(anchor element type, ULP dtype, quantile)``: also each fp32
        voter's error in ULPs of the float64 result rounded to that type
        (:meth:`anpred.judge.stats.Reference.compare`'s ``ulp_q`` and ``ulp_median``), for :meth:`tails`."""
        ref = got[self.fp64[0]]
        tensors = [((anchor, b), x) for b, x in got.items() if self.backends[b].votes]
        if ulp is not None:
            dtype, udt, q = ulp
            truth = Reference(truth_of(ref, dtype))
            for (_, b), x in tensors:
                if self.backends[b].precision != "fp32":
                    continue
                st = truth.compare(x, udt, ulp_quantile=q).stats
                if math.isnan(st.ulp_q):
                    continue
                u = self.ulps.setdefault((anchor, b), [0.0, 0.0])
                u[0], u[1] = max(u[0], st.ulp_q), max(u[1], st.ulp_median)
        if consensus is not None and consensus.shape == ref.shape:
            tensors.append((None, consensus))
        for key, x in tensors:
            ok = np.isfinite(x) & np.isfinite(ref)
            d = (x - ref)[ok]
            r = ref[ok]
            s = self.sums.setdefault(key, [0.0, 0.0]) if key else self.consensus_sums.setdefault(anchor, [0.0, 0.0])
            s[0] += float(np.einsum("i,i->", d, d))
            s[1] += float(np.einsum("i,i->", r, r))

    @property
    def consensus_error(self) -> dict[str, float]:
        """anchor -> pooled nRMSE of the consensus against the float64 execution."""
        return {a: _nrmse(dd, cc) for a, (dd, cc) in self.consensus_sums.items()}

    @property
    def error(self) -> dict[tuple[str, str], float]:
        """(anchor, voter) -> pooled nRMSE of the voter against the float64 execution."""
        return {k: _nrmse(dd, cc) for k, (dd, cc) in self.sums.items()}

    def arbitrate(self, cells: dict[tuple[str, str], Cell]) -> list[str]:
        """Accuracy arbitration by the float64 execution: a flagged cell of an fp32 voter whose own
        deviation from the float64 execution is smaller than the consensus' (pooled nRMSE) departs
        from the consensus because the consensus is less accurate there: it is unflagged, with the two
        figures in its reason. A voter on the arbiter's own library is never arbitrated (it shares the
        library's defects). The float64 execution's own flagged cells are cleared only at anchors where
        an independent fp32 voter that is flagged itself is closer to it than the consensus (a clean
        voter nearer by float32 noise backs nothing). A wrong shape, a missing output or a non-finite
        disagreement (either way) is never arbitrated. No constant: two measurements of the run are
        compared. Returns one note per backend arbitrated."""
        if not self.consensus_sums:
            return []
        mine, theirs = self.error, self.consensus_error
        arbiter, lib = self.fp64[0], self.library
        done: dict[str, list[str]] = {}
        backed: dict[str, str] = {}  # anchor -> a flagged independent voter found closer to float64 there

        def closer(a: str, b: str) -> tuple[float, float] | None:
            e_b, e_c = mine.get((a, b)), theirs.get(a)
            return (e_b, e_c) if e_b is not None and e_c is not None and e_b < e_c else None

        def clear(cell, e_b: float, e_c: float, by: str = "") -> None:
            cell.flagged = False
            why = f"backed by {by}, which departs from the consensus too and is closer to float64; " if by else ""
            cell.reason = (
                f"not flagged: closer to the float64 execution than the consensus (nRMSE {e_b:.3g} "
                f"against {e_c:.3g}); {why}the consensus shares an error here"
                + (f" [{cell.reason}]" if cell.reason else "")
            )
            done.setdefault(cell.backend, []).append(
                f"{cell.anchor} ({e_b:.2g} vs {e_c:.2g}{', backed by ' + by if by else ''})"
            )

        for (a, b), cell in cells.items():
            info = self.backends[b]
            # non-finite disagreement either way (NaN/Inf where the consensus is finite, or finite values
            # where it decided NaN/Inf) and wrong shapes are no accuracy question: never arbitrated
            if (
                not (info.votes and info.precision == "fp32")
                or info.family == lib
                or cell.nonfinite
                or cell.suppressed
                or cell.deviation
            ):
                continue
            pair = closer(a, b) if cell.flagged else None
            if pair is None:
                continue
            backed.setdefault(a, b)
            clear(cell, *pair)
        for (a, b), cell in cells.items():  # the arbiter itself: only where such a voter backs it
            if b == arbiter and cell.flagged and not cell.nonfinite and not cell.deviation and a in backed:
                clear(cell, 0.0, theirs[a], by=backed[a])
        return [
            f"{b}: departs from the consensus at {len(v)} anchor(s) but is closer to the float64 execution "
            f"({arbiter}) than the consensus there, nRMSE {'; '.join(v[:4])}{' ...' if len(v) > 4 else ''}: "
            "the majority shares an error (a less accurate computation), not flagged"
            for b, v in done.items()
        ]

    def tails(self, cells: dict[tuple[str, str], Cell], cfg: OracleConfig, skip: set[str]) -> None:
        """The wrong-tail warning against the float64 execution (docs/oracle.md, "Wrong tails"): a cell of
        an fp32 voter the nRMSE passes, whose ``ulp_q`` against the float64 result exceeds ``ulp_floor``
        and ``k`` (fp32) times that of the most accurate *other* independent family at the anchor
        (leaving out the arbiter's own library, which shares its formulas) while its ``ulp_median`` stays
        within ``origin_k`` times that family's (>= 1 ULP: a tail, not a broad error), carries
        ``Cell.tail`` (a warning, never a flag). Unlike the rule against the peers it sees a tail that
        most families share (it is then the consensus' own): one independent library computing the
        small values to a few ULPs shows the tail is not the type's limit. ``skip``: anchors judged part
        by part and the parts (their range rule judges the small values). The verdicts carry the
        warnings (:func:`anpred.judge.verdict.backend_verdict`)."""
        lib, k = self.library, cfg.k_for("fp32")
        by_anchor: dict[str, dict[str, list[float]]] = {}
        for (a, b), u in self.ulps.items():
            by_anchor.setdefault(a, {})[b] = u
        for a, per in by_anchor.items():
            if a in skip:
                continue
            for b, (q, med) in per.items():
                cell = cells.get((a, b))
                fam = self.backends[b].family
                if cell is None or cell.flagged or cell.tail or cell.deviation or fam == lib or not q > cfg.ulp_floor:
                    continue
                others = [(u[0], u[1], o) for o, u in per.items() if self.backends[o].family not in (fam, lib)]
                if not others:
                    continue
                best_q, best_med, best = min(others)
                if q > k * max(best_q, 1.0) and med <= cfg.origin_k * max(best_med, 1.0):
                    cell.tail = (
                        f"wrong tail against the float64 execution (a warning, not a flag): the "
                        f"{cfg.ulp_quantile:g} quantile of the error in ULPs of the float64 result {q:.3g} > "
                        f"{k:g} x {best}'s {best_q:.3g} (the most accurate independent family here) and > "
                        f"ulp_floor {cfg.ulp_floor:g}, while its median ULP error {med:.3g} is within "
                        f"origin_k {cfg.origin_k:g} x {best}'s {best_med:.3g}: an error relative to each "
                        "element's magnitude on part of the values, shared or not by the consensus"
                    )


def _nrmse(dd: float, cc: float) -> float:
    return math.sqrt(dd / cc) if cc > 0 else (0.0 if dd == 0 else math.inf)
