"""The evaluation's grid and its checks: the backends, tolerances and fault magnitudes it uses by
default, and what is checked before anything runs (fault magnitudes against the ranges of
:mod:`passes.faults`, stage indices against the manifest); :func:`configurations` spans the
(kind, stage, magnitude) grid."""

from __future__ import annotations

import math
from typing import Iterable

from anpred.errors import AnpredError

from .results import ModelSetup

__all__ = [
    "CLEAN_BACKENDS",
    "LOWP_BACKENDS",
    "TOLERANCES",
    "FAULT_LABEL",
    "FAULT_FAMILY",
    "DEFAULT_MAGNITUDES",
    "EVAL_SCHEMA",
    "NATIVE_TORCH",
    "EvaluationError",
    "magnitude_problem",
    "validate_magnitudes",
    "check_stages",
    "default_backends",
    "configurations",
]

CLEAN_BACKENDS = ("ort", "openvino", "torch", "tf", "onnx-reference")
LOWP_BACKENDS = ("ort-fp16", "ort-int8", "openvino-bf16")
TOLERANCES = (1e-5, 1e-4, 1e-3, 1e-2)
FAULT_LABEL = "fault"
FAULT_FAMILY = "fault"
# Magnitudes per kind (see passes.faults.FAULT_KINDS for their meaning), from barely below the fp32
# noise floor to clearly above it: round p bits (16 | 11 = float16 | 8 = bfloat16), sigmoid blend
# weight, epsilon factor, weight ULPs; rounding-mode and padding-same have no magnitude.
DEFAULT_MAGNITUDES: dict[str, tuple[float, ...]] = {
    "round": (16, 11, 8),
    "approx-sigmoid": (1e-4, 1e-2, 1.0),
    "norm-epsilon": (10.0, 1000.0),
    "weight-ulp": (16, 256, 4096),
    "rounding-mode": (1,),
    "padding-same": (1,),
}
EVAL_SCHEMA = "anpred.evaluation/1"
# The clean backend that runs the native model in eager PyTorch, for zoo models with a torch origin.
NATIVE_TORCH = "torch-native"


class EvaluationError(AnpredError):
    """The evaluation cannot run as asked (unknown model/kind, a clean backend failing, bad sizes)."""


def magnitude_problem(kind: str, m: float) -> str | None:
    """Why magnitude ``m`` is invalid for fault ``kind`` (None when valid). The ranges are those
    :mod:`passes.faults` enforces at injection time (or silently truncates), checked before anything runs:
    ``round`` an integer p in 2..23; ``approx-sigmoid`` a blend weight in (0, 1]; ``norm-epsilon`` a finite
    factor > 0 and != 1; ``weight-ulp`` an integer k >= 1; ``rounding-mode`` / ``padding-same`` have no
    magnitude (only 1)."""
    from passes.faults import FAULT_KINDS

    if kind not in FAULT_KINDS:
        return f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}"
    m = float(m)
    if not math.isfinite(m):
        return f"{kind}={m:g}: not a finite number"
    if kind == "round" and not (m == int(m) and 2 <= m <= 23):
        return f"round={m:g}: significand bits must be an integer in 2..23 (11 = float16, 8 = bfloat16)"
    if kind == "approx-sigmoid" and not 0 < m <= 1:
        return f"approx-sigmoid={m:g}: the blend weight must be in (0, 1]"
    if kind == "norm-epsilon" and not (m > 0 and m != 1):
        return f"norm-epsilon={m:g}: the epsilon factor must be > 0 and != 1"
    if kind == "weight-ulp" and not (m == int(m) and m >= 1):
        return f"weight-ulp={m:g}: the ULP count must be an integer >= 1"
    if kind in ("rounding-mode", "padding-same") and m != 1:
        return f"{kind}={m:g}: this kind has no magnitude (give 1 or leave it out)"
    return None


def validate_magnitudes(magnitudes: dict[str, Iterable[float]] | None) -> None:
    """Check every ``{kind: magnitudes}`` entry (:func:`magnitude_problem`) before anything runs.

    Raises:
        EvaluationError: one message listing every invalid kind / magnitude, or an empty list.
    """
    problems = []
    for k, ms in (magnitudes or {}).items():
        ms = list(ms)
        if not ms:
            problems.append(f"{k}: no magnitude given")
        problems += [p for p in (magnitude_problem(k, m) for m in ms) if p]
    if problems:
        raise EvaluationError("invalid fault magnitudes: " + "; ".join(dict.fromkeys(problems)))


def check_stages(manifest, stages: Iterable[int] | None, name: str = "model") -> list[int]:
    """The requested stage indices checked against ``manifest``'s stages (None: all of them).

    Raises:
        EvaluationError: an index the manifest does not have (the message lists the valid ones)."""
    all_stages = [s.index for s in manifest.stages]
    stages = all_stages if stages is None else list(stages)
    bad = [s for s in stages if s not in all_stages]
    if bad:
        raise EvaluationError(f"{name}: no stage {bad}; stages are {all_stages}")
    return stages


def default_backends(zm) -> tuple[str, ...]:
    """The clean fp32 backends for zoo model ``zm``: :data:`CLEAN_BACKENDS`, plus ``torch-native``
    (eager PyTorch, anchors mapped with :func:`exporters.mapping.map_anchors`) when the model has a
    native PyTorch rebuild (``zm.native_framework == "torch"``: yolov8n/s, yolov5n/s, yolov8n-doclaynet)."""
    return CLEAN_BACKENDS + ((NATIVE_TORCH,) if zm.native_framework == "torch" else ())


def configurations(
    setup: ModelSetup,
    kinds: Iterable[str],
    stages: Iterable[int] | None = None,
    magnitudes: dict[str, Iterable[float]] | None = None,
) -> list[tuple[str, int, float]]:
    """The (kind, stage, magnitude) grid: every kind x every stage (default: all of the manifest's)
    x the kind's magnitudes (default :data:`DEFAULT_MAGNITUDES`). Raises EvaluationError on an
    unknown kind or stage or an invalid magnitude (:func:`validate_magnitudes`)."""
    from passes.faults import FAULT_KINDS

    stages = check_stages(setup.manifest(), stages, setup.name)
    validate_magnitudes(magnitudes)
    out = []
    for k in kinds:
        if k not in FAULT_KINDS:
            raise EvaluationError(f"unknown fault kind {k!r}; known: {', '.join(FAULT_KINDS)}")
        mags = list((magnitudes or {}).get(k) or DEFAULT_MAGNITUDES.get(k) or (FAULT_KINDS[k][0],))
        for s in stages:
            for m in mags:
                out.append((k, s, float(m)))
    return out
