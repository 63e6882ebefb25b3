"""The one-shot pipeline: from a model to a verdict in one call (:func:`test`, ``anpred test``).

:func:`test` checks every option and takes a quick look at the model before the output folder is
touched, then builds the report folder in a hidden partial sibling (:mod:`anpred.pipeline.folder`)
and commits it when complete. :func:`_pipeline` is the walk, one call per step, each step one module
of the project:

1. **resolve** the model (:func:`anpred.pipeline.subject.resolve_model`, done by :func:`test`);
2. **shapes**: the dynamic input dimensions from ``input_shapes`` or the given inputs, the samples
   grouped into shape buckets (:mod:`anpred.pipeline.shapes`);
3. **instrument** it (:func:`anpred.pipeline.steps.instrument`: dynamic dimensions fixed, configuration
   inputs bound, stages K);
4. **choose the backends**: the ones under test, the witnesses that make a consensus, the defaults
   skipped with their reason (:mod:`anpred.pipeline.witnesses`);
5. **map** the anchors onto the native graph (:func:`anpred.pipeline.steps.map_native`) when a
   native backend runs;
6. **prepare the inputs** (:func:`anpred.pipeline.samples.prepare_inputs`);
7. **run** every backend in its own process (:func:`anpred.run.run_model`; per shape bucket,
   :mod:`anpred.pipeline.buckets`), its cost recorded (:mod:`anpred.pipeline.costs`);
8. **check**: align and judge (:func:`anpred.judge.check_run`), the witnesses marked
   (:func:`anpred.pipeline.witnesses.apply_roles`);
9. **write the reports**: ``report.json`` (schema ``anpred.check/1``), ``report.html``, then, once
   committed, ``test.json`` and optionally a history database row (:func:`anpred.report.history.append`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError
from anpred.options import TestOptions
from anpred.pipeline.choices import (
    DEFAULT_SAMPLES,
    NATIVE_BACKEND,
    check_native_backends,
    check_test_options,
    default_backends,
)
from anpred.pipeline.folder import finish_run_store, keep_checkpoint, prepare_out, relocated, stream_checkpoint_dir
from anpred.pipeline.progress import log
from anpred.pipeline.result import TestResult
from anpred.pipeline.samples import prepare_inputs
from anpred.pipeline.steps import check, instrument, map_native, save_anchored, task_adapter, timed, write_reports
from anpred.pipeline.subject import PythonPath, Subject, check_model, resolve_model

__all__ = [
    "test",
    "prepare_out",
    "relocated",
    "Prepared",
    "prepare_test",
    "prepare_samples",
    "finish_test",
    "finish_run_store",
]


def test(model: str | os.PathLike, out: str | os.PathLike | None = None, **options: Any) -> TestResult:
    """Test ``model`` end to end: export (when needed), instrument, map, run, align, judge, report.

    Args:
        model: an ``.onnx`` path, a zoo name (``anpred zoo`` lists them) or a factory
            ``module:function`` returning ``(torch.nn.Module | keras.Model, example_inputs)``
            (``example_inputs``: a tuple of tensors; the function must be importable in a fresh
            process: backend processes rebuild the model).
        out: the report folder to create (default ``anpred-test/<model label>``).
        options: the option groups by name (``judge=JudgeOptions(...)``, ``run=RunOptions(...)``,
            ``build=ModelOptions(...)``, ``feed=InputOptions(...)``, ``output=OutputOptions(...)``,
            ``stream=StreamOptions(...)`` or ``stream=True``; :mod:`anpred.options`, which documents
            every field) and their fields by name (``backends=["ort", "openvino"]``, ``samples=2``,
            ``imgsz=320``, ``input_shapes="ids:1x45"``, ``atol=1e-4``, ``quiet=True``, ...):
            :meth:`anpred.options.TestOptions.make`.

    Returns:
        :class:`TestResult` (truthy when consistent; ``.report`` is the CheckReport).

    Raises:
        ModelLoadError: an unreadable ``.onnx``; AnpredError: unknown zoo name or option, unusable
        factory, bad inputs, an ``out`` folder that holds something else; InputError: a ``bind``
        entry that is not ``NAME=VALUE`` or does not fit, inputs or ``input_shapes`` that contradict
        the model (a name that is not a graph input, a static dimension, an index outside its
        table); BackendError: an unknown, empty or repeated backend entry, a single backend, a
        native backend that does not fit the model (checked before any export). Nothing is written
        then. A backend that fails or crashes does not raise: see ``result.statuses``.
    """
    from anpred.onnx_io import atomic_write_text, to_json
    from passes.bind_inputs import parse_bindings

    t_start = time.perf_counter()
    seconds: dict[str, float] = {}
    opts = TestOptions.make(**options)
    backends = check_test_options(opts)
    _check_folder_labels(opts)
    opts.build.bind = parse_bindings(opts.build.bind)
    label_guess = check_model(model, backends)  # errors: nothing written
    final = (Path(out) if out is not None else Path("anpred-test") / label_guess).absolute()
    tmp = prepare_out(final, opts.output.overwrite)
    try:
        with timed(seconds, "resolve"):
            subject = resolve_model(
                model,
                imgsz=opts.build.imgsz,
                seed=opts.build.seed,
                factory_kwargs=opts.build.factory_kwargs,
                workdir=tmp,
                quiet=opts.output.quiet,
                backends=backends,
            )
        result = _pipeline(subject, final, tmp, opts, backends, seconds)
        from anpred.folders import commit_partial

        commit_partial(tmp, final)
        # what was tested names the final place of files built in the partial folder (a factory's export)
        result.details = relocated(result.details, tmp, final)
    except BaseException as err:
        if opts.stream is not None:
            keep_checkpoint(stream_checkpoint_dir(final), tmp, err)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if opts.stream is not None:
        shutil.rmtree(stream_checkpoint_dir(final), ignore_errors=True)
    if opts.output.history is not None and result.report.status != "error":
        from anpred.report.history import append

        append(opts.output.history, result.report)
    seconds["total"] = time.perf_counter() - t_start
    atomic_write_text(final / "test.json", to_json(result.to_dict(), indent=1))
    return result


def _check_folder_labels(opts: TestOptions) -> None:
    """``--labels folders`` with an input folder: the class folders checked before anything runs."""
    inputs = opts.feed.inputs
    if opts.judge.labels == "folders" and inputs is not None and Path(str(inputs)).is_dir():
        from anpred.inputs import ARRAY_EXTS, IMAGE_EXTS, input_files
        from anpred.task import load_labels

        load_labels(
            "folders",
            [{"id": f.name, "source": str(f)} for f in input_files(Path(str(inputs)), IMAGE_EXTS + ARRAY_EXTS)],
            "classify",
        )


def _pipeline(
    subject: Subject, final: Path, tmp: Path, opts: TestOptions, backends: list[str] | None, seconds: dict[str, float]
) -> TestResult:
    """The steps after resolving the model, built in ``tmp`` (committed to ``final`` by the caller);
    phase wall times go into ``seconds``."""
    prep = _prepare(subject, tmp, opts, backends, seconds)
    if opts.stream is not None:
        from anpred.pipeline.streamed import stream_step

        with timed(seconds, "stream"):
            report, statuses = stream_step(subject, prep, opts, tmp, final)
        return finish_test(prep, tmp, final, statuses=statuses, opts=opts, report=report, seconds=seconds)
    if prep.buckets is None:
        prepare_samples(prep, subject, tmp, opts)
    with timed(seconds, "run"):
        statuses = _run(subject, prep, tmp, final, opts)
    return finish_test(prep, tmp, final, statuses=statuses, opts=opts, seconds=seconds)


@dataclass
class Prepared:
    """A model instrumented, mapped and given its samples in a partial report folder, ready to run
    (:func:`prepare_test`); what the run and :func:`finish_test` need, picklable (sent between the
    processes of a campaign, :mod:`anpred.campaign`) once ``anchored`` is dropped.

    Attributes:
        label: the subject's label; ``names``: the backends to run (subjects, then witnesses);
            ``framework``: its origin.
        spec: the input spec the backends run (a folder of preprocessed samples in the partial folder).
        details: what ``test.json`` records (subject, inputs, fixed dims, bound inputs, mapping notes,
            ``backends``: the plan of :mod:`anpred.pipeline.witnesses`, ``buckets``).
        mapping: native backend -> anchor mapping counts; ``sys_path``: the factory's folder (or None).
        adapter: the task adapter (:mod:`anpred.task`) or None.
        anchored, manifest: the instrumented ModelProto and its AnchorManifest (None once sent away).
        seconds: wall time of the steps so far (``resolve``, ``instrument``, ``map``, ``prepare``: all), s.
        plan: the :class:`anpred.pipeline.witnesses.BackendPlan`; ``buckets``: the shape buckets
            (:class:`anpred.pipeline.shapes.Bucket`) when the samples have several shape sets, else None.
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
    plan: Any = None
    buckets: list | None = None


