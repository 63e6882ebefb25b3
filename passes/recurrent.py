"""Unrolling of the ONNX recurrent operators (``LSTM``, ``GRU``, ``RNN``) into elementary ops.

:class:`RecurrentUnrollPass` replaces every recurrent node whose sequence length is static by the
per-time-step equations of the ONNX operator schema, written with ``Gather``, ``MatMul``, ``Add``,
``Mul``, ``Sub``, ``Max``/``Min`` (clip), the activation ops, ``Reshape`` and ``Concat`` only. The
node's outputs keep their names (``Y``, ``Y_h``, ``Y_c``), so anchors on them still map. It is a
pre-conversion step for converters whose recurrent layers fail (onnx2tf 1.29: every
``LSTM``/``GRU``/``RNN`` whose ``X`` is a 3-D graph input failed, ``InvalidArgumentError`` in a
``Reshape``/``Split``, because onnx2tf transposes 3-D inputs to channels-last; bidirectional ones
without initial states failed with ``TypeError``); the unrolled graph holds 2-D tensors only between
the ``Gather`` of a time step and the final ``Concat``.

Equations (ONNX operator docs, LSTM-14/GRU-14/RNN-14; ``(.)`` is the element-wise product), with the
order of operations of ONNX Runtime's CPU kernels (``onnxruntime/core/providers/cpu/rnn``:
peepholes are added before the clip, the clip bounds ``pre-activation + bias`` of every gate and not
the cell state (``h(C_t)`` unclipped: measured against ONNX Runtime 1.32 with a float64 re-computation),
``input_forget`` sets ``f = 1 - i``):

- LSTM (gate order ``iofc`` in ``W``/``R``/``B``, ``iof`` in ``P``; default f=Sigmoid, g=h=Tanh):
  ``i = f(clip(X W_i^T + H R_i^T + P_i (.) C + Wb_i + Rb_i))``, same for ``f`` with ``P_f``,
  ``c = g(clip(X W_c^T + H R_c^T + Wb_c + Rb_c))``, ``C' = f (.) C + i (.) c``,
  ``o = f(clip(X W_o^T + H R_o^T + P_o (.) C' + Wb_o + Rb_o))``, ``H' = o (.) h(C')``;
- GRU (gate order ``zrh``; default f=Sigmoid, g=Tanh): ``z = f(X W_z^T + H R_z^T + Wb_z + Rb_z)``,
  ``r`` likewise, ``h = g(X W_h^T + (r (.) H) R_h^T + Rb_h + Wb_h)`` (``linear_before_reset=0``) or
  ``h = g(X W_h^T + r (.) (H R_h^T + Rb_h) + Wb_h)`` (``=1``), ``H' = (1 - z) (.) h + z (.) H``;
- RNN (default f=Tanh): ``H' = f(X W_i^T + H R_i^T + Wb_i + Rb_i)``.

The reverse direction runs t = T-1 .. 0 and writes ``Y`` in the original time order; ``bidirectional``
stacks forward then reverse on the ``num_directions`` axis. A missing initial state is zero (the
terms it multiplies are left out). ``layout=1`` (batch first) is honoured.

A node is left as it is (and named in ``info["kept"]`` with the reason) when its sequence length is
not static, ``W``/``R``/``B``/``P`` are not initializers, ``sequence_lens`` is given and is not a
constant equal to the sequence length everywhere, or an activation is not one of the schema's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from passes.base import GraphPass, PassResult

__all__ = ["RecurrentUnrollPass", "RECURRENT_OPS", "unroll_recurrent"]

RECURRENT_OPS = {"LSTM": 4, "GRU": 3, "RNN": 1}  # op -> gates
_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
# activation -> (default alpha, default beta), ONNX LSTM-14 "Activation functions"
_ACTS = {
    "Relu": (None, None),
    "Tanh": (None, None),
    "Sigmoid": (None, None),
    "Softsign": (None, None),
    "Softplus": (None, None),
    "Affine": (1.0, 0.0),
    "LeakyRelu": (0.01, None),
    "ThresholdedRelu": (1.0, None),
    "ScaledTanh": (1.0, 1.0),
    "HardSigmoid": (0.2, 0.5),
    "Elu": (1.0, None),
}


def _attrs(node) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def activation_list(op: str, attrs: dict[str, Any], directions: int) -> list[tuple[str, float | None, float | None]]:
    """The activations of a recurrent node as ``[(name, alpha, beta)]``, ``len = per-direction count x
    directions`` (forward first), with the schema's defaults where ``activations``/``activation_alpha``/
    ``activation_beta`` are absent (alpha/beta are consumed in order by the activations that take them).

    Raises:
        ValueError: an activation name the schema does not list, or a list of the wrong length.
    """
    per = len(_DEFAULT_ACTS[op])
    names = [a.decode() if isinstance(a, bytes) else str(a) for a in attrs.get("activations", [])]
    names = names or _DEFAULT_ACTS[op] * directions
    if len(names) != per * directions:
        raise ValueError(f"{len(names)} activations for {per} x {directions} direction(s)")
    alphas, betas = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
    out = []
    for n in names:
        if n not in _ACTS:
            raise ValueError(f"activation {n!r} is not one of the schema's ({', '.join(_ACTS)})")
        da, db = _ACTS[n]
        a = alphas.pop(0) if da is not None and alphas else da
        b = betas.pop(0) if db is not None and betas else db
        out.append((n, a, b))
    return out


class _Emitter:
    """Writes nodes/initializers for one recurrent node; ``None`` stands for an all-zero tensor."""

    def __init__(self, prefix: str, taken: set[str], opset: int):
        self.prefix, self.taken, self.opset = prefix, taken, opset
        self.nodes: list = []
        self.inits: list = []
        self.k = 0

    def name(self, tag: str) -> str:
        while True:
            self.k += 1
            n = f"{self.prefix}/unroll/{tag}_{self.k}"
            if n not in self.taken:
                self.taken.add(n)
                return n

    def const(self, arr: np.ndarray, tag: str = "c") -> str:
        from onnx import numpy_helper

        n = self.name(tag)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), n))
        return n

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        from onnx import helper

        o = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [o], name=self.name(op_type), **attrs))
        return o

    def add(self, *xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            return None
        acc = xs[0]
        for x in xs[1:]:
            acc = self.op("Add", [acc, x])
        return acc

    def mul(self, a, b):
        return None if a is None or b is None else self.op("Mul", [a, b])

    def matmul(self, a, w):
        return None if a is None else self.op("MatMul", [a, w])

    def unsqueeze(self, x, axis: int, out: str):
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.const(np.array([axis], np.int64), "axes")], out)
        return self.op("Unsqueeze", [x], out, axes=[axis])

    def clip(self, x, c, dtype):
        if c is None:
            return x
        x = self.op("Min", [x, self.const(np.array(c, dtype), "clip")])
        return self.op("Max", [x, self.const(np.array(-c, dtype), "clip")])

    def act(self, spec, x, dtype):
        name, a, b = spec
        if x is None:  # f(0) as a constant would need the batch size: materialise zeros instead
            raise ValueError("activation of a zero tensor")
        if name in ("Relu", "Tanh", "Sigmoid", "Softsign", "Softplus"):
            return self.op(name, [x])
        if name == "Affine":
            return self.op("Add", [self.op("Mul", [x, self.const(np.array(a, dtype))]), self.const(np.array(b, dtype))])
        if name == "ScaledTanh":
            t = self.op("Tanh", [self.op("Mul", [x, self.const(np.array(b, dtype))])])
            return self.op("Mul", [t, self.const(np.array(a, dtype))])
        if name == "HardSigmoid":
            return self.op("HardSigmoid", [x], alpha=float(a), beta=float(b))
        return self.op(name, [x], alpha=float(a))  # LeakyRelu, ThresholdedRelu, Elu


def _static_len(types: dict[str, Any], x: str, layout: int) -> int | None:
    tp = types.get(x)
    if tp is None or not tp.tensor_type.HasField("shape") or len(tp.tensor_type.shape.dim) != 3:
        return None
    d = tp.tensor_type.shape.dim[1 if layout else 0]
    return int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None


def _unroll(node, inits: dict[str, np.ndarray], types: dict[str, Any], taken: set[str], opset: int):
    """(nodes, initializers) replacing ``node``, or raise ValueError with the reason to keep it."""
    op = node.op_type
    G = RECURRENT_OPS[op]
    at = _attrs(node)
    direction = at.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    layout = int(at.get("layout", 0))
    H = int(at["hidden_size"]) if "hidden_size" in at else None
    ins = list(node.input) + [""] * (8 - len(node.input))
    x, w, r, b, seq, h0 = ins[:6]
    c0 = ins[6] if op == "LSTM" else ""
    p = ins[7] if op == "LSTM" else ""
    for role, v in (("W", w), ("R", r), ("B", b), ("P", p)):
        if v and v not in inits:
            raise ValueError(f"input {role} ({v!r}) is not an initializer")
    W, R = inits[w], inits[r]
    D = 2 if direction == "bidirectional" else 1
    H = H or R.shape[-1]
    T = _static_len(types, x, layout)
    if T is None:
        raise ValueError(f"the sequence length of X ({x!r}) is not static")
    if seq:
        if seq not in inits or not np.all(np.asarray(inits[seq]) == T):
            raise ValueError("sequence_lens is given and is not a constant equal to the sequence length")
    dtype = W.dtype
    Bv = inits[b] if b else np.zeros((D, 2 * G * H), dtype)
    P = inits[p] if p else None
    acts = activation_list(op, at, D)
    per = len(_DEFAULT_ACTS[op])
    clip = float(at["clip"]) if "clip" in at else None
    lbr = int(at.get("linear_before_reset", 0))
    input_forget = int(at.get("input_forget", 0))
    em = _Emitter(node.name or node.output[0], taken, opset)
    t_axis, s_axis = (1, 1) if layout else (0, 0)
    steps_idx = [em.const(np.array(t, np.int64), "t") for t in range(T)]
    y_shape = em.const(np.array([-1, T, D, H] if layout else [T, D, -1, H], np.int64), "yshape") if D == 2 else ""
    s_shape = em.const(np.array([-1, 1, H] if layout else [1, -1, H], np.int64), "sshape")
    xs = [em.op("Gather", [x, steps_idx[t]], axis=t_axis) for t in range(T)]
    ys, hs, cs = [], [], []
    for d in range(D):
        reverse = direction == "reverse" or d == 1
        fa = acts[d * per : (d + 1) * per]
        Wt = [em.const(W[d, g * H : (g + 1) * H, :].T, "w") for g in range(G)]
        Rt = [em.const(R[d, g * H : (g + 1) * H, :].T, "r") for g in range(G)]
        wb = [Bv[d, g * H : (g + 1) * H] for g in range(G)]
        rb = [Bv[d, (G + g) * H : (G + g + 1) * H] for g in range(G)]
        bias = [em.const((wb[g] + rb[g]).astype(dtype), "b") for g in range(G)]
        hidx = em.const(np.array(d, np.int64), "d") if (h0 or c0) else ""
        h = em.op("Gather", [h0, hidx], axis=s_axis) if h0 else None
        c = em.op("Gather", [c0, hidx], axis=s_axis) if c0 else None
        peep = [em.const(P[d, k * H : (k + 1) * H], "p") for k in range(3)] if P is not None else [None] * 3
        y_d = [None] * T
        for t in range(T - 1, -1, -1) if reverse else range(T):
            xt = xs[t]
            if op == "LSTM":
                gi, go, gf, gc = (em.add(em.matmul(xt, Wt[g]), em.matmul(h, Rt[g])) for g in range(4))
                i = em.act(fa[0], em.clip(em.add(gi, em.mul(c, peep[0]), bias[0]), clip, dtype), dtype)
                if input_forget:
                    f = em.op("Sub", [em.const(np.array(1, dtype), "one"), i])
                else:
                    f = em.act(fa[0], em.clip(em.add(gf, em.mul(c, peep[2]), bias[2]), clip, dtype), dtype)
                cc = em.act(fa[1], em.clip(em.add(gc, bias[3]), clip, dtype), dtype)
                c = em.add(em.mul(f, c), em.mul(i, cc))
                o = em.act(fa[0], em.clip(em.add(go, em.mul(c, peep[1]), bias[1]), clip, dtype), dtype)
                h = em.mul(o, em.act(fa[2], c, dtype))
            elif op == "GRU":
                z = em.act(
                    fa[0], em.clip(em.add(em.matmul(xt, Wt[0]), em.matmul(h, Rt[0]), bias[0]), clip, dtype), dtype
                )
                rr = em.act(
                    fa[0], em.clip(em.add(em.matmul(xt, Wt[1]), em.matmul(h, Rt[1]), bias[1]), clip, dtype), dtype
                )
                wbh, rbh = em.const(wb[2].astype(dtype), "b"), em.const(rb[2].astype(dtype), "b")
                if lbr:
                    rec = em.mul(rr, em.add(em.matmul(h, Rt[2]), rbh) if h is not None else rbh)
                else:
                    rec = em.add(em.matmul(em.mul(rr, h), Rt[2]), rbh)
                hh = em.act(fa[1], em.clip(em.add(em.matmul(xt, Wt[2]), rec, wbh), clip, dtype), dtype)
                one_minus_z = em.op("Sub", [em.const(np.array(1, dtype), "one"), z])
                h = em.add(em.mul(one_minus_z, hh), em.mul(z, h))
            else:
                h = em.act(
                    fa[0], em.clip(em.add(em.matmul(xt, Wt[0]), em.matmul(h, Rt[0]), bias[0]), clip, dtype), dtype
                )
            y_d[t] = h
        ys.append(y_d)
        hs.append(h)
        cs.append(c)
    out = list(node.output) + [""] * (3 - len(node.output))
    if out[0]:  # 2-D pieces joined, then one Reshape (no 4-D intermediates: onnx2tf mislaid their axes)
        pieces = [ys[d][t] for t in range(T) for d in range(D)]  # time-major, directions inside
        flat = em.op("Concat", pieces, axis=1 if layout else 0)  # [B, T*D*H] or [T*D*B, H]
        if D == 2:
            em.op("Reshape", [flat, y_shape], out[0])
        else:  # onnx2tf swapped T and D of a direct [T, 1, B, H] Reshape; via 3-D + Unsqueeze it does not
            y3 = em.op("Reshape", [flat, em.const(np.array([-1, T, H] if layout else [T, -1, H], np.int64), "yshape")])
            em.unsqueeze(y3, 2 if layout else 1, out[0])
    for name, finals in ((out[1], hs), (out[2] if op == "LSTM" else "", cs)):
        if name:
            parts = [em.op("Reshape", [s, s_shape]) for s in finals]
            if D == 1:
                em.op("Identity", parts, name)
            else:
                em.op("Concat", parts, name, axis=1 if layout else 0)
    return em.nodes, em.inits


class RecurrentUnrollPass(GraphPass):
    """Unroll ``LSTM``/``GRU``/``RNN`` nodes of the main graph (see the module docstring), in place.

    ``info``: ``{"unrolled": [node names], "kept": {node name: reason}}``. Needs the weights loaded
    (``W``, ``R``, ``B``, ``P`` are read as arrays); ``Constant`` nodes should be folded to
    initializers first (:func:`anpred.backends.convert.fold_constant_nodes`).
    """

    in_place = True

    def __init__(self, only=None):
        #: node names to unroll (a node without a name: its first output); None: every recurrent node
        self.only = set(only) if only is not None else None

    def call(self, model) -> PassResult:
        import onnx
        from onnx import numpy_helper

        g = model.graph
        targets = [
            n
            for n in g.node
            if n.op_type in RECURRENT_OPS
            and n.domain in ("", "ai.onnx")
            and (self.only is None or (n.name or n.output[0]) in self.only)
        ]
        info: dict[str, Any] = {"unrolled": [], "kept": {}}
        if not targets:
            return PassResult(model, False, info)
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - shapes from the model's own value_info then
            inferred = model
        types = {
            vi.name: vi.type
            for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)
        }
        wanted = {v for n in targets for v in n.input[1:] if v}
        inits = {t.name: numpy_helper.to_array(t) for t in g.initializer if t.name in wanted}
        taken = (
            {v for n in g.node for v in list(n.input) + list(n.output)}
            | {n.name for n in g.node}
            | {t.name for t in g.initializer}
            | {i.name for i in g.input}
        )
        opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        new_nodes, added = [], []
        for n in g.node:
            if n not in targets:
                new_nodes.append(n)
                continue
            label = n.name or n.output[0]
            try:
                nodes, tensors = _unroll(n, inits, types, taken, opset)
            except (ValueError, KeyError, IndexError) as err:
                info["kept"][label] = f"{n.op_type}: {err}"
                new_nodes.append(n)
                continue
            new_nodes.extend(nodes)
            added.extend(tensors)
            info["unrolled"].append(label)
        if not info["unrolled"]:
            return PassResult(model, False, info)
        del g.node[:]
        g.node.extend(new_nodes)
        g.initializer.extend(added)
        used = {v for n in g.node for v in n.input}
        kept = [t for t in g.initializer if t.name in used or t.name not in wanted]
        if len(kept) != len(g.initializer):  # the recurrent weights now live in per-gate copies
            gone = {t.name for t in g.initializer} - {t.name for t in kept}
            del g.initializer[:]
            g.initializer.extend(kept)
            inputs = [i for i in g.input if i.name not in gone]  # IR < 4: initializers listed as inputs
            del g.input[:]
            g.input.extend(inputs)
        return PassResult(model, True, info)


def unroll_recurrent(model, only=None) -> dict[str, Any]:
    """Run :class:`RecurrentUnrollPass` on ``model`` in place (only the nodes named in ``only``, when
    given); returns its ``info``."""
    return RecurrentUnrollPass(only)(model).info
