"""YOLO detectors built offline from ultralytics' module definitions, with seeded (untrained) weights
whose BatchNorm statistics are calibrated on real photographs.

- YOLOv8n/s: ultralytics ``yolov8n.yaml`` / ``yolov8s.yaml`` (anchor-free ``Detect`` head, put in
  export mode so the network returns one tensor ``(1, 4 + nc, A)``, boxes ``cx, cy, w, h`` in input
  pixels, class scores after sigmoid).
- YOLOv5n/s: the backbone and neck of ultralytics ``yolov5{n,s}u.yaml`` (identical to YOLOv5 v6.0+:
  Conv/C3/SPPF, PANet) with the *original anchor-based* YOLOv5 head (:class:`AnchorDetect`, after
  ``models/yolo.py::Detect`` of ultralytics/yolov5 v7.0), output ``(1, 3 * sum(ny * nx), 5 + nc)``.

Weights are not trained. After seeding (``torch.manual_seed``) and ultralytics' own initialisation,
BatchNorm running statistics are calibrated (:func:`calibrate_batchnorm`: forward passes in training
mode, cumulative average, no gradient) on the two photographs shipped in ``ultralytics/assets`` and
augmented copies (flips, crops, colour jitter), so activations have realistic ranges. Then Conv+BN are
fused (as ultralytics' export does). The calibrated state is cached with :mod:`anpred.cache`, so every
process rebuilds bit-identical weights.

Factories (``module:function`` strings recorded in the manifest) return ``(model, (example,))`` where
``model`` is the eval-mode ``torch.nn.Module`` and ``example`` a ``float32 (1, 3, H, W)`` torch tensor
(the letterboxed bus photograph).
"""

from __future__ import annotations

import math

import numpy as np

CALIB_IMGSZ = 320  # calibration size (fixed: the weights do not depend on the requested input size)
CALIB_IMAGES = 8

# Original YOLOv5 anchors (pixels), P3/8, P4/16, P5/32 (ultralytics/yolov5 models/yolov5*.yaml).
V5_ANCHORS = ((10, 13, 16, 30, 33, 23), (30, 61, 62, 45, 59, 119), (116, 90, 156, 198, 373, 326))
V5_STRIDES = (8.0, 16.0, 32.0)


def _torch():
    import torch

    return torch


def _ultralytics_versions() -> dict:
    import torch

    from anpred.compat import import_ultralytics

    return {"torch": torch.__version__, "ultralytics": import_ultralytics().__version__}


def make_anchor_detect_class():
    """Return the :class:`AnchorDetect` ``nn.Module`` class (defined lazily: torch is imported only
    when a model is built)."""
    if "AnchorDetect" in globals():
        return globals()["AnchorDetect"]
    torch = _torch()
    nn = torch.nn

    class AnchorDetect(nn.Module):
        """The original anchor-based YOLOv5 detection head.

        Input: three feature maps ``(B, ch[i], H / s_i, W / s_i)``. Training mode: the raw maps
        ``(B, na, ny, nx, 5 + nc)``. Eval mode: ``(B, na * sum(ny * nx), 5 + nc)`` with
        ``xy = (2 sigmoid(t_xy) - 0.5 + grid) * stride``, ``wh = (2 sigmoid(t_wh))^2 * anchor``
        (pixels), objectness and class scores after sigmoid (YOLOv5 v7.0 ``Detect.forward``).
        """

        def __init__(self, nc: int, ch: tuple[int, ...], anchors=V5_ANCHORS, strides=V5_STRIDES):
            super().__init__()
            self.nc, self.no = nc, nc + 5
            self.nl, self.na = len(anchors), len(anchors[0]) // 2
            self.register_buffer("anchors", torch.tensor(anchors, dtype=torch.float32).view(self.nl, self.na, 2))
            self.register_buffer("stride", torch.tensor(strides, dtype=torch.float32))
            self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)
            with torch.no_grad():  # YOLOv5 Model._initialize_biases (cf = None)
                for mi, s in zip(self.m, strides):
                    b = mi.bias.view(self.na, -1)
                    b[:, 4] += math.log(8 / (640 / s) ** 2)
                    b[:, 5:] += math.log(0.6 / (nc - 0.99))

        def forward(self, x):
            z = []
            for i in range(self.nl):
                xi = self.m[i](x[i])
                bs, _, ny, nx = xi.shape
                xi = xi.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
                if self.training:
                    z.append(xi)
                    continue
                yv, xv = torch.meshgrid(
                    torch.arange(ny, dtype=xi.dtype), torch.arange(nx, dtype=xi.dtype), indexing="ij"
                )
                grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2) - 0.5
                anchor_grid = self.anchors[i].view(1, self.na, 1, 1, 2)
                xy, wh, conf = xi.sigmoid().split((2, 2, self.nc + 1), 4)
                xy = (xy * 2 + grid) * self.stride[i]
                wh = (wh * 2) ** 2 * anchor_grid
                z.append(torch.cat((xy, wh, conf), 4).view(bs, self.na * nx * ny, self.no))
            return z if self.training else torch.cat(z, 1)

    globals()["AnchorDetect"] = AnchorDetect
    return AnchorDetect


