"""Known defects of the installed ``onnx.reference`` evaluator that a model runs into, found by probing
the library itself (so the finding disappears when a fixed onnx is installed).

:func:`work_around` rewrites the model the evaluator runs so that it computes what the ONNX spec
defines where the library is known not to (``onnx-reference``, its population members and ``onnx-reference-fp64`` do so
by default, option
``workarounds=False`` runs the library as it is): each
rewrite is exact (the spec's own equations or an equal operator), what was rewritten and why is in
``versions()`` (``reference_workarounds``) and in the report's notes, so the defect stays visible
while the backend votes on every other value of the model. A probe that finds nothing (a fixed onnx)
rewrites nothing. Defects the rewrites cannot take stay: :func:`reference_defects` is called at
``prepare`` on the rewritten model; when a run then fails, the :class:`~anpred.errors.BackendError`
names them (:func:`failure_reason`) beside the library's own error, and ``versions()`` lists them
(``reference_defects``).

Probed (onnx 1.23.2, ``onnx/reference/ops/op_global_max_pool.py``): ``GlobalMaxPool`` reduces the axes
``range(ndim - 2, ndim)`` (the last two) instead of ``range(2, ndim)``, then appends ``ndim - 2`` unit
axes: right for a rank-4 input only. A rank-3 ``[N, C, L]`` input gives ``[N, 1]`` (the channel axis
reduced away) instead of ``[N, C, 1]``; a rank-5 ``[N, C, D, H, W]`` gives ``[N, C, D, 1, 1, 1]``
(D not reduced, rank 6). magika's ``GlobalMaxPool`` of ``[1, 512, 508]`` then made the following
``Squeeze(axes=[2])`` fail (``AxisError: axis 2 is out of bounds for array of dimension 2``).
``GlobalAveragePool`` is probed alike (right in onnx 1.23.2).

Also probed: ``BatchNormalization`` of opsets 9 to 13, with or without a ``momentum`` attribute (an
absent one gets the schema's default 0.9) (``op_batch_normalization.py`` ``BatchNormalization_9``):
the evaluator then normalizes with
``mean * momentum + batch_mean * (1 - momentum)`` (and the variance alike), the batch statistics of the
input, where the operator (inference only in these opsets: one output) uses the given mean and
variance. Paddle2ONNX writes ``momentum`` on every BatchNormalization, so the PP-OCR models reach it
(how far on ppocr-cls: docs/backends-converters.md, 'Measurements: defects on real models').
The run does not fail there: with ``workarounds=False`` the values are the library's (and the
consensus flags them); by default the evaluator is given the library's own inference formula
(:func:`inference_batchnorm_kernel`).
"""

from __future__ import annotations

__all__ = [
    "reference_defects",
    "probe_global_pool",
    "probe_batchnorm_momentum",
    "probe_recurrent_attribute",
    "recurrent_defects",
    "RECURRENT_ATTRIBUTE_PROBES",
    "work_around",
    "inference_batchnorm_kernel",
    "evaluator_lacks",
    "failure_reason",
    "summarize",
    "PROBED_OPS",
    "RECURRENT_PROBE_TOLERANCE",
]

#: operators whose kernel is probed, at each input rank the model gives them
PROBED_OPS = ("GlobalMaxPool", "GlobalAveragePool")


