"""The evaluation's typed results, apart from the steps that fill them: :class:`ModelSetup` (a prepared
model and its clean run), :class:`CleanSummary` (the clean run judged) and :class:`ConfigResult` (one
fault configuration judged). Their ``to_dict`` is what ``results.json`` holds."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ModelSetup", "CleanSummary", "ConfigResult"]


@dataclass
class ModelSetup:
    """A prepared model: anchored ONNX, manifest, clean run folder and sample provenance.

    Attributes:
        name: zoo name. trained: weights from a real training run (False: seeded random).
        imgsz: input (H, W). layout: detector output layout (``yolov8``/``yolov5``) or None.
        anchored: path of the anchored ONNX. clean_dir: the clean run folder.
        samples: ``{sample_id: "real" | "random"}`` in run order.
        backends: clean fp32 backends that ran ok; lowp: reduced-precision ones that ran ok.
        seconds_clean: wall seconds of the clean run.
    """

    name: str
    trained: bool
    imgsz: tuple[int, int]
    layout: str | None
    anchored: str
    clean_dir: str
    samples: dict[str, str]
    backends: list[str]
    lowp: list[str]
    seconds_clean: float = 0.0
    weights: str = ""

    def manifest(self):
        from anpred.manifest import AnchorManifest

        return AnchorManifest.load(Path(self.clean_dir) / "manifest.json")


@dataclass
class CleanSummary:
    """The clean run judged: ANPRED verdicts of all backends, per-anchor primary statistic (nRMSE vs
    consensus) per backend, the baseline's verdict per backend and tolerance, detections vs the clean
    consensus, and the reference outputs / consensus detections the configurations reuse (not saved)."""

    model: str
    reference: str
    backends: list[str]
    report: dict[str, Any]
    flagged: list[str]
    verdicts: dict[str, dict[str, Any]]
    profile: dict[str, list[float | None]]
    anchors: list[dict[str, Any]]
    threshold: dict[str, dict[str, bool]]
    threshold_max: dict[str, dict[str, float]]
    detections: dict[str, dict[str, Any]]
    seconds: float
    ref_outputs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)
    ort_raw: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)
    consensus_dets: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("ref_outputs", "ort_raw", "consensus_dets"):
            d.pop(k)
        return d


@dataclass
class ConfigResult:
    """One configuration (a fault kind x stage x magnitude, or the null configuration ``kind=None``).

    Attributes:
        truth: the injected fault's :class:`passes.fault_truth.FaultTruth` as a dict (None: null config).
        skipped: why no variant was run (the kind does not apply in that stage), else "".
        flagged: ANPRED flagged ``fault``. origin_stage/origin_anchor: its localization.
        clean_flagged: clean fp32 backends ANPRED flagged in this configuration (false alarms).
        threshold: tolerance (``"1e-05"`` ...) -> the baseline flagged ``fault``.
        critical_tolerance: the largest tolerance at which the baseline still flags ``fault``.
        propagation, non_monotonic, output_flagged: from the verdict (:class:`anpred.judge.BackendVerdict`).
        profile: per anchor (manifest order) the oracle's primary statistic of ``fault``.
        true_profile: per anchor the nRMSE of ``fault`` vs the clean ``ort`` tensors.
        injected_nrmse / output_nrmse: true size at the injection stage (max) / at the outputs.
        detections: ``fault``'s detections vs the clean consensus detections, summed over samples;
            per sample kind in ``detections_by_kind``.
        seconds: wall time of this configuration (inject, run, judge).
    """

    model: str
    kind: str | None
    stage: int | None
    magnitude: float | None
    truth: dict[str, Any] | None = None
    skipped: str = ""
    flagged: bool = False
    origin_stage: int | None = None
    origin_anchor: str | None = None
    clean_flagged: list[str] = field(default_factory=list)
    threshold: dict[str, bool] = field(default_factory=dict)
    critical_tolerance: float | None = None
    propagation: str = "none"
    non_monotonic: bool = False
    output_flagged: bool = False
    profile: list[float | None] = field(default_factory=list)
    true_profile: list[float | None] = field(default_factory=list)
    injected_nrmse: float | None = None
    output_nrmse: float | None = None
    detections: dict[str, Any] = field(default_factory=dict)
    detections_by_kind: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ConfigResult":
        return cls(**d)
