"""Testing hooks of a streamed run: the points where a test interrupts it (:mod:`anpred.pipeline.stream`).

A test injects a :class:`StreamHooks` subclass (``StreamOptions(hooks=...)``, or
``anpred.cli.main(argv, stream_hooks=...)`` for a command line run in a process of its own), never an
environment variable; the command line itself runs with the no-op hooks below. The tests' hooks send
a real Ctrl-C once some samples are judged and checkpointed, or raise KeyboardInterrupt after the last
checkpoint or while the report is written, to prove that ``--resume`` continues from there.
"""

from __future__ import annotations

__all__ = ["StreamHooks"]


class StreamHooks:
    """The points of a streamed run a test can act at; every method here does nothing."""

    def judged(self, n: int) -> None:
        """In the judge thread, after each chunk is judged and its checkpoint written: ``n`` samples
        judged so far (this run and the one it resumes)."""

    def before_refill(self) -> None:
        """In the caller's thread, once every chunk is judged, before the kept samples are run once
        more in full."""

    def after_stream(self) -> None:
        """In the caller's thread (``anpred test --stream``), once the stream's run folder has joined
        the report being built, before the report is written."""