def prepare_test(
    model: str | os.PathLike, tmp: str | os.PathLike, seconds: dict[str, float] | None = None, **options: Any
) -> Prepared:
    """The steps of :func:`test` before the run, in the (partial) report folder ``tmp``: resolve,
    instrument, map, task adapter, samples. ``options``: :func:`test`'s (no witnesses unless
    ``witnesses=True``: a campaign runs the backends it names); ``tmp`` must exist.
    Returns a :class:`Prepared` (``anchored``/``manifest`` set to None: it travels between processes).

    Raises: what :func:`test` raises for a bad model, option or input (nothing is run then).
    """
    from passes.bind_inputs import parse_bindings

    tmp = Path(tmp)
    t0 = time.perf_counter()
    seconds = {} if seconds is None else seconds
    opts = TestOptions.make(**{"witnesses": False, "quiet": True, **options})
    backends = check_test_options(opts)
    opts.build.bind = parse_bindings(opts.build.bind)
    check_model(model, backends)
    with timed(seconds, "resolve"):
        subject = resolve_model(
            model,
            imgsz=opts.build.imgsz,
            seed=opts.build.seed,
            factory_kwargs=opts.build.factory_kwargs,
            workdir=tmp,
            quiet=opts.output.quiet,
            backends=backends,
        )
    prep = _prepare(subject, tmp, opts, backends, seconds)
    if prep.buckets is not None:
        raise AnpredError(
            f"{subject.label}: the inputs have {len(prep.buckets)} shape sets; a campaign runs one "
            "(give each its own input set)"
        )
    prepare_samples(prep, subject, tmp, opts)
    prep.anchored = prep.manifest = None
    seconds["prepare"] = time.perf_counter() - t0
    prep.seconds = seconds
    return prep


