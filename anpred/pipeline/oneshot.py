"""The one-shot pipeline: from a model to a verdict in one call (:func:`test`, ``anpred test``).

:func:`test` checks every option and takes a quick look at the model before the output folder is
touched, then builds the report folder in a hidden partial sibling (:mod:`anpred.folders`) and
commits it when complete. :func:`_pipeline` is the walk, one call per step, each step one module of
the project:

1. **resolve** the model (:func:`anpred.pipeline.subject.resolve_model`, done by :func:`test`);
2. **instrument** it (:func:`anpred.instrument.instrument_model`, ``stages`` K, dynamic input
   dimensions fixed first: :func:`anpred.pipeline.samples.fix_static_inputs`, then configuration
   inputs bound: :func:`passes.bind_inputs.bind_inputs`, the zoo's ``ZooInput.bind`` and the user's
   ``bind``) and record the origin and the bound inputs in the manifest (``manifest.model["origin"]``,
   ``manifest.model["bound_inputs"]``);
3. **map** the anchors onto the native graph (:func:`exporters.mapping.map_anchors`, torch-native /
   tf-native) when a native backend runs; without an explicit backend list a model that cannot be
   mapped runs without its native backend;
4. **prepare the inputs** (:func:`anpred.pipeline.samples.prepare_inputs`);
5. **run** every backend in its own process (:func:`anpred.run.run_model`, mode ``tensors``);
6. **check**: align and judge (:func:`anpred.judge.check_run`: :class:`anpred.align.Aligner` then
   the consensus oracle of ``docs/oracle.md``);
7. **write the reports**: ``report.json`` (schema ``anpred.check/1``), ``report.html`` (plots
   embedded), then, once committed, ``test.json`` and optionally a history database row
   (:func:`anpred.history.append`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from anpred.errors import AnpredError, OutputPathError
from anpred.pipeline.choices import NATIVE_BACKEND, check_native_backends, check_test_options, default_backends
from anpred.pipeline.progress import log
from anpred.pipeline.result import TestResult
from anpred.pipeline.samples import fix_static_inputs, input_hw, prepare_inputs, record_zoo_inputs, zoo_input_shapes
from anpred.pipeline.subject import PythonPath, QuietLogger, Subject, check_model, native_model, resolve_model

__all__ = ["test", "prepare_out", "relocated", "Prepared", "prepare_test", "prepare_samples", "finish_test",
           "finish_run_store"]


def test(model: str | os.PathLike, *, out: str | os.PathLike | None = None,
         backends: Iterable[str] | str | None = None, inputs: str | None = None, samples: int | None = None,
         stages: int | None = None, max_cut_width: int = 4, imgsz: int | tuple[int, int] | None = None,
         seed: int = 0, factory_kwargs: dict[str, Any] | None = None, oracle: str = "consensus",
         config: str | os.PathLike | None = None, history: str | os.PathLike | None = None,
         allow_incomplete: bool = False, timeout_s: float = 600, overwrite: bool = False,
         quiet: bool = False, bind: dict[str, Any] | Iterable[str] | str | None = None,
         drill: bool = False, task: str | Any | None = None, labels: Any = None,
         stream: bool = False, chunk: int | None = None, keep: int = 4, side_by_side: bool = False,
         positions: int | None = None, resume: bool = False) -> TestResult:
    """Test ``model`` end to end: export (when needed), instrument, map, run, align, judge, report.

    Args:
        model: an ``.onnx`` path, a zoo name (``anpred zoo`` lists them) or a factory
            ``module:function`` returning ``(torch.nn.Module | keras.Model, example_inputs)``
            (``example_inputs``: a tuple of tensors, NCHW float32 for torch image models; the
            function must be importable in a fresh process: backend processes rebuild the model).
        out: the report folder to create (default ``anpred-test/<model label>``).
        backends: backend names (list or comma-separated); default :func:`default_backends`.
        inputs: a folder or file of images / ``.npy`` / ``.npz``, or ``random:...`` (see
            :mod:`anpred.inputs`); default: the zoo model's real images, the ultralytics photographs
            for image inputs, seeded uniform arrays otherwise.
        samples: number of generated samples (default 3; ignored for files).
        stages: number of stages K (default: automatic, about 8); ``max_cut_width``: most tensors
            per stage boundary.
        imgsz: input size (int or (H, W)) for resizable zoo models and dynamic ONNX dimensions
            (default: the zoo size, else 640).
        seed: seed of the random inputs, of seeded zoo weights and of a zoo model's rendered pages or
            text lines (pages ``seed, seed + 1, ...``; the ultralytics photographs are fixed files).
        factory_kwargs: keyword arguments for a factory.
        oracle, config, allow_incomplete: see :func:`anpred.judge.check_run` (``allow_incomplete``:
            a report with gaps, e.g. a backend that failed, exits 0); history: SQLite file to append to.
        timeout_s: per backend limit in seconds (prepare + all samples).
        overwrite: replace ``out`` when it holds an earlier test (only once the new one is complete).
        quiet: no progress output on stderr.
        bind: configuration inputs fixed to a value before instrumentation, ``{input name: value}``
            or ``"NAME=VALUE"`` texts (:func:`passes.bind_inputs.parse_bindings`; VALUE is JSON:
            ``"sr=16000"``). Each becomes a constant of the input's dtype and shape, the ``If``
            nodes it decides are inlined (:mod:`passes.bind_inputs`), and the samples no longer
            feed it (a given ``.npz`` that holds it must hold the bound value). A zoo model's own
            bindings (``ZooInput.bind``: silero-vad's ``sr`` = 16000) apply too; ``bind`` overrides
            them. Recorded in ``test.json`` (``details.bound_inputs``) and the manifest.
        drill: after judging, replay each stage alone from the consensus and drill each flagged fp32
            backend down to the operator, with a verified standalone repro (:func:`anpred.drill.drill_run`;
            ``out/drill/``, ``report.drill``, ``verdicts[b].culprit``).
        task: task metrics of every backend against the consensus (:mod:`anpred.task`): ``detect`` |
            ``classify`` | ``dense`` | ``module:function`` | an adapter; default: the zoo entry's task
            (YOLO detectors: detect; PP-OCR detector: dense; classifiers: classify), none otherwise.
            ``"none"`` turns it off. ``report.task``; its headlines lead the terminal and HTML reports.
        labels: ground truth for the task (:func:`anpred.task.load_labels`): each backend's accuracy
            and its delta to the consensus.
        stream: run ``inputs`` (a folder) as a dataset, in chunks of ``chunk`` samples judged as they
            come, memory flat in the number of inputs; the run folder keeps the ``keep`` most deviating
            samples per backend (:mod:`anpred.pipeline.stream`); ``chunk`` None: as many samples as write
            1 GiB of anchor tensors over all backends (:func:`anpred.pipeline.stream.auto_chunk`, at most 64);
            ``side_by_side``: the backends of a chunk run at once, each in its own long-lived worker,
            the cores divided among them (:func:`anpred.run.spec.split_threads`; default False: one
            after the other, each with its library's default threads); ``positions``: intermediate
            anchors judged on that many sampled positions (:mod:`anpred.judge.positions`; None: 65536;
            0: every element). A streamed run writes a checkpoint after each judged chunk into
            ``.<out name>.stream/`` beside ``out`` (removed once the run is complete); ``resume``
            continues an interrupted one from it (:mod:`anpred.pipeline.stream_state`).

    Returns:
        :class:`TestResult` (truthy when consistent; ``.report`` is the CheckReport).

    Raises:
        ModelLoadError: an unreadable ``.onnx``; AnpredError: unknown zoo name, unusable factory,
        bad inputs, an ``out`` folder that holds something else; InputError: a ``bind`` entry that is
        not ``NAME=VALUE``, names no graph input (the message lists them) or does not fit its input's
        dtype and shape; BackendError: an unknown, empty
        or repeated backend entry, a single backend, a native backend that does not fit the model
        (checked before any export). Nothing is
        written then. A backend that fails or crashes does not raise: see ``result.statuses``.
    """
    from anpred.folders import commit_partial
    from anpred.onnx_io import atomic_write_text, to_json

    t_start = time.perf_counter()
    seconds: dict[str, float] = {}
    from passes.bind_inputs import parse_bindings

    if drill and oracle == "threshold":
        raise AnpredError("--drill needs the consensus oracle (--oracle consensus or both): the drill-down "
                          "judges every replay against the consensus of the backends")
    backends = check_test_options(oracle=oracle, samples=samples, stages=stages, backends=backends, inputs=inputs,
                                  config=config, history=history)
    if resume and not stream:
        raise AnpredError("--resume continues an interrupted streamed run: it needs --stream")
    if labels == "folders" and inputs is not None and Path(str(inputs)).is_dir():  # before anything runs
        from anpred.inputs import ARRAY_EXTS, IMAGE_EXTS, input_files
        from anpred.task import load_labels

        load_labels("folders", [{"id": f.name, "source": str(f)} for f in input_files(Path(str(inputs)),
                                                                                      IMAGE_EXTS + ARRAY_EXTS)],
                    "classify")
    bind = parse_bindings(bind)
    label_guess = check_model(model, backends)  # errors: nothing written
    final = (Path(out) if out is not None else Path("anpred-test") / label_guess).absolute()
    tmp = prepare_out(final, overwrite)
    try:
        with _timed(seconds, "resolve"):
            subject = resolve_model(model, imgsz=imgsz, seed=seed, factory_kwargs=factory_kwargs, workdir=tmp,
                                    quiet=quiet, backends=backends)
        result = _pipeline(subject, final, tmp, backends=backends, inputs=inputs, samples=samples, stages=stages,
                           max_cut_width=max_cut_width, imgsz=imgsz, seed=seed, oracle=oracle, config=config,
                           allow_incomplete=allow_incomplete, timeout_s=timeout_s, quiet=quiet, seconds=seconds,
                           bind=bind, drill=drill, task=task, labels=labels,
                           stream={"chunk": chunk, "keep": int(keep), "side_by_side": bool(side_by_side),
                                   "positions": positions, "resume": bool(resume)}
                           if stream else None)
        commit_partial(tmp, final)
        # what was tested names the final place of files built in the partial folder (a factory's export)
        result.details = relocated(result.details, tmp, final)
    except BaseException as err:
        if stream:
            _keep_checkpoint(stream_checkpoint_dir(final), tmp, err)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if stream:
        shutil.rmtree(stream_checkpoint_dir(final), ignore_errors=True)
    if history is not None and result.report.status != "error":
        from anpred.history import append

        append(history, result.report)
    seconds["total"] = time.perf_counter() - t_start
    atomic_write_text(final / "test.json", to_json(result.to_dict(), indent=1))
    return result


def _pipeline(subject: Subject, final: Path, tmp: Path, *, backends, inputs, samples, stages, max_cut_width,
              imgsz, seed, oracle, config, allow_incomplete, timeout_s, quiet, seconds,
              bind: dict[str, Any] | None = None, drill: bool = False, task=None, labels=None,
              stream: dict[str, int] | None = None) -> TestResult:
    """The steps after resolving the model, built in ``tmp`` (committed to ``final`` by the caller);
    phase wall times go into ``seconds``."""
    prep = _prepare(subject, tmp, backends=backends, stages=stages, max_cut_width=max_cut_width, imgsz=imgsz,
                    quiet=quiet, seconds=seconds, bind=bind, task=task, labels=labels)
    if stream is not None:
        with _timed(seconds, "stream"):
            report, statuses = _stream(subject, prep.anchored, prep.manifest, prep.names, inputs, tmp, final,
                                       timeout_s, quiet, oracle, config, allow_incomplete, prep.adapter, labels,
                                       stream, prep.details)
        return finish_test(prep, tmp, final, report=report, statuses=statuses, oracle=oracle, quiet=quiet,
                           seconds=seconds, drill=drill)
    prepare_samples(prep, subject, tmp, inputs=inputs, samples=samples, seed=seed, quiet=quiet)
    with _timed(seconds, "run"):
        statuses = _run(subject, prep.names, prep.spec, prep.details["inputs"], tmp, final, timeout_s, quiet)
    return finish_test(prep, tmp, final, statuses=statuses, oracle=oracle, config=config,
                       allow_incomplete=allow_incomplete, labels=labels, drill=drill, quiet=quiet, seconds=seconds)


@dataclass
class Prepared:
    """A model instrumented, mapped and given its samples in a partial report folder, ready to run
    (:func:`prepare_test`); what the run and :func:`finish_test` need, picklable (sent between the
    processes of a campaign, :mod:`anpred.campaign`) once ``anchored`` is dropped.

    Attributes:
        label: the subject's label; ``names``: the backends to run; ``framework``: its origin.
        spec: the input spec the backends run (a folder of preprocessed samples in the partial folder).
        details: what ``test.json`` records (subject, inputs, fixed dims, bound inputs, mapping notes).
        mapping: native backend -> anchor mapping counts; ``sys_path``: the factory's folder (or None).
        adapter: the task adapter (:mod:`anpred.task`) or None.
        anchored, manifest: the instrumented ModelProto and its AnchorManifest (None once sent away).
        seconds: wall time of the steps so far (``resolve``, ``instrument``, ``map``, ``prepare``: all), s.
    """

    label: str
    names: list[str]
    framework: str
    details: dict[str, Any]
    mapping: dict[str, dict[str, int]]
    sys_path: str | None = None
    adapter: Any = None
    spec: str | None = None
    anchored: Any = None
    manifest: Any = None
    seconds: dict[str, float] | None = None


def prepare_test(model: str | os.PathLike, tmp: str | os.PathLike, *, backends=None, inputs: str | None = None,
                 samples: int | None = None, stages: int | None = None, max_cut_width: int = 4,
                 imgsz: int | tuple[int, int] | None = None, seed: int = 0,
                 factory_kwargs: dict[str, Any] | None = None, bind=None, task=None, labels=None,
                 quiet: bool = True, seconds: dict[str, float] | None = None) -> Prepared:
    """The steps of :func:`test` before the run, in the (partial) report folder ``tmp``: resolve,
    instrument, map, task adapter, samples. The options are :func:`test`'s; ``tmp`` must exist.
    Returns a :class:`Prepared` (``anchored``/``manifest`` set to None: it travels between processes).

    Raises: what :func:`test` raises for a bad model, option or input (nothing is run then).
    """
    from passes.bind_inputs import parse_bindings

    tmp = Path(tmp)
    t0 = time.perf_counter()
    seconds = {} if seconds is None else seconds
    backends = check_test_options(oracle="consensus", samples=samples, stages=stages, backends=backends,
                                  inputs=inputs, config=None, history=None)
    check_model(model, backends)
    with _timed(seconds, "resolve"):
        subject = resolve_model(model, imgsz=imgsz, seed=seed, factory_kwargs=factory_kwargs, workdir=tmp,
                                quiet=quiet, backends=backends)
    prep = _prepare(subject, tmp, backends=backends, stages=stages, max_cut_width=max_cut_width, imgsz=imgsz,
                    quiet=quiet, seconds=seconds, bind=parse_bindings(bind), task=task, labels=labels)
    prepare_samples(prep, subject, tmp, inputs=inputs, samples=samples, seed=seed, quiet=quiet)
    prep.anchored = prep.manifest = None
    seconds["prepare"] = time.perf_counter() - t0
    prep.seconds = seconds
    return prep


def _prepare(subject: Subject, tmp: Path, *, backends, stages, max_cut_width, imgsz, quiet, seconds, bind, task,
             labels) -> Prepared:
    """Instrument, map, save the anchored model and choose the task adapter (labels checked)."""
    details: dict[str, Any] = {"subject": subject.to_dict()}
    with _timed(seconds, "instrument"):
        anchored, manifest = _instrument(subject, imgsz, stages, max_cut_width, details, quiet, bind)
    names = _backend_names(subject, backends)
    mapping = _map(subject, manifest, anchored, names, backends is not None, tmp, details, seconds, quiet)
    _save_anchored(subject, anchored, manifest, tmp)
    adapter = _task_adapter(subject, task)
    if labels is not None:  # checked before anything runs
        if adapter is None:
            raise AnpredError("labels need a task (--task detect|classify|dense|module:function)")
        from anpred.task.impact import load_labels

        load_labels(labels, [], adapter.name, require=False)
    return Prepared(label=subject.label, names=names, framework=subject.framework, details=details,
                    mapping=mapping, sys_path=subject.sys_path, adapter=adapter, anchored=anchored,
                    manifest=manifest)


def prepare_samples(prep: Prepared, subject: Subject, tmp: Path, *, inputs, samples, seed, quiet) -> None:
    """The samples of a prepared test in ``tmp/.inputs`` (:func:`anpred.pipeline.samples.prepare_inputs`):
    sets ``prep.spec`` and ``prep.details["inputs"]``."""
    from anpred.onnx_io import load_model

    anchored = prep.anchored if prep.anchored is not None else load_model(tmp / "anchored.onnx", load_external=False)
    prep.spec, prep.details["inputs"] = prepare_inputs(subject, anchored, inputs, samples, seed, tmp / ".inputs", quiet,
                                                       bound=prep.details.get("bound_inputs"))


def finish_test(prep: Prepared, tmp: Path, final: Path, *, statuses, report=None, oracle: str = "consensus",
                config=None, allow_incomplete: bool = False, labels=None, drill: bool = False, quiet: bool = True,
                seconds: dict[str, float] | None = None) -> TestResult:
    """The steps of :func:`test` after the run (the run store in ``tmp/run``): judge (unless
    ``report`` is given: a streamed run judged as it went), task metrics, drill-down, reports in
    ``tmp``. ``statuses``: backend -> BackendStatus. Returns the :class:`TestResult` naming ``final``."""
    seconds = {} if seconds is None else seconds
    if report is None:
        with _timed(seconds, "check"):
            report = _check(tmp, final, oracle, config, allow_incomplete)
        if prep.adapter is not None and report.status != "error":
            from anpred.task import task_impact

            with _timed(seconds, "task"):
                report.task = task_impact(tmp / "run", prep.adapter, labels=labels, config=config)
        elif labels is not None:
            raise AnpredError("labels need a task (--task)")
    if drill and report.status != "error" and oracle in ("consensus", "both"):
        from anpred.drill import drill_run
        from anpred.onnx_io import atomic_write_text, to_json

        with _timed(seconds, "drill"):
            drill_run(tmp / "run", report, tmp / "drill", progress=not quiet)
        report.drill = relocated(report.drill, tmp, final)
        for c in report.drill.get("culprits", {}).values():
            report.verdicts[c["backend"]].culprit = c
        if (tmp / "drill").is_dir():  # drill.json names the files at their final place too
            atomic_write_text(tmp / "drill" / "drill.json", to_json(report.drill, indent=1))
    with _timed(seconds, "report"):
        _write_reports(report, tmp)
    return TestResult(model=prep.label, out=final, report=report, anchored=final / "anchored.onnx",
                      manifest=final / "anchored.anchors.json", run_dir=final / "run",
                      report_json=final / "report.json", report_html=final / "report.html", backends=prep.names,
                      statuses={b: s.status for b, s in statuses.items()},
                      reasons={b: s.reason.splitlines()[0][:300] for b, s in statuses.items() if s.reason},
                      mapping=prep.mapping, seconds=seconds, details=prep.details)


def stream_checkpoint_dir(final: Path) -> Path:
    """Where a streamed test of the report folder ``final`` keeps its checkpoint and the run folder
    being built (:mod:`anpred.pipeline.stream_state`): ``.<name>.stream`` beside it."""
    return final.parent / f".{final.name}.stream"


def _keep_checkpoint(ck: Path, tmp: Path, err: BaseException) -> None:
    """A streamed test stopped: keep what ``--resume`` needs (the run folder goes back beside the
    checkpoint if it had joined the report) and say so; nothing for a refused resume (an AnpredError
    :class:`anpred.pipeline.stream_state.ResumeRefused`: its checkpoint is as it was)."""
    if not (ck / "state.pkl").is_file():
        return
    if (tmp / "run").is_dir() and not (ck / "run").exists():
        shutil.move(str(tmp / "run"), str(ck / "run"))
    from anpred.pipeline.stream_state import ResumeRefused

    if not isinstance(err, ResumeRefused):
        print(f"anpred: the streamed run stopped; its checkpoint is in {ck}: the same command with --resume "
              f"continues it", file=sys.stderr, flush=True)


# ---- the steps -------------------------------------------------------------------------------------
def _stream(subject: Subject, anchored, manifest, names, inputs, tmp: Path, final: Path, timeout_s, quiet, oracle,
            config, allow_incomplete, adapter, labels, stream: dict[str, Any], details: dict[str, Any]):
    """A dataset run in chunks (:func:`anpred.pipeline.stream.stream_test`): ``(report, statuses)``."""
    from anpred.inputs import InputSpec, model_inputs
    from anpred.pipeline.samples import is_images
    from anpred.pipeline.stream import stream_test, zoo_image_samples
    from anpred.run import RunStore

    if inputs is None or str(inputs).startswith("random:"):
        raise AnpredError("--stream needs --inputs: a folder of images or .npz/.npy files")
    zm = subject.zoo
    if zm is not None and is_images(inputs) and not zm.entry.inputs:
        samples = zoo_image_samples(zm, inputs)
        desc = {"kind": "files", "path": str(Path(inputs).resolve()), "preprocessing": zm.info()["preprocessing"]}
    else:
        spec = InputSpec.parse(str(inputs))
        hint = subject.label
        samples = spec.samples(model_inputs(anchored), hint)
        desc = spec.describe(hint)
    if stream.get("chunk") is None:
        from anpred.pipeline.stream import auto_chunk

        stream = {**stream, "chunk": auto_chunk(manifest, len(names))}
    log(f"streaming {inputs} through {len(names)} backends in chunks of {stream['chunk']}", quiet)
    resume = bool(stream.pop("resume", False))
    ck = stream_checkpoint_dir(final)  # the checkpoint and the run folder being built (stream_state)
    if resume and not (ck / "state.pkl").is_file():
        raise AnpredError(f"nothing to resume: no checkpoint in {ck} (a streamed run writes one after each chunk it "
                          f"has judged; run without --resume to start over)")
    if not resume and (ck / "state.pkl").is_file():
        log(f"replacing the checkpoint of an interrupted run in {ck} (--resume would have continued it)", quiet)
    if not resume:
        shutil.rmtree(ck, ignore_errors=True)
    ck.mkdir(parents=True, exist_ok=True)
    details["inputs"] = {"kind": "streamed", "spec": str(inputs), **stream}
    with PythonPath(subject.sys_path):
        report = stream_test(tmp / "anchored.onnx", names, samples, ck / "run", chunk=stream["chunk"],
                             keep=stream["keep"], side_by_side=stream.get("side_by_side", False),
                             positions=stream.get("positions"), timeout_s=timeout_s, quiet=quiet, oracle=oracle,
                             config=config, allow_incomplete=allow_incomplete, adapter=adapter, labels=labels,
                             inputs_description=desc, checkpoint=True, resume=resume)
    # the run folder joins the report being built; the checkpoint stays until the report is committed
    # (test(): an interruption while reporting moves the run folder back beside it)
    shutil.move(str(ck / "run"), str(tmp / "run"))
    if os.environ.get("ANPRED_STREAM_FAULT") == "after-stream":  # testing hook: interrupted while reporting
        raise KeyboardInterrupt
    report.run_dir = str(final / "run")
    store = RunStore.open(tmp / "run")
    store.meta.setdefault("model", {})["name"] = subject.label
    store.meta["model"]["path"] = str(final / "anchored.onnx")
    store.save_meta()
    report.model = {**(report.model or {}), "name": subject.label}
    return report, store.statuses()


def _task_adapter(subject: Subject, task):
    """The task adapter: ``task`` (:func:`anpred.task.load_adapter`), else the zoo entry's, else None."""
    from anpred.task import load_adapter, zoo_task

    if task == "none":
        return None
    if task is not None:
        layout = getattr(subject.zoo, "output_layout", None) if subject.zoo is not None else None
        return load_adapter(task, layout=layout)
    return zoo_task(subject.zoo) if subject.zoo is not None else None



@contextlib.contextmanager
def _timed(seconds: dict[str, float], phase: str):
    """``seconds[phase]``: the wall time of the block (not set when it raises)."""
    t = time.perf_counter()
    yield
    seconds[phase] = time.perf_counter() - t


def _instrument(subject: Subject, imgsz, stages, max_cut_width, details: dict[str, Any], quiet: bool,
                bind: dict[str, Any] | None = None):
    """Load the subject's ONNX file, fix its dynamic input dimensions (``details["fixed_dims"]``),
    bind its configuration inputs (:func:`_bind`) and instrument it; the manifest names the model,
    its origin and the bound inputs. Returns ``(anchored, manifest)``."""
    from anpred.instrument import instrument_model
    from anpred.onnx_io import load_model

    proto = load_model(subject.onnx_path, load_external=False)
    fixed = fix_static_inputs(proto, input_hw(subject, imgsz), zoo_input_shapes(subject))
    if fixed:
        log(f"dynamic input dimensions fixed: {', '.join(fixed)}", quiet)
        details["fixed_dims"] = fixed
    proto = _bind(subject, proto, bind, details, quiet)
    anchored, manifest = instrument_model(proto, stages=stages, max_cut_width=max_cut_width,
                                          source_path=subject.onnx_path)
    manifest.model["name"] = subject.label
    if subject.origin:
        manifest.model["origin"] = dict(subject.origin)
    if details.get("bound_inputs"):
        manifest.model["bound_inputs"] = details["bound_inputs"]
    n_anchors = sum(a.kind != "output" for a in manifest.anchors)
    log(f"instrumented {subject.onnx_path.name}: {len(manifest.stages)} stages, {n_anchors} anchors + "
        f"{len(manifest.anchors) - n_anchors} outputs", quiet)
    for note in manifest.partition.get("notes", []):  # e.g. wide cuts inside a long block (passes.wide_cuts)
        log(f"partition: {note}", quiet)
    return anchored, manifest


def _bind(subject: Subject, proto, bind: dict[str, Any] | None, details: dict[str, Any], quiet: bool):
    """``proto`` with its configuration inputs bound (:func:`passes.bind_inputs.bind_inputs`): the zoo
    entry's (``ZooModel.bindings``) updated with the user's ``bind``. Records ``details["bound_inputs"]``
    ({name: value}) and ``details["binding"]`` (what the pass folded and inlined); ``proto`` itself
    when nothing is bound. Raises InputError (unknown name, a value that does not fit)."""
    from passes.bind_inputs import bind_inputs

    values = {**(subject.zoo.bindings() if subject.zoo is not None else {}), **(bind or {})}
    if not values:
        return proto
    bound, info = bind_inputs(proto, values)
    details["bound_inputs"] = {n: b["value"] for n, b in info["bound"].items()}
    details["binding"] = {k: (len(v) if k == "inlined" else v) for k, v in info.items() if k != "bound"}
    left = f"; If left: {', '.join(info['ifs_left'])}" if info["ifs_left"] else ""
    log(f"bound {', '.join(f'{n}={v}' for n, v in details['bound_inputs'].items())}: {info['folded']} nodes folded, "
        f"{len(info['inlined'])} If inlined{left}", quiet)
    return bound


def _backend_names(subject: Subject, backends: list[str] | None) -> list[str]:
    """The backends to run: the given ones, else the defaults of the subject's origin."""
    names = list(backends) if backends is not None else default_backends(subject.framework)
    check_native_backends(names, subject.framework, subject.label, subject.kind)
    return names


def _map(subject: Subject, manifest, anchored, names: list[str], explicit: bool, tmp: Path,
         details: dict[str, Any], seconds: dict[str, float], quiet: bool) -> dict[str, dict[str, int]]:
    """Map the anchors onto the native model when its native backend runs (``tmp/mapping.json``).
    Returns native backend -> counts. A model that cannot be mapped raises when the backends were
    given, else its native backend is left out of ``names`` (``details["native_left_out"]``)."""
    from anpred.onnx_io import atomic_write_text, to_json

    mapping: dict[str, dict[str, int]] = {}
    native = NATIVE_BACKEND.get(subject.framework)
    if native is None or native not in names:
        return mapping
    with _timed(seconds, "map"):
        from exporters.mapping import MappingError, map_anchors

        try:
            with PythonPath(subject.sys_path), QuietLogger("ultralytics"):
                net, example = native_model(subject)
                rep = map_anchors(manifest, net, subject.framework, onnx_model=anchored,
                                  example_inputs=tuple(example) if subject.framework == "torch" else None)
            mapping[native] = rep.counts(native)
            atomic_write_text(tmp / "mapping.json", to_json(rep.to_dict(), indent=1))
            c = mapping[native]
            log(f"mapped anchors onto the {subject.framework} model: {c['exact']} exact, {c['equivalent']} "
                f"equivalent, {c['unmapped']} unmapped", quiet)
        except MappingError as err:
            if explicit:
                raise
            names.remove(native)
            log(f"{native} left out: {err}", quiet)
            details["native_left_out"] = str(err)
        finally:
            net = example = None
    return mapping


def _save_anchored(subject: Subject, anchored, manifest, tmp: Path) -> None:
    """``tmp/anchored.onnx`` (manifest in its metadata) and ``tmp/anchored.anchors.json``."""
    from anpred.onnx_io import atomic_write_text, save_model

    manifest.to_model(anchored)
    # the report folder is self-contained: external weights are streamed next to the anchored model
    save_model(anchored, tmp / "anchored.onnx", source_path=subject.onnx_path, copy_external_data=True)
    atomic_write_text(tmp / "anchored.anchors.json", manifest.to_json())


def _run(subject: Subject, names: list[str], spec: str, inputs_info: dict[str, Any], tmp: Path, final: Path,
         timeout_s: float, quiet: bool) -> dict[str, Any]:
    """Run the backends into ``tmp/run`` (the run store names the final paths). Returns the
    backends' statuses."""
    from anpred.run import run_model

    log(f"running {len(names)} backends, each in its own process: {', '.join(names)}", quiet)
    with PythonPath(subject.sys_path):
        store = run_model(tmp / "anchored.onnx", names, spec, tmp / "run", mode="tensors", timeout_s=timeout_s,
                          progress=not quiet, preprocess=None)
    return finish_run_store(store, subject.label, spec, inputs_info, tmp, final)


def finish_run_store(store, label: str, spec: str, inputs_info: dict[str, Any], tmp: Path, final: Path
                     ) -> dict[str, Any]:
    """After the run into ``tmp/run``: the prepared samples folder ``tmp/.inputs`` removed (they live
    on in the run store, which names their sources), the model named ``label`` at its final place
    ``final/anchored.onnx``. Returns the backends' statuses (backend -> BackendStatus)."""
    shutil.rmtree(tmp / ".inputs", ignore_errors=True)
    if spec == str(tmp / ".inputs"):  # the preprocessed inputs live on in the run store only
        record_zoo_inputs(store, inputs_info["sources"], final / "run")
    store.meta.setdefault("model", {})["name"] = label
    store.meta["model"]["path"] = str(final / "anchored.onnx")
    store.save_meta()
    return store.statuses()


def _check(tmp: Path, final: Path, oracle: str, config, allow_incomplete: bool):
    """Align and judge the run (:func:`anpred.judge.check_run`); the report names the final run folder."""
    from anpred.judge import check_run

    report = check_run(tmp / "run", oracle=oracle, config=config, allow_incomplete=allow_incomplete)
    report.run_dir = str(final / "run")
    return report


def _write_reports(report, tmp: Path) -> None:
    """``tmp/report.json`` and ``tmp/report.html``."""
    from anpred.report import write_html, write_json

    write_json(report, tmp / "report.json")
    write_html(report, tmp / "report.html")


# ---- the report folder -----------------------------------------------------------------------------
def prepare_out(out: Path, overwrite: bool) -> Path:
    """Check the report folder ``out`` and return the hidden partial folder to build in
    (:func:`anpred.folders.partial_dir`; commit it with :func:`anpred.folders.commit_partial`).

    Raises:
        OutputPathError: ``out`` is not a folder, or is not empty and not an earlier test (no
        ``test.json``), or holds a test and ``overwrite`` is not given; its parent cannot be created
        or written. Nothing is written then.
    """
    from anpred.folders import partial_dir

    out = Path(out).absolute()
    if out.exists():
        if not out.is_dir():
            raise OutputPathError(f"{out} exists and is not a folder; nothing was written")
        if any(out.iterdir()):
            if not (out / "test.json").is_file():
                raise OutputPathError(f"{out} exists and is not empty (and is not an anpred test folder); "
                                      "nothing was written")
            if not overwrite:
                raise OutputPathError(f"{out} already holds a test; choose another -o or pass --overwrite "
                                      "(nothing was written)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputPathError(f"cannot create {out.parent}: {err.strerror or err}") from err
    if not os.access(out.parent, os.W_OK):
        raise OutputPathError(f"{out.parent} is not writable; nothing was written")
    return partial_dir(out)


def relocated(value: Any, src: str | Path, dst: str | Path) -> Any:
    """``value`` (JSON-able: dicts, lists, strings, paths ...) through JSON (:func:`anpred.onnx_io.to_json`)
    with every occurrence of the path ``src`` rewritten to ``dst`` (files built in a partial folder
    named at their final place)."""
    from anpred.onnx_io import to_json

    return json.loads(to_json(value).replace(json.dumps(str(src))[1:-1], json.dumps(str(dst))[1:-1]))
