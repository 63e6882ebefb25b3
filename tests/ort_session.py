"""The tests' one ONNX Runtime session: the CPU execution provider on a model, the plain reference many
tests compare a backend, a pass or a converter against.

``model`` is an ``onnx.ModelProto``, its serialized bytes, or a path. Options (each left at ONNX Runtime's
default when not given): ``threads`` (``intra_op_num_threads``), ``level`` (a
``GraphOptimizationLevel`` name, e.g. ``"ORT_DISABLE_ALL"``), ``x64quantprecision`` (ONNX Runtime's
session option of that name: its U8U8 integer kernels, where the u8s8 ones would sum pairs in
saturating int16 on a CPU without VNNI/AMX; no effect on a CPU with them), ``quiet`` (log severity 3:
errors only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def ort_session(
    model: Any,
    *,
    threads: int | None = None,
    level: str | None = None,
    x64quantprecision: bool = False,
    quiet: bool = False,
):
    """An ``onnxruntime.InferenceSession`` on ``model`` with the CPU execution provider."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads is not None:
        so.intra_op_num_threads = threads
    if level is not None:
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if x64quantprecision:
        so.add_session_config_entry("session.x64quantprecision", "1")
    if quiet:
        so.log_severity_level = 3
    if isinstance(model, (str, Path)):
        src = str(model)
    elif isinstance(model, bytes):
        src = model
    else:
        src = model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def ort_outputs(model: Any, feeds: dict, names: list[str] | None = None, **options: Any) -> dict[str, Any]:
    """Graph output name -> array of one run of ``model`` on ``feeds`` (``names``: only those outputs)."""
    s = ort_session(model, **options)
    names = names or [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feeds)))


def ort_anchors(model: Any, manifest, feeds: dict, **options: Any) -> dict[str, Any]:
    """Anchor name -> array of one run of the anchored ``model`` on ``feeds`` (``manifest``:
    :class:`anpred.manifest.AnchorManifest`; an original graph output is read by its value name)."""
    out = ort_outputs(model, feeds, **options)
    return {a.name: out[a.value if a.kind == "output" else a.name] for a in manifest.anchors}
