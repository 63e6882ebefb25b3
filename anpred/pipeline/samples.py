"""The inputs of a one-shot test: static input dimensions and the samples the backends run on.

- :func:`fix_static_inputs` gives every dynamic input dimension a value (batch 1, the image size on
  spatial axes, :func:`input_hw`; a zoo model's declared input shapes, :func:`zoo_input_shapes`) so
  every converter sees static shapes;
- :func:`prepare_inputs` chooses the samples: a zoo model's own real samples written as ``.npz``
  files of named arrays (:func:`zoo_samples`): real images (ultralytics' photographs, rendered
  document pages or text lines, or the user's image files) preprocessed by the model, or for a model
  not fed with one image (byte values, audio chunks with a recurrent state and a sample rate) the
  arrays of its generator (:meth:`models.zoo.ZooModel.real_samples`), each with its real source; the
  user's inputs as given; otherwise the ultralytics photographs with seeded random crops for an image
  input (:func:`image_input`: 4-D, 3 channels; where the ultralytics wheel is installed), seeded
  uniform random arrays for any other;
- inputs bound to constants (:mod:`passes.bind_inputs`) are not fed: left out of a zoo model's
  samples, and dropped from given ``.npz`` files, which must hold the bound value
  (:func:`drop_bound_inputs`);
- :func:`record_zoo_inputs` names, in the run store, each preprocessed sample's real source.

An image folder may name each image's real source in :data:`SOURCES_FILE` (the demo's temporary images).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from anpred.errors import InputError
from anpred.pipeline.choices import DEFAULT_IMGSZ, DEFAULT_SAMPLES
from anpred.pipeline.progress import log

__all__ = [
    "SOURCES_FILE",
    "input_hw",
    "zoo_input_shapes",
    "fix_static_inputs",
    "image_input",
    "is_images",
    "prepare_inputs",
    "zoo_samples",
    "zoo_sources",
    "record_zoo_inputs",
    "drop_bound_inputs",
]

#: In an image folder given as inputs: ``{file name: real source}`` recorded in test.json instead of the path.
SOURCES_FILE = "sources.json"


def input_hw(subject, imgsz: int | tuple[int, int] | None) -> tuple[int, int]:
    """The (H, W) given to dynamic dimensions: the zoo model's size, else ``imgsz``, else
    :data:`DEFAULT_IMGSZ` square."""
    if subject.zoo is not None and subject.zoo.hw is not None:
        return tuple(subject.zoo.hw)
    if imgsz is not None:
        return (int(imgsz), int(imgsz)) if isinstance(imgsz, int) else tuple(int(v) for v in imgsz)
    return (DEFAULT_IMGSZ, DEFAULT_IMGSZ)


def zoo_input_shapes(subject) -> dict[str, tuple[int | None, ...]] | None:
    """The declared input shapes ``{name: shape}`` of a zoo model with explicit inputs (magika,
    silero-vad), None on the axes the entry leaves dynamic (``ZooInput.dynamic_axes``); else None."""
    zm = subject.zoo
    if zm is None or not zm.entry.inputs:
        return None
    return {i.name: tuple(None if a in i.dynamic_axes else d for a, d in enumerate(i.shape)) for i in zm.entry.inputs}


def fix_static_inputs(proto, hw: tuple[int, int], shapes: dict[str, tuple[int | None, ...]] | None = None) -> list[str]:
    """Give every dynamic input dimension a value in place: an input named in ``shapes`` takes that
    shape's dimensions (same rank required; static dimensions are kept, None leaves the dimension
    dynamic); otherwise batch 1, 4-D image inputs ``hw`` on their spatial axes (NCHW or NHWC), other
    dynamic dimensions ``hw[0]``. A negative ``dim_value`` (Paddle2ONNX writes -1 for a dynamic
    dimension; ONNX requires dim_value >= 0) counts as dynamic; in the graph's outputs and value_info
    it is made an unknown dimension, which the instrumentation and the aligner resolve like any
    dynamic one. Returns what was changed (``"name[axis]=value"``, ``"name[axis]=?"``).

    Raises:
        InputError: an input in ``shapes`` whose rank differs from the graph's.
    """
    inits = {t.name for t in proto.graph.initializer}
    fixed = []
    for vi in proto.graph.input:
        if vi.name in inits or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        nhwc = (
            len(dims) == 4
            and dims[3].HasField("dim_value")
            and dims[3].dim_value == 3
            and not (dims[1].HasField("dim_value") and dims[1].dim_value == 3)
        )
        spatial = {2: hw[0], 3: hw[1]} if not nhwc else {1: hw[0], 2: hw[1]}
        given = (shapes or {}).get(vi.name)
        if given is not None and len(given) != len(dims):
            raise InputError(
                f"input {vi.name!r}: declared shape {tuple(given)} has rank {len(given)}, the graph's "
                f"has rank {len(dims)}"
            )
        for i, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            if given is not None:
                if given[i] is None:
                    if d.HasField("dim_value"):  # a negative dim_value left dynamic
                        d.Clear()
                        fixed.append(f"{vi.name}[{i}]=?")
                    continue
                v = int(given[i])
            else:
                v = 1 if i == 0 else (spatial.get(i, hw[0]) if len(dims) == 4 else hw[0])
            d.ClearField("dim_param")
            d.dim_value = v
            fixed.append(f"{vi.name}[{i}]={v}")
    for vi in list(proto.graph.output) + list(proto.graph.value_info):
        for i, d in enumerate(vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else ()):
            if d.HasField("dim_value") and d.dim_value < 0:
                d.Clear()
                fixed.append(f"{vi.name}[{i}]=?")
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
    from anpred.inputs import ARRAY_EXTS, IMAGE_EXTS, input_files

    p = Path(inputs)
    if p.is_file():
        return p.suffix.lower() in IMAGE_EXTS
    files = input_files(p, IMAGE_EXTS + ARRAY_EXTS) if p.is_dir() else []
    return any(f.suffix.lower() in IMAGE_EXTS for f in files) and not any(f.suffix.lower() in ARRAY_EXTS for f in files)


def prepare_inputs(
    subject,
    anchored,
    inputs: str | None,
    samples: int | None,
    seed: int,
    folder: Path,
    quiet: bool,
    bound: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Choose the samples of a test (see the module docstring). A zoo model's real images are written
    preprocessed into ``folder``; ``bound`` ({input name: value}, the inputs bound to constants)
    are left out of a zoo model's samples and dropped from given ``.npz`` files
    (:func:`drop_bound_inputs`, written into ``folder``).

    Returns:
        ``(spec, info)``: the inputs spec for :func:`anpred.run.run_model` and what ``test.json``
        records as ``details.inputs`` (``kind``; ``spec``, or ``sources`` and ``preprocessing``).

    Raises:
        InputError: an image zoo model without a single image input, images given to a zoo model not
        fed with images, an image folder without images, an unreadable image, a given ``.npz`` that
        feeds a bound input another value.
    """
    n = samples or DEFAULT_SAMPLES
    bound = dict(bound or {})
    img = image_input(anchored)
    zm = subject.zoo
    if zm is not None and (inputs is None or (not str(inputs).startswith("random:") and is_images(inputs))):
        if img is None and not zm.entry.inputs:
            raise InputError(f"{subject.label}: zoo model without a single image input")
        sources = zoo_samples(
            zm, n, inputs, folder, img[0] if img is not None and not zm.entry.inputs else None, drop=tuple(bound)
        )
        spec = str(folder)
        info: dict[str, Any] = {
            "kind": "zoo real samples" if zm.entry.inputs else "zoo real images",
            "preprocessing": zm.info()["preprocessing"],
            "sources": sources,
        }
    elif inputs is not None:
        spec = str(inputs)
        info = {"kind": "given", "spec": spec}
        stripped = drop_bound_inputs(spec, bound, folder) if bound and not spec.startswith("random:") else None
        if stripped:
            spec, info["sources"] = str(folder), stripped
            info["bound_dropped"] = sorted(bound)
    else:
        # ultralytics' two photographs where its wheel is installed (the 'zoo' extra), else seeded arrays
        photos = img is not None and importlib.util.find_spec("ultralytics") is not None
        dist = "images" if photos else "uniform"
        spec = f"random:{dist}:seed={seed}:n={n}"
        info = {"kind": "generated", "spec": spec}
        if img is not None and not photos:
            info["note"] = "an image input, but no photographs to crop (ultralytics, the 'zoo' extra, is not installed)"
            log(f"inputs: {info['note']}: seeded uniform arrays", quiet)
    if bound:
        info["bound"] = bound
    log(f"inputs: {info.get('spec') or ', '.join(info['sources'])}", quiet)
    return spec, info


