"""Parts of concatenated outputs: judged on their own, so that a change confined to small-valued
channels is not diluted by large-valued ones.

A detector's output often packs quantities of very different scales into one tensor: YOLOv8's
``output0`` is ``Concat(boxes in pixels (up to the image size), class probabilities (0..1))`` on axis 1,
YOLOv5's is, per pyramid level, ``Concat(xy, wh, objectness + class probabilities)`` on the last axis,
reshaped and concatenated over the levels. A whole-tensor statistic such as nRMSE is dominated by the
large part (``||d|| / ||c||`` with ``||c||`` the boxes' norm), so a fault that changes only the
probabilities (an approximated Sigmoid, a perturbed class-branch weight) stays far below the noise
floor of the whole output although every probability moves (``docs/evaluation.md``: two points of the
reference evaluation were missed this way).

:func:`output_parts` reads, from the ONNX graph, how each *output* anchor was assembled:
``Concat`` nodes (static axis, static sizes along it; other axes may be symbolic), looking through
``Identity``, ``Transpose`` and ``Reshape`` nodes that keep the concatenation axis and everything after
it (``[1, 3, 40, 40, 85] -> [1, 4800, 85]``) or everything up to it (``[1, C, H, W] -> [1, C, H*W]``),
recursively, and returns the finest parts (at most :data:`MAX_PARTS`) as index expressions into the
output's ONNX (canonical) shape, e.g. ``output/output0[:, 4:15]``. The oracle judges each part like an
anchor (same stage, floor and peers as its output; :class:`anpred.judge.consensus.Oracle`) with two guards
(``docs/oracle.md``): a scale guard (``OracleConfig.part_min_scale``: a part is judged on its own only
where its largest consensus magnitude is at least that fraction of its output's, so a random-weight
detector's class probabilities of 1e-5 next to boxes of 500 px are judged only as part of the whole),
and the part range rule (flagged only where its largest deviation also exceeds the floor times its
largest consensus magnitude: ONNX Runtime's Sigmoid tail is off by ~1e-7 in absolute terms, which is
large relative to the RMS of nearly-all-zero probabilities and negligible relative to their range).

Only outputs are split: inner anchors are feature maps of one kind; parts that are graph inputs,
constants, or themselves anchors are left out (already judged, or equal everywhere).

Contract: :func:`output_parts` never raises on odd graphs (what cannot be resolved statically is not
split); an :class:`OutputPart` takes its view of an aligned output with :meth:`OutputPart.take`.
"""

from __future__ import annotations

from dataclasses import dataclass

from passes.graph import build_index

__all__ = ["MAX_PARTS", "OutputPart", "add_part_views", "output_parts"]

#: most parts judged per output; an output assembled from more is split at its top ``Concat`` only
#: (if that is within the cap) or not at all.
MAX_PARTS = 32
#: ops looked through between two ``Concat`` nodes (each must keep the concatenation axis).
_PASS_OPS = frozenset({"Identity", "Transpose", "Reshape"})


@dataclass(frozen=True)
class OutputPart:
    """One part of a concatenated output anchor.

    Attributes:
        name: ``<output anchor>[<index>]``, e.g. ``output/output0[:, 4:15]`` (numpy index notation,
            trailing full axes left out).
        output: the output anchor's name.
        value: the ONNX value the part is a copy of (a ``Concat`` input): its place in the data flow.
        index: ``(start, stop)`` per axis of the output's canonical (ONNX) shape; ``None`` = whole axis.
        shape: the part's shape (``None`` for a symbolic dimension of the output).
    """

    name: str
    output: str
    value: str
    index: tuple[tuple[int, int] | None, ...]
    shape: tuple[int | None, ...]

    def slices(self) -> tuple[slice, ...]:
        """The index as a tuple of ``slice`` objects for a numpy array of the output's shape."""
        return tuple(slice(None) if ix is None else slice(ix[0], ix[1]) for ix in self.index)

    def take(self, array):
        """``array[self.slices()]`` (a view) when ``array`` has the output's rank and the part fits in it,
        else ``None`` (a backend's tensor of another shape: judged as unaligned at the output already)."""
        if getattr(array, "ndim", -1) != len(self.index):
            return None
        for ix, n in zip(self.index, array.shape):
            if ix is not None and ix[1] > n:
                return None
        return array[self.slices()]


