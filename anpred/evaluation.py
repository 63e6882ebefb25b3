"""The reference evaluation: ANPRED's consensus oracle vs threshold baselines on injected faults.

For one zoo model (issue 7 items 3-4, issue 10 items 3-4):

1. :func:`prepare_model` instruments the model, writes the samples (real inputs: photos or rendered
   document pages; plus seeded uniform random inputs) and runs the clean backends (``ort``,
   ``openvino``, ``torch``, ``tf``, ``onnx-reference``) and the reduced-precision ones (``ort-fp16``,
   ``ort-int8``, ``openvino-bf16``) **once** with :func:`anpred.runner.run_model` into ``clean/``.
2. :func:`clean_summary` judges that run (:func:`anpred.judge.check_run`, consensus oracle), the
   threshold baseline at every tolerance, and the end-result detections of every backend against the
   detections of the clean consensus output.
3. :func:`run_configuration` injects one fault (:func:`passes.faults.inject_fault`) into the anchored
   model, builds a run folder whose clean backends' ``tensors/<label>`` are *symbolic links* to the clean
   run (nothing clean is recomputed), runs only the faulty variant with ONNX Runtime in this process as
   backend ``fault`` (its own family, so its vote cannot hide inside a clean family) and judges the
   folder with ``check_run``; the threshold baseline compares the faulty output with the reference's
   stored output; detections are decoded and matched (:mod:`models.detect`). ``kind=None`` is the
   null configuration (the clean model in the fault slot).
4. :func:`summarize` turns the :class:`ConfigResult` list into rates.

Definitions (per model):

- detection: ANPRED flags ``fault`` (``BackendVerdict.flagged``); a baseline at tolerance ``t`` flags it
  when some output element has ``|x - r| > t`` and ``|x - r| / |r| > t`` against the reference
  ``r`` (:class:`anpred.judge.ThresholdCheck`, atol = rtol = t).
- false alarm: a clean fp32 backend flagged, on the all-clean configurations (the clean run and the
  null configuration) and among the clean backends of every faulty configuration. The baseline's
  verdicts on clean backends do not depend on the configuration (same reference, same tensors).
- localization: over detected faults, ``origin_stage == truth.stage`` (top-1) and ``|origin -
  truth| <= 1`` (within one stage).
- injected size: pooled nRMSE ``sqrt(sum ||f - o||^2 / sum ||o||^2)`` of the faulty backend ``f``
  against the clean ``ort`` tensors ``o`` (same kernels), at the injection stage's anchors (maximum)
  and at the outputs: the fault's true effect, independent of any oracle.
- detections: :func:`models.detect.decode` (conf 0.25, class-aware NMS IoU 0.45) of each output,
  matched one-to-one (IoU >= 0.5, same class) with the detections of the clean consensus output (the
  element-wise median of the clean fp32 backends' aligned outputs); ``changed`` = unmatched on either
  side, summed over samples.

Performance: the judge is single-threaded numpy; set ``OPENBLAS_NUM_THREADS=1`` before numpy is
imported on a loaded machine (``benchmarks/oracle_eval.py`` does): multi-threaded OpenBLAS dot products
on ~1e5-element vectors were measured 10-150x slower under contention.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from anpred.errors import AnpredError

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


# ------------------------------------------------------------------------------------------------
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


def prepare_model(name: str, work: str | Path, *, imgsz: int | None = None, n_real: int = 2, n_random: int = 2,
                  seed: int = 0, backends: Iterable[str] | None = None, lowp: Iterable[str] = LOWP_BACKENDS,
                  progress: bool = False, timeout_s: float = 1800, stages: Iterable[int] | None = None) -> ModelSetup:
    """Instrument zoo model ``name`` and run the clean and reduced-precision backends once.

    Args:
        name: a :mod:`models` zoo name (``yolov8n``, ``yolov5n``, ``yolov8n-doclaynet`` ...).
        work: folder for this model (``anchored.onnx``, ``inputs/``, ``clean/``); created.
        imgsz: square input side (None: the zoo default; static models ignore other sizes).
        n_real, n_random: real inputs (zoo ``real_inputs``) and uniform [0, 1) random inputs
            (``numpy.random.default_rng(seed)``), each ``float32 (1, 3, H, W)``.
        backends: the clean fp32 backends (at least 3 families for a median consensus; None:
            :func:`default_backends`, which adds ``torch-native`` for models with a PyTorch rebuild).
        lowp: reduced-precision backends run on the same samples (judged, never voting).
        stages: the stage indices the caller will inject faults into; checked against the instrumented
            model (:func:`check_stages`) *before* anything is written or run.

    Returns:
        :class:`ModelSetup`. Raises EvaluationError when fewer than 3 clean backends run ok or a
        requested stage does not exist (then nothing is written).
    """
    import onnx

    import models
    from anpred.instrument import instrument_model
    from anpred.onnx_io import save_model
    from anpred.runner import run_model

    if n_real < 0 or n_random < 0 or n_real + n_random < 1:
        raise EvaluationError(f"need at least one sample (n_real={n_real}, n_random={n_random})")
    zm = models.get(name) if (imgsz is None or not models.REGISTRY[name].resizable) else models.get(name, imgsz=imgsz)
    backends, lowp = list(default_backends(zm) if backends is None else backends), list(lowp)
    proto = onnx.load(str(zm.onnx_path()))
    anchored, manifest = instrument_model(proto)
    check_stages(manifest, stages, name)  # before any clean run (a bad --stages costs nothing)
    manifest.model["name"] = zm.name
    manifest.model["origin"] = dict(zm.manifest_origin())
    if NATIVE_TORCH in backends:
        if zm.native_framework != "torch":
            raise EvaluationError(f"{name}: {NATIVE_TORCH} needs a native PyTorch model; {name} has none")
        from exporters.mapping import map_anchors

        net, example = zm.build_native()
        map_anchors(manifest, net, "torch", onnx_model=anchored, example_inputs=tuple(example))
        del net
    manifest.to_model(anchored)
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    apath = work / "anchored.onnx"
    save_model(anchored, apath)
    inp = work / "inputs"
    shutil.rmtree(inp, ignore_errors=True)
    inp.mkdir()
    in_name = proto.graph.input[0].name
    kinds: dict[str, str] = {}
    for i, x in enumerate(zm.real_inputs(n_real) if n_real else []):
        np.savez(inp / f"a{i:02d}-real.npz", **{in_name: x})
    rng = np.random.default_rng(seed)
    for i in range(n_random):
        np.savez(inp / f"b{i:02d}-random.npz", **{in_name: rng.random(zm.input_shape).astype(np.float32)})
    t0 = time.monotonic()
    store = run_model(apath, backends + lowp, inp, work / "clean", overwrite=True, progress=progress,
                      timeout_s=timeout_s)
    seconds = time.monotonic() - t0
    for s in store.meta["samples"]:
        kinds[s["id"]] = "real" if "-real" in s["source"] else "random"
    st = store.statuses()
    ok = [b for b in backends if st[b].status == "ok"]
    if len(ok) < 3:
        raise EvaluationError(f"{name}: fewer than 3 clean backends ran ok: " +
                              "; ".join(f"{b}: {st[b].status} {st[b].reason[:200]}" for b in backends))
    return ModelSetup(name=name, trained=zm.trained, imgsz=zm.hw, layout=zm.output_layout, anchored=str(apath),
                      clean_dir=str(work / "clean"), samples=kinds, backends=ok,
                      lowp=[b for b in lowp if st[b].status == "ok"], seconds_clean=seconds, weights=zm.weights_note)


# ------------------------------------------------------------------------------------------------
def _output_anchors(manifest) -> list[str]:
    outs = [a.name for a in manifest.anchors if a.kind == "output"]
    return outs or [a.name for a in manifest.anchors if a.stage == max(x.stage for x in manifest.anchors)]


def _reference(backends: list[str]) -> str:
    from anpred.defaults import REFERENCE_PRIORITY

    return next((b for b in REFERENCE_PRIORITY if b in backends), backends[0])


def _judge_config():
    """The oracle configuration used: the defaults, without the HTML plot reservoirs (plots only)."""
    from anpred.defaults import OracleConfig

    return OracleConfig(reservoir=0)


def _detections(output: np.ndarray, layout: str | None):
    from models.detect import decode

    return decode(output, layout=layout) if layout else None


def _match_summary(dets, ref) -> dict[str, Any]:
    """Detections ``dets`` vs ``ref``: counts, matched pairs, unmatched (changed), mean IoU of matches."""
    from models.detect import match_detections

    m = match_detections(dets, ref)
    return {"n": len(dets), "n_ref": len(ref), "matched": int(len(m.pairs)), "changed": int(m.changed),
            "missing": int(len(m.unmatched_b)), "extra": int(len(m.unmatched_a)),
            "iou_sum": float(np.sum(m.ious)) if len(m.pairs) else 0.0}


def _add_match(acc: dict[str, Any], s: dict[str, Any]) -> None:
    for k, v in s.items():
        acc[k] = acc.get(k, 0) + v


def _finish_match(acc: dict[str, Any]) -> dict[str, Any]:
    out = dict(acc)
    out["mean_iou"] = out.pop("iou_sum", 0.0) / out["matched"] if out.get("matched") else None
    return out


def _nrmse_acc(acc: dict[str, list[float]], key: str, x: np.ndarray, o: np.ndarray) -> None:
    x = np.asarray(x, dtype=np.float64).ravel()
    o = np.asarray(o, dtype=np.float64).ravel()
    ok = np.isfinite(x) & np.isfinite(o)
    d = x[ok] - o[ok]
    a = acc.setdefault(key, [0.0, 0.0, 0])
    a[0] += float(np.dot(d, d))
    a[1] += float(np.dot(o[ok], o[ok]))
    a[2] += int((~ok).sum())


def _nrmse_of(a: list[float]) -> float:
    if a[2]:
        return math.inf
    return 0.0 if a[0] == 0 else (math.sqrt(a[0] / a[1]) if a[1] > 0 else math.inf)


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


def clean_summary(setup: ModelSetup) -> CleanSummary:
    """Judge the clean run of ``setup`` (see :class:`CleanSummary`)."""
    from anpred.align import Aligner
    from anpred.judge import ThresholdCheck, check_run
    from anpred.runstore import RunStore

    t0 = time.monotonic()
    rep = check_run(setup.clean_dir, oracle="consensus", config=_judge_config())
    if rep.status == "error":
        raise EvaluationError(f"{setup.name}: the clean run cannot be judged: {'; '.join(rep.problems)}")
    store = RunStore.open(setup.clean_dir)
    man = store.manifest
    outs = _output_anchors(man)
    every = setup.backends + setup.lowp
    ref = _reference(setup.backends)
    statuses = {b: s for b, s in store.statuses().items() if b in every}
    aligner = Aligner(man, statuses)
    thr = {t: ThresholdCheck(outs, every, ref, t, t) for t in TOLERANCES}
    crit: dict[str, float] = {}
    dets: dict[str, dict[str, Any]] = {b: {} for b in every}
    ref_outputs, ort_raw, cons_dets = {}, {}, {}
    for sid in store.sample_ids:
        raw = {b: {k: v for k, v in store.read_anchors(b, sid).items() if k in outs} for b in every}
        al = aligner.align(sid, raw).tensors
        for t in thr.values():
            t.add(al)
        ref_outputs[sid] = {o: al[o][ref] for o in outs if ref in al.get(o, {})}
        if "ort" in setup.backends:
            ort_raw[sid] = store.read_anchors("ort", sid)
        for b in every:
            crit[b] = max(crit.get(b, 0.0), _critical_tolerance(al, outs, b, ref))
        if setup.layout:
            o = outs[0]
            cons = np.median(np.stack([al[o][b] for b in setup.backends if b in al.get(o, {})]), axis=0)
            cd = cons_dets[sid] = _detections(cons, setup.layout)
            for b in every:
                if b in al.get(o, {}):
                    _add_match(dets[b], _match_summary(_detections(al[o][b], setup.layout), cd))
    thres = {b: {f"{t:g}": bool(thr[t].finish()[b].passed is False) for t in TOLERANCES}
             for b in every if b != ref}
    pos = {a.name: i for i, a in enumerate(man.anchors)}  # profiles follow the manifest (parts left out)
    profile = {b: [None] * len(pos) for b in every}
    for c in rep.cells:
        if c.backend in profile and c.anchor in pos:
            profile[c.backend][pos[c.anchor]] = _finite(c.primary)
    return CleanSummary(
        model=setup.name, reference=ref, backends=list(setup.backends), report={"status": rep.status, "notes": rep.notes,
                                                "consensus": rep.consensus},
        flagged=rep.flagged_backends, verdicts={b: v.to_dict() for b, v in rep.verdicts.items()},
        profile=profile,
        anchors=[{"name": a.name, "stage": a.stage, "kind": a.kind, "shape": a.shape, "op_type": a.op_type}
                 for a in man.anchors],
        threshold=thres, threshold_max={b: {"critical_tolerance": _finite(v)} for b, v in crit.items() if b != ref},
        detections={b: _finish_match(d) for b, d in dets.items() if d}, seconds=time.monotonic() - t0,
        ref_outputs=ref_outputs, ort_raw=ort_raw, consensus_dets=cons_dets)


def _critical_tolerance(al: dict[str, dict[str, np.ndarray]], outs: list[str], b: str, ref: str) -> float:
    """Smallest t for which the baseline at atol = rtol = t passes ``b``: ``max min(|x-r|, |x-r|/|r|)``
    over the output elements (inf with NaN/Inf where the reference is finite; 0 when b is the reference)."""
    if b == ref:
        return 0.0
    worst = 0.0
    for o in outs:
        per = al.get(o) or {}
        if b not in per or ref not in per:
            continue
        x, r = per[b], per[ref]
        rf = np.isfinite(r)
        if (~np.isfinite(x) & rf).any():
            return math.inf
        ok = np.isfinite(x) & rf
        ad = np.abs(x[ok] - r[ok])
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = ad / np.abs(r[ok])
        m = np.minimum(ad, np.nan_to_num(rel, nan=0.0, posinf=np.inf))
        if m.size:
            worst = max(worst, float(m.max()))
    return worst


def _finite(v):
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else (None if math.isnan(v) else 1e300)


# ------------------------------------------------------------------------------------------------
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


def build_config_run(setup: ModelSetup, out_dir: str | Path) -> "Any":
    """Create run folder ``out_dir`` holding the clean run's samples (hard links) and the clean fp32
    backends' tensors (``tensors/<label>`` symbolic links to the clean run) and statuses; returns its
    :class:`anpred.runstore.RunStore` (the faulty backend is added by the caller)."""
    from anpred.runstore import RunStore

    clean = RunStore.open(setup.clean_dir)
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    store = RunStore.create(out, clean.manifest, model=dict(clean.meta.get("model", {})),
                            inputs=dict(clean.meta.get("inputs", {})))
    store.meta["samples"] = list(clean.meta["samples"])
    for sid in clean.sample_ids:
        src = clean.input_file(sid)
        try:
            os.link(src, out / "inputs" / src.name)
        except OSError:
            shutil.copyfile(src, out / "inputs" / src.name)
    for b in setup.backends:
        os.symlink(clean.backend_dir(b).resolve(), store.backend_dir(b), target_is_directory=True)
        store.meta["backends"][b] = clean.meta["backends"][b]
    store.meta["evaluation"] = {"clean_run": str(Path(setup.clean_dir).resolve()), "linked": list(setup.backends)}
    store.save_meta()
    return store


def run_fault_backend(store, model_path: str | Path, *, backend: str = "ort", label: str = FAULT_LABEL,
                      family: str = FAULT_FAMILY) -> dict[str, dict[str, np.ndarray]]:
    """Run ``backend`` on ``model_path`` (an anchored variant) for every sample of ``store`` *in this
    process*, store its tensors under ``label`` and its status with family ``family``.

    Returns ``{sample_id: {anchor: array}}`` as the backend returned them. A backend failure becomes a
    ``failed`` status (and an empty dict), as in the run driver.
    """
    from anpred.backends import backend_class
    from anpred.backends.base import BackendStatus

    st = BackendStatus(name=label, family=family)
    out: dict[str, dict[str, np.ndarray]] = {}
    work = store.root / ".work" / label
    work.mkdir(parents=True, exist_ok=True)
    be = backend_class(backend)({})
    try:
        t0 = time.perf_counter()
        be.prepare(Path(model_path), store.manifest, work)
        st.seconds_prepare = time.perf_counter() - t0
        st.versions, st.precision, st.precision_requested = be.versions(), be.effective_precision(), be.precision
        st.captures = {k: asdict(v) for k, v in be.anchor_info().items()}
        t0 = time.perf_counter()
        for sid in store.sample_ids:
            res = be.run(store.read_inputs(sid))
            store.write_anchors(label, sid, res)
            out[sid] = res
            st.samples += 1
        st.seconds_run = time.perf_counter() - t0
        st.dtypes = {k: str(np.asarray(v).dtype) for k, v in next(iter(out.values()), {}).items()}
        st.anchors_captured = len(next(iter(out.values()), {}))
        st.status = "ok"
    except Exception as err:  # noqa: BLE001 - becomes the backend's status, as in the run driver
        st.status, st.reason = "failed", f"{type(err).__name__}: {err}"[:1500]
        out = {}
    finally:
        try:
            be.close()
        except Exception:  # noqa: BLE001
            pass
        shutil.rmtree(work, ignore_errors=True)
    store.set_status(st)
    return out


def run_configuration(setup: ModelSetup, clean: CleanSummary, kind: str | None, stage: int | None,
                      magnitude: float | None, work: str | Path, *, seed: int = 0, keep: bool = False,
                      fault_backend: str = "ort") -> ConfigResult:
    """Inject ``kind`` at ``stage`` with ``magnitude`` (``kind=None``: the clean model in the fault slot),
    run and judge it (see the module docstring). The configuration's run folder under ``work`` is
    removed afterwards unless ``keep``.

    Raises:
        EvaluationError: the variant could not be run or judged (a broken configuration, not a verdict).
    """
    import onnx

    from anpred.judge import ThresholdCheck, check_run
    from passes.faults import FaultError, inject_fault

    t0 = time.monotonic()
    res = ConfigResult(model=setup.name, kind=kind, stage=stage, magnitude=magnitude)
    man = setup.manifest()
    tag = "null" if kind is None else f"{kind}-s{stage}-m{magnitude:g}"
    cdir = Path(work) / tag
    cdir.mkdir(parents=True, exist_ok=True)
    variant_path = cdir / "variant.onnx"
    if kind is None:
        variant_path = Path(setup.anchored)
    else:
        try:
            variant, truth = inject_fault(onnx.load(setup.anchored), kind, stage=stage, magnitude=magnitude,
                                          manifest=man, seed=seed)
        except FaultError as err:
            res.skipped = str(err)
            shutil.rmtree(cdir, ignore_errors=True)
            return res
        res.truth = truth.to_dict()
        onnx.save(variant, str(variant_path))
    run_dir = cdir / "run"
    try:
        store = build_config_run(setup, run_dir)
        raw = run_fault_backend(store, variant_path, backend=fault_backend)
        if not raw:
            raise EvaluationError(f"{tag}: the faulty backend failed: {store.statuses()[FAULT_LABEL].reason}")
        rep = check_run(run_dir, oracle="consensus", config=_judge_config())
        if rep.status == "error":
            raise EvaluationError(f"{tag}: cannot be judged: {'; '.join(rep.problems)}")
        v = rep.verdicts.get(FAULT_LABEL)
        if v is None:
            raise EvaluationError(f"{tag}: the faulty backend was not judged: {rep.unjudged_backends}")
        res.flagged, res.origin_stage, res.origin_anchor = v.flagged, v.origin_stage, v.origin_anchor
        res.propagation, res.non_monotonic, res.output_flagged = v.propagation, v.non_monotonic, v.output_flagged
        res.clean_flagged = [b for b in setup.backends if rep.verdicts.get(b) is not None and rep.verdicts[b].flagged]
        names = [a.name for a in man.anchors]
        pos = {a: i for i, a in enumerate(names)}  # the profile follows the manifest (parts left out)
        res.profile = [None] * len(names)
        for c in rep.cells:
            if c.backend == FAULT_LABEL and c.anchor in pos:
                res.profile[pos[c.anchor]] = _finite(c.primary)
        # threshold baseline on the final outputs (the faulty backend's outputs are ONNX-shaped)
        outs = _output_anchors(man)
        thr = {t: ThresholdCheck(outs, [clean.reference, FAULT_LABEL], clean.reference, t, t) for t in TOLERANCES}
        crit = 0.0
        acc: dict[str, list[float]] = {}
        dets: dict[str, Any] = {}
        by_kind: dict[str, dict[str, Any]] = {}
        for sid, anchors in raw.items():
            tensors = {o: {clean.reference: clean.ref_outputs[sid][o], FAULT_LABEL: np.asarray(anchors[o], np.float64)}
                       for o in outs if o in anchors and o in clean.ref_outputs.get(sid, {})}
            for t in thr.values():
                t.add(tensors)
            crit = max(crit, _critical_tolerance(tensors, outs, FAULT_LABEL, clean.reference))
            for a in names:
                if a in anchors and a in clean.ort_raw.get(sid, {}):
                    _nrmse_acc(acc, a, anchors[a], clean.ort_raw[sid][a])
            if setup.layout and sid in clean.consensus_dets and outs[0] in anchors:
                s = _match_summary(_detections(anchors[outs[0]], setup.layout), clean.consensus_dets[sid])
                _add_match(dets, s)
                _add_match(by_kind.setdefault(setup.samples.get(sid, "real"), {}), s)
        res.threshold = {f"{t:g}": (not thr[t].finish()[FAULT_LABEL].passed) for t in TOLERANCES}
        res.critical_tolerance = _finite(crit)
        res.true_profile = [_finite(_nrmse_of(acc[a])) if a in acc else None for a in names]
        stage_of = {a.name: a.stage for a in man.anchors}
        if res.truth is not None and res.truth.get("stage") is not None:
            at = [_nrmse_of(acc[a]) for a in names if a in acc and stage_of[a] == res.truth["stage"]]
            res.injected_nrmse = _finite(max(at)) if at else None
        o_vals = [_nrmse_of(acc[o]) for o in outs if o in acc]
        res.output_nrmse = _finite(max(o_vals)) if o_vals else None
        res.detections = _finish_match(dets) if dets else {}
        res.detections_by_kind = {k: _finish_match(d) for k, d in by_kind.items()}
    finally:
        if not keep:
            shutil.rmtree(cdir, ignore_errors=True)
    res.seconds = time.monotonic() - t0
    return res


def configurations(setup: ModelSetup, kinds: Iterable[str], stages: Iterable[int] | None = None,
                   magnitudes: dict[str, Iterable[float]] | None = None) -> list[tuple[str, int, float]]:
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


# ------------------------------------------------------------------------------------------------
def _rate(num: int, den: int) -> dict[str, Any]:
    return {"n": den, "k": num, "rate": (num / den) if den else None}


def summarize(results: list[ConfigResult], cleans: dict[str, CleanSummary | dict[str, Any]]) -> dict[str, Any]:
    """Rates over the configurations of one or more models.

    Returns a dict with, per model and over all models:
    ``detection[method][kind][magnitude]`` (method ``anpred`` or ``threshold@<t>``: rate of flagged
    faulty variants), ``false_alarm[method]`` on clean configurations and among clean backends of
    faulty ones (rate over backend verdicts), ``localization`` (top-1 and within one stage, over
    ANPRED's detections), ``propagation`` counts (masked, non-monotonic) and ``skipped`` counts.
    """
    methods = ["anpred"] + [f"threshold@{t:g}" for t in TOLERANCES]
    out: dict[str, Any] = {}
    models_ = sorted({r.model for r in results} | set(cleans))
    for scope in models_ + ["all"]:
        rs = [r for r in results if scope in ("all", r.model)]
        cl = [c if isinstance(c, dict) else c.to_dict() for m, c in cleans.items() if scope in ("all", m)]
        faulty = [r for r in rs if r.kind is not None and not r.skipped]
        null = [r for r in rs if r.kind is None and not r.skipped]
        det: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in methods}
        for r in faulty:
            mag = f"{r.magnitude:g}"
            flags = {"anpred": r.flagged, **{f"threshold@{t}": v for t, v in r.threshold.items()}}
            for m in methods:
                cell = det[m].setdefault(r.kind, {}).setdefault(mag, {"k": 0, "n": 0})
                cell["n"] += 1
                cell["k"] += int(bool(flags[m]))
        for m in methods:
            for k in det[m]:
                for mag, c in det[m][k].items():
                    c["rate"] = c["k"] / c["n"] if c["n"] else None
            tot = [r for r in faulty]
            hit = sum(1 for r in tot if ({"anpred": r.flagged, **{f"threshold@{t}": v for t, v in r.threshold.items()}}[m]))
            det[m]["all"] = {"all": _rate(hit, len(tot))}
        # false alarms (rates over backend verdicts). All-clean configurations: the clean run's fp32
        # backends and the null configurations' backends (the clean ones and the fault slot running the
        # clean model). The baseline's verdicts on clean backends are the same in every configuration.
        fa: dict[str, Any] = {}
        n_cc = sum(len(c["backends"]) for c in cl) + sum(len(_clean_backends(cleans, r.model)) + 1 for r in null)
        k_cc = sum(len([b for b in c["flagged"] if b in c["backends"]]) for c in cl) + \
            sum(len(r.clean_flagged) + int(r.flagged) for r in null)
        n_fb = sum(len(_clean_backends(cleans, r.model)) for r in faulty)
        k_fb = sum(len(r.clean_flagged) for r in faulty)
        fa["anpred"] = {"clean_configs": _rate(k_cc, n_cc), "clean_backends_of_faulty": _rate(k_fb, n_fb),
                        "faulty_configs_with_false_alarm": _rate(sum(1 for r in faulty if r.clean_flagged), len(faulty))}
        for t in TOLERANCES:
            key = f"{t:g}"
            k = n = kf = nf = 0
            for c in cl:
                judged = [b for b in c["backends"] if b in c["threshold"]]  # the reference is not judged
                flagged = sum(int(c["threshold"][b][key]) for b in judged)
                repeats = 1 + sum(1 for r in null if r.model == c["model"])
                nfaulty = sum(1 for r in faulty if r.model == c["model"])
                n += len(judged) * repeats
                k += flagged * repeats
                nf += len(judged) * nfaulty
                kf += flagged * nfaulty
            n += len(null)
            k += sum(1 for r in null if r.threshold.get(key))
            fa[f"threshold@{key}"] = {"clean_configs": _rate(k, n), "clean_backends_of_faulty": _rate(kf, nf)}
        detected = [r for r in faulty if r.flagged and r.truth and r.truth.get("stage") is not None]
        top1 = sum(1 for r in detected if r.origin_stage == r.truth["stage"])
        near = sum(1 for r in detected if r.origin_stage is not None and abs(r.origin_stage - r.truth["stage"]) <= 1)
        loc = {"top1": _rate(top1, len(detected)), "within_one": _rate(near, len(detected)),
               "by_kind": {}}
        for k in sorted({r.kind for r in detected}):
            d = [r for r in detected if r.kind == k]
            loc["by_kind"][k] = {"top1": _rate(sum(1 for r in d if r.origin_stage == r.truth["stage"]), len(d)),
                                 "within_one": _rate(sum(1 for r in d if abs((r.origin_stage or 0) - r.truth["stage"]) <= 1), len(d))}
        prop = {"flagged": len([r for r in faulty if r.flagged]),
                "masked": sum(1 for r in faulty if r.flagged and r.propagation == "masked"),
                "non_monotonic": sum(1 for r in faulty if r.flagged and r.non_monotonic),
                "by_kind": {p: sum(1 for r in faulty if r.flagged and r.propagation == p)
                            for p in ("amplified", "attenuated", "stable", "masked")}}
        skipped = {}
        for r in rs:
            if r.skipped:
                skipped.setdefault(r.kind, []).append(r.stage)
        out[scope] = {"configs": len(faulty), "null_configs": len(null), "detection": det, "false_alarm": fa,
                      "localization": loc, "propagation": prop,
                      "skipped": {k: sorted(set(v)) for k, v in skipped.items()}}
    return out


def _clean_backends(cleans: dict[str, Any], model: str) -> list[str]:
    """The clean fp32 backends of ``model`` in ``cleans`` (CleanSummary or its dict)."""
    c = cleans.get(model)
    if c is None:
        return []
    return list(c["backends"] if isinstance(c, dict) else c.backends)


def bars(summary: dict[str, Any]) -> dict[str, Any]:
    """The project's bars on a :func:`summarize` scope: ANPRED's detection rate >= the best baseline's
    at every (kind, magnitude) where that baseline has zero false alarms on clean configurations;
    ANPRED's false-alarm rate 0 on clean configurations; top-1 localization >= 90%. A bar is never
    met on nothing: detection needs at least one faulty configuration, false alarms at least one clean
    verdict, localization at least one detected fault.
    Returns ``{"detection": {"met": bool, "violations": [...]}, "false_alarm": {...}, "localization": {...}}``."""
    det = summary["detection"]
    fa = summary["false_alarm"]
    zero = [m for m in det if m != "anpred" and (fa[m]["clean_configs"]["rate"] or 0) == 0]
    viol = []
    for m in zero:
        for k, mags in det[m].items():
            if k == "all":
                continue
            for mag, c in mags.items():
                a = det["anpred"].get(k, {}).get(mag, {})
                if c["rate"] is not None and (a.get("rate") or 0) < c["rate"]:
                    viol.append({"baseline": m, "kind": k, "magnitude": mag, "anpred": a.get("rate"), "baseline_rate": c["rate"]})
    fa_rate = fa["anpred"]["clean_configs"]["rate"]
    top1 = summary["localization"]["top1"]["rate"]
    n = summary.get("configs", 0)
    return {"detection": {"met": bool(n) and not viol, "configs": n, "zero_false_alarm_baselines": zero,
                          "violations": viol},
            "false_alarm": {"met": fa_rate is not None and fa_rate == 0, "rate": fa_rate},
            "localization": {"met": top1 is not None and top1 >= 0.9, "top1": top1}}


def save_results(path: str | Path, payload: dict[str, Any]) -> None:
    """Write the evaluation JSON atomically (schema :data:`EVAL_SCHEMA`)."""
    from anpred.onnx_io import atomic_write_text

    atomic_write_text(Path(path), json.dumps({"schema": EVAL_SCHEMA, **payload}, indent=1, default=_json_default))


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return _finite(float(o))
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
