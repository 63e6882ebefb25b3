"""Known defects of the installed ``onnx.reference`` evaluator that a model runs into, found by probing
the library itself (so the finding disappears when a fixed onnx is installed).

:func:`work_around` rewrites the model the evaluator runs so that it computes what the ONNX spec
defines where the library is known not to (``onnx-reference``, its population members and ``onnx-reference-fp64`` do so by default, option
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

Also probed: ``BatchNormalization`` of opsets 9 to 13 with an explicit ``momentum`` attribute
(``op_batch_normalization.py`` ``BatchNormalization_9``): the evaluator then normalizes with
``mean * momentum + batch_mean * (1 - momentum)`` (and the variance alike), the batch statistics of the
input, where the operator (inference only in these opsets: one output) uses the given mean and
variance. Paddle2ONNX writes ``momentum`` on every BatchNormalization: on ppocr-cls (opset 11) the
evaluator's first BatchNormalization output is 0.10 nRMSE from ONNX Runtime's and the last anchor 0.32.
The run does not fail there; the values are the library's (and the consensus can flag them).
"""

from __future__ import annotations

__all__ = ["reference_defects", "probe_global_pool", "probe_batchnorm_momentum", "probe_recurrent", "work_around",
           "inference_batchnorm_kernel", "evaluator_lacks",
           "failure_reason", "summarize", "PROBED_OPS", "RECURRENT_PROBE_TOLERANCE"]

#: operators whose kernel is probed, at each input rank the model gives them
PROBED_OPS = ("GlobalMaxPool", "GlobalAveragePool")


def probe_batchnorm_momentum(opset: int) -> float:
    """max |y - y_spec| of the installed ``onnx.reference`` ``BatchNormalization`` at ``opset`` with
    ``momentum=0.9``, on ``x`` = arange(24) as [1, 2, 3, 4], mean 0, var 1, scale 1, bias 0, epsilon 0
    (the spec's inference output is ``x`` itself); 0.0 when it computes the spec's formula."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    inits = [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in
             (("s", [1, 1]), ("b", [0, 0]), ("m", [0, 0]), ("v", [1, 1]))]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=0.0, momentum=0.9)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    y = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])).run(None, {"x": x})[0]
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
    graph = helper.make_graph([helper.make_node(op_type, ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", elem, None)])
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
                "last two axes, not all spatial axes: right for rank 4 only)")
    return out


def _batchnorm_defects(model) -> dict[str, str]:
    """The BatchNormalization nodes with a ``momentum`` attribute, at a default-domain opset 9 to 13,
    when the installed evaluator's kernel there departs from the spec (:func:`probe_batchnorm_momentum`)."""
    import onnx

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    nodes = [n for n in model.graph.node if n.op_type == "BatchNormalization" and n.domain in ("", "ai.onnx")
             and any(a.name == "momentum" for a in n.attribute)]
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
    why = (f"onnx.reference {onnx.__version__} BatchNormalization (opset {opset}) with a momentum attribute "
           "normalizes with the running mean/variance blended with the input's batch statistics "
           f"(mean * momentum + batch_mean * (1 - momentum)), not the given mean/variance (probe: off by {dev:.3g})")
    return {n.name or f"BatchNormalization#{k}": why for k, n in enumerate(nodes)}


_PROBES: dict[tuple[str, int], object] = {}


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
    return (f"{backend}: {type(err).__name__}: {str(err)[:300]} -- the model reaches a known defect of the "
            f"installed onnx.reference: {listed}{more}")


def summarize(defects: dict[str, str]) -> str:
    """One line for ``versions()``: each distinct reason once, with the number of nodes and the first
    three node names."""
    by: dict[str, list[str]] = {}
    for node, why in defects.items():
        by.setdefault(why, []).append(node)
    return "; ".join(f"{why} [{len(ns)} node(s): {', '.join(ns[:3])}{' ...' if len(ns) > 3 else ''}]"
                     for why, ns in by.items())


