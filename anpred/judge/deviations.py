"""A wrong shape or a missing output is a deviation, not a gap.

A backend that returns another shape than the one the voting families agree on, or no value for a
graph output they agree on, has deviated: the finding is about that backend, and it is flagged at the
anchor with its own wording (``cells[].deviation`` = ``"shape"`` | ``"layout"`` | ``"missing"``), never only listed as
``unjudged``. What stays a gap: a backend that did not run for the sample (failed, crashed), an anchor
whose layout is ambiguous, an inner anchor a backend cannot expose (a fused tensor: a capture
limitation, not a result), the part of an output (its output's entry says it), anchors of a backend
running a native graph of its own (``torch-native``, ``tf-native``: their mapping to the ONNX graph is
approximate by nature), and anything where fewer than two voting families agree.

Contract: :func:`shape_gap` classifies one gap reason of :class:`anpred.judge.consensus.Oracle` (called
once the consensus of the anchor is formed by at least two voting families); :func:`deviation_cells`
turns the recorded deviations into flagged :class:`anpred.judge.struct.Cell`\\ s (or flags the cell of a
backend judged on its values in other samples).
"""

from __future__ import annotations

import math

from anpred.align import NATIVE_BACKENDS, NO_LAYOUT_REASONS, WRONG_SHAPE_REASONS
from anpred.judge.stats import ErrorStats
from anpred.judge.struct import AnchorInfo, BackendInfo, Cell

__all__ = ["deviation_cells", "shape_gap"]

_SHAPE = "differs from the other backends' shape"
_MISSING = ("anchor missing in this backend's output", "not captured: ")


def shape_gap(anchor: AnchorInfo, why: str, absent: bool, backend: str = "") -> str:
    """``"shape"``, ``"layout"`` (no candidate layout of the tensor matches the ONNX-layout backends'
    consensus: every reading of it deviates), ``"missing"`` or ``""`` (an ordinary gap) for the reason ``why`` a backend
    could not be compared at ``anchor`` (module docstring); ``absent``: the backend stored nothing for the sample."""
    if absent or anchor.part_of or backend in NATIVE_BACKENDS:
        return ""
    if _SHAPE in why:
        return "shape"
    if why.startswith("not aligned: ") and why[len("not aligned: ") :].startswith(WRONG_SHAPE_REASONS):
        return "shape"
    if why.startswith("not aligned: ") and why[len("not aligned: ") :].startswith(NO_LAYOUT_REASONS):
        return "layout"
    if anchor.kind == "output" and (why == _MISSING[0] or why.startswith("not aligned: " + _MISSING[1])):
        return "missing"
    return ""


def deviation_cells(
    cells: dict[tuple[str, str], Cell],
    deviations: dict[tuple[str, str], dict[tuple[str, str], list[str]]],
    anchors: list[AnchorInfo],
    backends: dict[str, BackendInfo],
    samples: int,
) -> None:
    """Flag every (anchor, backend) of ``deviations`` (``(kind, reason) -> sample ids``) in ``cells``:
    a new cell without statistics (``primary`` = inf: no tensor to compare) or, where the backend was
    judged on its values in other samples, that cell flagged as well. The reason reads ``wrong shape:
    ...`` or ``missing output: ...`` with the samples it happened in."""
    stage = {a.name: a.stage for a in anchors}
    for (a, b), kinds in deviations.items():
        if a not in stage or b not in backends:
            continue
        kind = next((k for k in ("shape", "layout", "missing") if any(k == x for x, _ in kinds)), "missing")
        texts = []
        n = 0
        for (k, why), sids in kinds.items():
            n = max(n, len(sids))
            where = "" if len(sids) >= samples else f" (in {len(sids)} of {samples} samples)"
            label = {"shape": "wrong shape", "layout": "no layout of its tensor matches"}.get(k, "missing output")
            detail = why[len("not aligned: ") :] if why.startswith("not aligned: ") else why
            detail = detail[len("wrong shape: ") :] if detail.startswith("wrong shape: ") else detail
            texts.append(f"{label}: {detail}{where}; the voting families agree on the anchor")
        reason = "; ".join(texts)
        cell = cells.get((a, b))
        if cell is not None:
            cell.flagged, cell.deviation = True, kind
            cell.reason = reason + (f"; on its values: {cell.reason}" if cell.reason else "")
            continue
        nan = math.nan
        cells[(a, b)] = Cell(
            anchor=a,
            backend=b,
            samples=n,
            stats=ErrorStats(0, nan, nan, nan, nan, nan, nan, nan, nan),
            primary=math.inf,
            per_sample={"p50": math.inf, "p90": math.inf, "max": math.inf},
            floor=nan,
            peer_level=None,
            threshold=nan,
            nonfinite=0,
            flagged=True,
            reason=reason,
            deviation=kind,
        )