def build_architecture(arch: str, nc: int = 80, seed: int = 0):
    """Build the unfused, uncalibrated network ``arch`` in ``{"yolov8n", "yolov8s", "yolov5n",
    "yolov5s"}`` with seeded initial weights (global RNG state restored afterwards).

    Returns:
        an ``ultralytics.nn.tasks.DetectionModel`` in training mode.
    """
    from anpred.compat import import_ultralytics
    from anpred.errors import AnpredError

    import_ultralytics()
    from ultralytics.nn.tasks import DetectionModel

    torch = _torch()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if arch in ("yolov8n", "yolov8s"):
            model = DetectionModel(f"{arch}.yaml", nc=nc, verbose=False)
        elif arch in ("yolov5n", "yolov5s"):
            model = DetectionModel(f"{arch}u.yaml", nc=nc, verbose=False)
            old = model.model[-1]
            ch = tuple(seq[0].conv.in_channels for seq in old.cv2)
            head = make_anchor_detect_class()(nc, ch)
            head.f, head.i, head.type, head.np = old.f, old.i, "AnchorDetect", sum(p.numel() for p in head.parameters())
            model.model[-1] = head
            model.stride = head.stride.clone()
        else:
            raise AnpredError(f"unknown YOLO architecture {arch!r}; known: yolov8n, yolov8s, yolov5n, yolov5s")
    return model


def calibration_images(seed: int = 0, n: int = CALIB_IMAGES) -> list[np.ndarray]:
    """``n`` uint8 RGB images: the two ultralytics photographs and seeded augmentations of them
    (horizontal flip, random crop of 50-90 % per side, colour jitter of brightness/contrast/saturation
    by factors in [0.6, 1.4])."""
    from PIL import Image, ImageEnhance

    from models.documents import photos

    rng = np.random.default_rng(seed)
    base = photos()
    out = []
    for k in range(n):
        img = Image.fromarray(base[k % len(base)])
        if k >= len(base):
            if rng.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            w, h = img.size
            cw, ch = int(w * rng.uniform(0.5, 0.9)), int(h * rng.uniform(0.5, 0.9))
            x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            img = img.crop((x0, y0, x0 + cw, y0 + ch))
            for enh in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
                img = enh(img).enhance(float(rng.uniform(0.6, 1.4)))
        out.append(np.asarray(img.convert("RGB"), dtype=np.uint8))
    return out


def calibrate_batchnorm(model, images: list[np.ndarray], imgsz: int = CALIB_IMGSZ, batch: int = 4) -> int:
    """Re-estimate every BatchNorm's running mean/variance from ``images`` (uint8 RGB), letterboxed to
    ``imgsz``: statistics reset, ``momentum=None`` (cumulative average over batches), forward passes
    in training mode without gradients; the model is left in eval mode with the original momenta.

    Returns:
        the number of BatchNorm layers calibrated.
    """
    from models.detect import yolo_input

    torch = _torch()
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    momenta = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    x = np.concatenate([yolo_input(im, (imgsz, imgsz))[0] for im in images])
    model.train()
    with torch.no_grad():
        for i in range(0, len(x), batch):
            model(torch.from_numpy(x[i : i + batch]))
    for bn, mom in zip(bns, momenta):
        bn.momentum = mom
    model.eval()
    return len(bns)