def probe_batchnorm_momentum(opset: int) -> float:
    """max |y - y_spec| of the installed ``onnx.reference`` ``BatchNormalization`` at ``opset`` without a
    ``momentum`` attribute (the schema's default 0.9 applies; onnx 1.23.2 then blends in the batch
    statistics exactly as with an explicit 0.9), on ``x`` = arange(24) as [1, 2, 3, 4], mean 0, var 1,
    scale 1, bias 0, epsilon 0 (the spec's inference output is ``x`` itself); 0.0 when it computes the
    spec's formula."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    inits = [
        numpy_helper.from_array(np.asarray(v, np.float32), n)
        for n, v in (("s", [1, 1]), ("b", [0, 0]), ("m", [0, 0]), ("v", [1, 1]))
    ]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=0.0)
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    y = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])).run(
        None, {"x": x}
    )[0]
    return float(np.abs(np.asarray(y, np.float64) - x).max())


def probe_global_pool(op_type: str, rank: int, dtype=None) -> tuple[list[int], list[int]]:
    """Run ``op_type`` (a global pooling op) of the installed ``onnx.reference`` on an input of shape
    ``[2, 3, 4, ...]`` (``rank`` >= 3 dims) of ``dtype`` (numpy, default float32; values ``arange``).
    Returns ``(the shape the evaluator gave, the shape the ONNX spec defines: [N, C, 1, ...])``.
    Raises whatever the evaluator raises."""
    import numpy as np
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    dtype = np.dtype(dtype or np.float32)
    shape = [2 + i for i in range(rank)]
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    graph = helper.make_graph(
        [helper.make_node(op_type, ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    y = ReferenceEvaluator(model).run(None, {"x": x})[0]
    return list(np.shape(y)), shape[:2] + [1] * (rank - 2)


def reference_defects(model) -> dict[str, str]:
    """``{node name: reason}`` for the nodes of ``model``'s main graph (``onnx.ModelProto``) whose
    operator (:data:`PROBED_OPS`) the installed ``onnx.reference`` computes wrongly at the input rank
    the model gives it (ONNX shape inference; nodes of unknown rank are not probed). Empty when
    nothing is known wrong. Probe results are cached per (op, rank) for the process."""
    import onnx

    out = _batchnorm_defects(model)
    for n in model.graph.node:
        if n.op_type in ("LSTM", "GRU", "RNN") and n.domain in ("", "ai.onnx"):
            found = recurrent_defects(n)
            why = _sequence_lens_defect(model, n)
            if why:
                found.append(why)
            if found:
                out[n.name or n.output[0]] = "; ".join(found)
    nodes = [n for n in model.graph.node if n.op_type in PROBED_OPS and n.domain in ("", "ai.onnx")]
    if not nodes:
        return out
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - ranks unknown: nothing probed
        return out
    ranks = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    for k, n in enumerate(nodes):
        r = ranks.get(n.input[0])
        if r is None or r < 3:
            continue
        got, want = _probe(n.op_type, r)
        if got != want:
            out[n.name or f"{n.op_type}#{k}"] = (
                f"onnx.reference {onnx.__version__} {n.op_type} on a rank-{r} input returns shape {got} where the "
                f"ONNX spec gives {want} (probed on a {[2 + i for i in range(r)]} input; its kernel reduces the "
                "last two axes, not all spatial axes: right for rank 4 only)"
            )
    return out


def _sequence_lens_defect(model, node) -> str | None:
    """onnx 1.23.2's LSTM/GRU/RNN kernels ignore ``sequence_lens`` (a parameter marked unused): the
    reason when ``node`` gives one that is not a constant equal to the sequence length everywhere
    (that one is harmless, and :mod:`passes.recurrent` unrolls such a node), else None."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    if len(node.input) < 5 or not node.input[4]:
        return None
    why = (
        f"onnx.reference {onnx.__version__} {node.op_type} ignores sequence_lens (every sequence is taken "
        "at its full length)"
    )
    init = next((t for t in model.graph.initializer if t.name == node.input[4]), None)
    if init is None:
        return why
    lens = numpy_helper.to_array(init)
    layout = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "layout"), 0)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001
        inferred = model
    vi = next(
        (v for v in list(inferred.graph.input) + list(inferred.graph.value_info) if v.name == node.input[0]), None
    )
    dims = (
        [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim] if vi is not None else []
    )
    t = dims[1 if layout else 0] if len(dims) == 3 else 0
    return None if t and lens.size and bool(np.all(lens == t)) else why


