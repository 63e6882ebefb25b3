"""Anchored real models for the run tests and benchmark (helpers, not tests).

- ``anchored_yolo(size)``: YOLOv8n built from the ultralytics YAML (random weights, ``torch.manual_seed(0)``),
  exported with the TorchScript exporter (opset 17), anchored; cached with :mod:`anpred.cache`.
- ``anchored_zoo_yolo(imgsz)``: the zoo's YOLOv8n (``models.get("yolov8n", imgsz=...)``, dynamo export,
  opset 18+, which onnx2tf and onnx2torch both convert), anchored; cached.
- ``anchored_ppocr_det()``: PP-OCRv4 detection model from the ``rapidocr_onnxruntime`` wheel, anchored.

Anchoring uses ``anpred.instrument.instrument_file`` when it exists; otherwise (while that module is
being written) one anchor per top-level module scope (``/model.N/`` for YOLO, the last node of every
``k``-th block otherwise) is made an output by hand with a matching :class:`AnchorManifest`.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

STAGES = 8
_ANCHOR_OPS = ("Conv", "Concat", "Resize", "ConvTranspose")


def ultralytics_assets() -> Path:
    spec = importlib.util.find_spec("ultralytics")
    return Path(list(spec.submodule_search_locations)[0]) / "assets"


def ppocr_det_path() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")  # importing it fails (no pyclipper)
    return Path(list(spec.submodule_search_locations)[0]) / "models" / "ch_PP-OCRv4_det_infer.onnx"


def _export_yolo(out: Path, size: int) -> None:
    import torch

    from anpred.compat import import_ultralytics

    import_ultralytics()
    from ultralytics import YOLO

    torch.manual_seed(0)
    model = YOLO("yolov8n.yaml").model.eval()
    for m in model.modules():
        if type(m).__name__ == "Detect":
            m.export = True  # one output tensor (1, 84, N) as in ultralytics' own ONNX export
    x = torch.rand(1, 3, size, size)
    torch.onnx.export(
        model, x, str(out), dynamo=False, opset_version=17, input_names=["images"], output_names=["output0"]
    )


def _hand_anchor(src: Path, dst: Path, scope_re: str, every: int = 1) -> None:
    """Make the last output of each scope group an anchor (graph output) and store a manifest.
    ``scope_re`` is matched against node names (or, for unnamed nodes, their first output) of the
    ops in ``_ANCHOR_OPS``; its group 1 is the scope."""
    import onnx

    from anpred.manifest import Anchor, AnchorManifest, Stage
    from anpred.naming import anchor_name, output_anchor_name

    model = onnx.shape_inference.infer_shapes(onnx.load(str(src)))
    types = {vi.name: vi for vi in list(model.graph.value_info) + list(model.graph.output)}
    last: dict[str, int] = {}
    for i, n in enumerate(model.graph.node):
        if n.op_type == "Constant" or (not n.name and n.op_type not in _ANCHOR_OPS):
            continue
        m = re.match(scope_re, n.name or n.output[0])
        if m:
            last[m.group(1)] = i
    picks = sorted(last.items(), key=lambda kv: kv[1])[::every]
    anchors, stages, first = [], [], 0
    outs = {o.name for o in model.graph.output}
    for k, (scope, i) in enumerate(picks):
        node = model.graph.node[i]
        v = node.output[0]
        vi = types.get(v)
        if vi is None:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        name = anchor_name(len(stages), scope)
        anchors.append(
            Anchor(
                name=name,
                value=v,
                stage=len(stages),
                order=i,
                producer=node.name,
                op_type=node.op_type,
                shape=shape,
                dtype=onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name,
                layout="NCHW" if len(shape) == 4 else "unknown",
                scope=scope,
            )
        )
        stages.append(Stage(len(stages), first, i, i - first + 1, float(i - first + 1), [name]))
        first = i + 1
        if v not in outs:
            model.graph.output.append(vi)
    last_stage = max(len(stages) - 1, 0)
    for o in model.graph.output[: len(outs)]:
        tt = o.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        anchors.append(
            Anchor(
                name=output_anchor_name(o.name),
                value=o.name,
                stage=last_stage,
                order=len(model.graph.node) - 1,
                producer="",
                op_type="",
                shape=shape,
                dtype=onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name,
                kind="output",
            )
        )
    man = AnchorManifest(anchors=anchors, stages=stages, model={"source": str(src)}, partition={"hand_made": True})
    man.to_model(model)
    onnx.save(model, str(dst))
    man.save(dst.with_suffix(".manifest.json"))


def _anchor(src: Path, dst: Path, scope_re: str, every: int) -> None:
    try:
        from anpred.instrument import instrument_file
    except ImportError:
        _hand_anchor(src, dst, scope_re, every)
        return
    instrument_file(str(src), str(dst), stages=STAGES)


def anchored_yolo(size: int = 224) -> Path:
    from anpred.cache import cache_key, cached_dir

    def build(d: Path):
        _export_yolo(d / "yolov8n.onnx", size)
        _anchor(d / "yolov8n.onnx", d / "yolov8n.anchored.onnx", r"^/model\.(\d+)/", 1)

    d = cached_dir("test-models", cache_key("yolov8n-anchored", size, _instrument_version(), 2), build)
    return d / "yolov8n.anchored.onnx"


def anchored_zoo_yolo(imgsz: int = 320) -> Path:
    import models
    from anpred.cache import cache_key, cached_dir

    src = models.get("yolov8n", imgsz=imgsz).onnx_path()

    def build(d: Path):
        _anchor(src, d / "yolov8n.anchored.onnx", r"^/model\.(\d+)/", 1)

    d = cached_dir("test-models", cache_key("zoo-yolov8n-anchored", src, _instrument_version(), 1), build)
    return d / "yolov8n.anchored.onnx"


def anchored_ppocr_det() -> Path:
    from anpred.cache import cache_key, cached_dir

    src = ppocr_det_path()

    def build(d: Path):
        _anchor(src, d / "ppocr_det.anchored.onnx", r"^(\w+?)(?:\.tmp_\d+)?$", 6)

    d = cached_dir("test-models", cache_key("ppocr-det-anchored", src, _instrument_version(), 2), build)
    return d / "ppocr_det.anchored.onnx"


def _instrument_version() -> str:
    """The instrumentation code's identity (so a changed pass rebuilds the cached models)."""
    spec = importlib.util.find_spec("anpred.instrument")
    if spec is None:
        return "hand"
    from anpred.onnx_io import sha256_file

    return sha256_file(spec.origin) + str(STAGES)
