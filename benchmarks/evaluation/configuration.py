"""One fault configuration of the evaluation: :func:`build_config_run` links the clean run into a new
run folder, :func:`run_fault_backend` runs the faulty variant in this process as backend ``fault``, and
:func:`run_configuration` injects the fault, runs and judges it (oracle, threshold baseline, injected
size, detections)."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .grid import FAULT_FAMILY, FAULT_LABEL, TOLERANCES, EvaluationError
from .measures import (
    add_match,
    critical_tolerance,
    decode_detections,
    finish_match,
    finite,
    judge_config,
    match_summary,
    nrmse_acc,
    nrmse_of,
    output_anchors,
)
from .results import CleanSummary, ConfigResult, ModelSetup

__all__ = ["build_config_run", "link_run", "run_fault_backend", "run_configuration"]


def link_run(clean_dir: str | Path, out_dir: str | Path, backends) -> "Any":
    """Create run folder ``out_dir`` holding the samples of the run at ``clean_dir`` (hard links, copies
    across file systems) and the tensors (``tensors/<label>`` symbolic links) and statuses of
    ``backends``; returns its :class:`anpred.run.RunStore` (``run.json`` names the clean run and the
    linked backends under ``evaluation``; the caller adds what it runs anew)."""
    from anpred.run import RunStore

    clean = RunStore.open(clean_dir)
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    store = RunStore.create(
        out, clean.manifest, model=dict(clean.meta.get("model", {})), inputs=dict(clean.meta.get("inputs", {}))
    )
    store.meta["samples"] = list(clean.meta["samples"])
    for sid in clean.sample_ids:
        src = clean.input_file(sid)
        try:
            os.link(src, out / "inputs" / src.name)
        except OSError:
            shutil.copyfile(src, out / "inputs" / src.name)
    for b in backends:
        os.symlink(clean.backend_dir(b).resolve(), store.backend_dir(b), target_is_directory=True)
        store.meta["backends"][b] = clean.meta["backends"][b]
    store.meta["evaluation"] = {"clean_run": str(Path(clean_dir).resolve()), "linked": list(backends)}
    store.save_meta()
    return store


def build_config_run(setup: ModelSetup, out_dir: str | Path) -> "Any":
    """:func:`link_run` of ``setup``'s clean run with its clean fp32 backends (the faulty backend is
    added by the caller)."""
    return link_run(setup.clean_dir, out_dir, setup.backends)


def run_fault_backend(
    store, model_path: str | Path, *, backend: str = "ort", label: str = FAULT_LABEL, family: str = FAULT_FAMILY
) -> dict[str, dict[str, np.ndarray]]:
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
        # how to run it again (the drill-down, anpred.drill, re-runs it on subgraphs): the backend, its
        # own model, its family
        store.meta.setdefault("backend_specs", {})[label] = {
            "name": backend,
            "options": {"model": str(Path(model_path).resolve()), "family": family},
        }
        store.save_meta()
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


def run_configuration(
    setup: ModelSetup,
    clean: CleanSummary,
    kind: str | None,
    stage: int | None,
    magnitude: float | None,
    work: str | Path,
    *,
    seed: int = 0,
    keep: bool = False,
    fault_backend: str = "ort",
) -> ConfigResult:
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
            variant, truth = inject_fault(
                onnx.load(setup.anchored), kind, stage=stage, magnitude=magnitude, manifest=man, seed=seed
            )
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
        rep = check_run(run_dir, oracle="consensus", config=judge_config())
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
                res.profile[pos[c.anchor]] = finite(c.primary)
        # threshold baseline on the final outputs (the faulty backend's outputs are ONNX-shaped)
        outs = output_anchors(man)
        thr = {t: ThresholdCheck(outs, [clean.reference, FAULT_LABEL], clean.reference, t, t) for t in TOLERANCES}
        crit = 0.0
        acc: dict[str, list[float]] = {}
        dets: dict[str, Any] = {}
        by_kind: dict[str, dict[str, Any]] = {}
        for sid, anchors in raw.items():
            tensors = {
                o: {clean.reference: clean.ref_outputs[sid][o], FAULT_LABEL: np.asarray(anchors[o], np.float64)}
                for o in outs
                if o in anchors and o in clean.ref_outputs.get(sid, {})
            }
            for t in thr.values():
                t.add(tensors)
            crit = max(crit, critical_tolerance(tensors, outs, FAULT_LABEL, clean.reference))
            for a in names:
                if a in anchors and a in clean.ort_raw.get(sid, {}):
                    nrmse_acc(acc, a, anchors[a], clean.ort_raw[sid][a])
            if setup.layout and sid in clean.consensus_dets and outs[0] in anchors:
                s = match_summary(decode_detections(anchors[outs[0]], setup.layout), clean.consensus_dets[sid])
                add_match(dets, s)
                add_match(by_kind.setdefault(setup.samples.get(sid, "real"), {}), s)
        res.threshold = {f"{t:g}": (not thr[t].finish()[FAULT_LABEL].passed) for t in TOLERANCES}
        res.critical_tolerance = finite(crit)
        res.true_profile = [finite(nrmse_of(acc[a])) if a in acc else None for a in names]
        stage_of = {a.name: a.stage for a in man.anchors}
        if res.truth is not None and res.truth.get("stage") is not None:
            at = [nrmse_of(acc[a]) for a in names if a in acc and stage_of[a] == res.truth["stage"]]
            res.injected_nrmse = finite(max(at)) if at else None
        o_vals = [nrmse_of(acc[o]) for o in outs if o in acc]
        res.output_nrmse = finite(max(o_vals)) if o_vals else None
        res.detections = finish_match(dets) if dets else {}
        res.detections_by_kind = {k: finish_match(d) for k, d in by_kind.items()}
    finally:
        if not keep:
            shutil.rmtree(cdir, ignore_errors=True)
    res.seconds = time.monotonic() - t0
    return res
