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

__all__ = ["task_impact", "load_labels", "TaskAccumulator", "task_accumulator", "ConsensusOf"]


def load_labels(
    spec: str | Path | list | dict | None, samples: list[dict[str, Any]], task: str, require: bool = True
) -> list[Any] | None:
    """Per sample of ``samples`` (a run's ``meta["samples"]``: ``{"id", "source"}`` each, run order), the label: a class
    index (classify) or a :class:`models.detect.Detections` (detect); None where a sample has none. ``spec``: see the
    module docstring (or an already-built list/dict).

    Raises:
        AnpredError: an unreadable file, a label that is not an integer, a COCO file without
            ``images``/``annotations``, labels for none of the samples.
    """
    if spec is None:
        return None
    names = [Path(s.get("source") or "").name for s in samples]
    ids = [s["id"] for s in samples]
    if spec == "folders":
        return _folder_labels(samples)
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
        try:
            return _coco_truth(data, names, ids, require)
        except (KeyError, TypeError, ValueError) as err:
            raise AnpredError(
                f"detection labels: malformed COCO JSON ({type(err).__name__}: {err}); each "
                "annotation needs image_id, bbox [x, y, w, h] and category_id"
            ) from err
    if isinstance(data, dict) and "labels" in data:
        data = data["labels"]
    if isinstance(data, list):
        out = list(data[: len(samples)]) + [None] * max(0, len(samples) - len(data))
    elif isinstance(data, dict):
        out = [data.get(n, data.get(i)) for n, i in zip(names, ids)]
    else:
        raise AnpredError("labels: expected a list or a mapping of class indices")
    try:
        out = [None if x is None else int(x) for x in out]
    except (TypeError, ValueError) as err:
        raise AnpredError(f"labels: a label is not a class index ({err})") from err
    if require and all(x is None for x in out):
        raise AnpredError("labels: none of the run's samples has a label")
    return out


def _folder_labels(samples: list[dict[str, Any]]) -> list[int]:
    """Class indices of the class-folder layout ``ROOT/<class>/<file>``: the classes are every subfolder
    of ROOT in sorted order (as torchvision's ``ImageFolder``: an empty class folder keeps its index).

    Raises:
        AnpredError: a sample not from a file, samples from more than one ROOT, a single class folder
            (a flat inputs folder, or stray files beside the class folders)."""
    if not samples:
        return []
    paths = [Path(s.get("source") or "") for s in samples]
    if not all(p.parent.name for p in paths):
        raise AnpredError("labels 'folders': the samples do not come from files in class folders")
    roots = {p.parent.parent for p in paths}
    parents = [p.parent.name for p in paths]
    if len(set(parents)) == 1 or len(roots) != 1:
        where = f"one folder ({parents[0]!r})" if len(set(parents)) == 1 else f"{len(roots)} parent folders"
        raise AnpredError(
            f"labels 'folders': the samples come from {where}; the class-folder layout has one "
            f"subfolder per class and no input file beside them (INPUTS/<class>/<file>)"
        )
    root = roots.pop()
    classes = (
        sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        if root.is_dir()
        else sorted(set(parents))
    )
    return [classes.index(p) for p in parents]


def _coco_truth(data, names: list[str], ids: list[str], require: bool = True) -> list[Any]:
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
    if require and all(x is None for x in out):
        raise AnpredError("detection labels: no image of the COCO file names one of the run's samples")
    return out


