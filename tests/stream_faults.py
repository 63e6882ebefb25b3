"""Streamed runs interrupted on purpose (helpers, not tests): testing hooks injected into ``anpred test
--stream`` (:class:`anpred.pipeline.stream_hooks.StreamHooks`), for the tests of its checkpoint and resume.

``python tests/stream_faults.py FAULT ARGS...`` runs ``anpred ARGS...`` (:func:`anpred.cli.main`, the
same exit codes and messages) in a process of its own with the hooks of ``FAULT``:

- ``sigint-after=N``: a real Ctrl-C (SIGINT to the main thread) once N samples are judged and checkpointed;
- ``before-refill``: KeyboardInterrupt once every chunk is judged, before the kept samples are run again;
- ``after-stream``: KeyboardInterrupt while the report is written.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

if __name__ == "__main__":  # the checkout's anpred, as `python -m anpred` run from there imports it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from anpred.pipeline.stream_hooks import StreamHooks  # noqa: E402


class SigintAfter(StreamHooks):
    """Ctrl-C once ``after`` samples are judged."""

    def __init__(self, after: int) -> None:
        self.after, self.sent = after, False

    def judged(self, n: int) -> None:
        if n >= self.after and not self.sent:
            # a real Ctrl-C (SIGINT to the main thread) once that many samples are judged and
            # checkpointed, whatever the load (a test that sends it on reading the progress line can come too late)
            self.sent = True
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


class InterruptAt(StreamHooks):
    """KeyboardInterrupt at the hook named ``at`` (``before_refill`` or ``after_stream``)."""

    def __init__(self, at: str) -> None:
        self.at = at

    def before_refill(self) -> None:
        if self.at == "before_refill":  # interrupted after the last checkpoint
            raise KeyboardInterrupt

    def after_stream(self) -> None:
        if self.at == "after_stream":  # interrupted while reporting
            raise KeyboardInterrupt


def hooks(fault: str) -> StreamHooks:
    """The hooks of ``fault`` (module docstring). Raises ValueError: an unknown fault."""
    if fault.startswith("sigint-after="):
        return SigintAfter(int(fault.split("=", 1)[1]))
    if fault in ("before-refill", "after-stream"):
        return InterruptAt(fault.replace("-", "_"))
    raise ValueError(f"unknown stream fault {fault!r}")


def command(fault: str) -> list[str]:
    """The command line prefix that runs ``anpred`` with the hooks of ``fault`` (append anpred's arguments)."""
    return [sys.executable, str(Path(__file__).resolve()), fault]


if __name__ == "__main__":
    from anpred.cli import main

    sys.exit(main(sys.argv[2:], stream_hooks=hooks(sys.argv[1])))
