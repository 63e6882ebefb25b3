"""Keras-defined zoo models (origin ``tf``): seeded, ``weights=None``, nothing downloaded.

The model takes NCHW ``float32 (1, 3, H, W)`` like every zoo model: a ``Permute`` layer (named
``to_nhwc``) turns it into NHWC for the Keras layers, so the native model and its ONNX export
(tf2onnx) take the same array.
"""

from __future__ import annotations

import os

import numpy as np


def mobilenetv2(imgsz: int = 96, seed: int = 0):
    """Factory: ``keras.applications.MobileNetV2(alpha=0.35, weights=None, classes=10)`` on an NCHW
    input ``(1, 3, H, W)`` (batch fixed to 1) with ``keras.utils.set_random_seed(seed)`` (Keras'
    default initialisers; BatchNorm mean 0 / variance 1), and the example input
    ``(float32 (1, 3, H, W),)``: the bus photograph resized and scaled to [-1, 1].

    Note: ``set_random_seed`` also seeds Python's, NumPy's and TensorFlow's global generators.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from models.documents import photos
    from models.preprocess import PREPROCESS

    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    keras.utils.set_random_seed(seed)
    inp = keras.Input(shape=(3, h, w), batch_size=1, name="images")
    x = keras.layers.Permute((2, 3, 1), name="to_nhwc")(inp)
    body = keras.applications.MobileNetV2(input_tensor=x, alpha=0.35, weights=None, classes=10)
    model = keras.Model(inp, body.output, name=body.name)  # a single-tensor input (not a list of one)
    calibrate_batchnorm(model, (h, w), seed)
    x = PREPROCESS["mobilenet"](photos()[0], (h, w))
    return model, (np.ascontiguousarray(x),)


def calibrate_batchnorm(model, hw: tuple[int, int], seed: int = 0) -> int:
    """Set every BatchNorm's moving mean/variance to the batch statistics of the 8 calibration images
    (:func:`models.yolo.calibration_images`: 2 photographs + 6 augmentations), as one training-mode
    call with ``momentum = 0`` (then restored): with random weights and the initial statistics the
    activations vanish with depth and every output is the same. Returns the number of layers."""
    import keras

    from models.yolo import calibration_images
    from models.preprocess import PREPROCESS

    batch = np.concatenate([PREPROCESS["mobilenet"](im, hw) for im in calibration_images(seed)])
    bns = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [bn.momentum for bn in bns]
    for bn in bns:
        bn.momentum = 0.0
    inp = keras.Input(shape=batch.shape[1:], batch_size=len(batch))
    keras.Model(inp, model(inp, training=True))(batch, training=True)  # batch of 8 (the model's own batch is 1)
    for bn, m in zip(bns, momenta):
        bn.momentum = m
    return len(bns)