def _prepare(
    subject: Subject, tmp: Path, opts: TestOptions, backends: list[str] | None, seconds: dict[str, float]
) -> Prepared:
    """Shapes, instrument, choose the backends, map, save the anchored model and choose the task
    adapter (labels checked)."""
    from anpred.pipeline.shapes import resolve_shapes
    from anpred.pipeline.witnesses import not_installed, plan_backends

    details: dict[str, Any] = {"subject": subject.to_dict()}
    declared, buckets = resolve_shapes(subject, opts, tmp)
    with timed(seconds, "instrument"):
        anchored, manifest = instrument(subject, opts.build, declared, details, opts.output.quiet)
    names = (
        list(backends)
        if backends is not None
        else list(
            dict.fromkeys(
                default_backends(subject.framework, opts.run.precision, opts.run.all_backends) + list(opts.run.also)
            )
        )
    )
    check_native_backends(names, subject.framework, subject.label, subject.kind)
    missing = {} if backends is not None else not_installed(names)  # a default not installed: skipped
    names = [b for b in names if b not in missing]
    native = NATIVE_BACKEND.get(subject.framework)
    with timed(seconds, "map") if native in names else contextlib.nullcontext():
        mapping = map_native(subject, manifest, anchored, names, backends is not None, tmp, details, opts.output.quiet)
    save_anchored(subject, anchored, manifest, tmp)
    with timed(seconds, "plan"):
        plan = plan_backends(
            names,
            backends is not None,
            tmp / "anchored.onnx",
            _n_samples(opts, buckets),
            witnesses=opts.run.witnesses,
            min_families=_min_voters(opts),
            quiet=opts.output.quiet,
        )
    plan.skipped = {**missing, **plan.skipped}
    for b, why in plan.skipped.items():
        log(f"{b} skipped: {why}", opts.output.quiet)
    names = plan.names
    details["backends"] = plan.to_dict()
    adapter = task_adapter(subject, opts.judge.task)
    if opts.judge.labels is not None:  # checked before anything runs
        if adapter is None:
            raise AnpredError("labels need a task (--task detect|classify|dense|module:function)")
        from anpred.task.impact import load_labels

        load_labels(opts.judge.labels, [], adapter.name, require=False)
    return Prepared(
        label=subject.label,
        names=names,
        framework=subject.framework,
        details=details,
        mapping=mapping,
        sys_path=subject.sys_path,
        adapter=adapter,
        anchored=anchored,
        manifest=manifest,
        plan=plan,
        buckets=buckets,
    )


