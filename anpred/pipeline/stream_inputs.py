"""The inputs of a streamed run (:mod:`anpred.pipeline.stream`): the dataset read lazily, in chunks, by a
thread of lower priority than the backends (:data:`JUDGE_NICE`), one chunk ahead of the one running;
a resumed run's judged samples skipped and checked; the int8 backends calibrated on the first samples.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

__all__ = [
    "StreamInputs",
    "zoo_image_samples",
    "JUDGE_NICE",
    "lower_priority",
    "batched",
    "skip_judged",
    "prefetched",
    "calibrated",
]


@dataclass
class StreamInputs:
    """The dataset of a streamed run: ``samples``, ``(source, {input name: array})`` per sample (an
    iterator: read lazily), and ``description``, what the run records as its inputs (None: the first
    chunk's own record)."""

    samples: Iterator[tuple[str, dict[str, np.ndarray]]]
    description: dict[str, Any] | None = None


def zoo_image_samples(zm, folder: str | Path) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """``(source, {input name: array})`` for every image of ``folder`` (sorted names), preprocessed
    lazily as the zoo model ``zm`` wants (:meth:`models.zoo.ZooModel.preprocess`).

    Raises:
        InputError: a folder without images, an unreadable image.
    """
    from PIL import Image

    from anpred.errors import InputError
    from anpred.inputs import IMAGE_EXTS, input_files

    files = input_files(Path(folder), IMAGE_EXTS)
    if not files:
        raise InputError(f"inputs {folder}: no image in the folder")
    name = zm.input_names()[0]
    for f in files:
        try:
            with Image.open(f) as im:
                arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
        except OSError as err:
            raise InputError(f"{f}: unreadable image ({err})") from err
        yield str(f), {name: zm.preprocess(arr)}


#: nice increment of the stream's judge and input-reader threads: the backends' workers (at the driver's
#: nice value, in its session: :class:`anpred.run.driver.WorkerPool`) get the cores first, and the judge
#: works beside them with what they leave, at no cost to their parallel regions. Not the lowest
#: priority: at +19 the judge starves beside the backends that spin and the runner waits for it
#: (docs/task.md, 'Who gets the cores')
JUDGE_NICE = 10


def lower_priority(increment: int | None = None) -> int | None:
    """Raise the calling thread's nice value by ``increment`` (default :data:`JUDGE_NICE`; at most 19;
    Linux ``setpriority(2)`` on the thread id). Returns the new value, or None on another OS (not
    tried: there the thread id may name another process) or where the system refuses (a sandbox): the
    thread then keeps its priority."""
    inc = JUDGE_NICE if increment is None else increment
    if not sys.platform.startswith("linux"):  # elsewhere a thread id is no PRIO_PROCESS target (another process')
        return None
    try:
        tid = threading.get_native_id()
        new = min(19, os.getpriority(os.PRIO_PROCESS, tid) + inc)
        os.setpriority(os.PRIO_PROCESS, tid, new)
        return new
    except (OSError, AttributeError):
        return None


def batched(it, n: int, later: int | None = None):
    """Lists of ``n`` items of ``it``, then of ``later`` (default ``n``); the last may be shorter."""
    buf = []
    for x in it:
        buf.append(x)
        if len(buf) == n:
            yield buf
            buf = []
            n = later or n
    if buf:
        yield buf


def skip_judged(samples, sources: list[str], shas: list[str]):
    """``samples`` after the ``len(sources)`` judged before an interruption, each checked to come from
    the same source with the same content as then (:func:`anpred.run.store.sample_sha256`): a file
    added, removed, renamed or rewritten since would change what the checkpoint's statistics mean.

    Raises:
        AnpredError: a sample's source or content differs, or the inputs end before them."""
    import anpred.pipeline.stream_state as stream_state
    from anpred.run.store import sample_sha256

    it = iter(samples)
    for i, want in enumerate(sources):
        got = next(it, None)
        if got is None or got[0] != want:
            raise stream_state.ResumeRefused(
                f"cannot resume: the inputs changed since the checkpoint: sample s{i:06d} was {want}, now "
                f"{'nothing (fewer inputs)' if got is None else got[0]}; run without --resume to start over"
            )
        if i < len(shas) and sample_sha256(got[1]) != shas[i]:
            raise stream_state.ResumeRefused(
                f"cannot resume: the inputs changed since the checkpoint: sample s{i:06d} ({want}) has other "
                f"contents; run without --resume to start over"
            )
    yield from it


def prefetched(
    samples,
    chunk: int,
    work: Path,
    sources: list[str],
    first: int = 0,
    description: dict[str, Any] | None = None,
    later: int | None = None,
):
    """``(k, part, ids)`` per chunk of ``chunk`` samples (``later`` after the first): ``part`` the
    chunk's inputs in memory (:class:`anpred.inputs.ArraySamples`, ``description`` its inputs' record;
    each sample also hashed and written to ``work/in<k>``, to be moved into the chunk's run), ``ids``
    chunk sample id -> the dataset's id; ``sources`` grows with each sample's source; ``first``: the
    samples before it, already judged by a resumed run, are in ``sources`` and skipped by ``samples``.
    A thread reads and preprocesses the next chunk while the caller runs the current one (at most one
    chunk ahead, so at most three chunks of inputs are in memory: the one running, the one queued, the
    one being read); its errors (an unreadable image) are raised here. Closing the generator stops the thread."""
    from anpred.inputs import ArraySamples
    from anpred.run.store import sample_sha256
    from anpred.tensorfile import storable, write_safetensors

    del sources[first:]
    q: "queue.Queue[Any]" = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        lower_priority()
        try:
            for k, part in enumerate(batched(samples, chunk, later)):
                ids = {}
                pre: list = []
                folder = work / f"in{k}"
                folder.mkdir(parents=True, exist_ok=True)
                for j, (src, arrays) in enumerate(part):
                    ids[f"s{j:04d}"] = f"s{len(sources):06d}"
                    sources.append(src)
                    # hashed and written here, beside the running chunk, then moved into the chunk's run
                    if storable(arrays):
                        write_safetensors(folder / f"{j:06d}.safetensors", arrays, direct=False)
                        pre.append((sample_sha256(arrays), folder / f"{j:06d}.safetensors"))
                    else:
                        pre.append(None)
                if not put((k, ArraySamples(part, description, pre), ids)):
                    return
            put(None)
        except BaseException as err:  # noqa: BLE001 - raised in the caller's thread
            put(err)

    th = threading.Thread(target=produce, daemon=True, name="anpred-stream-inputs")
    th.start()
    try:
        while True:
            item = q.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        th.join()


def calibrated(specs: list, head: list, folder: Path) -> list:
    """``specs`` as :class:`anpred.run.BackendSpec`, those that calibrate on the run's inputs (int8)
    given the ``head`` samples (written into ``folder``) as their calibration: one quantized model for
    the whole dataset, calibrated as a run in one piece would be (its first 32 samples)."""
    from anpred.backends import backend_class
    from anpred.run import BackendSpec

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, (_, arrays) in enumerate(head):
        np.savez(folder / f"{i:06d}.npz", **arrays)
        files.append(str(folder / f"{i:06d}.npz"))
    out = []
    for s in specs:
        spec = BackendSpec.coerce(s)
        if (
            files
            and getattr(backend_class(spec.name), "needs_calibration", False)
            and "calibration" not in spec.options
        ):
            spec = BackendSpec(spec.name, spec.label, {**spec.options, "calibration": files})
        out.append(spec)
    return out
