"""What a deviation costs the user: task metrics of every backend against the consensus, and against
labels when there are any.

:func:`task_impact` reads a judged run folder sample by sample (only the output anchors, aligned to
the canonical layout), forms the consensus of the outputs exactly as the oracle does (fp32 voters,
:meth:`anpred.judge.consensus.Oracle.consensus`), turns each backend's outputs and the consensus'
into task results with an adapter (:mod:`anpred.task.adapters`), and pools the comparisons over the
samples. Memory: one sample's outputs at a time, plus every sample's task results (detections,
probability vectors: small) for the set metrics.

Labels (:func:`load_labels`): classification labels as a ``.json`` list (sample order) or mapping
(sample source file name or sample id -> class index), a ``.txt`` with one class index per line, or
``folders`` (the class is the name of each sample's parent folder, in sorted order of the folder
names: the class-folder layout); detection ground truth as COCO-style JSON whose ``images`` name
the samples (``file_name`` = the sample's source file name, or ``id`` = the sample's position + 1)
and whose ``bbox`` ([x, y, w, h]) are in the model input's pixels, ``category_id`` = class index + 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from anpred.errors import AnpredError

__all__ = ["task_impact", "load_labels"]


def load_labels(spec: str | Path | list | dict | None, store, task: str) -> list[Any] | None:
    """Per sample of ``store`` (its order), the label: a class index (classify) or a
    :class:`models.detect.Detections` (detect); None where a sample has none. ``spec``: see the module
    docstring (or an already-built list/dict).

    Raises:
        AnpredError: an unreadable file, a label that is not an integer, a COCO file without
            ``images``/``annotations``, labels for none of the samples.
    """
    if spec is None:
        return None
    samples = store.meta["samples"]
    names = [Path(s.get("source") or "").name for s in samples]
    ids = [s["id"] for s in samples]
    if spec == "folders":
        parents = [Path(s.get("source") or "").parent.name for s in samples]
        if not all(parents):
            raise AnpredError("labels 'folders': the samples do not come from files in class folders")
        classes = sorted(set(parents))
        return [classes.index(p) for p in parents]
    data: Any = spec
    if isinstance(spec, (str, Path)):
        p = Path(spec)
        try:
            text = p.read_text()
        except OSError as err:
            raise AnpredError(f"labels {p}: {err.strerror or err}") from err
        if p.suffix == ".txt":
            data = [line.strip() for line in text.splitlines() if line.strip()]
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                raise AnpredError(f"labels {p}: not JSON ({err})") from err
    if task == "detect":
        return _coco_truth(data, names, ids)
    if isinstance(data, dict) and "labels" in data:
        data = data["labels"]
    if isinstance(data, list):
        out = list(data[:len(samples)]) + [None] * max(0, len(samples) - len(data))
    elif isinstance(data, dict):
        out = [data.get(n, data.get(i)) for n, i in zip(names, ids)]
    else:
        raise AnpredError("labels: expected a list or a mapping of class indices")
    try:
        out = [None if x is None else int(x) for x in out]
    except (TypeError, ValueError) as err:
        raise AnpredError(f"labels: a label is not a class index ({err})") from err
    if all(x is None for x in out):
        raise AnpredError("labels: none of the run's samples has a label")
    return out


def _coco_truth(data, names: list[str], ids: list[str]) -> list[Any]:
    from models.detect import Detections

    if not isinstance(data, dict) or "images" not in data or "annotations" not in data:
        raise AnpredError("detection labels must be COCO-style JSON with 'images' and 'annotations'")
    by_file = {Path(im.get("file_name", "")).name: im["id"] for im in data["images"]}
    boxes: dict[Any, list] = {}
    for a in data["annotations"]:
        x, y, w, h = a["bbox"]
        boxes.setdefault(a["image_id"], []).append((x, y, x + w, y + h, int(a["category_id"]) - 1))
    out = []
    for i, n in enumerate(names):
        img = by_file.get(n) if n else None
        img = img if img is not None else (i + 1 if any(im["id"] == i + 1 for im in data["images"]) else None)
        if img is None:
            out.append(None)
            continue
        b = np.array([r[:4] for r in boxes.get(img, [])], np.float64).reshape(-1, 4)
        c = np.array([r[4] for r in boxes.get(img, [])], np.int64)
        out.append(Detections(b, np.ones(len(c)), c, None))
    if all(x is None for x in out):
        raise AnpredError("detection labels: no image of the COCO file names one of the run's samples")
    return out


def task_impact(run_dir: str | Path, adapter, *, labels=None, config=None) -> dict[str, Any]:
    """Task metrics of every usable backend of the run against the consensus (and the labels).

    Args:
        run_dir: a tensors-mode run folder.
        adapter: a task adapter (:func:`anpred.task.adapters.load_adapter`).
        labels: see :func:`load_labels`.
        config: oracle settings (:class:`anpred.defaults.OracleConfig`, a file, or None).

    Returns:
        ``{"task": adapter.describe(), "samples": n, "backends": {backend: {"metrics", "headline",
        "truth"}}, "consensus_truth": {...} | None, "labels": n labelled}``; ``truth`` (with labels):
        classify ``{"top1", "delta_to_consensus"}``, detect ``{"map50", "delta_to_consensus"}``.

    Raises:
        AnpredError: not a readable tensors run; a task that does not fit the outputs (the adapter's
            message, e.g. a detector layout that does not match).
    """
    from anpred.judge.check import usable_backends
    from anpred.judge.consensus import Oracle
    from anpred.judge.samples import _aligned_sample, _aligner, judged_anchors
    from anpred.judge.struct import BackendInfo

    run = usable_backends(run_dir, config=config, allow_incomplete=True)
    store, rep, cfg = run.store, run.report, run.config
    if store.meta.get("mode", "tensors") != "tensors":
        raise AnpredError(f"{run_dir}: task metrics need a tensors run")
    outs = [a for a in store.manifest.anchors if a.kind == "output"]
    if not outs:
        raise AnpredError(f"{run_dir}: the manifest has no output anchor")
    usable = list(run.usable)
    voters = [b for b in usable if rep.backends[b]["precision"] == "fp32" and
              BackendInfo.make(b, rep.backends[b]["family"], "fp32", cfg).votes]
    orc = Oracle(judged_anchors(store.manifest, []), [BackendInfo.make(b, rep.backends[b]["family"], "fp32", cfg)
                                                     for b in voters], cfg)
    aligner = _aligner(store, usable)
    names = {a.name for a in outs}
    truth = load_labels(labels, store, adapter.name)
    sums: dict[str, dict[str, float]] = {b: {} for b in usable}
    results: dict[str, list[Any]] = {b: [] for b in usable}
    refs: list[Any] = []
    kept_truth: list[Any] = []
    idx_truth: list[int] = []
    n = 0
    for i, sid in enumerate(store.sample_ids):
        tensors, _, _ = _aligned_sample(store, aligner, usable, sid, names, [])
        cons = {}
        for a in outs:
            per = {b: t for b, t in tensors.get(a.name, {}).items() if b in voters}
            if per:
                c, _, _ = orc.consensus(per)
                if c is not None:
                    cons[a.value] = c
        if len(cons) != len(outs):
            continue  # no consensus for this sample: not counted
        ref = adapter.result(cons)
        refs.append(ref)
        if truth is not None:
            kept_truth.append(truth[i])
            idx_truth.append(len(refs) - 1)
        n += 1
        for b in usable:
            got = {a.value: tensors[a.name][b] for a in outs if b in tensors.get(a.name, {})}
            if len(got) != len(outs):
                results[b].append(None)
                continue
            r = adapter.result(got)
            results[b].append(r)
            for k, v in adapter.compare(r, ref).items():
                sums[b][k] = sums[b].get(k, 0.0) + v
    out: dict[str, Any] = {"task": adapter.describe(), "samples": n, "backends": {}, "consensus_truth": None,
                           "labels": sum(1 for t in (truth or []) if t is not None)}
    for b in usable:
        pairs = [(r, f) for r, f in zip(results[b], refs) if r is not None]
        if not pairs:
            continue
        m = adapter.summary(sums[b], [r for r, _ in pairs], [f for _, f in pairs])
        out["backends"][b] = {"metrics": m, "headline": adapter.headline(m), "precision": rep.backends[b]["precision"]}
    if truth is not None:
        lab = [(j, t) for j, t in zip(idx_truth, kept_truth) if t is not None]
        cons_truth = _truth(adapter.name, [refs[j] for j, _ in lab], [t for _, t in lab])
        out["consensus_truth"] = cons_truth
        for b, d in out["backends"].items():
            rs = [(results[b][j], t) for j, t in lab if results[b][j] is not None]
            tb = _truth(adapter.name, [r for r, _ in rs], [t for _, t in rs])
            if tb is not None and cons_truth is not None:
                key = next(iter(cons_truth))
                tb["delta_to_consensus"] = (tb[key] - cons_truth[key]) if tb[key] is not None and \
                    cons_truth[key] is not None else None
            d["truth"] = tb
    return out


def _truth(task: str, results: list[Any], labels: list[Any]) -> dict[str, Any] | None:
    """Accuracy against labels: classify ``{"top1": fraction}``, detect ``{"map50": COCO AP@0.5}``."""
    if not results:
        return None
    if task == "classify":
        return {"top1": float(np.mean([int(np.argmax(r)) == int(t) for r, t in zip(results, labels)])),
                "labelled": len(results)}
    if task == "detect":
        from anpred.task.adapters import coco_map50

        return {"map50": coco_map50(labels, results), "labelled": len(results)}
    return None