def _batchnorm_defects(model) -> dict[str, str]:
    """The BatchNormalization nodes at a default-domain opset 9 to 13, with or without a ``momentum``
    attribute (the evaluator fills an absent one with the schema's default 0.9), when the installed
    evaluator's kernel there departs from the spec (:func:`probe_batchnorm_momentum`)."""
    import onnx

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    nodes = [n for n in model.graph.node if n.op_type == "BatchNormalization" and n.domain in ("", "ai.onnx")]
    if not nodes or not 9 <= opset <= 13:
        return {}
    if ("BatchNormalization", opset) not in _PROBES:
        try:
            _PROBES["BatchNormalization", opset] = probe_batchnorm_momentum(opset)
        except Exception:  # noqa: BLE001 - no verdict
            _PROBES["BatchNormalization", opset] = 0.0
    dev = _PROBES["BatchNormalization", opset]
    if not dev:
        return {}
    why = (
        f"onnx.reference {onnx.__version__} BatchNormalization (opset {opset}; momentum given or its default 0.9) "
        "normalizes with the running mean/variance blended with the input's batch statistics "
        f"(mean * momentum + batch_mean * (1 - momentum)), not the given mean/variance (probe: off by {dev:.3g})"
    )
    return {n.name or f"BatchNormalization#{k}": why for k, n in enumerate(nodes)}


_PROBES: dict[tuple, object] = {}


def _probe(op_type: str, rank: int) -> tuple[list, list]:
    if (op_type, rank) not in _PROBES:
        try:
            _PROBES[op_type, rank] = probe_global_pool(op_type, rank)
        except Exception as err:  # noqa: BLE001 - a failing kernel is a defect too
            _PROBES[op_type, rank] = ([f"{type(err).__name__}: {err}"], [2, 3] + [1] * (rank - 2))
    return _PROBES[op_type, rank]


def failure_reason(backend: str, defects: dict[str, str], err: BaseException) -> str:
    """The message of the BackendError a run failure becomes when ``defects`` (from
    :func:`reference_defects`) is not empty: the library's error, then the known defects by node."""
    listed = "; ".join(f"node {name!r}: {why}" for name, why in list(defects.items())[:4])
    more = f" (+{len(defects) - 4} more)" if len(defects) > 4 else ""
    return (
        f"{backend}: {type(err).__name__}: {str(err)[:300]} -- the model reaches a known defect of the "
        f"installed onnx.reference: {listed}{more}"
    )


def summarize(defects: dict[str, str]) -> str:
    """One line for ``versions()``: each distinct reason once, with the number of nodes and the first
    three node names."""
    by: dict[str, list[str]] = {}
    for node, why in defects.items():
        by.setdefault(why, []).append(node)
    return "; ".join(
        f"{why} [{len(ns)} node(s): {', '.join(ns[:3])}{' ...' if len(ns) > 3 else ''}]" for why, ns in by.items()
    )


#: the non-default domains ``onnx.reference.ReferenceEvaluator`` has kernels for, and the module of
#: their ``load_op`` (the evaluator's own dispatch, ``ReferenceEvaluator._load_impl``)
EVALUATOR_DOMAINS = {
    "ai.onnx.ml": "onnx.reference.ops.aionnxml",
    "ai.onnx.preview": "onnx.reference.ops.aionnx_preview",
    "ai.onnx.preview.training": "onnx.reference.ops.aionnx_preview_training",
    "experimental": "onnx.reference.ops.experimental",
}


def _domain_lacks(dom: str, op: str, opset: int) -> str:
    """Why ``onnx.reference`` has no kernel for ``op`` of the non-default domain ``dom`` ("" when it
    has one). Model-local functions never reach here (:func:`anpred.onnx_io.model_ops` lists their
    bodies' operators instead)."""
    import importlib

    mod = EVALUATOR_DOMAINS.get(dom)
    if mod is None:
        return (
            f"onnx.reference has no kernel for domain {dom!r} (it runs the ONNX domains and the model's "
            "own functions only)"
        )
    try:
        importlib.import_module(mod).load_op(dom, op, opset or None)
    except Exception as err:  # noqa: BLE001 - NotImplementedError or a version lookup failure
        return f"onnx.reference has no kernel for {dom}::{op} ({type(err).__name__})"
    return ""


