"""onnx2torch converters ANPRED adds through onnx2torch's own registry
(``onnx2torch.node_converters.registry``): operators onnx2torch 1.5.15 lacks or converts only in part.

:func:`register` (called by :func:`import_onnx2torch`, once per process) adds:

- ``LSTM``, ``GRU``, ``RNN`` (versions 7, 14, 22): :class:`OnnxRecurrent`. The ONNX gate order is
  mapped onto ``torch.nn.LSTM``/``GRU``/``RNN`` (LSTM ``iofc`` -> torch ``ifgo``, GRU ``zrh`` -> torch
  ``rzn``) whenever the node uses what torch's layers compute: default activations (RNN: Tanh or Relu),
  no ``clip``, no peepholes, no ``input_forget`` and, for GRU, ``linear_before_reset=1``; a reverse
  direction runs the time-flipped sequence; ``bidirectional`` uses torch's bidirectional layer.
  Otherwise the ONNX equations run step by step in torch ops (:func:`passes.recurrent` states them,
  with ONNX Runtime's order: peephole before clip, clip on each gate's pre-activation + bias, not on
  ``C_t``).
  ``layout`` 0 and 1; a missing initial state is zero; ``sequence_lens`` only when absent or a
  constant equal to the sequence length (else ``NotImplementedError`` naming the node).
  ``W``/``R``/``B``/``P`` must be initializers or ``Constant`` outputs (read once at conversion).
- ``GlobalMaxPool`` (1, 22), ``GlobalLpPool`` (2, 22), ``LpPool`` (11, 18, 22): :class:`OnnxGlobalPool`,
  :class:`OnnxWindowPool`.
- ``AveragePool`` (7, 10, 11; 19 through :func:`anpred.backends.onnx2torch_compat.onnx2torch_compat`)
  and ``MaxPool`` (8, 10, 11, 12): onnx2torch's converters are kept for what they handle (symmetric
  pads, no ``auto_pad=SAME_*``; for AveragePool also no ``ceil_mode``); ``auto_pad=SAME_UPPER``/
  ``SAME_LOWER``, asymmetric pads and (AveragePool) ``ceil_mode=1`` go to :class:`OnnxWindowPool`,
  which pads explicitly and divides window sums by the count of the cells each window covers, as the
  ONNX spec defines (``count_include_pad`` both ways).
- ``Pad`` (11, 13) in ``reflect``/``edge`` mode: onnx2torch's converter is kept for ``constant``
  mode; the others go to :class:`OnnxModePad`, since ``torch.nn.functional.pad`` pads in these modes
  only the last 1-3 axes of a 2-5-D tensor shaped ``(N, C, ...)`` (a 2-D ``(1, 576)`` audio chunk
  reflect-padded on its last axis failed: "reflect padding is implemented for ... the last dimension
  of 3D input tensor"): the padded trailing axes are kept, every leading axis is folded into one
  channel axis behind a unit batch (``reshape(1, prod(leading), *trailing)``), padded, and reshaped
  back. More than 3 padded trailing axes raise ``NotImplementedError`` naming the node.

Output sizes (ONNX AveragePool-19 / MaxPool-12 schema, ONNX Runtime ``pool_attributes.h``):
``out = floor((in + pad_begin + pad_end - ((k - 1) * d + 1)) / s) + 1``, with ``ceil`` instead of
``floor`` for ``ceil_mode=1`` and one window less when the last one would start beyond
``in + pad_begin``; ``SAME_*``: ``out = ceil(in / s)``, total pad ``max((out - 1) * s + (k - 1) * d + 1
- in, 0)``, the odd cell at the end (``SAME_UPPER``) or at the beginning (``SAME_LOWER``).
"""

from __future__ import annotations

from anpred.backends.onnx2torch_nodes import const_input, module_bases, node_attributes
from anpred.backends.torch_recurrent import recurrent_class, recurrent_converter

__all__ = [
    "register",
    "import_onnx2torch",
    "OnnxRecurrent",
    "OnnxGlobalPool",
    "OnnxWindowPool",
    "OnnxModePad",
    "pool_geometry",
    "const_input",
    "explicit_same_pads",
    "REGISTERED",
]

#: (op_type, version) pairs :func:`register` put into onnx2torch's registry (new or wrapped)
REGISTERED: list[tuple[str, int]] = []


