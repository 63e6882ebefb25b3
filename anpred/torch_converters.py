"""onnx2torch converters ANPRED adds through onnx2torch's own registry
(``onnx2torch.node_converters.registry``): operators onnx2torch 1.5.15 lacks or converts only in part.

:func:`register` (called by :func:`anpred.compat.import_onnx2torch`, once per process) adds:

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
- ``AveragePool`` (7, 10, 11; 19 through :func:`anpred.convert.onnx2torch_compat`) and ``MaxPool`` (8, 10, 11, 12): onnx2torch's converters are
  kept for what they handle (symmetric pads, no ``auto_pad=SAME_*``; for AveragePool also no
  ``ceil_mode``); ``auto_pad=SAME_UPPER``/``SAME_LOWER``, asymmetric pads and (AveragePool)
  ``ceil_mode=1`` go to :class:`OnnxWindowPool`, which pads explicitly and divides window sums by the
  count of the cells each window covers, as the ONNX spec defines (``count_include_pad`` both ways).
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

from typing import Any

import numpy as np

__all__ = ["register", "OnnxRecurrent", "OnnxGlobalPool", "OnnxWindowPool", "OnnxModePad", "pool_geometry",
           "const_input", "explicit_same_pads", "REGISTERED"]

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


def _attrs_of(node) -> dict[str, Any]:
    return dict(node.attributes)


def const_input(graph, name: str) -> np.ndarray | None:
    """The value of ``name`` in an onnx2torch ``OnnxGraph`` when it is an initializer or the output of
    a ``Constant`` node (``value`` attribute), else None."""
    if name in graph.initializers:
        return graph.initializers[name].to_numpy()
    try:
        node, _ = graph.value_as_node_output(name)
    except KeyError:
        return None
    v = node.attributes.get("value") if node.operation_type == "Constant" else None
    return None if v is None else (v.to_numpy() if hasattr(v, "to_numpy") else np.asarray(v))


def _base():
    import torch
    from onnx2torch.utils.common import OnnxToTorchModule

    return torch.nn.Module, OnnxToTorchModule


def _global_pool_class():
    Module, Marker = _base()

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
    Module, Marker = _base()

    class OnnxWindowPool(Module, Marker):
        """Max / average / Lp pooling over 1-3 spatial axes with ONNX's padding rules (explicit,
        asymmetric or ``SAME_*`` pads, ``ceil_mode``, ``count_include_pad``), computed from the input's
        runtime shape: the input is padded (max: -inf, others: 0), window sums come from
        ``avg_pool`` with ``divisor_override=1`` and are divided by the number of counted cells per
        window (from the same pooling of a 0/1 mask)."""

        def __init__(self, kind: str, kernel, strides, dilations, pads, auto_pad: str, ceil_mode: int,
                     count_include_pad: int, p: float = 2.0):
            super().__init__()
            self.kind, self.kernel, self.strides, self.dilations = kind, list(kernel), list(strides), list(dilations)
            self.pads, self.auto_pad, self.ceil_mode = list(pads), auto_pad, int(ceil_mode)
            self.count_include_pad, self.p = int(count_include_pad), float(p)

        def _sum_pool(self, x, r: int):
            import torch.nn.functional as F

            if r == 1:  # avg_pool1d has no divisor_override: run it as 2-D with a unit axis
                return F.avg_pool2d(x.unsqueeze(2), [1, self.kernel[0]], [1, self.strides[0]], divisor_override=1).squeeze(2)
            fn = F.avg_pool2d if r == 2 else F.avg_pool3d
            return fn(x, self.kernel, self.strides, divisor_override=1)

        def forward(self, x):
            import torch
            import torch.nn.functional as F

            r = x.dim() - 2
            geo = [pool_geometry(int(x.shape[2 + i]), self.kernel[i], self.strides[i], self.dilations[i],
                                 self.pads[i], self.pads[r + i], self.auto_pad, self.ceil_mode) for i in range(r)]
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

    a = _attrs_of(node)
    k = list(a["kernel_shape"])
    r = len(k)
    if kind != "max" and any(int(d) != 1 for d in a.get("dilations", [1] * r)):
        raise NotImplementedError(f"{node.operation_type} node {node.name!r}: dilations "
                                  f"{list(a['dilations'])} are not supported")
    mod = _window_pool_class()(kind, k, a.get("strides", [1] * r), a.get("dilations", [1] * r),
                               a.get("pads", [0] * 2 * r), a.get("auto_pad", "NOTSET"), a.get("ceil_mode", 0),
                               a.get("count_include_pad", 0), a.get("p", 2))
    return OperationConverterResult(torch_module=mod, onnx_mapping=onnx_mapping_from_node(node))


def _needs_explicit(node, kind: str) -> bool:
    a = _attrs_of(node)
    r = len(a.get("kernel_shape", []))
    pads = list(a.get("pads", [0] * 2 * r))
    asym = pads[:r] != pads[r:]
    return a.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER") or asym or \
        (kind == "avg" and int(a.get("ceil_mode", 0)) == 1)


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

        mod = _global_pool_class()(kind, _attrs_of(node).get("p", 2))
        return OperationConverterResult(torch_module=mod, onnx_mapping=onnx_mapping_from_node(node))

    return conv


def _mode_pad_class():
    Module, Marker = _base()

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
                raise NotImplementedError(f"Pad {self.name!r}: {self.mode} padding of {k} trailing axes (torch pads "
                                          "at most 3 in this mode)")
            lead, trail = list(x.shape[:r - k]), list(x.shape[r - k:])
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

        a = _attrs_of(node)
        mod = OnnxBatchNorm(momentum=1 - a.get("momentum", 0.9), epsilon=a.get("epsilon", 1e-5))
        return OperationConverterResult(torch_module=mod, onnx_mapping=onnx_mapping_from_node(node))

    conv.anpred_wraps = original
    return conv


def _pad_wrapped(original):
    def conv(node, graph):
        from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

        mode = _attrs_of(node).get("mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode not in ("reflect", "edge"):
            return original(node, graph)
        mod = _mode_pad_class()("replicate" if mode == "edge" else "reflect", node.name)
        return OperationConverterResult(torch_module=mod, onnx_mapping=onnx_mapping_from_node(node))

    conv.anpred_wraps = original
    return conv


# ---- recurrent layers ------------------------------------------------------------------------------
def _recurrent(node, graph):
    from onnx2torch.utils.common import OnnxMapping, OperationConverterResult

    from passes.recurrent import RECURRENT_OPS, activation_list

    op = node.operation_type
    a = _attrs_of(node)
    ins = list(node.input_values) + [""] * (8 - len(node.input_values))
    where = f"{op} node {node.name!r}"
    consts = {}
    for role, v in (("W", ins[1]), ("R", ins[2]), ("B", ins[3]), ("P", ins[7] if op == "LSTM" else "")):
        if v:
            val = const_input(graph, v)
            if val is None:
                raise NotImplementedError(f"{where}: input {role} ({v!r}) is not a constant")
            consts[role] = np.asarray(val)  # its own dtype: float16 models stay float16
    direction = a.get("direction", "forward")
    D = 2 if direction == "bidirectional" else 1
    try:
        acts = activation_list(op, a, D)
    except ValueError as err:
        raise NotImplementedError(f"{where}: {err}") from err
    if ins[4]:
        seq = const_input(graph, ins[4])
        shape = graph.value_info[ins[0]].type.tensor_type.shape.dim if ins[0] in graph.value_info else []
        T = shape[1 if a.get("layout", 0) else 0].dim_value if len(shape) == 3 else 0
        if seq is None or not T or not np.all(np.asarray(seq) == T):
            raise NotImplementedError(f"{where}: sequence_lens other than a constant equal to the static sequence "
                                      "length is not supported")
    mod = _recurrent_class()(op, RECURRENT_OPS[op], direction, int(a["hidden_size"]), int(a.get("layout", 0)),
                             consts["W"], consts["R"], consts.get("B"), consts.get("P"), acts,
                             a.get("clip"), int(a.get("input_forget", 0)), int(a.get("linear_before_reset", 0)))
    mapping = OnnxMapping(inputs=(ins[0], ins[5], ins[6] if op == "LSTM" else ""), outputs=node.output_values)
    return OperationConverterResult(torch_module=mod, onnx_mapping=mapping)


_TORCH_FUSED = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh")}


def _recurrent_class():
    Module, Marker = _base()

    class OnnxRecurrent(Module, Marker):
        """One ONNX LSTM/GRU/RNN node: ``forward(x, initial_h=None, initial_c=None)`` returns
        ``(Y, Y_h[, Y_c])`` in the node's layout (``Y``: [T, D, B, H], layout 1: [B, T, D, H]).
        ``self.fused`` tells whether torch's own layer runs it (see the module docstring)."""

        def __init__(self, op, gates, direction, hidden, layout, W, R, B, P, acts, clip, input_forget, lbr):
            import torch

            super().__init__()
            D = 2 if direction == "bidirectional" else 1
            self.op, self.G, self.direction, self.H, self.layout, self.D = op, gates, direction, hidden, layout, D
            self.acts, self.clip, self.input_forget, self.lbr = acts, clip, input_forget, lbr
            B = B if B is not None else np.zeros((D, 2 * gates * hidden), W.dtype)
            names = [n for n, *_ in acts]
            per = len(names) // D
            same = all(names[d * per:(d + 1) * per] == names[:per] for d in range(D))
            if op == "RNN":
                fused_ok = same and names[0] in ("Tanh", "Relu")
            else:
                fused_ok = tuple(names[:per]) == _TORCH_FUSED[op] and same and (op != "GRU" or lbr == 1)
            fused_ok = fused_ok and clip is None and not input_forget and (P is None or not np.any(P))
            self.fused = bool(fused_ok)
            H, F = hidden, W.shape[-1]
            if self.fused:
                cls = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN": torch.nn.RNN}[op]
                kw = {"nonlinearity": names[0].lower()} if op == "RNN" else {}
                self.layer = cls(F, H, bidirectional=D == 2, dtype=torch.from_numpy(W[:1, :1, :1]).dtype, **kw)
                order = {"LSTM": [0, 2, 3, 1], "GRU": [1, 0, 2], "RNN": [0]}[op]  # torch gate k = ONNX gate order[k]
                idx = np.concatenate([np.arange(g * H, (g + 1) * H) for g in order])
                with torch.no_grad():
                    for d in range(D):
                        sfx = "_reverse" if d == 1 else ""
                        getattr(self.layer, "weight_ih_l0" + sfx).copy_(torch.from_numpy(W[d][idx]))
                        getattr(self.layer, "weight_hh_l0" + sfx).copy_(torch.from_numpy(R[d][idx]))
                        getattr(self.layer, "bias_ih_l0" + sfx).copy_(torch.from_numpy(B[d, :gates * H][idx]))
                        getattr(self.layer, "bias_hh_l0" + sfx).copy_(torch.from_numpy(B[d, gates * H:][idx]))
            else:
                self.register_buffer("Wt", torch.from_numpy(np.ascontiguousarray(np.swapaxes(W, 1, 2))))  # [D, F, G*H]
                self.register_buffer("Rt", torch.from_numpy(np.ascontiguousarray(np.swapaxes(R, 1, 2))))  # [D, H, G*H]
                self.register_buffer("Wb", torch.from_numpy(B[:, :gates * H].copy()))
                self.register_buffer("Rb", torch.from_numpy(B[:, gates * H:].copy()))
                self.register_buffer("P", torch.from_numpy(P.copy()) if P is not None else None)

        # -- helpers
        def _act(self, spec, x):
            import torch
            import torch.nn.functional as F

            name, a, b = spec
            if name == "Sigmoid":
                return torch.sigmoid(x)
            if name == "Tanh":
                return torch.tanh(x)
            if name == "Relu":
                return torch.relu(x)
            if name == "Softsign":
                return x / (1 + torch.abs(x))
            if name == "Softplus":
                return F.softplus(x)
            if name == "Affine":
                return a * x + b
            if name == "ScaledTanh":
                return a * torch.tanh(b * x)
            if name == "HardSigmoid":
                return torch.clamp(a * x + b, 0.0, 1.0)
            if name == "LeakyRelu":
                return torch.where(x >= 0, x, a * x)
            if name == "ThresholdedRelu":
                return torch.where(x > a, x, torch.zeros_like(x))
            return torch.where(x >= 0, x, a * (torch.exp(x) - 1))  # Elu

        def _clip(self, x):
            import torch

            return x if self.clip is None else torch.clamp(x, -float(self.clip), float(self.clip))

        def _steps(self, x, h, c, d):
            """One direction over x [T, B, F] with states [B, H]; returns (Y [T, B, H], h, c)."""
            import torch

            H, per = self.H, len(self.acts) // self.D
            fa = self.acts[d * per:(d + 1) * per]
            Wt, Rt, wb, rb = self.Wt[d], self.Rt[d], self.Wb[d], self.Rb[d]
            order = range(x.shape[0] - 1, -1, -1) if (self.direction == "reverse" or d == 1) else range(x.shape[0])
            ys = [None] * x.shape[0]
            for t in order:
                xw = x[t] @ Wt
                hr = h @ Rt
                if self.op == "LSTM":
                    g = xw + hr
                    pi, po, pf = (self.P[d, k * H:(k + 1) * H] for k in range(3)) if self.P is not None else (None,) * 3
                    bias = wb + rb
                    gi, go, gf, gc = (g[:, k * H:(k + 1) * H] for k in range(4))
                    i = self._act(fa[0], self._clip(gi + (pi * c if pi is not None else 0) + bias[:H]))
                    if self.input_forget:
                        f = 1 - i
                    else:
                        f = self._act(fa[0], self._clip(gf + (pf * c if pf is not None else 0) + bias[2 * H:3 * H]))
                    cc = self._act(fa[1], self._clip(gc + bias[3 * H:]))
                    c = f * c + i * cc
                    o = self._act(fa[0], self._clip(go + (po * c if po is not None else 0) + bias[H:2 * H]))
                    h = o * self._act(fa[2], c)
                elif self.op == "GRU":
                    z = self._act(fa[0], self._clip(xw[:, :H] + hr[:, :H] + wb[:H] + rb[:H]))
                    r = self._act(fa[0], self._clip(xw[:, H:2 * H] + hr[:, H:2 * H] + wb[H:2 * H] + rb[H:2 * H]))
                    if self.lbr:
                        rec = r * (hr[:, 2 * H:] + rb[2 * H:])
                    else:
                        rec = (r * h) @ Rt[:, 2 * H:] + rb[2 * H:]
                    hh = self._act(fa[1], self._clip(xw[:, 2 * H:] + rec + wb[2 * H:]))
                    h = (1 - z) * hh + z * h
                else:
                    h = self._act(fa[0], self._clip(xw + hr + wb + rb))
                ys[t] = h
            return torch.stack(ys), h, c

        def forward(self, x, initial_h=None, initial_c=None):
            import torch

            if self.layout:  # [B, T, F] -> [T, B, F]; states [B, D, H] -> [D, B, H]
                x = x.transpose(0, 1)
                initial_h = initial_h.transpose(0, 1) if initial_h is not None else None
                initial_c = initial_c.transpose(0, 1) if initial_c is not None else None
            T, Bn = x.shape[0], x.shape[1]
            zeros = x.new_zeros((self.D, Bn, self.H))
            h0 = initial_h if initial_h is not None else zeros
            c0 = initial_c if initial_c is not None else zeros
            if self.fused:
                rev = self.direction == "reverse"
                xin = torch.flip(x, [0]) if rev else x
                state = (h0.contiguous(), c0.contiguous()) if self.op == "LSTM" else h0.contiguous()
                y, st = self.layer(xin, state)
                y = torch.flip(y, [0]) if rev else y
                y = y.reshape(T, Bn, self.D, self.H).permute(0, 2, 1, 3)  # [T, D, B, H]
                yh, yc = (st if self.op == "LSTM" else (st, None))
            else:
                outs = [self._steps(x, h0[d], c0[d], d) for d in range(self.D)]
                y = torch.stack([o[0] for o in outs], 1)
                yh = torch.stack([o[1] for o in outs])
                yc = torch.stack([o[2] for o in outs]) if self.op == "LSTM" else None
            if self.layout:  # Y [T, D, B, H] -> [B, T, D, H]; states -> [B, D, H]
                y = y.permute(2, 0, 1, 3)
                yh = yh.transpose(0, 1)
                yc = yc.transpose(0, 1) if yc is not None else None
            return (y, yh, yc) if self.op == "LSTM" else (y, yh)

    return OnnxRecurrent