def _label(index: tuple[tuple[int, int] | None, ...]) -> str:
    last = max((i for i, ix in enumerate(index) if ix is not None), default=-1)
    return "[" + ", ".join(":" if ix is None else f"{ix[0]}:{ix[1]}" for ix in index[: last + 1]) + "]"


def _dims(shape) -> tuple[int | None, ...]:
    return tuple(d if isinstance(d, int) and d > 0 else None for d in shape)


def _shapes(model) -> dict[str, tuple[int | None, ...] | None]:
    """Value name -> shape by ONNX shape inference: a tuple with ``None`` for each symbolic or unknown
    dimension; ``None`` when even the rank is unknown."""
    from onnx import shape_inference

    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - shape inference is best effort here: no parts without shapes
        inferred = model
    out: dict[str, tuple[int, ...] | None] = {}
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if not t.HasField("shape"):
            out[vi.name] = None
            continue
        out[vi.name] = _dims([d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim])
    for init in g.initializer:
        out[init.name] = tuple(int(d) for d in init.dims)
    return out


def _node_of(idx, v: str):
    """The node producing value ``v`` in the graph of index ``idx`` (None: a graph input or initializer)."""
    pos = idx.producer.get(v)
    return None if pos is None else idx.nodes[pos]


def _concat_axis(node, rank: int) -> int | None:
    """The axis of ``Concat`` ``node`` in a tensor of rank ``rank`` (None: missing or out of range)."""
    ax = next((a.i for a in node.attribute if a.name == "axis"), None)
    if ax is None:
        return None
    ax = ax + rank if ax < 0 else ax
    return ax if 0 <= ax < rank else None


def _split(idx, shapes: dict, value: str, axis_map, depth: int, nested: bool) -> list[tuple[str, tuple]] | None:
    """Parts of ``value`` (an ONNX value) as ``(source value, index into the output)``; ``axis_map``
    maps an axis of ``value`` to an axis of the output (None: not representable). None: ``value``
    is not split (a leaf). ``nested``: split the inputs of the ``Concat`` further. ``idx``: the graph's
    index (``passes.graph.build_index``); ``shapes``: value -> static shape."""
    node = _node_of(idx, value)
    if node is None or depth > 8:
        return None
    shp = shapes.get(value)
    if shp is None:
        return None
    if node.op_type in _PASS_OPS:
        src = node.input[0] if node.input else ""
        s_in = shapes.get(src)
        if s_in is None:
            return None
        if node.op_type == "Identity":
            return _split(idx, shapes, src, axis_map, depth + 1, nested)
        if node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            if perm is None:
                perm = list(range(len(s_in)))[::-1]
            # output axis j reads input axis perm[j]
            inv = {perm[j]: j for j in range(len(perm))}
            return _split(idx, shapes, src, lambda a: axis_map(inv[a]) if a in inv else None, depth + 1, nested)
        # Reshape: the trailing axes from the (later) concatenation axis on must be kept as they are
        return _split(idx, shapes, src, _reshape_map(s_in, shp, axis_map), depth + 1, nested)
    if node.op_type != "Concat":
        return None
    ax = _concat_axis(node, len(shp))
    out_ax = axis_map(ax) if ax is not None else None
    if out_ax is None:
        return None
    sizes = [shapes.get(i) for i in node.input]
    if any(s is None or len(s) != len(shp) or s[ax] is None for s in sizes):
        return None  # the slices need every size along the axis (other axes may be symbolic)
    parts, off = [], 0
    for inp, s in zip(node.input, sizes):
        n = s[ax]
        if n == 0:
            continue
        sub = _split(idx, shapes, inp, axis_map, depth + 1, nested) if nested else None
        here = ((out_ax, off, off + n),)
        if sub is None:
            parts.append((inp, here))
        else:
            parts.extend((v, here + ix) for v, ix in sub)
        off += n
    return parts


