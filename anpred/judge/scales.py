"""Per-anchor error scales of a precision, derived from the model and the run, not from a table.

Contract: the oracle asks, per judged (anchor, backend), for the lower bound of its threshold and
where it comes from (:func:`floor_and_basis`), and for the deviation in the precision's natural unit
(:func:`natural_units`). Three bases, in this order (``docs/oracle.md``):

1. **population** -- the precision's cost measured on the run: the median primary statistic of the
   backend's peers, i.e. the other *families* that computed the same reduced-precision model (the
   threshold is ``k`` times it, :mod:`anpred.judge.verdict`). Used by both verdicts of a
   reduced-precision backend whenever a peer of its population was judged at the anchor.
2. **natural unit** -- the lower bound of that threshold, from the model itself: the RMS of *one*
   rounding to the anchor's grid, relative to the consensus' RMS (the nRMSE one rounding costs):

   * int8: a quantization step ``s`` (the scale of the DequantizeLinear that produces the anchor in the
     QDQ model, recorded by the int8 backends as ``quant_steps``): ``(s / sqrt(12)) / rms(c)``;
   * float16 / bfloat16 / float32: unit roundoff ``u`` (2**-11, 2**-8, 2**-24): ``u / sqrt(3)``.

   Source: the uniform rounding-noise model, a rounding error uniform over one step (variance
   ``s**2 / 12``; B. Widrow, I. Kollar, *Quantization Noise*, Cambridge UP 2008, ch. 4) and a
   relative rounding error uniform in ``[-u, u]`` (RMS ``u / sqrt(3)``; N. J. Higham, *Accuracy and
   Stability of Numerical Algorithms*, 2nd ed., 2002, sec. 2.7, which discusses when the model holds).
   The bound only matters where the peers agree (nearly) exactly; the peers decide elsewhere.
   For an fp32 voter at an anchor whose element type is float16/bfloat16 (a model whose own tensors
   are), the floor is ``k`` times that type's natural unit.
3. **constant** -- the measured per-precision floor of :mod:`anpred.defaults` (``floor_at``): the
   stated fallback where no peer of the population was judged and no natural unit is known (an int8
   anchor produced by a float operation), and the fp32 voters' floor (measured on the zoo).

The precision of a cell is the coarser of the backend's precision and the anchor's element type: a
float16 tensor computed by an "fp32" backend (a model whose own tensors are float16) is judged on
float16's scale (:func:`cell_precision`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from anpred.defaults import OracleConfig

__all__ = [
    "COARSENESS",
    "DTYPE_PRECISION",
    "UNIT_ROUNDOFF",
    "CellMeasures",
    "cell_precision",
    "floor_and_basis",
    "floor_basis_of",
    "natural_units",
    "threshold_basis",
    "unit_nrmse",
    "voter_floor",
]

#: unit roundoff u = 2**-p of each float precision (p = significand bits incl. the implicit one)
UNIT_ROUNDOFF: dict[str, float] = {"fp64": 2.0**-53, "fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
#: element type name -> precision
DTYPE_PRECISION: dict[str, str] = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
#: precisions from the finest to the coarsest
COARSENESS: tuple[str, ...] = ("fp64", "fp32", "fp16", "bf16", "int8")

_ULP_NAME = {"fp16": "float16 ULP", "bf16": "bfloat16 ULP", "fp32": "float32 ULP", "fp64": "float64 ULP"}


def cell_precision(backend_precision: str, anchor_dtype: str) -> str:
    """The coarser of ``backend_precision`` (fp32/fp16/bf16/int8) and the precision of the anchor's
    element type (``float16`` -> fp16 ...; other dtypes leave the backend's)."""
    p = backend_precision if backend_precision in COARSENESS else "fp32"
    q = DTYPE_PRECISION.get(str(anchor_dtype), p)
    return max(p, q, key=COARSENESS.index)


def unit_nrmse(precision: str, step: float | None = None, rms: float | None = None) -> float | None:
    """The nRMSE one rounding to ``precision``'s grid costs (module docstring, basis 2).

    Args:
        precision: fp64/fp32/fp16/bf16/int8.
        step: int8 only: the anchor's quantization step (scale; tensor units).
        rms: int8 only: the RMS of the consensus at the anchor (tensor units).

    Returns:
        Dimensionless; None for int8 without a positive step and RMS.
    """
    if precision == "int8":
        if not step or not rms or step <= 0 or rms <= 0 or not math.isfinite(step):
            return None
        return step / math.sqrt(12.0) / rms
    return UNIT_ROUNDOFF.get(precision, UNIT_ROUNDOFF["fp32"]) / math.sqrt(3.0)


@dataclass(frozen=True)
class CellMeasures:
    """What the run measured at one judged cell, for its floor (:func:`floor_and_basis`).

    Attributes:
        step, rms: int8's quantization step at the anchor and the consensus RMS (:func:`unit_nrmse`;
            None: not known).
        cost: implementation verdicts: the precision's own cost at this anchor (its population's
            median nRMSE against the fp32 consensus; None: not measured).
    """

    step: float | None = None
    rms: float | None = None
    cost: float | None = None


def floor_and_basis(
    cfg: OracleConfig,
    precision: str,
    stage: int,
    *,
    population: list[str] | None = None,
    measured: CellMeasures | None = None,
    fallback_why: str = "",
    implementation: bool = False,
    anchor_type: bool = False,
) -> tuple[float, str]:
    """``(floor, basis)`` of one cell (module docstring).

    Args:
        precision: the cell's precision (:func:`cell_precision`).
        population: the peers of the backend's population judged at this anchor (None: the backend is
            an fp32 voter judged against the fp32 consensus with the measured constant floor).
        measured: the cell's quantization step, consensus RMS and cost (None: none known).
        fallback_why: why no population peer was there (for the basis text).
        implementation: the cell belongs to an implementation verdict (its factor is ``population_k``).
            With a ``measured.cost``, the floor is the larger of ``sqrt(2) * cost`` and
            the natural unit: two implementations whose errors are independent realizations of that
            cost differ by sqrt(2) times it (variances of independent errors add), the most two
            correct implementations can differ by when each makes its own rounding decisions. Without
            a natural unit (no quantization step known at the anchor: its members compute it in
            float), the floor is never below the measured fp32 floor of the stage.
        anchor_type: an fp32 voter at an anchor whose element type is ``precision`` (float16 ...):
            its peers decide, with ``k`` times that type's natural unit as the floor (implementations
            legitimately differ by a few roundings there: float32 arithmetic rounded to float16 at each
            output vs float16 arithmetic; docs/oracle.md, 'The element type of the anchor', has the
            figure).
    """
    m = measured or CellMeasures()
    step, rms, cost = m.step, m.rms, m.cost
    if population is None:
        floor = cfg.floor_at(precision, stage)
        return floor, (
            f"peers: {cfg.k_for(precision):g} x median of the other voting families; floor = constant: "
            f"the measured {precision} floor {cfg.floor.get(precision, cfg.floor['fp32']):g}"
            f" x sqrt(1 + {cfg.depth_growth.get(precision, 1.0):g} x stage) (docs/oracle.md)"
        )
    unit = unit_nrmse(precision, step, rms)
    if anchor_type and unit is not None:
        k = cfg.k_for("fp32")
        return k * unit, (
            f"peers: {k:g} x median of {', '.join(population) or '-'}; floor = {k:g} x the natural "
            f"unit of the anchor's element type ({precision}: one rounding u/sqrt(3) = {unit:.3g})"
        )
    if population:
        peers = ", ".join(population)
        k = _k_text(cfg, precision, implementation)
        if unit is not None:
            what = (
                f"one int8 step {step:.3g} / sqrt(12) of RMS {rms:.3g}"
                if precision == "int8"
                else f"one {precision} rounding u/sqrt(3)"
            )
            if cost is not None and math.sqrt(2.0) * cost > unit:
                return math.sqrt(2.0) * cost, (
                    f"population: {k} median of {peers}; floor = sqrt(2) x the {precision} cost here {cost:.3g} "
                    f"(two independent realizations of its error; > natural unit: {what})"
                )
            return unit, f"population: {k} median of {peers}; floor = natural unit ({what})"
        floor = cfg.floor_at(precision, stage)
        if cost is not None and cost > 0:
            # without a quantization step the members compute this anchor in float: never held finer than
            # fp32 implementations are among themselves (the measured fp32 floor)
            fp32 = cfg.floor_at("fp32", stage)
            if math.sqrt(2.0) * cost < fp32:
                return fp32, (
                    f"population: {k} median of {peers}; floor = the measured fp32 floor {fp32:.3g} at this "
                    f"stage (> sqrt(2) x the {precision} cost here {cost:.3g}: no quantization step known "
                    "at this anchor, its members compute it in float)"
                )
            return math.sqrt(2.0) * cost, (
                f"population: {k} median of {peers}; floor = sqrt(2) x the {precision} "
                f"cost here {cost:.3g} (no quantization step known at this anchor)"
            )
        return floor, (
            f"population: {k} median of {peers}; floor = constant {precision} "
            f"floor (no quantization step known at this anchor)"
        )
    if implementation and cost is not None and cost > 0:
        return max(math.sqrt(2.0) * cost, unit or 0.0), (
            f"no peer judged here (the population's reference is the consensus); floor = sqrt(2) x the "
            f"{precision} cost here {cost:.3g}"
        )
    floor = cfg.floor_at(precision, stage)
    return floor, (
        f"constant fallback: the measured {precision} floor {cfg.floor.get(precision, cfg.floor['fp32']):g}"
        f" x sqrt(1 + stage) ({fallback_why or 'no other implementation of this precision judged here'})"
    )


#: separates the term that set a cell's threshold from the basis of its peers and floor (:func:`threshold_basis`)
BASIS_SEP = "; "


def threshold_basis(
    threshold: float, k: float, peer_level: float | None, floor: float, floor_basis: str
) -> tuple[str, str]:
    """``(term, basis)`` of a cell whose threshold is ``max(k * peer_level, floor)``
    (:func:`anpred.judge.verdict.judge_cell`): ``term`` is ``"peers"`` or ``"floor"``, whichever set it,
    and ``basis`` says so with both values, then where the peers and the floor come from
    (:func:`floor_and_basis`), e.g. ``threshold 1.77 = 10 x the peers' median 0.177 (above the floor
    2e-05); peers: 10 x median of the other voting families; floor = constant: ...``.
    All values are the cell's primary statistic (nRMSE by default, dimensionless)."""
    if peer_level is not None and k * peer_level > floor:
        term, text = (
            "peers",
            (f"threshold {threshold:.3g} = {k:g} x the peers' median {peer_level:.3g} (above the floor {floor:.3g})"),
        )
    elif peer_level is not None:
        term, text = (
            "floor",
            (
                f"threshold {threshold:.3g} = the floor ({k:g} x the peers' median "
                f"{peer_level:.3g} = {k * peer_level:.3g} is not above it)"
            ),
        )
    else:
        term, text = "floor", f"threshold {threshold:.3g} = the floor (no peer judged here)"
    return term, text + (BASIS_SEP + floor_basis if floor_basis else "")


def floor_basis_of(basis: str) -> str:
    """Where the peers and the floor come from (:func:`floor_and_basis`) in a cell's ``basis``
    (:func:`threshold_basis`)."""
    return basis.split(BASIS_SEP, 1)[1] if BASIS_SEP in basis else basis


def voter_floor(cfg: OracleConfig, stage: int, dtype: str) -> float:
    """The floor an fp32 voter's deviation must exceed to be flagged at an anchor of ``stage`` and
    element type ``dtype``: the measured constant, or ``k`` x the natural unit of a float16/bfloat16
    anchor (:func:`floor_and_basis`)."""
    prec = cell_precision("fp32", dtype)
    if prec != "fp32":
        return floor_and_basis(cfg, prec, stage, population=[], anchor_type=True)[0]
    return floor_and_basis(cfg, prec, stage)[0]


def _k_text(cfg: OracleConfig, precision: str, implementation: bool) -> str:
    return f"{cfg.k_for(precision, population=implementation):g} x"


def natural_units(
    precision: str, max_abs: float, rms_err: float, rms_c: float | None, step: float | None = None
) -> dict[str, Any]:
    """The deviation in ``precision``'s natural unit, ``{"unit", "size", "max", "rms"}``: ``max_abs``
    and ``rms_err`` (tensor units) divided by ``size`` =

    * int8: the quantization step ``step`` of the anchor (unit ``int8 step``);
    * float16 / bfloat16: the spacing (ULP) of that type at the consensus' RMS magnitude ``rms_c``
      (unit ``float16 ULP at RMS`` ...): a ULP at the tensor's typical value, unlike the element-wise
      ``max_ulp`` of :mod:`anpred.judge.stats`, which counts ULPs at each consensus value and is huge
      wherever the consensus is near 0;
    * fp32: empty (nRMSE, SNR and cosine say it).
    """
    size = None
    if precision == "int8":
        size, unit = step, "int8 step"
    elif precision in ("fp16", "bf16") and rms_c and rms_c > 0 and math.isfinite(rms_c):
        from anpred.judge.stats import ulp

        size = float(ulp(np.array([rms_c]), "float16" if precision == "fp16" else "bfloat16")[0])
        unit = f"{_ULP_NAME[precision]} at RMS"
    if not size or size <= 0:
        return {}
    return {"unit": unit, "size": float(size), "max": float(max_abs / size), "rms": float(rms_err / size)}