# ---- pooling ---------------------------------------------------------------------------------------
def pool_geometry(in_size: int, k: int, s: int, d: int, pb: int, pe: int, auto_pad: str, ceil_mode: int):
    """``(out, pad_begin, pad_end, extra)`` for one spatial axis: the output size, the pads the ONNX
    node implies, and ``extra`` cells past ``pad_end`` that the last (ceil-mode) window reaches (never
    counted). Formulas: module docstring."""
    dk = (k - 1) * d + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = -(-in_size // s)
        total = max((out - 1) * s + dk - in_size, 0)
        small, big = total // 2, total - total // 2
        pb, pe = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pb = pe = 0
        out = (in_size - dk) // s + 1
    else:
        span = in_size + pb + pe - dk
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= in_size + pb:
            out -= 1
    extra = max((out - 1) * s + dk - (in_size + pb + pe), 0)
    return out, pb, pe, extra


def explicit_same_pads(model) -> list[str]:
    """In place: every ``Conv`` with ``auto_pad`` ``SAME_UPPER``/``SAME_LOWER`` whose input's spatial
    dims are known (ONNX shape inference on the model) gets the explicit ``pads`` the ONNX spec implies
    (:func:`pool_geometry`: ``out = ceil(in / s)``, the odd cell at the end for SAME_UPPER, at the
    beginning for SAME_LOWER) and ``auto_pad`` NOTSET: onnx2torch's Conv refuses ``SAME_*`` ("auto_pad
    is not implemented"; PP-OCR-style models exported from Paddle). Returns the node names changed; a
    Conv whose input shape is unknown is left as it is (the conversion then says why)."""
    import onnx
    from onnx import helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - no shapes, nothing to make explicit
        return []
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input):
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    changed = []
    for n in model.graph.node:
        if n.op_type != "Conv":
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        pad = a.get("auto_pad", b"NOTSET")
        pad = pad.decode() if isinstance(pad, bytes) else pad
        shape = shapes.get(n.input[0])
        if pad not in ("SAME_UPPER", "SAME_LOWER") or not shape or any(v is None for v in shape[2:]):
            continue
        r = len(shape) - 2
        ks = list(a.get("kernel_shape") or [])
        if not ks:  # taken from the weight's shape [M, C/group, k1, k2, ...]
            ks = (weights.get(n.input[1]) or shapes.get(n.input[1]) or [None, None])[2:]
        if len(ks) != r or any(k is None for k in ks):
            continue
        st, dl = list(a.get("strides") or [1] * r), list(a.get("dilations") or [1] * r)
        geo = [pool_geometry(shape[2 + i], ks[i], st[i], dl[i], 0, 0, pad, 0) for i in range(r)]
        keep = [x for x in n.attribute if x.name not in ("auto_pad", "pads")]
        del n.attribute[:]
        n.attribute.extend(keep + [helper.make_attribute("pads", [g[1] for g in geo] + [g[2] for g in geo])])
        changed.append(n.name or n.output[0])
    return changed


def _global_pool_class():
    Module, Marker = module_bases()

    class OnnxGlobalPool(Module, Marker):
        """GlobalMaxPool (``amax`` over the spatial axes) or GlobalLpPool (``(sum |x|^p)^(1/p)``),
        keeping the axes as size 1 (N, C, 1, ...)."""

        def __init__(self, kind: str, p: float = 2.0):
            super().__init__()
            self.kind, self.p = kind, float(p)

        def forward(self, x):
            import torch

            dims = tuple(range(2, x.dim()))
            if self.kind == "max":
                return torch.amax(x, dim=dims, keepdim=True)
            return torch.pow(torch.sum(torch.pow(torch.abs(x), self.p), dim=dims, keepdim=True), 1.0 / self.p)

    return OnnxGlobalPool