def __getattr__(name: str):  # the module classes are built lazily (torch is imported on first use)
    factories = {"OnnxRecurrent": _recurrent_class, "OnnxGlobalPool": _global_pool_class,
                 "OnnxWindowPool": _window_pool_class, "OnnxModePad": _mode_pad_class}
    if name in factories:
        cls = factories[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# ---- registration ----------------------------------------------------------------------------------
_NEW = ([(op, v, _recurrent) for op in ("LSTM", "GRU", "RNN") for v in (7, 14, 22)]
        + [("GlobalMaxPool", v, _global("max")) for v in (1, 22)]
        + [("GlobalLpPool", v, _global("lp")) for v in (2, 22)]
        + [("LpPool", v, lambda node, graph: _window_pool(node, "lp")) for v in (11, 18, 22)])
_WRAP = ([("AveragePool", v, "avg") for v in (7, 10, 11)] + [("MaxPool", v, "max") for v in (8, 10, 11, 12)]
         + [("Pad", v, "pad") for v in (11, 13)] + [("BatchNormalization", v, "bn") for v in (9, 14, 15)])


def register() -> list[tuple[str, int]]:
    """Put the converters of this module into onnx2torch's registry (``add_converter`` for new
    operators; onnx2torch's own AveragePool/MaxPool entries are wrapped so that the cases they refuse
    or compute otherwise reach :class:`OnnxWindowPool`). Idempotent; returns the (op, version) pairs
    added or wrapped by this call. onnx2torch must already be imported (through
    :func:`anpred.compat.import_onnx2torch`)."""
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
            _CONVERTER_REGISTRY[key] = (_pad_wrapped(cur) if kind == "pad" else _bn_wrapped(cur) if kind == "bn"
                                        else _wrapped(cur, kind))
            done.append((op, v))
    REGISTERED.extend(done)
    return done
