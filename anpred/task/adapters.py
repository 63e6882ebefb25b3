"""Task adapters: a backend's outputs -> task results, compared with the consensus' task results.

An adapter turns the output anchors of one sample (``{ONNX output name: array}``, canonical layout)
into a task result, compares a backend's result with the consensus' one (sums that pool over
samples), summarises the sums into metrics and names the headline number. Built in:

- :class:`DetectAdapter` (``detect``): YOLOv5/YOLOv8-style heads decoded and NMS'd
  (:func:`models.detect.decode`: class score > ``conf`` 0.25, class-aware NMS at IoU 0.45,
  ultralytics' ``predict`` defaults); matched one-to-one with the consensus' detections at IoU >= 0.5
  and the same class (:func:`models.detect.match_detections`): kept (= recall against the consensus),
  precision, F1, mean IoU and mean |score shift| of matched boxes; mAP@0.5 taking the consensus'
  detections as pseudo-labels (pycocotools ``COCOeval``, the COCO definition).
- :class:`ClassifyAdapter` (``classify``): top-1 agreement with the consensus' class, top-5 overlap
  (|top5 ∩ top5_consensus| / 5), mean |probability shift| of the consensus' top class (the output is
  taken as probabilities when it is non-negative and sums to 1 per row, else softmax is applied).
- :class:`DenseAdapter` (``dense``): IoU of the maps thresholded at ``threshold`` (0.3: PP-OCR's DB
  binarisation threshold, ``rapidocr`` ``thresh``), pooled over samples (sum of intersections / sum of
  unions).

A user adapter is ``module:function`` returning an object with the same four methods
(:class:`TaskAdapter`).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from anpred.errors import AnpredError

__all__ = ["TaskAdapter", "DetectAdapter", "ClassifyAdapter", "DenseAdapter", "load_adapter", "TASKS", "zoo_task"]

TASKS = ("detect", "classify", "dense")


class TaskAdapter:
    """Protocol of a task adapter (subclass it or provide the same methods).

    ``name``: the task. ``result(outputs)``: one sample's task result from ``{output name: array}``
    (the model's graph outputs, float64 or their dtype). ``compare(res, ref)``: a dict of sums that
    add over samples (``res``: a backend's result, ``ref``: the consensus'). ``summary(sums, results,
    refs)``: the metrics (``results``/``refs``: every sample's results, for set metrics such as mAP).
    ``headline(metrics)``: one short line, e.g. ``"0 of 29 detections kept"``.
    """

    name = "task"

    def result(self, outputs: dict[str, np.ndarray]) -> Any:
        raise NotImplementedError

    def compare(self, res: Any, ref: Any) -> dict[str, float]:
        raise NotImplementedError

    def summary(self, sums: dict[str, float], results: list[Any], refs: list[Any]) -> dict[str, Any]:
        raise NotImplementedError

    def headline(self, metrics: dict[str, Any]) -> str:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"task": self.name}


def _one_output(outputs: dict[str, np.ndarray], name: str | None) -> np.ndarray:
    if name is not None:
        if name not in outputs:
            raise AnpredError(f"task output {name!r} not among the model's outputs {sorted(outputs)}")
        return outputs[name]
    if len(outputs) != 1:
        raise AnpredError(
            f"the model has {len(outputs)} outputs ({', '.join(sorted(outputs))}): name the one "
            "the task reads (--task-output)"
        )
    return next(iter(outputs.values()))


class DetectAdapter(TaskAdapter):
    """YOLO-style detection (module docstring). ``layout``: ``yolov8`` ((4 + nc, A) per image) or
    ``yolov5`` ((A, 5 + nc)); ``conf``, ``iou``: decoding; ``match_iou``: 0.5 (the field's mAP@0.5)."""

    name = "detect"

    def __init__(
        self,
        layout: str = "yolov8",
        conf: float = 0.25,
        iou: float = 0.45,
        match_iou: float = 0.5,
        output: str | None = None,
        class_names: tuple[str, ...] | None = None,
    ):
        self.layout, self.conf, self.iou, self.match_iou = layout, conf, iou, match_iou
        self.output, self.class_names = output, class_names

    def describe(self) -> dict[str, Any]:
        return {
            "task": "detect",
            "layout": self.layout,
            "conf": self.conf,
            "nms_iou": self.iou,
            "match_iou": self.match_iou,
        }

    def result(self, outputs):
        from models.detect import decode

        out = np.asarray(_one_output(outputs, self.output), np.float64)
        per = out[0] if out.ndim == 3 else out
        if per.ndim == 2 and self.class_names is not None:
            nc = len(self.class_names)
            want = (4 + nc) if self.layout == "yolov8" else (5 + nc)
            got = per.shape[0] if self.layout == "yolov8" else per.shape[1]
            if got != want:
                raise AnpredError(
                    f"detect: a {self.layout} head of {nc} classes has {want} "
                    f"{'rows' if self.layout == 'yolov8' else 'columns'}, "
                    f"the output has shape {out.shape} "
                    "(another layout? --task-layout)"
                )
        elif per.ndim == 2 and self.layout == "yolov8" and per.shape[0] > per.shape[1]:
            raise AnpredError(
                f"detect: output {out.shape} looks like (anchors, values), not yolov8's "
                "(4 + classes, anchors): --task-layout yolov5?"
            )
        elif per.ndim == 2 and self.layout == "yolov5" and per.shape[1] > per.shape[0]:
            raise AnpredError(
                f"detect: output {out.shape} looks like (values, anchors), not yolov5's "
                "(anchors, 5 + classes): --task-layout yolov8?"
            )
        return decode(out, self.layout, conf=self.conf, iou=self.iou)

    def compare(self, res, ref) -> dict[str, float]:
        from models.detect import match_detections

        m = match_detections(ref, res, iou=self.match_iou, same_class=True)
        shift = np.abs(ref.scores[m.pairs[:, 0]] - res.scores[m.pairs[:, 1]]) if len(m.pairs) else np.zeros(0)
        return {
            "ref": float(len(ref)),
            "dets": float(len(res)),
            "matched": float(len(m.pairs)),
            "iou_sum": float(np.sum(m.ious)),
            "shift_sum": float(np.sum(shift)),
        }

    def summary(self, sums, results, refs) -> dict[str, Any]:
        n_ref, n, k = sums.get("ref", 0.0), sums.get("dets", 0.0), sums.get("matched", 0.0)
        recall = k / n_ref if n_ref else (1.0 if n == 0 else 0.0)
        precision = k / n if n else (1.0 if n_ref == 0 else 0.0)
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {
            "consensus_detections": int(n_ref),
            "detections": int(n),
            "kept": int(k),
            "kept_fraction": recall,
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "mean_iou": sums["iou_sum"] / k if k else None,
            "mean_score_shift": sums["shift_sum"] / k if k else None,
            "map50_vs_consensus": coco_map50(refs, results),
        }

    def headline(self, metrics) -> str:
        return f"{metrics['kept']} of {metrics['consensus_detections']} detections kept"


def coco_map50(truth: list[Any], dets: list[Any]) -> float | None:
    """mAP@0.5 of ``dets`` (one :class:`models.detect.Detections` per image) against ``truth`` (one per
    image: its boxes and classes are the labels), by pycocotools ``COCOeval``: its ``stats[1]`` (AP at
    IoU 0.50, area all, 100 detections), computed as ``summarize`` does (the mean of the precision
    table where it is defined) with only that IoU threshold, area range and detection limit evaluated:
    COCO matches each threshold and area range on its own, so the number is the same, in a quarter of
    the time of the default ten thresholds, four ranges and three limits (docs/task.md).
    None when ``truth`` holds no box (AP undefined)."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images, anns, res = [], [], []
    cats: set[int] = set()
    for i, (t, d) in enumerate(zip(truth, dets)):
        images.append({"id": i + 1, "width": 1, "height": 1})
        for b, c in zip(np.asarray(t.boxes).reshape(-1, 4), np.asarray(t.classes).reshape(-1)):
            w, h = float(b[2] - b[0]), float(b[3] - b[1])
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": i + 1,
                    "category_id": int(c) + 1,
                    "iscrowd": 0,
                    "bbox": [float(b[0]), float(b[1]), w, h],
                    "area": w * h,
                }
            )
            cats.add(int(c) + 1)
        for b, c, s in zip(
            np.asarray(d.boxes).reshape(-1, 4), np.asarray(d.classes).reshape(-1), np.asarray(d.scores).reshape(-1)
        ):
            res.append(
                {
                    "image_id": i + 1,
                    "category_id": int(c) + 1,
                    "score": float(s),
                    "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])],
                }
            )
            cats.add(int(c) + 1)
    if not anns:
        return None
    gt = COCO()
    gt.dataset = {"images": images, "annotations": anns, "categories": [{"id": c} for c in sorted(cats)]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        if not res:
            return 0.0
        dt = gt.loadRes(res)
        ev = COCOeval(gt, dt, "bbox")
        ev.params.iouThrs = np.array([0.5])
        ev.params.areaRng, ev.params.areaRngLbl = [ev.params.areaRng[0]], ["all"]  # [0, 1e5 ** 2]
        ev.params.maxDets = [100]
        ev.evaluate()
        ev.accumulate()
    prec = ev.eval["precision"][0, :, :, 0, 0]  # [recall thresholds, categories] (COCOeval._summarize)
    defined = prec[prec > -1]
    return max(0.0, float(np.mean(defined))) if defined.size else 0.0


def _probabilities(x: np.ndarray) -> np.ndarray:
    """Probabilities of one output row; all NaN when the output holds a non-finite value (it then
    agrees with nothing)."""
    x = np.asarray(x, np.float64).reshape(-1)
    if not np.isfinite(x).all():
        return np.full(x.shape, np.nan)
    if np.all(x >= 0) and abs(float(x.sum()) - 1.0) < 1e-3:
        return x
    e = np.exp(x - x.max())
    return e / e.sum()


class ClassifyAdapter(TaskAdapter):
    """Classification (module docstring); one image per sample (batch 1)."""

    name = "classify"

    def __init__(self, output: str | None = None, topk: int = 5):
        self.output, self.topk = output, topk

    def result(self, outputs):
        return _probabilities(_one_output(outputs, self.output))

    def compare(self, res, ref) -> dict[str, float]:
        if not np.isfinite(res).all() or not np.isfinite(ref).all():  # NaN/Inf output: agrees with nothing
            return {"n": 1.0, "top1": 0.0, "topk": 0.0, "nonfinite": 1.0}
        k = min(self.topk, len(ref))
        top_r, top_b = np.argsort(-ref)[:k], np.argsort(-res)[:k]
        c = int(top_r[0])
        return {
            "n": 1.0,
            "top1": float(int(np.argmax(res)) == c),
            "topk": len(set(top_r) & set(top_b)) / k,
            "shift_sum": abs(float(res[c] - ref[c])),
            "finite": 1.0,
        }

    def summary(self, sums, results, refs) -> dict[str, Any]:
        n, f = sums.get("n", 0.0), sums.get("finite", 0.0)
        return {
            "samples": int(n),
            "top1_agreement": sums.get("top1", 0.0) / n if n else None,
            "top5_overlap": sums.get("topk", 0.0) / n if n else None,
            "mean_prob_shift": sums.get("shift_sum", 0.0) / f if f else None,
            "nonfinite_outputs": int(sums.get("nonfinite", 0.0)),
        }

    def headline(self, metrics) -> str:
        n = metrics["samples"]
        agree = round((metrics["top1_agreement"] or 0) * n)
        return f"top-1 agrees with the consensus on {agree} of {n} inputs"


class DenseAdapter(TaskAdapter):
    """Dense maps (module docstring): ``threshold`` 0.3 (PP-OCR DB)."""

    name = "dense"

    def __init__(self, threshold: float = 0.3, output: str | None = None):
        self.threshold, self.output = threshold, output

    def describe(self) -> dict[str, Any]:
        return {"task": "dense", "threshold": self.threshold}

    def result(self, outputs):
        return np.asarray(_one_output(outputs, self.output)) > self.threshold

    def compare(self, res, ref) -> dict[str, float]:
        return {
            "inter": float(np.logical_and(res, ref).sum()),
            "union": float(np.logical_or(res, ref).sum()),
            "ref_px": float(ref.sum()),
            "px": float(res.sum()),
        }

    def summary(self, sums, results, refs) -> dict[str, Any]:
        u = sums.get("union", 0.0)
        return {
            "iou": sums["inter"] / u if u else 1.0,
            "consensus_pixels": int(sums.get("ref_px", 0)),
            "pixels": int(sums.get("px", 0)),
        }

    def headline(self, metrics) -> str:
        return (
            f"map IoU {metrics['iou']:.4f} with the consensus ({metrics['pixels']} of "
            f"{metrics['consensus_pixels']} pixels above {self.threshold:g})"
        )


def zoo_task(entry) -> TaskAdapter | None:
    """The built-in adapter of a zoo model (its entry's ``task``: a ``models.zoo.ZooModel`` or
    ``ZooEntry``), None when none applies."""
    task = getattr(entry, "task", None) or getattr(getattr(entry, "entry", None), "task", "")
    if task in ("detect", "layout-detect") and getattr(entry, "output_layout", None):
        return DetectAdapter(entry.output_layout, class_names=getattr(entry, "class_names", None))
    if task in ("classify", "text-cls"):
        return ClassifyAdapter()
    if task == "text-det":
        return DenseAdapter()
    return None


def load_adapter(
    spec: str | TaskAdapter | None, *, layout: str | None = None, output: str | None = None
) -> TaskAdapter | None:
    """``detect`` | ``classify`` | ``dense`` | ``module:function`` (a callable returning an adapter) |
    an adapter object | None.

    Raises:
        AnpredError: an unknown task, a module or function that cannot be imported, a callable that
            does not return an adapter (no ``result``/``compare``/``summary``/``headline``).
    """
    if spec is None or isinstance(spec, TaskAdapter):
        return spec
    if not isinstance(spec, str):
        obj = spec
    elif spec == "detect":
        return DetectAdapter(layout or "yolov8", output=output)
    elif spec == "classify":
        return ClassifyAdapter(output=output)
    elif spec == "dense":
        return DenseAdapter(output=output)
    elif ":" in spec:
        import os
        import sys

        mod, _, fn = spec.partition(":")
        if os.getcwd() not in sys.path:  # as model factories: a module of the current folder
            sys.path.insert(0, os.getcwd())
        try:
            obj = getattr(importlib.import_module(mod), fn)()
        except (ImportError, AttributeError) as err:
            raise AnpredError(f"task adapter {spec!r} cannot be loaded: {err}") from err
    else:
        raise AnpredError(f"unknown task {spec!r}; known: {', '.join(TASKS)}, or module:function")
    missing = [m for m in ("result", "compare", "summary", "headline") if not callable(getattr(obj, m, None))]
    if missing:
        raise AnpredError(f"task adapter {spec!r} lacks {', '.join(missing)}")
    if not getattr(obj, "name", None):
        obj.name = "custom"
    if not callable(getattr(obj, "describe", None)):
        obj.describe = _Describe(obj.name, str(spec))
    return obj


class _Describe:
    """A user adapter's ``describe()`` when it has none (picklable: a streamed run's checkpoint holds it)."""

    def __init__(self, name: str, spec: str):
        self.name, self.spec = name, spec

    def __call__(self) -> dict[str, str]:
        return {"task": self.name, "adapter": self.spec}
