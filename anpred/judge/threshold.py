"""The threshold baseline: a Polygraphy-style element-wise check of each backend's final outputs
against one reference backend, beside the consensus oracle (``anpred check --oracle threshold|both``).

Contract: :class:`ThresholdCheck` is streaming (one aligned sample per :meth:`ThresholdCheck.add`,
``{anchor: {backend: array}}``, canonical ONNX shape) and keeps per backend and output only counts and
maxima; :meth:`ThresholdCheck.finish` returns a :class:`anpred.judge.struct.ThresholdResult` per
backend other than the reference. An element fails when ``|x - r| > atol`` *and* ``|x - r| / |r| >
rtol`` (Polygraphy's ``simple`` compare function, ``check_error_stat="elemwise"``); NaN/Inf where the
reference is finite fail. Outputs missing in the reference, or in a backend, or of another shape are
skipped (a backend that compared no element does not pass).
"""

from __future__ import annotations

import numpy as np

from anpred.judge.struct import ThresholdResult

__all__ = ["ThresholdCheck"]


class ThresholdCheck:
    """Streaming Polygraphy-style baseline on the output anchors (see :class:`ThresholdResult`)."""

    def __init__(self, outputs: list[str], backends: list[str], reference: str, atol: float = 1e-5, rtol: float = 1e-5):
        self.outputs, self.reference, self.atol, self.rtol = list(outputs), reference, float(atol), float(rtol)
        self.res = {
            b: {"failed": 0, "total": 0, "max_abs": 0.0, "max_rel": 0.0, "outputs": {}}
            for b in backends
            if b != reference
        }

    def add(self, tensors: dict[str, dict[str, np.ndarray]]) -> None:
        for o in self.outputs:
            per = tensors.get(o) or {}
            if self.reference not in per:
                continue
            r = np.asarray(per[self.reference], dtype=np.float64)
            for b, acc in self.res.items():
                if b not in per or np.shape(per[b]) != r.shape:
                    continue
                x = np.asarray(per[b], dtype=np.float64)
                with np.errstate(invalid="ignore", divide="ignore"):
                    ad = np.abs(x - r)
                    rel = ad / np.abs(r)
                rf = np.isfinite(r)
                nonfin = ~np.isfinite(x) & rf
                both = np.isfinite(x) & rf
                fail = nonfin | (both & (ad > self.atol) & (rel > self.rtol))
                nf, nt = int(fail.sum()), int(x.size)
                mad = float(ad[both].max()) if both.any() else 0.0
                mrel = float(np.nan_to_num(rel[both], nan=0.0, posinf=np.inf).max()) if both.any() else 0.0
                acc["failed"] += nf
                acc["total"] += nt
                acc["max_abs"] = max(acc["max_abs"], mad)
                acc["max_rel"] = max(acc["max_rel"], mrel)
                po = acc["outputs"].setdefault(o, {"failed": 0, "total": 0, "max_abs": 0.0, "max_rel": 0.0})
                po["failed"] += nf
                po["total"] += nt
                po["max_abs"] = max(po["max_abs"], mad)
                po["max_rel"] = max(po["max_rel"], mrel)

    def finish(self) -> dict[str, ThresholdResult]:
        return {
            b: ThresholdResult(
                backend=b,
                reference=self.reference,
                atol=self.atol,
                rtol=self.rtol,
                passed=(a["failed"] == 0 and a["total"] > 0),
                failed_elements=a["failed"],
                total_elements=a["total"],
                max_abs=a["max_abs"],
                max_rel=a["max_rel"],
                outputs=a["outputs"],
            )
            for b, a in self.res.items()
        }
