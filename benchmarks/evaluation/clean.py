"""The clean side of the evaluation: :func:`prepare_model` instruments a zoo model, writes its samples
and runs the clean and reduced-precision backends once; :func:`clean_summary` judges that run (oracle,
threshold baseline at every tolerance, detections against the clean consensus)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from .grid import LOWP_BACKENDS, NATIVE_TORCH, TOLERANCES, EvaluationError, check_stages, default_backends
from .measures import (
    add_match,
    critical_tolerance,
    decode_detections,
    finish_match,
    finite,
    judge_config,
    match_summary,
    output_anchors,
    reference_backend,
)
from .results import CleanSummary, ModelSetup

__all__ = ["prepare_model", "clean_summary"]


def prepare_model(
    name: str,
    work: str | Path,
    *,
    imgsz: int | None = None,
    n_real: int = 2,
    n_random: int = 2,
    seed: int = 0,
    backends: Iterable[str] | None = None,
    lowp: Iterable[str] = LOWP_BACKENDS,
    progress: bool = False,
    timeout_s: float = 1800,
    stages: Iterable[int] | None = None,
) -> ModelSetup:
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
    from anpred.run import run_model

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
    store = run_model(
        apath, backends + lowp, inp, work / "clean", overwrite=True, progress=progress, timeout_s=timeout_s
    )
    seconds = time.monotonic() - t0
    for s in store.meta["samples"]:
        kinds[s["id"]] = "real" if "-real" in s["source"] else "random"
    st = store.statuses()
    ok = [b for b in backends if st[b].status == "ok"]
    if len(ok) < 3:
        raise EvaluationError(
            f"{name}: fewer than 3 clean backends ran ok: "
            + "; ".join(f"{b}: {st[b].status} {st[b].reason[:200]}" for b in backends)
        )
    return ModelSetup(
        name=name,
        trained=zm.trained,
        imgsz=zm.hw,
        layout=zm.output_layout,
        anchored=str(apath),
        clean_dir=str(work / "clean"),
        samples=kinds,
        backends=ok,
        lowp=[b for b in lowp if st[b].status == "ok"],
        seconds_clean=seconds,
        weights=zm.weights_note,
    )


def clean_summary(setup: ModelSetup) -> CleanSummary:
    """Judge the clean run of ``setup`` (see :class:`CleanSummary`)."""
    from anpred.align import Aligner
    from anpred.judge import ThresholdCheck, check_run
    from anpred.run import RunStore

    t0 = time.monotonic()
    rep = check_run(setup.clean_dir, oracle="consensus", config=judge_config())
    if rep.status == "error":
        raise EvaluationError(f"{setup.name}: the clean run cannot be judged: {'; '.join(rep.problems)}")
    store = RunStore.open(setup.clean_dir)
    man = store.manifest
    outs = output_anchors(man)
    every = setup.backends + setup.lowp
    ref = reference_backend(setup.backends)
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
            crit[b] = max(crit.get(b, 0.0), critical_tolerance(al, outs, b, ref))
        if setup.layout:
            o = outs[0]
            cons = np.median(np.stack([al[o][b] for b in setup.backends if b in al.get(o, {})]), axis=0)
            cd = cons_dets[sid] = decode_detections(cons, setup.layout)
            for b in every:
                if b in al.get(o, {}):
                    add_match(dets[b], match_summary(decode_detections(al[o][b], setup.layout), cd))
    thres = {b: {f"{t:g}": bool(thr[t].finish()[b].passed is False) for t in TOLERANCES} for b in every if b != ref}
    pos = {a.name: i for i, a in enumerate(man.anchors)}  # profiles follow the manifest (parts left out)
    profile = {b: [None] * len(pos) for b in every}
    for c in rep.cells:
        if c.backend in profile and c.anchor in pos:
            profile[c.backend][pos[c.anchor]] = finite(c.primary)
    return CleanSummary(
        model=setup.name,
        reference=ref,
        backends=list(setup.backends),
        report={"status": rep.status, "notes": rep.notes, "consensus": rep.consensus},
        flagged=rep.flagged_backends,
        verdicts={b: v.to_dict() for b, v in rep.verdicts.items()},
        profile=profile,
        anchors=[
            {"name": a.name, "stage": a.stage, "kind": a.kind, "shape": a.shape, "op_type": a.op_type}
            for a in man.anchors
        ],
        threshold=thres,
        threshold_max={b: {"critical_tolerance": finite(v)} for b, v in crit.items() if b != ref},
        detections={b: finish_match(d) for b, d in dets.items() if d},
        seconds=time.monotonic() - t0,
        ref_outputs=ref_outputs,
        ort_raw=ort_raw,
        consensus_dets=cons_dets,
    )