def zoo_samples(
    zm, n: int, inputs: str | None, folder: Path, input_name: str | None = None, drop: tuple[str, ...] = ()
) -> list[str]:
    """Write ``n`` real samples of zoo model ``zm`` as ``folder/sNNNN.npz`` files, each holding one
    array per graph input (:meth:`models.zoo.ZooModel.real_samples`: preprocessed real images under
    ``input_name``, or a non-image model's named arrays of several dtypes) but those named in
    ``drop`` (inputs bound to constants); from ``inputs`` images when given (a folder or an image
    file; image models only). Returns the samples' sources.

    Raises:
        InputError: images given to a model not fed with images, no image in the folder, an
        unreadable image.
    """
    import numpy as np

    from anpred.inputs import IMAGE_EXTS, input_files

    if inputs is not None and zm.entry.inputs:
        raise InputError(
            f"{zm.name} is not fed with images ({zm.inputs_text()}): give .npz files with these "
            "arrays as inputs, or no inputs for its real samples"
        )
    if inputs is not None:
        p = Path(inputs)
        files = input_files(p, IMAGE_EXTS) if p.is_dir() else [p]
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
        name = input_name or zm.input_names()[0]
        pairs = [(src, {name: zm.preprocess(im)}) for src, im in zip(sources, images)]
    else:
        pairs = zm.real_samples(n, input_name=input_name)
    folder.mkdir(parents=True, exist_ok=True)
    for i, (_, arrays) in enumerate(pairs):
        np.savez(folder / f"s{i:04d}.npz", **{k: a for k, a in arrays.items() if k not in drop})
    return [src for src, _ in pairs]


