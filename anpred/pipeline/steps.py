"""The steps of a one-shot test between resolving the model and running it, and after the run:
instrument (dynamic dimensions fixed, configuration inputs bound), map the anchors onto the native
model, save the anchored model, choose the task adapter; judge and write the reports. Each is one
call into the project's own module; :mod:`anpred.pipeline.oneshot` chains them."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from anpred.pipeline.choices import NATIVE_BACKEND
from anpred.pipeline.progress import log
from anpred.pipeline.samples import fix_static_inputs, input_hw, zoo_input_shapes
from anpred.pipeline.subject import PythonPath, QuietLogger, Subject, native_model

__all__ = ["timed", "instrument", "bindings", "task_adapter", "map_native", "save_anchored", "check", "write_reports"]


def task_adapter(subject: Subject, task):
    """The task adapter: ``task`` (:func:`anpred.task.load_adapter`), else the zoo entry's, else None."""
    from anpred.task import load_adapter, zoo_task

    if task == "none":
        return None
    if task is not None:
        layout = getattr(subject.zoo, "output_layout", None) if subject.zoo is not None else None
        return load_adapter(task, layout=layout)
    return zoo_task(subject.zoo) if subject.zoo is not None else None


@contextlib.contextmanager
def timed(seconds: dict[str, float], phase: str):
    """``seconds[phase]``: the wall time of the block (not set when it raises)."""
    t = time.perf_counter()
    yield
    seconds[phase] = time.perf_counter() - t


def instrument(subject: Subject, model_opts, shapes: dict[str, tuple] | None, details: dict[str, Any], quiet: bool):
    """Load the subject's ONNX file, fix its dynamic input dimensions (``details["fixed_dims"]``):
    ``shapes`` ({input name: shape, None where a dimension stays dynamic}: stated by the user or read
    from the given inputs, :mod:`anpred.pipeline.shapes`) over a zoo model's declared shapes, else
    batch 1 and ``model_opts.imgsz``; bind its configuration inputs (:func:`_bind`) and instrument it
    (``model_opts``: :class:`anpred.options.ModelOptions`); the manifest names the model, its origin
    and the bound inputs. Returns ``(anchored, manifest)``."""
    from anpred.instrument import instrument_model
    from anpred.onnx_io import load_model

    proto = load_model(subject.onnx_path, load_external=False)
    declared = {**(zoo_input_shapes(subject) or {}), **(shapes or {})}
    fixed = fix_static_inputs(proto, input_hw(subject, model_opts.imgsz), declared or None)
    if fixed:
        log(f"dynamic input dimensions fixed: {', '.join(fixed)}", quiet)
        details["fixed_dims"] = fixed
    proto = _bind(subject, proto, bindings(subject, model_opts.bind), details, quiet)
    anchored, manifest = instrument_model(
        proto, stages=model_opts.stages, max_cut_width=model_opts.max_cut_width, source_path=subject.onnx_path
    )
    manifest.model["name"] = subject.label
    if subject.origin:
        manifest.model["origin"] = dict(subject.origin)
    if details.get("bound_inputs"):
        manifest.model["bound_inputs"] = details["bound_inputs"]
    log(f"instrumented {subject.onnx_path.name}: {manifest.counts()}", quiet)
    for note in manifest.partition.get("notes", []):  # e.g. wide cuts inside a long block (passes.wide_cuts)
        log(f"partition: {note}", quiet)
    return anchored, manifest


def bindings(subject: Subject, bind: dict[str, Any] | None) -> dict[str, Any]:
    """The configuration inputs to bind: the zoo entry's (``ZooModel.bindings``) updated with the
    user's ``bind`` (parsed, :func:`passes.bind_inputs.parse_bindings`)."""
    return {**(subject.zoo.bindings() if subject.zoo is not None else {}), **(bind or {})}


def _bind(subject: Subject, proto, values: dict[str, Any], details: dict[str, Any], quiet: bool):
    """``proto`` with its configuration inputs bound to ``values`` (:func:`bindings`;
    :func:`passes.bind_inputs.bind_inputs`). Records ``details["bound_inputs"]``
    ({name: value}) and ``details["binding"]`` (what the pass folded and inlined); ``proto`` itself
    when nothing is bound. Raises InputError (unknown name, a value that does not fit)."""
    from passes.bind_inputs import bind_inputs

    if not values:
        return proto
    bound, info = bind_inputs(proto, values)
    details["bound_inputs"] = {n: b["value"] for n, b in info["bound"].items()}
    details["binding"] = {k: (len(v) if k == "inlined" else v) for k, v in info.items() if k != "bound"}
    left = f"; If left: {', '.join(info['ifs_left'])}" if info["ifs_left"] else ""
    log(
        f"bound {', '.join(f'{n}={v}' for n, v in details['bound_inputs'].items())}: {info['folded']} nodes folded, "
        f"{len(info['inlined'])} If inlined{left}",
        quiet,
    )
    return bound


def map_native(
    subject: Subject,
    manifest,
    anchored,
    names: list[str],
    explicit: bool,
    tmp: Path,
    details: dict[str, Any],
    quiet: bool,
) -> dict[str, dict[str, int]]:
    """Map the anchors onto the native model when its native backend runs (``tmp/mapping.json``).
    Returns native backend -> counts. A model that cannot be mapped raises when the backends were
    given, else its native backend is left out of ``names`` (``details["native_left_out"]``)."""
    from anpred.onnx_io import atomic_write_text, to_json

    mapping: dict[str, dict[str, int]] = {}
    native = NATIVE_BACKEND.get(subject.framework)
    if native is None or native not in names:
        return mapping
    from exporters.mapping import MappingError, map_anchors

    try:
        with PythonPath(subject.sys_path), QuietLogger("ultralytics"):
            net, example = native_model(subject)
            rep = map_anchors(
                manifest,
                net,
                subject.framework,
                onnx_model=anchored,
                example_inputs=tuple(example) if subject.framework == "torch" else None,
            )
        mapping[native] = rep.counts(native)
        atomic_write_text(tmp / "mapping.json", to_json(rep.to_dict(), indent=1))
        c = mapping[native]
        log(
            f"mapped anchors onto the {subject.framework} model: {c['exact']} exact, {c['equivalent']} "
            f"equivalent, {c['unmapped']} unmapped",
            quiet,
        )
    except MappingError as err:
        if explicit:
            raise
        names.remove(native)
        log(f"{native} left out: {err}", quiet)
        details["native_left_out"] = str(err)
    finally:
        net = example = None
    return mapping


def save_anchored(subject: Subject, anchored, manifest, tmp: Path) -> None:
    """``tmp/anchored.onnx`` (manifest in its metadata) and ``tmp/anchored.anchors.json``."""
    from anpred.onnx_io import atomic_write_text, save_model

    manifest.to_model(anchored)
    # the report folder is self-contained: external weights are streamed next to the anchored model
    save_model(anchored, tmp / "anchored.onnx", source_path=subject.onnx_path, copy_external_data=True)
    atomic_write_text(tmp / "anchored.anchors.json", manifest.to_json())


def check(tmp: Path, final: Path, judge):
    """Align and judge the run (:func:`anpred.judge.check_run` with the :class:`anpred.options.JudgeOptions`
    ``judge``); the report names the final run folder."""
    from anpred.judge import check_run

    report = check_run(tmp / "run", **judge.check_kwargs())
    report.run_dir = str(final / "run")
    return report


def write_reports(report, tmp: Path) -> None:
    """``tmp/report.json`` and ``tmp/report.html``."""
    from anpred.report import write_html, write_json

    write_json(report, tmp / "report.json")
    write_html(report, tmp / "report.html")