def output_parts(
    model,
    outputs: dict[str, str],
    skip_values: set[str] | frozenset = frozenset(),
    max_parts: int = MAX_PARTS,
    index=None,
) -> dict[str, list[OutputPart]]:
    """The parts of each concatenated output (module docstring).

    Args:
        model: ``onnx.ModelProto`` (external weights need not be loaded).
        outputs: output anchor name -> its ONNX value name.
        skip_values: values not to make parts of (e.g. the values of other anchors, judged already).
        max_parts: most parts per output (:data:`MAX_PARTS`).
        index: ``passes.graph.build_index(model.graph)`` when the caller has it already.

    Returns:
        output anchor name -> its parts in concatenation order (outputs that are not assembled by a
        ``Concat`` with static sizes along its axis have no entry). Never raises on odd graphs: what
        cannot be resolved statically is simply not split.
    """
    g = model.graph
    try:
        idx = index if index is not None else build_index(g)
    except Exception:  # noqa: BLE001 - a graph that cannot be indexed has no parts (check reports it elsewhere)
        return {}

    if not any(
        (n := _node_of(idx, v)) is not None and (n.op_type == "Concat" or n.op_type in _PASS_OPS)
        for v in outputs.values()
    ):
        return {}  # no output assembled by a Concat: skip shape inference (seconds on large graphs)
    shapes = _shapes(model)

    result: dict[str, list[OutputPart]] = {}
    for anchor, value in outputs.items():
        oshape = shapes.get(value)
        if oshape is None:
            continue
        leaves = _split(idx, shapes, value, lambda a: a, 0, True)
        if leaves and len(leaves) > max_parts:  # too fine: the top Concat's inputs only
            leaves = _split(idx, shapes, value, lambda a: a, 0, False)
        if not leaves or len(leaves) < 2 or len(leaves) > max_parts:
            continue
        made = []
        for src, ranges in leaves:
            if src in skip_values or not idx.is_data(src) or src in idx.graph_inputs:
                continue
            index: list[tuple[int, int] | None] = [None] * len(oshape)
            ok = True
            for ax, lo, hi in ranges:
                if index[ax] is not None:  # nested split on an axis already restricted: offset inside it
                    plo, phi = index[ax]
                    lo, hi = plo + lo, plo + hi
                    if hi > phi:
                        ok = False
                        break
                index[ax] = (lo, hi)
            if not ok:
                continue
            shape = tuple(n if ix is None else ix[1] - ix[0] for n, ix in zip(oshape, index))  # None: symbolic
            tix = tuple(index)
            made.append(OutputPart(name=f"{anchor}{_label(tix)}", output=anchor, value=src, index=tix, shape=shape))
        if made:
            result[anchor] = made
    return result


def _reshape_map(s_in: tuple[int, ...], s_out: tuple[int, ...], axis_map):
    """Axis map through a ``Reshape`` ``s_in -> s_out``: input axis ``a`` maps to output axis ``a`` when
    the dimensions up to and including ``a`` are identical, or to ``a + len(s_out) - len(s_in)`` when
    the trailing dimensions from ``a`` on are (either way a slice along ``a``, full on every other axis,
    stays such a slice: C order); other axes are not representable."""
    shift = len(s_out) - len(s_in)

    def m(a):
        if a is None:
            return None
        if None not in s_in[: a + 1] and tuple(s_in[: a + 1]) == tuple(s_out[: a + 1]):
            return axis_map(a)  # the axes up to ``a`` kept, later ones merged or split ([1,C,H,W] -> [1,C,HW])
        if a + shift < 0 or tuple(s_in[a:]) != tuple(s_out[a + shift :]) or None in s_in[a:]:
            return None
        return axis_map(a + shift)

    return m


def add_part_views(tensors: dict[str, dict], unaligned: dict[tuple[str, str], str], parts: list[OutputPart]) -> None:
    """Add each part of ``parts`` to one aligned sample, in place: ``tensors[part] = {backend: view}``
    (:meth:`OutputPart.take` of the aligned output), and an unaligned output leaves its parts unaligned
    too (``unaligned[(part, backend)]`` = the output's reason)."""
    for p in parts:  # views into the aligned output; an unaligned output leaves its parts unjudged too
        per = tensors.get(p.output) or {}
        got = {b: v for b, v in ((b, p.take(t)) for b, t in per.items()) if v is not None}
        tensors[p.name] = got
        for (a, b), why in list(unaligned.items()):
            if a == p.output:
                unaligned[(p.name, b)] = why