def drop_bound_inputs(inputs: str, bound: dict[str, Any], folder: Path) -> dict[str, str] | None:
    """Given inputs (an ``.npz`` file or a folder of ``.npz`` / ``.npy``) that hold arrays of bound
    inputs: copies without them in ``folder`` (same file names; ``.npy`` files copied as they are).
    An array of a bound input must equal the bound value (a stacked array: every sample).

    Returns:
        ``{file name in folder: original path}``, or None when no file holds a bound input (the
        inputs are used as given).

    Raises:
        InputError: a file feeds a bound input another value (naming the file, the input, both values).
    """
    import shutil

    import numpy as np

    p = Path(inputs)
    from anpred.inputs import input_files

    files = input_files(p, (".npz", ".npy")) if p.is_dir() else [p]
    want = {k: np.asarray(v) for k, v in bound.items()}
    contents, hit = {}, False
    for f in files:
        if f.suffix.lower() != ".npz":
            continue
        with np.load(f, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        for k in set(data) & set(want):
            a, b = data[k], want[k]
            same = a.shape[a.ndim - b.ndim :] == b.shape and np.array_equal(a, np.broadcast_to(b, a.shape))
            if not same:
                shown = a.tolist() if a.size <= 8 else f"an array of shape {a.shape}"
                raise InputError(
                    f"inputs {f}: input {k!r} is bound to {b.tolist()} but the file feeds {shown}; "
                    f"drop it from the file or bind it to that value"
                )
            hit = True
        contents[f] = data
    if not hit:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for f in files:
        if f in contents:
            np.savez(folder / f.name, **{k: a for k, a in contents[f].items() if k not in want})
        else:
            shutil.copy2(f, folder / f.name)
        out[f.name] = str(f.resolve())
    return out


def zoo_sources(zm, n: int) -> list[str]:
    """What each of ``zm.real_images(n)`` is (:meth:`models.zoo.ZooModel.image_sources`: the model's
    seed chooses the rendered pages and text lines; the two photographs are fixed files)."""
    return zm.image_sources(n)


def record_zoo_inputs(store, sources: list[str] | dict[str, str], run_dir: Path) -> None:
    """The preprocessed zoo inputs (or given inputs with their bound arrays dropped) live on in the
    run store only: ``store.meta`` names their folder (``run_dir/inputs``, the run's final place) and
    each sample's real source and stored file (not saved here). ``sources``: one per ``sNNNN.npz``
    file in order, or ``{file name: source}``."""
    given = isinstance(sources, dict)
    store.meta["inputs"] = {
        **store.meta.get("inputs", {}),
        "path": str(run_dir / "inputs"),
        "kind": ("given inputs, bound inputs dropped" if given else "zoo real samples, preprocessed")
        + " (stored in the run)",
        "sources": list(sources.values()) if given else sources,
    }
    real = dict(sources) if given else {f"s{i:04d}.npz": src for i, src in enumerate(sources)}
    for smp in store.meta.get("samples", []):  # each sample: its real source and where it is stored
        name = Path(str(smp.get("source", ""))).name
        if name in real:
            smp["source"] = real[name]
            smp["stored"] = str(run_dir / "inputs" / store.input_file(smp["id"]).name)