def evaluator_lacks(model) -> dict[str, str]:
    """``{op type: reason}`` for the default-domain operators of ``model`` (sub-graphs included) that
    the installed ``onnx.reference`` can neither load a kernel class for nor expand from the schema's
    function body (``onnx.reference.ops.load_op`` at the model's opset; context-dependent functions
    count as supported). Other domains are not listed."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.ops import load_op

    from anpred.onnx_io import model_ops

    out = {}
    for key, (dom, op, opset) in model_ops(model).items():
        if dom:
            continue
        try:
            load_op(dom, op, opset, evaluator_cls=ReferenceEvaluator)
        except NotImplementedError:
            out[key] = f"onnx.reference has no schema for {op} at opset {opset}"
        except Exception as err:  # noqa: BLE001 - RuntimeImplementationError / RuntimeContextError
            if type(err).__name__ != "RuntimeContextError":
                out[key] = (f"onnx.reference has no implementation of {op} at opset {opset} (no kernel class, "
                            "no function body in the schema)")
    return out


# ---- workarounds ------------------------------------------------------------------------------------
#: relative departure (max |kernel - unrolled| / max(1, max |unrolled|), float32) above which the
#: evaluator's recurrent kernel is taken to ignore an attribute of the node: the two compute the same
#: equations in float32, which for the few probe steps agree to about 1e-6; an ignored activation,
#: clip or input_forget departs by 1e-2 or more (measured on tests/test_converter_gaps.py's networks)
RECURRENT_PROBE_TOLERANCE = 1e-3
#: time steps and batch of the recurrent probe when the model's are not static
PROBE_STEPS = 3


def probe_recurrent(model, node, types: dict) -> str | None:
    """Whether the installed evaluator computes the recurrent ``node`` (``LSTM``/``GRU``/``RNN`` of
    ``model``'s main graph; ``types``: value name -> ``TypeProto`` from shape inference) as its
    equations define: the node alone, its weights converted to float32, is run by the evaluator on
    N(0, 1) inputs (seed 0), once as it is and once unrolled into elementary ops
    (:func:`passes.recurrent.unroll_recurrent`, the schema's equations). Returns the reason when the
    kernel raises or departs by more than :data:`RECURRENT_PROBE_TOLERANCE`, None when it agrees or
    when the probe cannot be built (a non-static shape, weights that are not initializers, a node the
    unrolling keeps).

    onnx 1.23.2 (``op_lstm.py``, ``op_gru.py``, ``op_rnn.py``): the LSTM and GRU kernels ignore
    ``activations``, ``activation_alpha``/``beta``, ``clip``, ``input_forget`` and ``sequence_lens``
    (parameters marked unused), RNN knows Tanh and Affine only ("Unknown activation function 'Relu'")."""
    import copy

    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from passes.recurrent import unroll_recurrent

    inits = {t.name: t for t in model.graph.initializer}
    probe_inits, probe_inputs, feeds = [], [], {}
    rng = np.random.default_rng(0)
    for k, name in enumerate(node.input):
        if not name:
            continue
        if name in inits:
            arr = numpy_helper.to_array(inits[name])
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float32)
            probe_inits.append(numpy_helper.from_array(arr, name))
            continue
        t = types.get(name)
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.tensor_type.shape.dim] \
            if t is not None and t.tensor_type.HasField("shape") else []
        if not dims or 0 in dims or k == 4:  # a dynamic shape, or sequence_lens computed in the graph
            return None
        probe_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
        feeds[name] = rng.standard_normal(dims).astype(np.float32)
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node.output if o]
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=14)
    probe = helper.make_model(helper.make_graph([copy.deepcopy(node)], "probe", probe_inputs, outs, probe_inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    unrolled = copy.deepcopy(probe)
    try:
        if not unroll_recurrent(unrolled)["unrolled"]:
            return None
        want = ReferenceEvaluator(unrolled).run(None, feeds)
    except Exception:  # noqa: BLE001 - no probe: the kernel is trusted
        return None
    import onnx

    try:
        got = ReferenceEvaluator(probe).run(None, feeds)
    except Exception as err:  # noqa: BLE001 - the kernel cannot run this node at all
        return (f"onnx.reference {onnx.__version__} {node.op_type} cannot run this node "
                f"({type(err).__name__}: {str(err)[:120]})")
    worst = max(float(np.abs(np.asarray(g, np.float64) - w).max() / max(1.0, float(np.abs(w).max())))
                for g, w in zip(got, want))
    if worst > RECURRENT_PROBE_TOLERANCE:
        used = sorted(a.name for a in node.attribute if a.name in
                      ("activations", "activation_alpha", "activation_beta", "clip", "input_forget"))
        return (f"onnx.reference {onnx.__version__} {node.op_type} departs from its equations on this node by "
                f"{worst:.3g} (relative; probe against the unrolled equations)"
                + (f"; it ignores attributes the node sets: {', '.join(used)}" if used else ""))
    return None


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
    - recurrent nodes whose kernel departs from their equations (:func:`probe_recurrent`) are unrolled
      into elementary ops (:mod:`passes.recurrent`);
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
        done["(graph order)"] = (f"onnx.reference {onnx.__version__} runs nodes in the order given and fails on an If "
                                 f"whose branches read a value produced after it (\"Unable to find input\"), an order "
                                 f"ONNX Runtime accepts (onnxconverter-common, quantize_static write it): {moved} "
                                 "node(s) sorted topologically")
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
            done[n.name] = (f"{found[n.name]}: computed by the library's own inference formula instead "
                            "(_batchnorm_test_mode, the kernel of its opset-14 BatchNormalization with training_mode=0)")
    recurrent = [n for n in model.graph.node if n.op_type in RECURRENT_OPS and n.domain in ("", "ai.onnx")]
    if recurrent:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:  # noqa: BLE001
            inferred = model
        types = {vi.name: vi.type for vi in list(inferred.graph.input) + list(inferred.graph.value_info)
                 + list(inferred.graph.output)}
        why = {}
        for n in recurrent:
            reason = probe_recurrent(model, n, types)
            if reason:
                why[n.name or n.output[0]] = reason
        if why:
            for name in unroll_recurrent(model, only=set(why))["unrolled"]:
                done[name] = f"{why[name]}: unrolled into elementary ops"
    from passes.frontend_rewrites import DECOMPOSITIONS

    lacking = set(evaluator_lacks(model))  # default-domain ops by type
    if lacking & set(DECOMPOSITIONS):
        info = decompose_ops(model, lacking & set(DECOMPOSITIONS))
        for name in info["rewritten"]:
            done[name] = f"onnx.reference {onnx.__version__} has no kernel for this operator at the model's opset: decomposed"
    return done