def _finish(model):
    """Fuse Conv+BN, eval mode, export mode of the ultralytics head (one output tensor)."""
    model.fuse(verbose=False)
    model.eval()
    head = model.model[-1]
    if hasattr(head, "export"):
        head.export = True
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def build_calibrated(arch: str, nc: int = 80, seed: int = 0):
    """Seeded network with calibrated BatchNorm, fused, eval, single-output head.

    The calibrated state dict is cached (``anpred.cache`` kind ``zoo-weights``, key: arch, nc, seed,
    calibration setup, torch and ultralytics versions); later calls and other processes load it, so
    the weights are bit-identical everywhere.
    """
    torch = _torch()
    from anpred.cache import cache_key, cached_dir

    key = cache_key("yolo-calibrated", arch, nc, seed, CALIB_IMGSZ, CALIB_IMAGES, 1, _ultralytics_versions())

    def build(tmp):
        model = build_architecture(arch, nc, seed)
        calibrate_batchnorm(model, calibration_images(seed))
        _finish(model)
        torch.save(model.state_dict(), tmp / "state.pt")

    folder = cached_dir("zoo-weights", key, build)
    model = _finish(build_architecture(arch, nc, seed))
    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model


def example_input(imgsz: int | tuple[int, int] = 640) -> np.ndarray:
    """The letterboxed bus photograph, ``float32 (1, 3, H, W)`` in [0, 1]."""
    from models.detect import yolo_input
    from models.documents import photos

    hw = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    return yolo_input(photos()[0], hw)[0]


def _factory(arch: str, imgsz, seed: int):
    torch = _torch()
    model = build_calibrated(arch, 80, seed)
    return model, (torch.from_numpy(example_input(imgsz)),)


def yolov8n(imgsz: int = 640, seed: int = 0):
    """Factory: seeded, BN-calibrated YOLOv8n (80 classes) and its example input (see module doc)."""
    return _factory("yolov8n", imgsz, seed)


def yolov8s(imgsz: int = 640, seed: int = 0):
    """Factory: seeded, BN-calibrated YOLOv8s (80 classes) and its example input."""
    return _factory("yolov8s", imgsz, seed)


def yolov5n(imgsz: int = 640, seed: int = 0):
    """Factory: seeded, BN-calibrated YOLOv5n with the anchor-based head, and its example input."""
    return _factory("yolov5n", imgsz, seed)


def yolov5s(imgsz: int = 640, seed: int = 0):
    """Factory: seeded, BN-calibrated YOLOv5s with the anchor-based head, and its example input."""
    return _factory("yolov5s", imgsz, seed)


COCO_NAMES = (
    "person",
    "bicycle",
    "car",
    "motorcycle",
    "airplane",
    "bus",
    "train",
    "truck",
    "boat",
    "traffic light",
    "fire hydrant",
    "stop sign",
    "parking meter",
    "bench",
    "bird",
    "cat",
    "dog",
    "horse",
    "sheep",
    "cow",
    "elephant",
    "bear",
    "zebra",
    "giraffe",
    "backpack",
    "umbrella",
    "handbag",
    "tie",
    "suitcase",
    "frisbee",
    "skis",
    "snowboard",
    "sports ball",
    "kite",
    "baseball bat",
    "baseball glove",
    "skateboard",
    "surfboard",
    "tennis racket",
    "bottle",
    "wine glass",
    "cup",
    "fork",
    "knife",
    "spoon",
    "bowl",
    "banana",
    "apple",
    "sandwich",
    "orange",
    "broccoli",
    "carrot",
    "hot dog",
    "pizza",
    "donut",
    "cake",
    "chair",
    "couch",
    "potted plant",
    "bed",
    "dining table",
    "toilet",
    "tv",
    "laptop",
    "mouse",
    "remote",
    "keyboard",
    "cell phone",
    "microwave",
    "oven",
    "toaster",
    "sink",
    "refrigerator",
    "book",
    "clock",
    "vase",
    "scissors",
    "teddy bear",
    "hair drier",
    "toothbrush",
)