class TaskAccumulator:
    """Task results of every backend against the consensus', fed one sample at a time.

    Args:
        adapter: a task adapter; outs: the output anchors (:class:`anpred.manifest.Anchor`, manifest
            order); voters: the fp32 voting backends; consensus: ``{backend: array} -> array | None``
            (the oracle's, :meth:`anpred.judge.consensus.Oracle.consensus`); backends: every backend
            judged, ``precisions``: backend -> precision.
    """

    def __init__(self, adapter, outs, voters: list[str], consensus, backends: list[str], precisions: dict[str, str]):
        self.adapter, self.outs, self.voters, self.consensus = adapter, list(outs), list(voters), consensus
        self.backends, self.precisions = list(backends), dict(precisions)
        self.sums: dict[str, dict[str, float]] = {b: {} for b in self.backends}
        self.results: dict[str, list[Any]] = {b: [] for b in self.backends}
        self.refs: list[Any] = []
        self.labels: list[Any] = []

    def add(
        self,
        tensors: dict[str, dict[str, np.ndarray]],
        label: Any = None,
        consensus: dict[str, np.ndarray] | None = None,
    ) -> bool:
        """One sample's aligned tensors (``{anchor: {backend: array}}``); ``label``: its ground truth
        (None: unlabelled); ``consensus``: output anchor -> the consensus the oracle formed for this
        sample (:attr:`anpred.judge.consensus.Oracle.last_consensus`; an output not in it is voted here).
        False when no consensus of the outputs could be formed (not counted)."""
        cons = {}
        for a in self.outs:
            c = (consensus or {}).get(a.name)
            if c is None:  # voted in float64, as the oracle votes (so both give the same consensus)
                per = {b: np.asarray(t, np.float64) for b, t in tensors.get(a.name, {}).items() if b in self.voters}
                c = self.consensus(per) if per else None
            if c is None:
                return False
            cons[a.value] = c
        ref = self.adapter.result(cons)
        self.refs.append(ref)
        self.labels.append(label)
        for b in self.backends:
            got = {a.value: tensors[a.name][b] for a in self.outs if b in tensors.get(a.name, {})}
            if len(got) != len(self.outs):
                self.results[b].append(None)
                continue
            r = self.adapter.result(got)
            self.results[b].append(r)
            for k, v in self.adapter.compare(r, ref).items():
                self.sums[b][k] = self.sums[b].get(k, 0.0) + v
        return True

    def running(self) -> dict[str, str]:
        """backend -> the headline from the running sums alone (no set metric such as mAP: cheap, for
        progress lines)."""
        out = {}
        for b in self.backends:
            if self.sums[b]:
                out[b] = self.adapter.headline(self.adapter.summary(self.sums[b], [], []))
        return out

    def result(self) -> dict[str, Any]:
        """See :func:`task_impact`."""
        adapter, refs = self.adapter, self.refs
        out: dict[str, Any] = {
            "task": adapter.describe(),
            "samples": len(refs),
            "backends": {},
            "consensus_truth": None,
            "labels": sum(1 for t in self.labels if t is not None),
        }
        for b in self.backends:
            pairs = [(r, f) for r, f in zip(self.results[b], refs) if r is not None]
            if not pairs:
                continue
            m = adapter.summary(self.sums[b], [r for r, _ in pairs], [f for _, f in pairs])
            out["backends"][b] = {"metrics": m, "headline": adapter.headline(m), "precision": self.precisions.get(b)}
        if out["labels"]:
            lab = [(j, t) for j, t in enumerate(self.labels) if t is not None]
            cons_truth = _truth(adapter.name, [refs[j] for j, _ in lab], [t for _, t in lab])
            out["consensus_truth"] = cons_truth
            for b, d in out["backends"].items():
                rs = [(self.results[b][j], t) for j, t in lab if self.results[b][j] is not None]
                tb = _truth(adapter.name, [r for r, _ in rs], [t for _, t in rs])
                if tb is not None and cons_truth is not None:
                    key = next(iter(cons_truth))
                    tb["delta_to_consensus"] = (
                        (tb[key] - cons_truth[key]) if tb[key] is not None and cons_truth[key] is not None else None
                    )
                d["truth"] = tb
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
        "precision", "truth"}}, "consensus_truth": {...} | None, "labels": n labelled}``; ``truth``
        (with labels): classify ``{"top1", "delta_to_consensus"}``, detect ``{"map50", "delta_to_consensus"}``.

    Raises:
        AnpredError: not a readable tensors run; a task that does not fit the outputs (the adapter's
            message, e.g. a detector layout that does not match).
    """
    from anpred.judge.check import usable_backends
    from anpred.judge.samples import aligned_sample, run_aligner

    run = usable_backends(run_dir, config=config, allow_incomplete=True)
    store = run.store
    if store.meta.get("mode", "tensors") != "tensors":
        raise AnpredError(f"{run_dir}: task metrics need a tensors run")
    acc = task_accumulator(run, adapter)
    aligner = run_aligner(store, list(run.usable))
    names = {a.name for a in acc.outs}
    truth = load_labels(labels, store.meta["samples"], adapter.name)
    for i, sid in enumerate(store.sample_ids):
        tensors, _, _ = aligned_sample(store, aligner, list(run.usable), sid, names, [])
        acc.add(tensors, truth[i] if truth is not None else None)
    return acc.result()


def task_accumulator(run, adapter) -> TaskAccumulator:
    """A :class:`TaskAccumulator` for a run being judged (an :class:`anpred.judge.samples.Judging`).

    Raises:
        AnpredError: the manifest has no output anchor."""
    from anpred.judge.consensus import Oracle
    from anpred.judge.samples import judged_anchors
    from anpred.judge.struct import BackendInfo

    store, rep, cfg = run.store, run.report, run.config
    outs = [a for a in store.manifest.anchors if a.kind == "output"]
    if not outs:
        raise AnpredError("the manifest has no output anchor: no task output to read")
    usable = list(run.usable)
    infos = {b: BackendInfo.make(b, rep.backends[b]["family"], "fp32", cfg) for b in usable}
    voters = [b for b in usable if rep.backends[b]["precision"] == "fp32" and infos[b].votes]
    orc = Oracle(judged_anchors(store.manifest, []), [infos[b] for b in voters], cfg)
    return TaskAccumulator(
        adapter, outs, voters, ConsensusOf(orc), usable, {b: rep.backends[b]["precision"] for b in usable}
    )


class ConsensusOf:
    """``{backend: array} -> the consensus array`` of an oracle (picklable, unlike a lambda: a streamed
    run's checkpoint holds the task accumulator, :mod:`anpred.pipeline.stream_state`)."""

    def __init__(self, oracle):
        self.oracle = oracle

    def __call__(self, per):
        return self.oracle.consensus(per)[0]


def _truth(task: str, results: list[Any], labels: list[Any]) -> dict[str, Any] | None:
    """Accuracy against labels: classify ``{"top1": fraction}``, detect ``{"map50": COCO AP@0.5}``."""
    if not results:
        return None
    if task == "classify":
        return {
            "top1": float(np.mean([int(np.argmax(r)) == int(t) for r, t in zip(results, labels)])),
            "labelled": len(results),
        }
    if task == "detect":
        from anpred.task.adapters import coco_map50

        return {"map50": coco_map50(labels, results), "labelled": len(results)}
    return None