def _n_samples(opts: TestOptions, buckets) -> int:
    return sum(len(b.sources) for b in buckets) if buckets else (opts.feed.samples or DEFAULT_SAMPLES)


def _min_voters(opts: TestOptions) -> int:
    """The oracle's ``min_voters`` (the judge options' config, else :mod:`anpred.defaults`)."""
    from anpred.defaults import OracleConfig, load_config

    cfg = opts.judge.config
    return (cfg if isinstance(cfg, OracleConfig) else load_config(cfg)).min_voters


def prepare_samples(prep: Prepared, subject: Subject, tmp: Path, opts: TestOptions) -> None:
    """The samples of a prepared test in ``tmp/.inputs`` (:func:`anpred.pipeline.samples.prepare_inputs`):
    sets ``prep.spec`` and ``prep.details["inputs"]``."""
    from anpred.onnx_io import load_model

    anchored = prep.anchored if prep.anchored is not None else load_model(tmp / "anchored.onnx", load_external=False)
    prep.spec, prep.details["inputs"] = prepare_inputs(
        subject,
        anchored,
        opts.feed.inputs,
        opts.feed.samples,
        opts.build.seed,
        tmp / ".inputs",
        opts.output.quiet,
        bound=prep.details.get("bound_inputs"),
    )


def _run(subject: Subject, prep: Prepared, tmp: Path, final: Path, opts: TestOptions) -> dict[str, Any]:
    """Run the backends into ``tmp/run`` (the run store names the final paths), per shape bucket
    when there are several, side by side with ``opts.run.side_by_side`` (long-lived workers, the cores
    divided among them: :func:`anpred.run.spec.split_threads`); record what each backend cost
    (:func:`anpred.pipeline.costs.record`).
    Returns the backends' statuses."""
    from anpred.onnx_io import load_model, sha256_file
    from anpred.pipeline.costs import model_size, record
    from anpred.run import RunStore, run_model

    quiet = opts.output.quiet
    log(f"running {len(prep.names)} backends, each in its own process: {', '.join(prep.names)}", quiet)
    with PythonPath(subject.sys_path):
        if prep.buckets is not None:
            from anpred.pipeline.buckets import bucket_lines, run_buckets

            per_bucket = run_buckets(tmp / "anchored.onnx", prep.names, prep.buckets, tmp, opts)
            prep.details["buckets"] = bucket_lines(prep.buckets, per_bucket)
            prep.details["inputs"] = {
                "kind": "given, in shape buckets",
                "spec": str(opts.feed.inputs),
                "buckets": len(prep.buckets),
            }
            prep.buckets = None
            store = RunStore.open(tmp / "run")
            prep.spec = str(opts.feed.inputs)
        elif opts.run.side_by_side:  # at once, each in its own worker, the cores divided among them
            from anpred.run.driver import WorkerPool
            from anpred.run.spec import split_threads

            with WorkerPool(tmp / ".pool", timeout_s=opts.run.timeout_s, side_by_side=True) as pool:
                store = run_model(
                    tmp / "anchored.onnx",
                    split_threads(prep.names),
                    prep.spec,
                    tmp / "run",
                    mode="tensors",
                    timeout_s=opts.run.timeout_s,
                    progress=not quiet,
                    pool=pool,
                )
            shutil.rmtree(tmp / ".pool", ignore_errors=True)
        else:
            store = run_model(
                tmp / "anchored.onnx",
                prep.names,
                prep.spec,
                tmp / "run",
                mode="tensors",
                timeout_s=opts.run.timeout_s,
                progress=not quiet,
                preprocess=None,
            )
    record(
        store.statuses(),
        sha256_file(tmp / "anchored.onnx"),
        model_size(load_model(tmp / "anchored.onnx", load_external=False)),
        store.meta,
    )
    if prep.plan is not None and prep.plan.witnesses:  # who ran as a witness, for later readers of the run
        store.meta["roles"] = {b: prep.plan.witnesses.get(b, "subject") for b in prep.names}
    return finish_run_store(store, subject.label, prep.spec, prep.details["inputs"], tmp, final)


