"""How a backend's run ended, in words a user can act on: the status of a worker the driver saw end
without one (a crash named as a crash of the library, a timeout), the bad-input rule over a run's
backends, and the end-of-run table. Used by :mod:`anpred.run.driver` and the campaign
(:mod:`anpred.campaign.engine`, which applies the bad-input rule over a configuration's runs).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Iterable

from anpred.backends.base import BackendStatus
from anpred.errors import InputError

__all__ = [
    "SHAPE_FAIL_RE",
    "inputs_misfit",
    "raise_if_inputs_misfit",
    "format_summary",
    "log_tail",
    "crash_reason",
    "lost_status",
]

#: a failure reason that is a shape error (the bad-input rule)
SHAPE_FAIL_RE = re.compile(
    r"shape|dimension|Incompatible|broadcast|size mismatch|Sizes of tensors|"
    r"must match|invalid size|cannot reshape",
    re.I,
)
# faulthandler's frame line: '  File "PATH", line N in FUNC'
_FRAME_RE = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')


def inputs_misfit(statuses: Iterable[BackendStatus], sources: dict[str, str] | None = None) -> str | None:
    """The bad-input rule: when *every* backend failed (not crashed) while running the same sample and
    every reason is a shape error, the sample does not fit the model. Returns that sentence (naming
    the backends, the sample, its source from ``sources`` (sample id -> source) and the first
    backend's error), None otherwise. Apply it over all the backends of one configuration: one
    backend's shape error is that backend's failure, not bad input."""
    sts = list(statuses)
    if not sts or any(s.status not in ("failed", "unsupported") for s in sts):
        return None
    where = {s.reason.split(":", 1)[0] for s in sts}
    if (
        len(where) != 1
        or not next(iter(where)).startswith("sample ")
        or not all(SHAPE_FAIL_RE.search(s.reason) for s in sts)
    ):
        return None
    sid = next(iter(where)).split()[1]
    src = (sources or {}).get(sid, "")
    first = sts[0].reason.split(":", 1)[1].strip().splitlines()[0][:240]
    return (
        f"the inputs do not fit the model: every backend ({', '.join(s.name for s in sts)}) failed on "
        f"sample {sid}{f' ({src})' if src else ''} with a shape error, e.g. {sts[0].name}: {first}"
    )


def raise_if_inputs_misfit(store) -> None:
    """:func:`inputs_misfit` over the run's statuses; raises InputError (one line) instead of storing a
    run in which nothing ran."""
    why = inputs_misfit(store.statuses().values(), {x["id"]: x.get("source", "") for x in store.meta["samples"]})
    if why:
        raise InputError(why)


#: the most characters of a reason the end-of-run table shows in its column; a longer one is cut there
#: with "..." and given in full under the table
REASON_WIDTH = 80


def format_summary(store) -> str:
    """The end-of-run table: backend, family, status, precision, samples, seconds (prepare / run),
    anchors captured of the manifest's, and the reason when not ok (its first line; one longer than
    :data:`REASON_WIDTH` is cut with "..." in the table and given in full below it)."""
    total = len(store.manifest.anchors)
    rows = [("backend", "family", "status", "precision", "samples", "prepare s", "run s", "anchors", "reason")]
    full: list[str] = []
    for label, st in store.statuses().items():
        prec = f"{st.precision} ({st.precision_requested} asked)" if st.precision_differs else st.precision
        reason = st.reason.strip().splitlines()[0] if st.reason and st.reason.strip() else ""
        if len(reason) > REASON_WIDTH:
            full.append(f"  {label}: {reason}")
            reason = reason[: REASON_WIDTH - 3] + "..."
        rows.append(
            (
                label,
                st.family,
                st.status,
                prec,
                str(st.samples),
                f"{st.seconds_prepare:.2f}",
                f"{st.seconds_run:.2f}",
                f"{st.anchors_captured}/{total}",
                reason,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if full:
        lines += ["reasons in full:"] + full
    return "\n".join(lines)


def log_tail(path: Path, n: int = 6) -> str:
    """The last ``n`` non-empty lines of a worker log, led by Python's fatal-error line if any."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
    return " | ".join(fatal[-1:] + lines[-n:])[-800:]