def _window_pool_class():
    Module, Marker = module_bases()

    class OnnxWindowPool(Module, Marker):
        """Max / average / Lp pooling over 1-3 spatial axes with ONNX's padding rules (explicit,
        asymmetric or ``SAME_*`` pads, ``ceil_mode``, ``count_include_pad``), computed from the input's
        runtime shape: the input is padded (max: -inf, others: 0), window sums come from
        ``avg_pool`` with ``divisor_override=1`` and are divided by the number of counted cells per
        window (from the same pooling of a 0/1 mask)."""

        def __init__(
            self,
            kind: str,
            kernel,
            strides,
            dilations,
            pads,
            auto_pad: str,
            ceil_mode: int,
            count_include_pad: int,
            p: float = 2.0,
        ):
            """``kind``: max | avg | lp; the others mirror the ONNX pooling schema's attributes
            (kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, count_include_pad; LpPool's
            p): hence more than 8 parameters."""
            super().__init__()
            self.kind, self.kernel, self.strides, self.dilations = kind, list(kernel), list(strides), list(dilations)
            self.pads, self.auto_pad, self.ceil_mode = list(pads), auto_pad, int(ceil_mode)
            self.count_include_pad, self.p = int(count_include_pad), float(p)

        def _sum_pool(self, x, r: int):
            import torch.nn.functional as F

            if r == 1:  # avg_pool1d has no divisor_override: run it as 2-D with a unit axis
                return F.avg_pool2d(
                    x.unsqueeze(2), [1, self.kernel[0]], [1, self.strides[0]], divisor_override=1
                ).squeeze(2)
            fn = F.avg_pool2d if r == 2 else F.avg_pool3d
            return fn(x, self.kernel, self.strides, divisor_override=1)

        def forward(self, x):
            import torch
            import torch.nn.functional as F

            r = x.dim() - 2
            geo = [
                pool_geometry(
                    int(x.shape[2 + i]),
                    self.kernel[i],
                    self.strides[i],
                    self.dilations[i],
                    self.pads[i],
                    self.pads[r + i],
                    self.auto_pad,
                    self.ceil_mode,
                )
                for i in range(r)
            ]
            torch_pad = []  # F.pad: last axis first, (begin, end) each
            for out, pb, pe, extra in reversed(geo):
                torch_pad += [pb, pe + extra]
            if self.kind == "max":
                xp = F.pad(x, torch_pad, value=float("-inf"))
                fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[r]
                y = fn(xp, self.kernel, self.strides, 0, self.dilations)
            else:
                src = torch.abs(x) ** self.p if self.kind == "lp" else x
                total = self._sum_pool(F.pad(src, torch_pad, value=0.0), r)
                if self.kind == "lp":
                    y = total ** (1.0 / self.p)
                else:
                    inner = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
                    if self.count_include_pad:  # pads count, the ceil-mode overhang does not
                        inner = F.pad(inner, [v for _, pb, pe, _ in reversed(geo) for v in (pb, pe)], value=1.0)
                        mask_pad = [v for *_, extra in reversed(geo) for v in (0, extra)]
                    else:
                        mask_pad = torch_pad
                    count = self._sum_pool(F.pad(inner, mask_pad, value=0.0), r)
                    y = total / count
            return y[(slice(None), slice(None)) + tuple(slice(0, g[0]) for g in geo)]

    return OnnxWindowPool


def _window_pool(node, kind: str):
    from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

    a = node_attributes(node)
    k = list(a["kernel_shape"])
    r = len(k)
    if kind != "max" and any(int(d) != 1 for d in a.get("dilations", [1] * r)):
        raise NotImplementedError(
            f"{node.operation_type} node {node.name!r}: dilations {list(a['dilations'])} are not supported"
        )
    mod = _window_pool_class()(
        kind,
        k,
        a.get("strides", [1] * r),
        a.get("dilations", [1] * r),
        a.get("pads", [0] * 2 * r),
        a.get("auto_pad", "NOTSET"),
        a.get("ceil_mode", 0),
        a.get("count_include_pad", 0),
        a.get("p", 2),
    )
    return OperationConverterResult(torch_module=mod, onnx_mapping=onnx_mapping_from_node(node))


def _needs_explicit(node, kind: str) -> bool:
    a = node_attributes(node)
    r = len(a.get("kernel_shape", []))
    pads = list(a.get("pads", [0] * 2 * r))
    asym = pads[:r] != pads[r:]
    return (
        a.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER")
        or asym
        or (kind == "avg" and int(a.get("ceil_mode", 0)) == 1)
    )


def _wrapped(original, kind: str):
    def conv(node, graph):
        if len([o for o in node.output_values if o]) == 1 and _needs_explicit(node, kind):
            return _window_pool(node, kind)
        return original(node, graph)

    conv.anpred_wraps = original
    return conv


def _global(kind: str):
    def conv(node, graph):
        from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

        mod = _global_pool_class()(kind, node_attributes(node).get("p", 2))
        return OperationConverterResult(torch_module=mod, onnx_mapping=onnx_mapping_from_node(node))

    return conv


def _mode_pad_class():
    Module, Marker = module_bases()

    class OnnxModePad(Module, Marker):
        """ONNX ``Pad`` in ``reflect``/``replicate`` (ONNX ``edge``) mode on a tensor of any rank: the
        trailing axes that carry pads (at most 3) are padded by ``F.pad`` on a ``(1, prod(leading),
        *trailing)`` view, then the leading axes are restored. ``pads`` as ONNX orders them
        (``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]``), read at run time."""

        def __init__(self, mode: str, name: str = ""):
            super().__init__()
            self.mode, self.name = mode, name

        def forward(self, x, pads, constant_value=None):
            import torch.nn.functional as F

            p = [int(v) for v in pads.tolist()]
            r = x.dim()
            begin, end = p[:r], p[r:]
            padded = [i for i in range(r) if begin[i] or end[i]]
            if not padded:
                return x
            k = r - padded[0]
            if k > 3:
                raise NotImplementedError(
                    f"Pad {self.name!r}: {self.mode} padding of {k} trailing axes (torch pads at most 3 in this mode)"
                )
            lead, trail = list(x.shape[: r - k]), list(x.shape[r - k :])
            n = 1
            for d in lead:
                n *= int(d)
            torch_pads = []
            for i in reversed(range(r - k, r)):  # F.pad: last axis first, (begin, end) pairs
                torch_pads += [begin[i], end[i]]
            y = F.pad(x.reshape([1, n] + trail), torch_pads, mode=self.mode)
            return y.reshape(lead + list(y.shape[2:]))

    return OnnxModePad


