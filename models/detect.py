"""Detector pre- and post-processing in numpy: letterbox, decoding of YOLO outputs, confidence
threshold, class-aware NMS (OpenCV's ``cv2.dnn.NMSBoxesBatched``; no torchvision), and IoU matching
of two detection sets (``scipy.optimize.linear_sum_assignment``).

Boxes are ``float64`` arrays of shape ``(N, 4)`` in ``xyxy`` pixel coordinates (x1, y1, x2, y2) unless
a name says otherwise.

Output layouts understood by :func:`decode`:

- ``"yolov8"`` (anchor-free, ultralytics export): ``(1, 4 + nc, A)``; rows 0..3 are ``cx, cy, w, h``
  in input pixels, rows 4.. are per-class sigmoid scores (no objectness).
- ``"yolov5"`` (anchor-based, original YOLOv5 ``Detect`` in inference mode): ``(1, A, 5 + nc)``;
  ``cx, cy, w, h, obj, cls...``; the score of class ``c`` is ``obj * cls[c]`` (YOLOv5
  ``non_max_suppression``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from anpred.errors import InputError

ULTRALYTICS_PAD = 114  # LetterBox fill value in ultralytics (ultralytics/data/augment.py)


@dataclass(frozen=True)
class LetterboxInfo:
    """How an image was letterboxed: ``resized = original * ratio``, then ``pad = (left, top)`` pixels
    added. :meth:`unmap` maps boxes in network input pixels back to original pixels."""

    ratio: float
    pad: tuple[int, int]
    original_hw: tuple[int, int]

    def unmap(self, boxes: np.ndarray) -> np.ndarray:
        """``(N, 4)`` xyxy boxes in letterboxed pixels -> original image pixels (clipped)."""
        b = np.asarray(boxes, dtype=np.float64).copy().reshape(-1, 4)
        b[:, [0, 2]] = (b[:, [0, 2]] - self.pad[0]) / self.ratio
        b[:, [1, 3]] = (b[:, [1, 3]] - self.pad[1]) / self.ratio
        h, w = self.original_hw
        b[:, [0, 2]] = b[:, [0, 2]].clip(0, w)
        b[:, [1, 3]] = b[:, [1, 3]].clip(0, h)
        return b


def to_rgb_array(image) -> np.ndarray:
    """A PIL image or an ``(H, W, 3)`` / ``(H, W)`` uint8 array -> ``(H, W, 3)`` uint8 RGB array.

    Raises:
        InputError: not an image of that kind, or an empty image (height or width 0).
    """
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover
        Image = None
    if Image is not None and isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"), dtype=np.uint8)
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.dtype != np.uint8:
        raise InputError(f"expected a PIL image or an HxWx3 uint8 array, got {arr.dtype} array of shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputError(f"empty image: shape {arr.shape} (height and width must be at least 1 pixel)")
    return np.ascontiguousarray(arr[:, :, :3])


def letterbox(image, size: tuple[int, int], pad_value: int = ULTRALYTICS_PAD) -> tuple[np.ndarray, LetterboxInfo]:
    """Resize keeping the aspect ratio and pad to ``size`` = (H, W), centred, as ultralytics'
    ``LetterBox(auto=False, scaleup=True, center=True)`` does (bilinear ``cv2.resize``, padding split
    with ``round(d -/+ 0.1)``, fill ``pad_value``).

    Returns:
        ``(H, W, 3)`` uint8 image and its :class:`LetterboxInfo`.
    Raises:
        InputError: not an image (see :func:`to_rgb_array`) or an empty one.
    """
    import cv2

    img = to_rgb_array(image)
    h0, w0 = img.shape[:2]
    H, W = int(size[0]), int(size[1])
    r = min(H / h0, W / w0)
    new_w, new_h = int(round(w0 * r)), int(round(h0 * r))
    if (new_w, new_h) != (w0, h0):
        img = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    dw, dh = (W - new_w) / 2, (H - new_h) / 2
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    img = cv2.copyMakeBorder(img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(pad_value,) * 3)
    return img, LetterboxInfo(ratio=r, pad=(left, top), original_hw=(h0, w0))


def yolo_input(image, size: tuple[int, int]) -> tuple[np.ndarray, LetterboxInfo]:
    """Ultralytics preprocessing: letterbox to ``size`` (pad 114), RGB, scaled to [0, 1], NCHW.

    Returns:
        ``float32 (1, 3, H, W)`` array and the :class:`LetterboxInfo`.
    Raises:
        InputError: not an image (see :func:`to_rgb_array`) or an empty one.
    """
    img, info = letterbox(image, size)
    x = img.transpose(2, 0, 1)[None].astype(np.float32) / np.float32(255.0)
    return np.ascontiguousarray(x), info


@dataclass
class Detections:
    """Final detections of one image: ``boxes (N, 4)`` xyxy float64, ``scores (N,)`` float64,
    ``classes (N,)`` int64, sorted by descending score."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    class_names: tuple[str, ...] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.scores)

    def names(self) -> list[str]:
        if self.class_names is None:
            return [str(int(c)) for c in self.classes]
        return [self.class_names[int(c)] for c in self.classes]

    def of_class(self, name_or_id) -> "Detections":
        """The detections of one class, given by name (needs :attr:`class_names`) or integer id.

        Raises:
            InputError: a class name that is not in :attr:`class_names` (the message lists them), or a
                name when the detections have no class names.
        """
        if isinstance(name_or_id, str):
            if self.class_names is None:
                raise InputError(
                    f"class {name_or_id!r} given by name, but these detections have no class names; "
                    "pass an integer class id"
                )
            if name_or_id not in self.class_names:
                raise InputError(f"unknown class {name_or_id!r}; known: {', '.join(self.class_names)}")
            cid = self.class_names.index(name_or_id)
        else:
            cid = int(name_or_id)
        k = self.classes == cid
        return Detections(self.boxes[k], self.scores[k], self.classes[k], self.class_names)


def xywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    b = np.asarray(b, dtype=np.float64)
    out = np.empty_like(b)
    out[..., 0] = b[..., 0] - b[..., 2] / 2
    out[..., 1] = b[..., 1] - b[..., 3] / 2
    out[..., 2] = b[..., 0] + b[..., 2] / 2
    out[..., 3] = b[..., 1] + b[..., 3] / 2
    return out


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes: ``(N, 4), (M, 4) -> (N, M)`` float64 (0 where a union is empty)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def nms(
    boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float = 0.45, max_det: int = 300
) -> np.ndarray:
    """Class-aware non-maximum suppression with OpenCV (``cv2.dnn.NMSBoxesBatched``).

    Args:
        boxes: ``(N, 4)`` xyxy. scores: ``(N,)``. classes: ``(N,)`` integer class ids.
        iou: suppress a box whose IoU with a higher-scored box of the same class exceeds this.
    Returns:
        int64 indices of the kept boxes, by descending score, at most ``max_det``.
    """
    import cv2

    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if len(boxes) == 0:
        return np.zeros(0, dtype=np.int64)
    xywh = np.column_stack([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]])
    keep = cv2.dnn.NMSBoxesBatched(
        xywh.tolist(),
        np.asarray(scores, dtype=np.float64).tolist(),
        np.asarray(classes, dtype=np.int64).astype(np.int32).tolist(),
        0.0,
        float(iou),
    )
    keep = np.asarray(keep, dtype=np.int64).reshape(-1)
    keep = keep[np.argsort(-np.asarray(scores)[keep], kind="stable")]
    return keep[:max_det]