def evaluator_lacks(model) -> dict[str, str]:
    """``{op key: reason}`` for the operators of ``model`` (sub-graphs included) the installed
    ``onnx.reference`` cannot run: in the default domain, those it can neither load a kernel class for
    nor expand from the schema's function body (``onnx.reference.ops.load_op`` at the model's opset;
    context-dependent functions count as supported); in another domain, those without a kernel of the
    evaluator's own (``ai.onnx.ml``, ``ai.onnx.preview``, ``ai.onnx.preview.training``,
    ``experimental``), e.g. a custom operator (:func:`_domain_lacks`). Model-local functions count
    as their bodies."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.ops import load_op

    from anpred.onnx_io import model_ops

    out = {}
    for key, (dom, op, opset) in model_ops(model).items():
        if dom:
            why = _domain_lacks(dom, op, opset)
            if why:
                out[key] = why
            continue
        try:
            load_op(dom, op, opset, evaluator_cls=ReferenceEvaluator)
        except NotImplementedError:
            out[key] = f"onnx.reference has no schema for {op} at opset {opset}"
        except Exception as err:  # noqa: BLE001 - RuntimeImplementationError / RuntimeContextError
            if type(err).__name__ != "RuntimeContextError":
                out[key] = (
                    f"onnx.reference has no implementation of {op} at opset {opset} (no kernel class, "
                    "no function body in the schema)"
                )
    return out


# ---- workarounds ------------------------------------------------------------------------------------
#: relative departure (max |kernel - unrolled| / max(1, max |unrolled|), float32) above which the
#: evaluator's recurrent kernel is taken to ignore the probed attribute: kernel and unrolled equations
#: compute the same float32 arithmetic, which over the probe's 3 steps agree to about 1e-6; an ignored
#: clip, input_forget or activation departs by 1e-2 or more (docs/backends-converters.md,
#: 'Measurements: recurrent attribute probes')
RECURRENT_PROBE_TOLERANCE = 1e-3
#: attribute of a recurrent operator -> the setting it is probed with (hidden 3, input 4, 3 steps,
#: batch 2, weights and inputs N(0, 1) x 3 with seed 0: large enough for a clip of 0.05 to bind)
RECURRENT_ATTRIBUTE_PROBES = {
    "LSTM": {
        "clip": {"clip": 0.05},
        "input_forget": {"input_forget": 1},
        "activations": {"activations": ["HardSigmoid", "Relu", "Softsign"]},
    },
    "GRU": {"clip": {"clip": 0.05}, "activations": {"activations": ["HardSigmoid", "Relu"]}},
    "RNN": {"clip": {"clip": 0.05}, "activations": {"activations": ["Relu"]}},
}
_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


def probe_recurrent_attribute(op: str, attribute: str) -> str | None:
    """Whether the installed evaluator's ``op`` kernel (LSTM, GRU, RNN) honours ``attribute`` (a key of
    :data:`RECURRENT_ATTRIBUTE_PROBES`): one node set as listed there is run by the evaluator as it is
    and unrolled into the schema's equations (:func:`passes.recurrent.unroll_recurrent`, run by the
    same evaluator). Returns the reason when the kernel raises or departs by more than
    :data:`RECURRENT_PROBE_TOLERANCE`, None when it agrees. Cached per process.

    onnx 1.23.2 (``op_lstm.py``, ``op_gru.py``, ``op_rnn.py``): the LSTM and GRU kernels ignore
    ``activations``, ``clip`` and ``input_forget`` (parameters marked unused), RNN knows Tanh and Affine
    only ("Unknown activation function 'Relu'") and ignores ``clip``."""
    key = ("recurrent", op, attribute)
    if key in _PROBES:
        return _PROBES[key]
    import copy

    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from models.opclass import rnn_node
    from passes.recurrent import unroll_recurrent

    rng = np.random.default_rng(0)
    node, inits, outs = rnn_node(
        op, "probe", "x", 4, 3, "forward", rng, B=2, **RECURRENT_ATTRIBUTE_PROBES[op][attribute]
    )
    for t in inits:  # weights N(0, 1) x 3: pre-activations well past the probed clip
        arr = onnx.numpy_helper.to_array(t) * np.float32(3)
        t.CopyFrom(onnx.numpy_helper.from_array(arr.astype(np.float32), t.name))
    g = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        inits,
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    unrolled = copy.deepcopy(model)
    x = {"x": (3 * rng.standard_normal((3, 2, 4))).astype(np.float32)}
    why = None
    try:
        if unroll_recurrent(unrolled)["unrolled"]:
            want = ReferenceEvaluator(unrolled).run(None, x)
            try:
                got = ReferenceEvaluator(model).run(None, x)
                worst = max(
                    float(np.abs(np.asarray(a, np.float64) - w).max() / max(1.0, float(np.abs(w).max())))
                    for a, w in zip(got, want)
                )
                if worst > RECURRENT_PROBE_TOLERANCE:
                    why = (
                        f"onnx.reference {onnx.__version__} {op} ignores {attribute} (probe: off by {worst:.3g} "
                        "relative to the unrolled equations)"
                    )
            except Exception as err:  # noqa: BLE001 - the kernel cannot run the setting at all
                why = (
                    f"onnx.reference {onnx.__version__} {op} cannot run {attribute} "
                    f"({type(err).__name__}: {str(err)[:100]})"
                )
    except Exception:  # noqa: BLE001 - no probe: the kernel is trusted
        why = None
    _PROBES[key] = why
    return why


def recurrent_defects(node) -> list[str]:
    """The probed defects (:func:`probe_recurrent_attribute`) a recurrent ``node`` reaches: the
    attributes it sets to something else than the default (``activations`` other than the schema's,
    any ``clip``, ``input_forget`` = 1) that the installed kernel ignores or cannot run."""
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    used = []
    if "clip" in attrs:
        used.append("clip")
    if node.op_type == "LSTM" and int(attrs.get("input_forget", 0)):
        used.append("input_forget")
    acts = [a.decode() if isinstance(a, bytes) else str(a) for a in attrs.get("activations", [])]
    default = _DEFAULT_ACTIVATIONS[node.op_type]
    if acts and [x.lower() for x in acts] != [x.lower() for x in default * (len(acts) // len(default) or 1)]:
        used.append("activations")
    return [why for u in used if (why := probe_recurrent_attribute(node.op_type, u))]


def inference_batchnorm_kernel():
    """A kernel class (``new_ops`` of the evaluator) for ``BatchNormalization`` that computes the
    inference output the ONNX spec defines at opsets 9-13 (given mean and variance) with the library's
    own function (``op_batch_normalization._batchnorm_test_mode``); ``momentum`` is not used."""
    from onnx.reference.op_run import OpRun
    from onnx.reference.ops.op_batch_normalization import _batchnorm_test_mode

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, **_):  # noqa: ARG001
        return (_batchnorm_test_mode(x, scale, bias, mean, var, epsilon=1e-5 if epsilon is None else epsilon),)

    return type("BatchNormalization", (OpRun,), {"op_domain": "", "_run": _run})


def work_around(model) -> dict[str, str]:
    """Rewrite ``model`` (``onnx.ModelProto`` with its weights, main graph) in place so that the
    installed evaluator computes what the ONNX spec defines, where it is known not to; returns
    ``{node name: what was done and why}`` (empty: nothing reached).

    - the nodes :func:`reference_defects` finds: ``GlobalMaxPool``/``GlobalAveragePool`` of a wrong
      rank become ``ReduceMax``/``ReduceMean`` over the spatial axes
      (:mod:`passes.frontend_rewrites`); ``BatchNormalization`` (opsets 9-13, ``momentum``) is listed:
      the caller gives the evaluator :func:`inference_batchnorm_kernel` (the schema fills ``momentum``
      with its default 0.9 when the attribute is absent, so no rewrite of the node can avoid the
      blending);
    - the main graph is sorted topologically with sub-graph reads counted
      (:func:`passes.control_flow.stable_toposort`) when it is not;
    - recurrent nodes that set an attribute the kernel ignores (:func:`recurrent_defects`) are unrolled
      into elementary ops (:mod:`passes.recurrent`); one that cannot be unrolled (a dynamic sequence
      length) stays and :func:`reference_defects` names it;
    - operators the evaluator has no kernel for at the model's opset and that have an exact
      decomposition (:data:`passes.frontend_rewrites.DECOMPOSITIONS`: ``GlobalLpPool``) are decomposed.
    Nodes a rewrite cannot take (unknown rank, dynamic sequence length) are left as they are."""
    import onnx

    from passes.frontend_rewrites import decompose_ops
    from passes.recurrent import RECURRENT_OPS, unroll_recurrent

    from passes.control_flow import stable_toposort

    done: dict[str, str] = {}
    moved = stable_toposort(model.graph)
    if moved:  # the evaluator runs nodes in graph order; a sub-graph read of a later producer fails
        done["(graph order)"] = (
            f"onnx.reference {onnx.__version__} runs nodes in the order given and fails on an If "
            f"whose branches read a value produced after it (\"Unable to find input\"), an order "
            f"ONNX Runtime accepts (onnxconverter-common, quantize_static write it): {moved} "
            "node(s) sorted topologically"
        )
    taken = {n.name for n in model.graph.node}
    for i, n in enumerate(model.graph.node):  # every node named: the findings are keyed by node name
        if not n.name:
            n.name = next(f"{n.op_type}_{i}_{k}" for k in range(len(taken) + 1) if f"{n.op_type}_{i}_{k}" not in taken)
            taken.add(n.name)
    found = reference_defects(model)
    pools = [n for n in model.graph.node if n.op_type in PROBED_OPS and n.name in found]
    if pools:
        info = decompose_ops(model, {n.op_type for n in pools}, only={n.name for n in pools})
        for name in info["rewritten"]:
            done[name] = f"{found[name]}: computed as a Reduce over the spatial axes"
    for n in model.graph.node:
        if n.op_type == "BatchNormalization" and n.name in found:
            done[n.name] = (
                f"{found[n.name]}: computed by the library's own inference formula instead "
                "(_batchnorm_test_mode, the kernel of its opset-14 BatchNormalization with "
                "training_mode=0)"
            )
    recurrent = [n for n in model.graph.node if n.op_type in RECURRENT_OPS and n.domain in ("", "ai.onnx")]
    why = {n.name: "; ".join(d) for n in recurrent if (d := recurrent_defects(n))}
    if why:
        info = unroll_recurrent(model, only=set(why))
        for name in info["unrolled"]:
            done[name] = f"{why[name]}: unrolled into elementary ops"
        # kept (a dynamic sequence length ...): still LSTM/GRU/RNN nodes, reference_defects names them
    from passes.frontend_rewrites import DECOMPOSITIONS

    lacking = set(evaluator_lacks(model))  # default-domain ops by type
    if lacking & set(DECOMPOSITIONS):
        info = decompose_ops(model, lacking & set(DECOMPOSITIONS))
        for name in info["rewritten"]:
            done[name] = (
                f"onnx.reference {onnx.__version__} has no kernel for this operator at the model's opset: decomposed"
            )
    return done
