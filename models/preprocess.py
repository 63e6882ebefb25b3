"""The zoo's inputs: image preprocessing (image -> network input) and the real images and samples each
entry is fed with.

- :data:`PREPROCESS`: key -> function ``(image, (H, W)) -> float32 (1, 3, H, W)``; an image is a PIL
  image or an ``(H, W, 3)`` uint8 RGB array; :data:`PREPROCESS_NOTES` says what each does.
- :data:`REAL_IMAGES`: key -> function ``(n, seed) -> [uint8 RGB image]`` (ultralytics' photographs,
  rendered pages, rendered text lines).
- :data:`REAL_SAMPLES`: key -> ``"module:function"`` for models not fed with one image (magika's bytes,
  silero-vad's audio), :data:`REAL_SAMPLES_NOTES` says what they are.
"""

from __future__ import annotations

import numpy as np


# preprocessing: image (PIL or HxWx3 uint8 RGB) -> float32 (1, 3, H, W)
def _pre_yolo(image, hw):
    from models.detect import yolo_input

    return yolo_input(image, hw)[0]


def _pre_ppocr_det(image, hw):
    """PaddleOCR / RapidOCR text detection: BGR, direct bilinear resize to (H, W) (PaddleOCR
    ``DetResizeForTest`` with a fixed ``image_shape``), ``(x / 255 - 0.5) / 0.5``."""
    import cv2

    from models.detect import to_rgb_array

    img = to_rgb_array(image)[:, :, ::-1]
    img = cv2.resize(np.ascontiguousarray(img), (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)
    x = (img.astype(np.float32) / np.float32(255.0) - np.float32(0.5)) / np.float32(0.5)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _pre_ppocr_rec(image, hw):
    """RapidOCR ``TextRecognizer.resize_norm_img``: BGR, resize to height H keeping the aspect ratio
    (width ``min(W, ceil(H * w / h))``), ``(x / 255 - 0.5) / 0.5``, zero padding on the right to W."""
    import math

    import cv2

    from models.detect import to_rgb_array

    img = np.ascontiguousarray(to_rgb_array(image)[:, :, ::-1])
    H, W = hw
    h, w = img.shape[:2]
    rw = min(W, int(math.ceil(H * w / h)))
    img = cv2.resize(img, (rw, H)).astype(np.float32)
    x = (img.transpose(2, 0, 1) / np.float32(255.0) - np.float32(0.5)) / np.float32(0.5)
    out = np.zeros((1, 3, H, W), dtype=np.float32)
    out[0, :, :, :rw] = x
    return out


def _pre_mobilenet(image, hw):
    """keras.applications.mobilenet_v2.preprocess_input after a bilinear resize: ``x / 127.5 - 1``."""
    import cv2

    from models.detect import to_rgb_array

    img = cv2.resize(to_rgb_array(image), (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)
    x = img.astype(np.float32) / np.float32(127.5) - np.float32(1.0)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _pre_picodet(image, hw):
    """rapid_layout 1.2.1 ``PPPreProcess`` (PP-PicoDet layout models): the image as rapid_layout loads
    it (BGR), direct bilinear resize to (H, W), ``(x / 255 - mean) / std`` with ImageNet's RGB
    constants applied to the BGR channels as rapid_layout does, NCHW."""
    import cv2

    from models.detect import to_rgb_array

    img = cv2.resize(np.ascontiguousarray(to_rgb_array(image)[:, :, ::-1]), (hw[1], hw[0]))
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    x = (img.astype(np.float32) * (1 / 255.0) - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None].astype(np.float32))


PREPROCESS = {
    "yolo": _pre_yolo,
    "ppocr-det": _pre_ppocr_det,
    "ppocr-rec": _pre_ppocr_rec,
    "mobilenet": _pre_mobilenet,
    "ppocr-cls": _pre_ppocr_rec,
    "picodet": _pre_picodet,
}

PREPROCESS_NOTES = {
    "yolo": "letterbox to HxW (bilinear, pad 114, centred), RGB, /255, NCHW",
    "ppocr-det": "BGR, bilinear resize to HxW, (x/255-0.5)/0.5, NCHW",
    "ppocr-rec": "BGR, resize to height H keeping aspect (width <= W), (x/255-0.5)/0.5, zero pad right, NCHW",
    "mobilenet": "RGB, bilinear resize to HxW, x/127.5-1, NCHW (the Keras model transposes to NHWC inside)",
    "ppocr-cls": "RapidOCR TextClassifier.resize_norm_img: BGR, resize to height H keeping aspect (width <= W), "
    "(x/255-0.5)/0.5, zero pad right, NCHW",
    "picodet": "rapid_layout PPPreProcess: BGR, bilinear resize to HxW, (x/255 - ImageNet mean)/std on BGR, NCHW",
}


# ----------------------------------------------------------------------------------------------
# real inputs: lists of uint8 RGB images


def _images_photos(n: int, seed: int) -> list:
    from models.documents import photos
    from models.yolo import calibration_images

    out = photos()[:n]
    if n > len(out):
        out += calibration_images(seed=1000 + seed, n=n + 2)[2 : n - len(out) + 2]
    return out[:n]


def _images_pages(n: int, seed: int) -> list:
    from models.documents import render_page

    return [render_page(seed + i).array() for i in range(n)]


def _images_pages_and_photos(n: int, seed: int) -> list:
    """Rendered pages, with the two photographs at positions 2 and 4 (0-based) when n allows."""
    from models.documents import photos

    kinds = ["photo" if i in (2, 4) else "page" for i in range(n)]
    pages = iter(_images_pages(kinds.count("page"), seed))
    ph = iter(photos())
    return [next(ph) if k == "photo" else next(pages) for k in kinds]


def _images_text_lines(n: int, seed: int) -> list:
    from models.documents import render_text_line

    return [render_text_line(seed + i)[0] for i in range(n)]


REAL_IMAGES = {
    "photos": _images_photos,
    "pages": _images_pages,
    "pages+photos": _images_pages_and_photos,
    "text-lines": _images_text_lines,
}


# real samples of models not fed with one image: "module:function" (zm, n, seed) -> [(source, {name: array})]

REAL_SAMPLES = {"magika-files": "models.nonimage:magika_samples", "silero-speech": "models.nonimage:silero_samples"}

REAL_SAMPLES_NOTES = {
    "magika-files": "bytes of real files of installed packages (models.nonimage.MAGIKA_FILES), magika's features v2: "
    "first 1024 bytes after lstrip + last 1024 before rstrip of at most 4096 read, padding token 256",
    "silero-speech": "16 kHz synthetic voiced signal (formant synthesis, seeded) and pauses: "
    "voiced and silent 512-sample "
    "chunks alternately, 64 context samples prepended, state of the model after the preceding chunks",
}