def _library_of(path: str) -> str:
    """The package a source file belongs to: the folder under ``site-packages``/``dist-packages``,
    ``anpred``, or the standard library module (``ctypes``)."""
    p = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in p:
            return p.split(marker, 1)[1].split("/")[0].removesuffix(".py")
    if "/anpred/" in p:
        return "anpred"
    m = re.search(r"/python3[.\d]*/([^/]+)", p)
    return m.group(1).removesuffix(".py") if m else Path(p).stem


def _crash_frames(log_text: str) -> list[tuple[str, int, str]]:
    """The frames (innermost first) of the thread that crashed, from faulthandler's dump in a worker
    log (``Current thread ...`` block; else the first block after ``Fatal Python error``)."""
    lines = log_text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Current thread")] or [
        i + 1 for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")
    ]
    if not starts:
        return []
    frames = []
    for ln in lines[starts[-1] + 1 :]:
        m = _FRAME_RE.match(ln)
        if m:
            frames.append((m.group(1), int(m.group(2)), m.group(3)))
        elif frames and ln.strip():
            break
    return frames


def _operator_in(frames: list[tuple[str, int, str]]) -> str:
    """An ONNX operator named by the crashed stack: a frame's file named after an operator (a
    converter's per-operator module, e.g. ``onnx2tf/ops/Conv.py``), innermost first; '' if none."""
    try:
        import onnx.defs as defs
    except ImportError:  # pragma: no cover - onnx is a dependency
        return ""
    for path, _, _ in frames:
        stem = Path(path).stem
        if stem[:1].isupper() and defs.has(stem):
            return stem
    return ""


def crash_reason(rc: int, stage: str, done: int, n: int, log_path: Path) -> str:
    """A worker killed by signal ``-rc`` named as a crash of the library it was in: the signal, the
    package and function of the innermost frame of faulthandler's stack in the worker log, the ONNX
    operator where the stack names one, the backend's own step that called the library (its innermost
    ``anpred`` frame, e.g. ``ort._run_impl``), the stage (``preparing`` or ``running sample ...``) from
    the worker's last progress, and where the full stack is."""
    try:
        sig = signal.Signals(-rc).name
    except ValueError:
        sig = f"signal {-rc}"
    try:
        frames = _crash_frames(log_path.read_text(errors="replace"))
    except OSError:
        frames = []
    if frames:
        path, line, func = frames[0]
        where = f"{_library_of(path)} ({sig} in {func}, {Path(path).name}:{line})"
        op = _operator_in(frames)
        if op:
            where += f" at operator {op}"
        own = next(((f, fn) for f, _, fn in frames if _library_of(f) == "anpred"), None)
        if own is not None and _library_of(path) != "anpred":  # the step of the backend that called it
            where += f", called from {Path(own[0]).stem}.{own[1]}"
    else:
        where = f"the backend's native code ({sig}; no Python stack in the log)"
    return (
        f"crash of {where} while {stage} ({done}/{n} samples done): the process died in native code, "
        f"a defect of the library (the other backends are unaffected); full stack in logs/{log_path.name}"
    )


def lost_status(
    st: BackendStatus, rc: int | None, prepared: bool, done: int, n: int, log_path: Path, sample_ids: list[str]
) -> BackendStatus:
    """``st`` completed for a worker that ended without a final status: ``crashed`` (signal, named by
    :func:`crash_reason`) or ``failed`` (an exit status), with the samples done."""
    if prepared:
        stage = f"running sample {sample_ids[done]}" if done < len(sample_ids) else "running samples"
    else:
        stage = "preparing"
    if rc is not None and rc < 0:
        st.status, st.reason = "crashed", crash_reason(rc, stage, done, n, log_path)
    else:
        st.status = "failed"
        st.reason = (
            f"process exited with status {rc} without a result while {stage} ({done}/{n} samples done); "
            f"log: {log_tail(log_path, 4)}"
        )
    st.samples = done
    return st
