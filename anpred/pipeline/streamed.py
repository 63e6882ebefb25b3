"""The streamed step of a one-shot test (``anpred test --stream``): the given dataset run and judged in
chunks by :func:`anpred.pipeline.stream.stream_test`, its checkpoint beside the report folder
(:func:`anpred.pipeline.folder.stream_checkpoint_dir`), its run folder moved into the report."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError
from anpred.pipeline.folder import stream_checkpoint_dir
from anpred.pipeline.progress import log
from anpred.pipeline.subject import PythonPath, Subject

__all__ = ["stream_step"]


def _samples(subject: Subject, anchored, inputs: str):
    """``(samples iterator, description)`` of the dataset ``inputs``: a zoo image model's images
    preprocessed by the model, else :meth:`anpred.inputs.InputSpec.samples`."""
    from anpred.inputs import InputSpec, model_inputs
    from anpred.pipeline.samples import is_images
    from anpred.pipeline.stream import zoo_image_samples

    zm = subject.zoo
    if zm is not None and is_images(inputs) and not zm.entry.inputs:
        desc = {"kind": "files", "path": str(Path(inputs).resolve()), "preprocessing": zm.info()["preprocessing"]}
        return zoo_image_samples(zm, inputs), desc
    spec = InputSpec.parse(str(inputs))
    return spec.samples(model_inputs(anchored), subject.label), spec.describe(subject.label)


def _checkpoint(final: Path, resume: bool, quiet: bool) -> Path:
    """The checkpoint folder (:mod:`anpred.pipeline.stream_state`), emptied unless ``resume``.
    Raises AnpredError: ``resume`` without a checkpoint."""
    ck = stream_checkpoint_dir(final)
    if resume and not (ck / "state.pkl").is_file():
        raise AnpredError(
            f"nothing to resume: no checkpoint in {ck} (a streamed run writes one after each chunk it "
            f"has judged; run without --resume to start over)"
        )
    if not resume and (ck / "state.pkl").is_file():
        log(f"replacing the checkpoint of an interrupted run in {ck} (--resume would have continued it)", quiet)
    if not resume:
        shutil.rmtree(ck, ignore_errors=True)
    ck.mkdir(parents=True, exist_ok=True)
    return ck


def stream_step(subject: Subject, prep, opts, tmp: Path, final: Path) -> tuple[Any, dict[str, Any]]:
    """Run the dataset ``opts.feed.inputs`` in chunks through ``prep.names`` (``prep``: the
    :class:`anpred.pipeline.oneshot.Prepared` test, its anchored model in ``tmp``; ``opts``: the
    :class:`anpred.options.TestOptions`, ``opts.stream`` set). Returns ``(report, statuses)``.

    Raises:
        AnpredError: no ``--inputs`` (or generated ones), ``resume`` without a checkpoint."""
    from anpred.pipeline.stream import StreamHooks, StreamInputs, stream_test
    from anpred.run import RunStore

    inputs, st, quiet = opts.feed.inputs, opts.stream, opts.output.quiet
    if inputs is None or str(inputs).startswith("random:"):
        raise AnpredError("--stream needs --inputs: a folder of images or .npz/.npy files")
    samples, desc = _samples(subject, prep.anchored, inputs)
    chunk = st.chunk
    if chunk is None:
        from anpred.pipeline.stream import auto_chunk

        chunk = auto_chunk(prep.manifest, len(prep.names))
    log(f"streaming {inputs} through {len(prep.names)} backends in chunks of {chunk}", quiet)
    ck = _checkpoint(final, st.resume, quiet)
    prep.details["inputs"] = {
        "kind": "streamed",
        "spec": str(inputs),
        "chunk": chunk,
        "keep": st.keep,
        "side_by_side": bool(opts.run.side_by_side),
        "positions": st.positions,
    }
    hooks = st.hooks or StreamHooks()
    with PythonPath(subject.sys_path):
        report = stream_test(
            tmp / "anchored.onnx",
            StreamInputs(samples, desc),
            ck / "run",
            run=replace(opts.run, backends=prep.names, side_by_side=bool(opts.run.side_by_side)),
            judge=replace(opts.judge, task=prep.adapter),
            stream=replace(st, chunk=chunk, hooks=hooks),
            quiet=quiet,
            checkpoint=True,
        )
    # the run folder joins the report being built; the checkpoint stays until the report is committed
    # (test(): an interruption while reporting moves the run folder back beside it)
    shutil.move(str(ck / "run"), str(tmp / "run"))
    hooks.after_stream()  # testing hook: a test interrupts here, while reporting
    report.run_dir = str(final / "run")
    store = RunStore.open(tmp / "run")
    store.meta.setdefault("model", {})["name"] = subject.label
    store.meta["model"]["path"] = str(final / "anchored.onnx")
    store.save_meta()
    report.model = {**(report.model or {}), "name": subject.label}
    return report, store.statuses()
