"""The onnx2torch converter of ONNX ``LSTM``, ``GRU`` and ``RNN`` (versions 7, 14, 22) that
:mod:`anpred.backends.torch_converters` registers: :class:`OnnxRecurrent`.

The ONNX gate order is mapped onto ``torch.nn.LSTM``/``GRU``/``RNN`` (LSTM ``iofc`` -> torch ``ifgo``,
GRU ``zrh`` -> torch ``rzn``) whenever the node uses what torch's layers compute (the conditions:
:mod:`anpred.backends.torch_converters`); otherwise the ONNX equations run step by step in torch ops
(:mod:`passes.recurrent` states them). torch is imported on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from anpred.backends.onnx2torch_nodes import const_input, module_bases, node_attributes

__all__ = ["RecurrentNode", "recurrent_converter", "recurrent_class"]


@dataclass(frozen=True)
class RecurrentNode:
    """The attributes of one ONNX LSTM/GRU/RNN node that decide its computation.

    Attributes:
        op: ``LSTM`` | ``GRU`` | ``RNN``; gates: gates per direction (4, 3, 1:
            :data:`passes.recurrent.RECURRENT_OPS`); direction: ``forward`` | ``reverse`` |
            ``bidirectional``; hidden: ``hidden_size``; layout: 0 (``[T, B, F]``) or 1 (``[B, T, F]``).
        acts: ``(name, alpha, beta)`` per activation, all directions
            (:func:`passes.recurrent.activation_list`); clip: the ``clip`` attribute (None: none).
        input_forget: LSTM ``input_forget``; lbr: GRU ``linear_before_reset``.
    """

    op: str
    gates: int
    direction: str
    hidden: int
    layout: int
    acts: Any
    clip: Any = None
    input_forget: int = 0
    lbr: int = 0


def recurrent_converter(node, graph):
    """onnx2torch converter of an LSTM/GRU/RNN node: an :class:`OnnxRecurrent`. Raises
    NotImplementedError (naming the node) for non-constant weights, unsupported activations and a
    ``sequence_lens`` other than a constant equal to the static sequence length."""
    from onnx2torch.utils.common import OnnxMapping, OperationConverterResult

    from passes.recurrent import RECURRENT_OPS, activation_list

    op = node.operation_type
    a = node_attributes(node)
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
            raise NotImplementedError(
                f"{where}: sequence_lens other than a constant equal to the static sequence length is not supported"
            )
    spec = RecurrentNode(
        op,
        RECURRENT_OPS[op],
        direction,
        int(a["hidden_size"]),
        int(a.get("layout", 0)),
        acts,
        a.get("clip"),
        int(a.get("input_forget", 0)),
        int(a.get("linear_before_reset", 0)),
    )
    mod = recurrent_class()(spec, consts["W"], consts["R"], consts.get("B"), consts.get("P"))
    mapping = OnnxMapping(inputs=(ins[0], ins[5], ins[6] if op == "LSTM" else ""), outputs=node.output_values)
    return OperationConverterResult(torch_module=mod, onnx_mapping=mapping)


_TORCH_FUSED = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh")}


def _act(spec, x):
    """Apply one ONNX recurrent activation ``(name, alpha, beta)`` to tensor ``x``."""
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


class _RecurrentLayer:
    """The computation of :class:`OnnxRecurrent`, mixed into a ``torch.nn.Module`` subclass built by
    :func:`recurrent_class` (so that torch is imported on first use, not at import)."""

    def __init__(self, spec: RecurrentNode, W, R, B=None, P=None):
        """``W`` [D, G*H, F], ``R`` [D, G*H, H], ``B`` [D, 2*G*H] (None: zeros), ``P`` [D, 3*H] (LSTM
        peepholes; None: none), numpy arrays of the model's float dtype."""
        super().__init__()
        op, gates, hidden = spec.op, spec.gates, spec.hidden
        D = 2 if spec.direction == "bidirectional" else 1
        self.op, self.G, self.direction, self.H, self.layout, self.D = op, gates, spec.direction, hidden, spec.layout, D
        self.acts, self.clip, self.input_forget, self.lbr = spec.acts, spec.clip, spec.input_forget, spec.lbr
        B = B if B is not None else np.zeros((D, 2 * gates * hidden), W.dtype)
        self.fused = self._fusable(P)
        if self.fused:
            self._load_fused(W, R, B)
        else:
            self._load_unfused(W, R, B, P)

    def _fusable(self, P) -> bool:
        """Whether torch's own layer computes this node (the module docstring's conditions)."""
        names = [n for n, *_ in self.acts]
        per = len(names) // self.D
        same = all(names[d * per : (d + 1) * per] == names[:per] for d in range(self.D))
        if self.op == "RNN":
            fused_ok = same and names[0] in ("Tanh", "Relu")
        else:
            fused_ok = tuple(names[:per]) == _TORCH_FUSED[self.op] and same and (self.op != "GRU" or self.lbr == 1)
        fused_ok = fused_ok and self.clip is None and not self.input_forget and (P is None or not np.any(P))
        return bool(fused_ok)

    def _load_fused(self, W, R, B) -> None:
        """Build ``self.layer`` (``torch.nn.LSTM``/``GRU``/``RNN``) with the node's weights, gates reordered."""
        import torch

        op, gates, H, D, F = self.op, self.G, self.H, self.D, W.shape[-1]
        cls = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN": torch.nn.RNN}[op]
        kw = {"nonlinearity": self.acts[0][0].lower()} if op == "RNN" else {}
        self.layer = cls(F, H, bidirectional=D == 2, dtype=torch.from_numpy(W[:1, :1, :1]).dtype, **kw)
        order = {"LSTM": [0, 2, 3, 1], "GRU": [1, 0, 2], "RNN": [0]}[op]  # torch gate k = ONNX gate order[k]
        idx = np.concatenate([np.arange(g * H, (g + 1) * H) for g in order])
        with torch.no_grad():
            for d in range(D):
                sfx = "_reverse" if d == 1 else ""
                getattr(self.layer, "weight_ih_l0" + sfx).copy_(torch.from_numpy(W[d][idx]))
                getattr(self.layer, "weight_hh_l0" + sfx).copy_(torch.from_numpy(R[d][idx]))
                getattr(self.layer, "bias_ih_l0" + sfx).copy_(torch.from_numpy(B[d, : gates * H][idx]))
                getattr(self.layer, "bias_hh_l0" + sfx).copy_(torch.from_numpy(B[d, gates * H :][idx]))

    def _load_unfused(self, W, R, B, P) -> None:
        """Register the weights as buffers for the step-by-step equations (:meth:`_steps`)."""
        import torch

        gates, H = self.G, self.H
        self.register_buffer("Wt", torch.from_numpy(np.ascontiguousarray(np.swapaxes(W, 1, 2))))  # [D, F, G*H]
        self.register_buffer("Rt", torch.from_numpy(np.ascontiguousarray(np.swapaxes(R, 1, 2))))  # [D, H, G*H]
        self.register_buffer("Wb", torch.from_numpy(B[:, : gates * H].copy()))
        self.register_buffer("Rb", torch.from_numpy(B[:, gates * H :].copy()))
        self.register_buffer("P", torch.from_numpy(P.copy()) if P is not None else None)

    # -- helpers
    def _act(self, spec, x):
        return _act(spec, x)

    def _clip(self, x):
        import torch

        return x if self.clip is None else torch.clamp(x, -float(self.clip), float(self.clip))

    def _lstm_step(self, xw, hr, c, d, fa):
        """One LSTM time step (ONNX equations); returns ``(h, c)``."""
        H = self.H
        g = xw + hr
        pi, po, pf = (self.P[d, k * H : (k + 1) * H] for k in range(3)) if self.P is not None else (None,) * 3
        bias = self.Wb[d] + self.Rb[d]
        gi, go, gf, gc = (g[:, k * H : (k + 1) * H] for k in range(4))
        i = self._act(fa[0], self._clip(gi + (pi * c if pi is not None else 0) + bias[:H]))
        if self.input_forget:
            f = 1 - i
        else:
            f = self._act(fa[0], self._clip(gf + (pf * c if pf is not None else 0) + bias[2 * H : 3 * H]))
        cc = self._act(fa[1], self._clip(gc + bias[3 * H :]))
        c = f * c + i * cc
        o = self._act(fa[0], self._clip(go + (po * c if po is not None else 0) + bias[H : 2 * H]))
        return o * self._act(fa[2], c), c

    def _gru_step(self, xw, hr, h, d, fa):
        """One GRU time step (ONNX equations); returns ``h``."""
        H, Rt, wb, rb = self.H, self.Rt[d], self.Wb[d], self.Rb[d]
        z = self._act(fa[0], self._clip(xw[:, :H] + hr[:, :H] + wb[:H] + rb[:H]))
        r = self._act(fa[0], self._clip(xw[:, H : 2 * H] + hr[:, H : 2 * H] + wb[H : 2 * H] + rb[H : 2 * H]))
        if self.lbr:
            rec = r * (hr[:, 2 * H :] + rb[2 * H :])
        else:
            rec = (r * h) @ Rt[:, 2 * H :] + rb[2 * H :]
        hh = self._act(fa[1], self._clip(xw[:, 2 * H :] + rec + wb[2 * H :]))
        return (1 - z) * hh + z * h

    def _steps(self, x, h, c, d):
        """One direction over x [T, B, F] with states [B, H]; returns (Y [T, B, H], h, c)."""
        import torch

        per = len(self.acts) // self.D
        fa = self.acts[d * per : (d + 1) * per]
        Wt, Rt, wb, rb = self.Wt[d], self.Rt[d], self.Wb[d], self.Rb[d]
        order = range(x.shape[0] - 1, -1, -1) if (self.direction == "reverse" or d == 1) else range(x.shape[0])
        ys = [None] * x.shape[0]
        for t in order:
            xw = x[t] @ Wt
            hr = h @ Rt
            if self.op == "LSTM":
                h, c = self._lstm_step(xw, hr, c, d, fa)
            elif self.op == "GRU":
                h = self._gru_step(xw, hr, h, d, fa)
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
            yh, yc = st if self.op == "LSTM" else (st, None)
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


def recurrent_class():
    """The ``torch.nn.Module`` class :class:`OnnxRecurrent` (built when called: imports torch)."""
    Module, Marker = module_bases()

    class OnnxRecurrent(_RecurrentLayer, Module, Marker):
        """One ONNX LSTM/GRU/RNN node: ``forward(x, initial_h=None, initial_c=None)`` returns
        ``(Y, Y_h[, Y_c])`` in the node's layout (``Y``: [T, D, B, H], layout 1: [B, T, D, H]).
        ``self.fused`` tells whether torch's own layer runs it (see the module docstring)."""

    return OnnxRecurrent
