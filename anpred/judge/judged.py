"""The description of what the judge judges (re-exported by :mod:`anpred.judge.struct`, the judge's
result types): :class:`BackendInfo` (family, precision, vote) and :class:`AnchorInfo` (an anchor or
a part of an output, in manifest order).
"""

from __future__ import annotations

from dataclasses import dataclass

from anpred.defaults import OracleConfig

__all__ = ["AnchorInfo", "BackendInfo"]


@dataclass
class BackendInfo:
    """A backend as the oracle sees it: family (one vote), precision (floor), whether it votes.

    ``precision`` is what the backend *computed* in (read back from the runtime, see
    :class:`anpred.backends.base.BackendStatus`), ``requested`` what it was asked for (the
    ``reduced_precision`` table, else its nominal precision); they differ e.g. for ``openvino-bf16``
    on a CPU without bf16 instructions (compiled to fp32), which is then judged as fp32 (fp32 floor
    and k), never as bf16. A backend asked for reduced precision does not vote either way."""

    name: str
    family: str
    precision: str = "fp32"
    votes: bool = True
    requested: str = ""
    # known defects of the backend's library that the model reaches (the run record's
    # ``versions["reference_defects"]``); such a backend is the consensus reference only when no
    # other candidate is left
    defects: str = ""
    # the reduced-precision program a population member ran (:func:`anpred.judge.populations.program_of`,
    # e.g. ``int8_model:<sha256 prefix>`` the ONNX QDQ model, ``pt2e_program:...`` ExecuTorch's PT2E one);
    # members of one precision that ran different programs form different populations; "" unknown
    program: str = ""

    @classmethod
    def make(
        cls,
        name: str,
        family: str | None = None,
        precision: str | None = None,
        config: OracleConfig | None = None,
        requested: str | None = None,
    ) -> "BackendInfo":
        """Args: ``precision``: the effective precision from the run record (``None``: unknown, the
        requested one is assumed); ``requested``: the nominal precision from the run record."""
        cfg = config or OracleConfig()
        fam = cfg.families.get(name) or family or name
        if "fp64" in (precision, requested):  # a float64 execution: the scale of fp32's error, never a vote
            return cls(name=name, family=fam, precision="fp64", votes=False, requested="fp64")
        reduced = cfg.reduced_precision.get(name)
        asked = reduced or requested or precision or "fp32"
        prec = precision or asked
        if prec not in cfg.floor:
            prec = "fp32"
        if asked not in cfg.floor:
            asked = "fp32"
        return cls(
            name=name,
            family=fam,
            precision=prec,
            votes=(reduced is None and asked == "fp32" and prec == "fp32"),
            requested=asked,
        )


@dataclass
class AnchorInfo:
    """An anchor in manifest (topological) order.

    ``part_of``: for a *part* of a concatenated output (:mod:`anpred.judge.parts`, ``kind == "part"``), the
    output anchor it is a slice of; judged like an anchor (same stage and floor as its output) when it
    passes the scale guard ``OracleConfig.part_min_scale``, else left out without a gap."""

    name: str
    stage: int
    kind: str = "boundary"
    op_type: str = ""
    dtype: str = "float32"
    part_of: str | None = None
