"""The report folder of a one-shot test: checked and built in a hidden partial sibling
(:func:`prepare_out`, :mod:`anpred.folders`), paths rewritten to its final place (:func:`relocated`),
the run store finished there (:func:`finish_run_store`), and a streamed test's checkpoint beside it
(:func:`stream_checkpoint_dir`, :func:`keep_checkpoint`)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from anpred.errors import OutputPathError
from anpred.pipeline.samples import record_zoo_inputs

__all__ = ["prepare_out", "relocated", "finish_run_store", "stream_checkpoint_dir", "keep_checkpoint"]


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
                raise OutputPathError(
                    f"{out} exists and is not empty (and is not an anpred test folder); nothing was written"
                )
            if not overwrite:
                raise OutputPathError(
                    f"{out} already holds a test; choose another -o or pass --overwrite (nothing was written)"
                )
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


def finish_run_store(
    store, label: str, spec: str, inputs_info: dict[str, Any], tmp: Path, final: Path
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


def stream_checkpoint_dir(final: Path) -> Path:
    """Where a streamed test of the report folder ``final`` keeps its checkpoint and the run folder
    being built (:mod:`anpred.pipeline.stream_state`): ``.<name>.stream`` beside it."""
    return final.parent / f".{final.name}.stream"


def keep_checkpoint(ck: Path, tmp: Path, err: BaseException) -> None:
    """A streamed test stopped: keep what ``--resume`` needs (the run folder goes back beside the
    checkpoint if it had joined the report) and say so; nothing for a refused resume (an AnpredError
    :class:`anpred.pipeline.stream_state.ResumeRefused`: its checkpoint is as it was)."""
    if not (ck / "state.pkl").is_file():
        return
    if (tmp / "run").is_dir() and not (ck / "run").exists():
        shutil.move(str(tmp / "run"), str(ck / "run"))
    from anpred.pipeline.stream_state import ResumeRefused

    if not isinstance(err, ResumeRefused):
        print(
            f"anpred: the streamed run stopped; its checkpoint is in {ck}: the same command with --resume continues it",
            file=sys.stderr,
            flush=True,
        )