def _bn_wrapped(original):
    """onnx2torch's BatchNormalization picks ``nn.BatchNorm1d/2d/3d`` from its input's rank in
    ``value_info`` and refuses a tensor whose shape ONNX shape inference could not give ("spatial rank
    == -2", PP-OCRv4 rec); its own functional module (``OnnxBatchNorm``: ``F.batch_norm``, any rank,
    inference mode as the module is in eval) computes the same: used then."""

    def conv(node, graph):
        try:
            return original(node, graph)
        except NotImplementedError as err:
            if "spatial rank" not in str(err) or len(node.output_values) != 1:
                raise
        from onnx2torch.node_converters.batch_norm import OnnxBatchNorm
        from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

        a = node_attributes(node)
        mod = OnnxBatchNorm(momentum=1 - a.get("momentum", 0.9), epsilon=a.get("epsilon", 1e-5))
        return OperationConverterResult(torch_module=mod, onnx_mapping=onnx_mapping_from_node(node))

    conv.anpred_wraps = original
    return conv


def _pad_wrapped(original):
    def conv(node, graph):
        from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

        mode = node_attributes(node).get("mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode not in ("reflect", "edge"):
            return original(node, graph)
        mod = _mode_pad_class()("replicate" if mode == "edge" else "reflect", node.name)
        return OperationConverterResult(torch_module=mod, onnx_mapping=onnx_mapping_from_node(node))

    conv.anpred_wraps = original
    return conv


def __getattr__(name: str):  # the module classes are built lazily (torch is imported on first use)
    factories = {
        "OnnxRecurrent": recurrent_class,
        "OnnxGlobalPool": _global_pool_class,
        "OnnxWindowPool": _window_pool_class,
        "OnnxModePad": _mode_pad_class,
    }
    if name in factories:
        cls = factories[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# ---- registration ----------------------------------------------------------------------------------
_NEW = (
    [(op, v, recurrent_converter) for op in ("LSTM", "GRU", "RNN") for v in (7, 14, 22)]
    + [("GlobalMaxPool", v, _global("max")) for v in (1, 22)]
    + [("GlobalLpPool", v, _global("lp")) for v in (2, 22)]
    + [("LpPool", v, lambda node, graph: _window_pool(node, "lp")) for v in (11, 18, 22)]
)
_WRAP = (
    [("AveragePool", v, "avg") for v in (7, 10, 11)]
    + [("MaxPool", v, "max") for v in (8, 10, 11, 12)]
    + [("Pad", v, "pad") for v in (11, 13)]
    + [("BatchNormalization", v, "bn") for v in (9, 14, 15)]
)


def register() -> list[tuple[str, int]]:
    """Put the converters of this module into onnx2torch's registry (``add_converter`` for new
    operators; onnx2torch's own AveragePool/MaxPool entries are wrapped so that the cases they refuse
    or compute otherwise reach :class:`OnnxWindowPool`). Idempotent; returns the (op, version) pairs
    added or wrapped by this call. onnx2torch must already be imported (through
    :func:`import_onnx2torch`)."""
    from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY, OperationDescription, add_converter

    done = []
    for op, v, conv in _NEW:
        key = OperationDescription(domain="", operation_type=op, version=v)
        if key not in _CONVERTER_REGISTRY:
            add_converter(operation_type=op, version=v)(conv)
            done.append((op, v))
    for op, v, kind in _WRAP:
        key = OperationDescription(domain="", operation_type=op, version=v)
        cur = _CONVERTER_REGISTRY.get(key)
        if cur is not None and not hasattr(cur, "anpred_wraps"):
            _CONVERTER_REGISTRY[key] = (
                _pad_wrapped(cur) if kind == "pad" else _bn_wrapped(cur) if kind == "bn" else _wrapped(cur, kind)
            )
            done.append((op, v))
    REGISTERED.extend(done)
    return done


def import_onnx2torch():
    """Import and return the ``onnx2torch`` module without torchvision
    (:func:`anpred.compat.import_onnx2torch_bare`), with ANPRED's converters registered in its
    registry (:func:`register`: LSTM/GRU/RNN, GlobalMaxPool, GlobalLpPool, LpPool, AveragePool/MaxPool
    with ``SAME_*``/asymmetric pads and AveragePool ``ceil_mode``)."""
    from anpred.compat import import_onnx2torch_bare

    o2t = import_onnx2torch_bare()
    register()
    return o2t
