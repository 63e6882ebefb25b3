"""The one-shot pipeline: from a model to a verdict in one call (``anpred test`` / ``anpred.test``).

    result = anpred.test("yolov8n-doclaynet", out="out/doclaynet")   # a zoo name
    result = anpred.test("model.onnx", backends=["ort", "openvino"], samples=4)  # + witnesses
    result = anpred.test("mypkg.nets:small_cnn", out="out/cnn")        # a factory module:function
    if not result:                                                      # truthy when consistent
        print(result.flagged_backends, result.report_html)

Each step is the project's own module; the pipeline only chains them. Its modules, in the order of
the walk:

- :mod:`anpred.pipeline.choices`: default backends, samples and sizes; the checks of the options;
- :mod:`anpred.pipeline.subject`: MODEL (an ``.onnx`` file, a zoo name or a factory
  ``module:function``) resolved into a :class:`Subject` (exported when needed);
- :mod:`anpred.pipeline.samples`: dynamic input dimensions fixed, the samples chosen (a zoo model's
  real images, given inputs, seeded random ones);
- :mod:`anpred.pipeline.shapes`, :mod:`anpred.pipeline.buckets`: input shapes from the user, shape buckets;
- :mod:`anpred.pipeline.witnesses`, :mod:`anpred.pipeline.costs`: which backends run (witnesses by
  measured cost, defaults skipped with their reason);
- :mod:`anpred.pipeline.steps`, :mod:`anpred.pipeline.folder`, :mod:`anpred.pipeline.streamed`: the
  steps, the report folder, the streamed step;
- :mod:`anpred.pipeline.stream`: a dataset run and judged in chunks, a driver over named steps: its
  inputs (:mod:`anpred.pipeline.stream_inputs`), the chunks' judge (:mod:`anpred.pipeline.stream_judge`),
  the kept samples (:mod:`anpred.pipeline.stream_kept`), its state and checkpoint
  (:mod:`anpred.pipeline.stream_state`), its testing hooks (:mod:`anpred.pipeline.stream_hooks`);
  :mod:`anpred.pipeline.scratch`: where its chunks live;
- :mod:`anpred.pipeline.oneshot`: :func:`test`, the walk resolve -> shapes -> instrument -> choose the
  backends -> map -> prepare inputs -> run -> check -> write reports, in the report folder;
- :mod:`anpred.pipeline.result`: :class:`TestResult`, :class:`DemoResult`, :func:`format_standing`;
- :mod:`anpred.pipeline.demos`: :func:`demo` (README's first command; a module name apart from the
  function's);
- :mod:`anpred.pipeline.progress`: the progress lines on stderr.

The report folder ``out`` (built in a hidden sibling folder and renamed at the end, :mod:`anpred.folders`:
an error or an interrupt leaves nothing half-written)::

    out/anchored.onnx            instrumented model (manifest in its metadata)
    out/anchored.anchors.json    anchor manifest (with the native mapping)
    out/exported.onnx            the export, for factory models only
    out/mapping.json             native mapping report (models with a native origin)
    out/run/                     run store (anpred.run/1: inputs, tensors per backend, statuses, logs)
    out/report.json, report.html verdict (anpred.check/1) and HTML report
    out/test.json                what was tested: model, options, inputs, backends, phase timings

Default backends (:func:`default_backends`): ``ort``, ``openvino``, ``torch`` (onnx2torch), ``mnn``,
``ncnn`` (five independent fp32 families, the quickest by measured cost), plus ``torch-native``
(PyTorch origin) or ``tf-native`` (Keras origin); ``precision`` adds the fp16 and int8 populations,
``all_backends`` every family (:data:`ALL_FP32`), the float64 execution and both populations. A
default backend that is not installed or cannot take the model is skipped with its reason; named
backends giving fewer than three voting families get witnesses (:mod:`anpred.pipeline.witnesses`).
Default inputs: a zoo model's own real images (ultralytics' photographs, rendered document pages or
text lines) with its own preprocessing;
for other models with an image input (4-D, 3 channels) the ultralytics photographs with seeded random
crops (``random:images``), otherwise seeded uniform random arrays (``random:uniform``); given arrays
fix the dynamic dimensions, in shape buckets when they differ (:mod:`anpred.pipeline.shapes`).
"""

from anpred.pipeline.choices import (
    ALL_FP32,
    DEFAULT_IMGSZ,
    DEFAULT_SAMPLES,
    NATIVE_BACKEND,
    ONNX_BACKENDS,
    POPULATIONS,
    QUICK_FP32,
    check_native_backends,
    default_backends,
    parse_backend_list,
)
from anpred.pipeline.demos import DEMO_MODELS, demo
from anpred.pipeline.oneshot import test
from anpred.pipeline.result import TEST_SCHEMA, DemoResult, TestResult, format_standing
from anpred.pipeline.samples import SOURCES_FILE
from anpred.pipeline.subject import Subject, resolve_model

__all__ = [
    "test",
    "demo",
    "resolve_model",
    "default_backends",
    "parse_backend_list",
    "check_native_backends",
    "Subject",
    "TestResult",
    "DemoResult",
    "ONNX_BACKENDS",
    "NATIVE_BACKEND",
    "DEMO_MODELS",
    "format_standing",
    "DEFAULT_SAMPLES",
    "DEFAULT_IMGSZ",
    "TEST_SCHEMA",
    "SOURCES_FILE",
    "QUICK_FP32",
    "ALL_FP32",
    "POPULATIONS",
]