def finish_test(
    prep: Prepared,
    tmp: Path,
    final: Path,
    *,
    statuses,
    opts: TestOptions,
    report=None,
    seconds: dict[str, float] | None = None,
) -> TestResult:
    """The steps of :func:`test` after the run (the run store in ``tmp/run``): judge (unless
    ``report`` is given: a streamed run judged as it went), witnesses marked, task metrics,
    drill-down, reports in ``tmp``. ``statuses``: backend -> BackendStatus; ``opts``: the
    :class:`anpred.options.TestOptions`. Returns the :class:`TestResult` naming ``final``."""
    seconds = {} if seconds is None else seconds
    judge = opts.judge
    if report is None:
        with timed(seconds, "check"):
            report = check(tmp, final, judge)
        if prep.adapter is not None and report.status != "error":
            from anpred.task import task_impact

            with timed(seconds, "task"):
                report.task = task_impact(tmp / "run", prep.adapter, labels=judge.labels, config=judge.config)
        elif judge.labels is not None:
            raise AnpredError("labels need a task (--task)")
    if prep.plan is not None:
        from anpred.pipeline.witnesses import apply_roles

        apply_roles(report, prep.plan)
    for b in prep.details.get("buckets") or []:
        report.notes.append(_bucket_note(b, len(prep.details["buckets"])))
    if judge.drill and report.status != "error" and judge.oracle in ("consensus", "both"):
        _drill(report, tmp, final, opts.output.quiet, seconds)
    with timed(seconds, "report"):
        write_reports(report, tmp)
    return TestResult(
        model=prep.label,
        out=final,
        report=report,
        anchored=final / "anchored.onnx",
        manifest=final / "anchored.anchors.json",
        run_dir=final / "run",
        report_json=final / "report.json",
        report_html=final / "report.html",
        backends=prep.names,
        statuses={b: s.status for b, s in statuses.items()},
        reasons={b: s.reason.splitlines()[0][:300] for b, s in statuses.items() if s.reason},
        mapping=prep.mapping,
        seconds=seconds,
        details=prep.details,
    )


def _bucket_note(b: dict[str, Any], n: int) -> str:
    """The report's line of one shape bucket (:func:`anpred.pipeline.buckets.bucket_lines`)."""
    shapes = ", ".join(f"{k} {'x'.join(str(d) for d in s)}" for k, s in b["shapes"].items())
    ids = b["samples"]
    line = (
        f"shape bucket {b['bucket']}/{n} ({shapes}): {len(b['sources'])} sample(s)"
        + (f" {ids[0]}..{ids[-1]}" if len(ids) > 1 else f" {ids[0]}" if ids else "")
        + ", judged with the others"
    )
    if b["not_run"]:
        line += "; not run by " + "; ".join(f"{k} ({v})" for k, v in b["not_run"].items())
    return line


def _drill(report, tmp: Path, final: Path, quiet: bool, seconds: dict[str, float]) -> None:
    """Drill each flagged fp32 backend down to the operator (:func:`anpred.drill.drill_run`) into
    ``tmp/drill``; the culprits join the verdicts."""
    from anpred.drill import drill_run
    from anpred.onnx_io import atomic_write_text, to_json

    with timed(seconds, "drill"):
        drill_run(tmp / "run", report, tmp / "drill", progress=not quiet)
    report.drill = relocated(report.drill, tmp, final)
    for c in report.drill.get("culprits", {}).values():
        report.verdicts[c["backend"]].culprit = c
    if (tmp / "drill").is_dir():  # drill.json names the files at their final place too
        atomic_write_text(tmp / "drill" / "drill.json", to_json(report.drill, indent=1))
