"""Input shapes from the user: stated (``--input-shapes``) or read from the given inputs, checked, and
the samples grouped into shape buckets.

- :func:`parse_input_shapes`: ``"ids:1x45,mask:1x45"`` (or a mapping) -> ``{name: (1, 45)}``;
- :func:`scan_inputs`: every sample of the given ``.npz`` / ``.npy`` inputs read once against the
  graph inputs: names, ranks and static dimensions checked (:func:`anpred.inputs.check_sample`), an
  integer input that indexes a table checked against its range (:func:`index_ranges`), and the
  samples grouped by shape set into :class:`Bucket` s (one per distinct set of input shapes, batch
  included);
- :func:`declared_shapes`: the dimensions every bucket shares become static, those that differ stay
  dynamic for the instrumentation (:func:`anpred.pipeline.samples.fix_static_inputs`);
- :func:`bucket_model`: the instrumented model with one bucket's shapes (one converted model per
  shape set: each backend converts, and caches, it by content).

Bad input gets one line (:class:`anpred.errors.InputError`): a name that is not a graph input, a shape
that contradicts a static dimension, an index outside the table it indexes.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anpred.errors import InputError
from anpred.options import parse_input_shapes

__all__ = [
    "parse_input_shapes",
    "check_stated_shapes",
    "Bucket",
    "scan_inputs",
    "declared_shapes",
    "bucket_model",
    "resolve_shapes",
    "index_ranges",
    "shape_text",
]


def shape_text(shape) -> str:
    """``(1, None, 45)`` -> ``1x?x45``."""
    return "x".join("?" if d is None else str(d) for d in shape)


def check_stated_shapes(proto, shapes: dict[str, tuple[int, ...]]) -> None:
    """Raises InputError where ``shapes`` names something that is not a graph input, or contradicts
    an input's rank or a static dimension."""
    from anpred.inputs import model_inputs

    ins = {i.name: i for i in model_inputs(proto)}
    unknown = sorted(set(shapes) - set(ins))
    if unknown:
        raise InputError(
            f"--input-shapes names {', '.join(unknown)}, not graph input(s); graph inputs: {', '.join(ins) or 'none'}"
        )
    for name, shape in shapes.items():
        want = ins[name].shape
        bad = len(shape) != len(want) or any(isinstance(d, int) and d != s for d, s in zip(want, shape))
        if bad:
            raise InputError(
                f"--input-shapes {name}: {shape_text(shape)} does not fit the model's "
                f"{shape_text(d if isinstance(d, int) else None for d in want)}"
            )


@dataclass
class Bucket:
    """Samples that share one set of input shapes: ``shapes`` ({input name: shape}), the samples'
    ``sources``, their ``arrays`` (kept only while several buckets are written apart) and ``ids``."""

    shapes: dict[str, tuple[int, ...]]
    sources: list[str] = field(default_factory=list)
    arrays: list[dict[str, Any]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)  # the samples' ids in the merged run (anpred.pipeline.buckets)

    @property
    def key(self) -> tuple:
        return tuple(sorted(self.shapes.items()))

    def text(self) -> str:
        return ", ".join(f"{n} {shape_text(s)}" for n, s in self.shapes.items())


def index_ranges(proto) -> dict[str, tuple[int, str]]:
    """The graph inputs that index a table: ``{input name: (rows, node)}`` for an integer input read
    (directly or through a Cast) as the indices of a ``Gather`` on axis 0 of an initializer with
    ``rows`` rows (an embedding table): ONNX's Gather takes indices in [-rows, rows - 1]."""
    from onnx import helper

    inits = {t.name: t for t in proto.graph.initializer}
    casts = {n.output[0]: n.input[0] for n in proto.graph.node if n.op_type == "Cast" and n.input}
    out: dict[str, tuple[int, str]] = {}
    names = {i.name for i in proto.graph.input}
    for n in proto.graph.node:
        if n.op_type != "Gather" or len(n.input) < 2 or n.input[0] not in inits:
            continue
        axis = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "axis"), 0)
        if axis != 0 or not inits[n.input[0]].dims:
            continue
        src = casts.get(n.input[1], n.input[1])
        if src in names:
            rows = int(inits[n.input[0]].dims[0])
            out[src] = min(out.get(src, (rows, n.name)), (rows, n.name or n.output[0]))
    return out


def _check_range(arrays: dict[str, Any], ranges: dict[str, tuple[int, str]], source: str) -> None:
    import numpy as np

    for name, (rows, node) in ranges.items():
        a = arrays.get(name)
        if a is None or a.size == 0 or np.asarray(a).dtype.kind not in "iu":
            continue
        lo, hi = int(np.min(a)), int(np.max(a))
        if lo < -rows or hi > rows - 1:
            bad = hi if hi > rows - 1 else lo
            raise InputError(
                f"input {name!r} ({source}): value {bad} is outside [{-rows}, {rows - 1}], the rows of "
                f"the {rows}-row table it indexes (Gather {node!r})"
            )