def decode(
    output: np.ndarray,
    layout: str = "yolov8",
    conf: float = 0.25,
    iou: float = 0.45,
    class_names: tuple[str, ...] | None = None,
    letterbox_info: LetterboxInfo | None = None,
    max_det: int = 300,
) -> Detections:
    """Decode one image's raw detector output into final detections: confidence threshold, then
    class-aware NMS (:func:`nms`), then (optionally) letterbox undo to original image pixels.

    Args:
        output: the raw output of one image, layout as in the module docstring (a leading batch
            dimension of 1 is accepted).
        layout: ``"yolov8"`` or ``"yolov5"``.
        conf: minimum class score (``yolov5``: ``obj * cls``), after YOLO's ``predict`` defaults.
    Raises:
        InputError: unknown layout, an output of the wrong rank, or one without a class score (yolov8:
            fewer than 5 rows; yolov5: fewer than 6 columns).
    """
    out = np.asarray(output, dtype=np.float64)
    if out.ndim == 3:
        if out.shape[0] != 1:
            raise InputError(f"decode takes one image at a time, got batch {out.shape[0]}")
        out = out[0]
    if out.ndim != 2:
        raise InputError(f"detector output must be 2-D per image, got shape {np.shape(output)}")
    if layout == "yolov8":
        if out.shape[0] < 5:
            raise InputError(
                f"yolov8 detector output must have 4 box rows and at least 1 class row "
                f"(shape (4 + nc, A)), got {out.shape[0]} rows: shape {np.shape(output)}"
            )
        boxes, cls_scores = out[:4].T, out[4:].T
    elif layout == "yolov5":
        if out.shape[1] < 6:
            raise InputError(
                f"yolov5 detector output must have 4 box columns, objectness and at least 1 "
                f"class column (shape (A, 5 + nc)), got {out.shape[1]} columns: shape {np.shape(output)}"
            )
        boxes, cls_scores = out[:, :4], out[:, 5:] * out[:, 4:5]
    else:
        raise InputError(f"unknown detector output layout {layout!r}; known: yolov8, yolov5")
    classes = cls_scores.argmax(axis=1)
    scores = cls_scores[np.arange(len(classes)), classes]
    k = scores > conf
    boxes, scores, classes = xywh_to_xyxy(boxes[k]), scores[k], classes[k]
    keep = nms(boxes, scores, classes, iou=iou, max_det=max_det)
    boxes, scores, classes = boxes[keep], scores[keep], classes[keep].astype(np.int64)
    if letterbox_info is not None:
        boxes = letterbox_info.unmap(boxes)
    return Detections(boxes, scores, classes, class_names)


@dataclass
class Match:
    """Result of :func:`match_detections`: ``pairs`` ``(K, 2)`` int64 indices (a, b) with their
    ``ious (K,)``; ``unmatched_a`` / ``unmatched_b`` index arrays."""

    pairs: np.ndarray
    ious: np.ndarray
    unmatched_a: np.ndarray
    unmatched_b: np.ndarray

    @property
    def changed(self) -> int:
        """Number of detections without a counterpart (missing + extra)."""
        return len(self.unmatched_a) + len(self.unmatched_b)


def match_detections(a: Detections, b: Detections, iou: float = 0.5, same_class: bool = True) -> Match:
    """Optimal one-to-one matching of two detection sets maximising total IoU (Hungarian algorithm,
    ``scipy.optimize.linear_sum_assignment``); a pair counts only with IoU >= ``iou`` and (when
    ``same_class``) equal classes."""
    from scipy.optimize import linear_sum_assignment

    m = box_iou(a.boxes, b.boxes)
    if same_class and m.size:
        m = np.where(a.classes[:, None] == b.classes[None, :], m, 0.0)
    if m.size:
        r, c = linear_sum_assignment(-m)
        ok = m[r, c] >= iou
        r, c = r[ok], c[ok]
    else:
        r = c = np.zeros(0, dtype=np.int64)
    pairs = np.column_stack([r, c]).astype(np.int64).reshape(-1, 2)
    return Match(
        pairs=pairs,
        ious=m[r, c] if m.size else np.zeros(0),
        unmatched_a=np.setdiff1d(np.arange(len(a)), r).astype(np.int64),
        unmatched_b=np.setdiff1d(np.arange(len(b)), c).astype(np.int64),
    )
