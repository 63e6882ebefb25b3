"""The inputs of a one-shot test: static input dimensions and the samples the backends run on.

- :func:`fix_static_inputs` gives every dynamic input dimension a value (batch 1, the image size on
  spatial axes, :func:`input_hw`) so every converter sees static shapes;
- :func:`prepare_inputs` chooses the samples: a zoo model's own real images (ultralytics'
  photographs, rendered document pages or text lines, or the user's image files) preprocessed by the
  model into ``.npz`` files (:func:`zoo_samples`, their sources named by :func:`zoo_sources`); the
  user's inputs as given; otherwise the ultralytics photographs with seeded random crops for an image
  input (:func:`image_input`: 4-D, 3 channels), seeded uniform random arrays for any other;
- :func:`record_zoo_inputs` names, in the run store, each preprocessed sample's real source.

An image folder may name each image's real source in :data:`SOURCES_FILE` (the demo's temporary images).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from anpred.errors import InputError
from anpred.pipeline.choices import DEFAULT_IMGSZ, DEFAULT_SAMPLES
from anpred.pipeline.progress import log

__all__ = ["SOURCES_FILE", "input_hw", "fix_static_inputs", "image_input", "is_images", "prepare_inputs",
           "zoo_samples", "zoo_sources", "record_zoo_inputs"]

#: In an image folder given as inputs: ``{file name: real source}`` recorded in test.json instead of the path.
SOURCES_FILE = "sources.json"


def input_hw(subject, imgsz: int | tuple[int, int] | None) -> tuple[int, int]:
    """The (H, W) given to dynamic dimensions: the zoo model's size, else ``imgsz``, else
    :data:`DEFAULT_IMGSZ` square."""
    if subject.zoo is not None:
        return tuple(subject.zoo.hw)
    if imgsz is not None:
        return (int(imgsz), int(imgsz)) if isinstance(imgsz, int) else tuple(int(v) for v in imgsz)
    return (DEFAULT_IMGSZ, DEFAULT_IMGSZ)


def fix_static_inputs(proto, hw: tuple[int, int]) -> list[str]:
    """Give every dynamic input dimension a value in place: batch 1, 4-D image inputs ``hw`` on
    their spatial axes (NCHW or NHWC), other dynamic dimensions ``hw[0]``. Returns what was fixed."""
    inits = {t.name for t in proto.graph.initializer}
    fixed = []
    for vi in proto.graph.input:
        if vi.name in inits or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        nhwc = len(dims) == 4 and dims[3].HasField("dim_value") and dims[3].dim_value == 3 and not (
            dims[1].HasField("dim_value") and dims[1].dim_value == 3)
        spatial = {2: hw[0], 3: hw[1]} if not nhwc else {1: hw[0], 2: hw[1]}
        for i, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            v = 1 if i == 0 else (spatial.get(i, hw[0]) if len(dims) == 4 else hw[0])
            d.ClearField("dim_param")
            d.dim_value = v
            fixed.append(f"{vi.name}[{i}]={v}")
    return fixed


def image_input(proto) -> tuple[str, list[int], str] | None:
    """``(name, shape, layout)`` of a single 4-D 3-channel float input, else None."""
    from anpred.inputs import model_inputs

    ins = model_inputs(proto)
    if len(ins) != 1:
        return None
    i = ins[0]
    if len(i.shape) != 4 or i.dtype not in ("float32", "float16", "float64"):
        return None
    if i.shape[1] == 3:
        return i.name, i.shape, "NCHW"
    if i.shape[3] == 3:
        return i.name, i.shape, "NHWC"
    return None


def is_images(inputs) -> bool:
    """Whether ``inputs`` is an image file, or a folder holding images and no ``.npy`` / ``.npz``."""
    from anpred.inputs import IMAGE_EXTS

    p = Path(inputs)
    if p.is_file():
        return p.suffix.lower() in IMAGE_EXTS
    return p.is_dir() and any(f.suffix.lower() in IMAGE_EXTS for f in p.iterdir()) and not any(
        f.suffix.lower() in (".npy", ".npz") for f in p.iterdir())


def prepare_inputs(subject, anchored, inputs: str | None, samples: int | None, seed: int, folder: Path,
                   quiet: bool) -> tuple[str, dict[str, Any]]:
    """Choose the samples of a test (see the module docstring). A zoo model's real images are written
    preprocessed into ``folder``.

    Returns:
        ``(spec, info)``: the inputs spec for :func:`anpred.run.run_model` and what ``test.json``
        records as ``details.inputs`` (``kind``; ``spec``, or ``sources`` and ``preprocessing``).

    Raises:
        InputError: a zoo model without a single image input, an image folder without images, an
        unreadable image.
    """
    n = samples or DEFAULT_SAMPLES
    img = image_input(anchored)
    if subject.zoo is not None and (inputs is None or (not str(inputs).startswith("random:") and is_images(inputs))):
        if img is None:
            raise InputError(f"{subject.label}: zoo model without a single image input")
        sources = zoo_samples(subject.zoo, n, inputs, folder, img[0])
        spec = str(folder)
        info: dict[str, Any] = {"kind": "zoo real images", "preprocessing": subject.zoo.info()["preprocessing"],
                                "sources": sources}
    elif inputs is not None:
        spec = str(inputs)
        info = {"kind": "given", "spec": spec}
    else:
        dist = "images" if img is not None else "uniform"
        spec = f"random:{dist}:seed={seed}:n={n}"
        info = {"kind": "generated", "spec": spec}
    log(f"inputs: {info.get('spec') or ', '.join(info['sources'])}", quiet)
    return spec, info


def zoo_samples(zm, n: int, inputs: str | None, folder: Path, input_name: str) -> list[str]:
    """Write ``n`` preprocessed real inputs of zoo model ``zm`` as ``.npz`` files in ``folder``
    (from ``inputs`` images when given: a folder or an image file). Returns their sources."""
    import numpy as np

    from anpred.inputs import IMAGE_EXTS

    if inputs is not None:
        p = Path(inputs)
        files = sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_EXTS) if p.is_dir() else [p]
        if not files:
            raise InputError(f"inputs {p}: no image ({', '.join(IMAGE_EXTS)}) in the folder")
        named = {}  # a folder may name each image's real source in sources.json (the demo's temporary images)
        if p.is_dir() and (p / SOURCES_FILE).is_file():
            named = json.loads((p / SOURCES_FILE).read_text())
        from PIL import Image

        images, sources = [], []
        for f in files:
            try:
                with Image.open(f) as im:
                    images.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
            except OSError as err:
                raise InputError(f"inputs {f}: not a readable image ({err})") from err
            sources.append(named.get(f.name) or str(f.resolve()))
    else:
        images = zm.real_images(n)
        sources = zoo_sources(zm, len(images))
    folder.mkdir(parents=True, exist_ok=True)
    for i, im in enumerate(images):
        np.savez(folder / f"s{i:04d}.npz", **{input_name: zm.preprocess(im)})
    return sources


def zoo_sources(zm, n: int) -> list[str]:
    """What each of ``zm.real_images(n)`` is (the model's seed chooses the rendered pages and text
    lines; the two photographs are fixed files)."""
    kind, seed = zm.entry.real_images, zm.seed
    if kind == "pages":
        return [f"rendered page seed {seed + i}" for i in range(n)]
    if kind == "text-lines":
        return [f"rendered text line seed {seed + i}" for i in range(n)]
    if kind == "photos":
        return (["ultralytics/assets/bus.jpg", "ultralytics/assets/zidane.jpg"] +
                [f"augmented photo {i} (seed {1000 + seed})" for i in range(2, n)])[:n]
    out, page = [], seed
    photos = iter(["ultralytics/assets/bus.jpg", "ultralytics/assets/zidane.jpg"])
    for i in range(n):
        if i in (2, 4):
            out.append(next(photos))
        else:
            out.append(f"rendered page seed {page}")
            page += 1
    return out


def record_zoo_inputs(store, sources: list[str], run_dir: Path) -> None:
    """The preprocessed zoo inputs live on in the run store only: ``store.meta`` names their folder
    (``run_dir/inputs``, the run's final place) and each sample's real source and stored file
    (not saved here)."""
    store.meta["inputs"] = {**store.meta.get("inputs", {}), "path": str(run_dir / "inputs"),
                            "kind": "zoo real images, preprocessed (stored in the run)", "sources": sources}
    real = {f"s{i:04d}.npz": src for i, src in enumerate(sources)}
    for smp in store.meta.get("samples", []):  # each sample: its real source and where it is stored
        name = Path(str(smp.get("source", ""))).name
        if name in real:
            smp["source"] = real[name]
            smp["stored"] = str(run_dir / "inputs" / store.input_file(smp["id"]).name)