def scan_inputs(proto, spec: str, skip: tuple[str, ...] = (), keep_arrays: bool = True) -> list[Bucket]:
    """The given inputs ``spec`` (a folder or file of ``.npz`` / ``.npy``) read against the graph
    inputs of ``proto`` (its dynamic dimensions not fixed) but those in ``skip`` (inputs bound to
    constants, dropped from the files beforehand: :func:`anpred.pipeline.samples.drop_bound_inputs`),
    grouped into buckets by shape set, in the order of their first sample; ``keep_arrays``: the
    buckets keep the samples' arrays.

    Raises:
        InputError: names that are not graph inputs, or a missing one; a shape that contradicts a
        rank or a static dimension; an index outside its table (:func:`index_ranges`); an
        unreadable file.
    """
    from anpred.inputs import InputSpec, model_inputs

    ins = [i for i in model_inputs(proto) if i.name not in skip]
    ranges = index_ranges(proto)
    buckets: dict[tuple, Bucket] = {}
    for src, arrays in InputSpec.parse(spec).samples(ins):
        _check_range(arrays, ranges, Path(str(src)).name or str(src))
        shapes = {i.name: tuple(int(d) for d in arrays[i.name].shape) for i in ins}
        b = Bucket(shapes)
        b = buckets.setdefault(b.key, b)
        b.sources.append(str(src))
        if keep_arrays:
            b.arrays.append(arrays)
    if not buckets:
        raise InputError(f"inputs {spec}: no sample")
    return list(buckets.values())


def declared_shapes(buckets: list[Bucket]) -> dict[str, tuple[int | None, ...]]:
    """One shape per input for the instrumentation: a dimension all buckets share is that value,
    one they differ in is None (left dynamic; each bucket fixes it, :func:`bucket_model`)."""
    first = buckets[0].shapes
    out = {}
    for name, shape in first.items():
        out[name] = tuple(d if all(b.shapes[name][i] == d for b in buckets) else None for i, d in enumerate(shape))
    return out


def bucket_model(proto, shapes: dict[str, tuple[int, ...]]):
    """A copy of the instrumented ``proto`` whose graph inputs have ``shapes`` (static), the symbolic
    dimensions of its outputs and value_info cleared and inferred again from them (ONNX shape
    inference; where it cannot, they stay unknown: the aligner resolves them per sample)."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(proto)
    for vi in m.graph.input:
        if vi.name in shapes:
            for d, v in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
                d.Clear()
                d.dim_value = int(v)
    del m.graph.value_info[:]
    for vi in m.graph.output:
        for d in vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else ():
            if not d.HasField("dim_value"):
                d.Clear()
    try:
        return onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001 - inference is a help for converters, not required
        return m


def resolve_shapes(subject, opts, tmp: Path) -> tuple[dict[str, tuple] | None, list[Bucket] | None]:
    """The input shapes of a test (``opts``: :class:`anpred.options.TestOptions`): ``(declared,
    buckets)``. ``declared`` ({input name: shape, None on a dimension left dynamic}) comes from
    ``input_shapes`` and the given ``.npz`` / ``.npy`` inputs (read once, :func:`scan_inputs`; inputs
    bound to constants dropped first into ``tmp/.given``); ``buckets`` is set when the given samples
    have several shape sets (:mod:`anpred.pipeline.buckets`), else None. Image inputs, generated
    inputs, a zoo model's own samples and a streamed dataset leave the shapes to the model's
    defaults (``(None, None)`` unless ``input_shapes`` states them).

    Raises:
        InputError: see :func:`check_stated_shapes` and :func:`scan_inputs`; stated shapes that the
        given samples contradict.
    """
    from anpred.onnx_io import load_model
    from anpred.pipeline.samples import drop_bound_inputs, is_images
    from anpred.pipeline.steps import bindings

    stated = opts.feed.input_shapes
    inputs = opts.feed.inputs
    proto = load_model(subject.onnx_path, load_external=False)
    if stated:
        check_stated_shapes(proto, stated)
    given = inputs is not None and not str(inputs).startswith("random:") and not is_images(inputs)
    if not given or opts.stream is not None:
        return (dict(stated) if stated else None), None
    bound = bindings(subject, opts.build.bind)
    spec = str(inputs)
    if bound:
        stripped = drop_bound_inputs(spec, bound, tmp / ".given")
        spec = str(tmp / ".given") if stripped else spec
    buckets = scan_inputs(proto, spec, skip=tuple(bound))
    for b in buckets:
        for name, shape in (stated or {}).items():
            if name in b.shapes and b.shapes[name] != tuple(shape):
                raise InputError(
                    f"input {name!r}: the given samples have shape {shape_text(b.shapes[name])} "
                    f"({b.sources[0]}), --input-shapes states {shape_text(shape)}"
                )
    if len(buckets) == 1:
        shutil.rmtree(tmp / ".given", ignore_errors=True)
        return dict(buckets[0].shapes), None
    return declared_shapes(buckets), buckets
