"""onnx2tf's onnx-simplifier runs, served by one warm process instead of a new one per call.

onnx2tf simplifies its input by running the ``onnxsim`` *command* three times in a row, and once more
after its own graph edits (``onnx2tf/onnx2tf.py``: ``subprocess.check_output(["onnxsim", IN, OUT,
...])``; it calls the command rather than the library "due to unstable script execution of onnxsim in
v0.4.8"). Each call starts a Python interpreter that imports onnx, onnxruntime and onnxsim, which on a
small model is nearly all of onnx2tf's time (docs/backends-converters.md, 'Measurements: onnxsim
calls'; ``benchmarks/bench_conformance.py --profile-onnx2tf``).

:func:`warm_onnxsim` routes those calls, for the duration of a conversion, to one long-lived child
process (:class:`OnnxsimServer`, started at the first call and kept for the next conversions of the
same worker) that runs onnx-simplifier's own command-line entry point (``onnxsim.main`` with that
``argv``) in process. What the simplifier does is unchanged (the same entry point, arguments, files);
isolation is kept as before: the simplifier runs in a process of its own, and a crash or an exit
there is a :class:`subprocess.CalledProcessError` for onnx2tf, as a failing command was (onnx2tf then
warns and converts the unsimplified graph); a dead server is replaced at the next call. The server
dies with its parent (``PR_SET_PDEATHSIG``) and lives in its process group (a worker killed on a
timeout takes it along).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from typing import Any, Iterator

__all__ = ["OnnxsimServer", "warm_onnxsim", "serve"]


class OnnxsimServer:
    """One child process running ``onnxsim.main`` for each request line (``python -m
    anpred.backends.onnxsim_warm``). :meth:`call` sends an argv and returns ``(exit status, output)``."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def _ensure(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "anpred.backends.onnxsim_warm", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,
                text=True,
            )
        return self.proc

    def call(self, args: list[str]) -> tuple[int, str]:
        """Run ``onnxsim ARGS`` in the server; returns ``(exit status, captured output)``; a server that
        died meanwhile gives status -1 (and is restarted at the next call)."""
        with self.lock:
            proc = self._ensure()
            try:
                proc.stdin.write(json.dumps(args) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
            if not line:
                proc.kill()
                proc.wait()
                self.proc = None
                return -1, "the onnxsim server process ended (crashed) during the call"
            reply = json.loads(line)
            return int(reply["rc"]), str(reply["out"])

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


_SERVER = OnnxsimServer()


class _SubprocessProxy:
    """The ``subprocess`` module as onnx2tf sees it inside :func:`warm_onnxsim`: ``check_output`` of an
    ``onnxsim`` command goes to the server, everything else to the real module."""

    def __init__(self, real, server: OnnxsimServer):
        self._real, self._server = real, server

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def check_output(self, cmd, *args, **kwargs):
        if isinstance(cmd, (list, tuple)) and cmd and os.path.basename(str(cmd[0])) == "onnxsim":
            rc, out = self._server.call([str(c) for c in cmd[1:]])
            if rc != 0:
                raise self._real.CalledProcessError(rc, list(cmd), output=out.encode())
            return out.encode() if not kwargs.get("text") else out
        return self._real.check_output(cmd, *args, **kwargs)


@contextlib.contextmanager
def warm_onnxsim() -> Iterator[OnnxsimServer | None]:
    """For the duration, onnx2tf's ``onnxsim`` command calls run in the warm server (module
    docstring). Not re-entrant across threads (one conversion at a time per process).
    ``ANPRED_WARM_ONNXSIM=0`` in the environment leaves onnx2tf's own subprocess calls (yields None;
    for measuring the difference, ``benchmarks/bench_conformance.py --profile-onnx2tf``)."""
    if os.environ.get("ANPRED_WARM_ONNXSIM", "1") == "0":
        yield None
        return
    import onnx2tf.onnx2tf as o2t_module

    real = o2t_module.subprocess
    o2t_module.subprocess = _SubprocessProxy(real, _SERVER)
    try:
        yield _SERVER
    finally:
        o2t_module.subprocess = real


def serve(parent: int = 0) -> None:
    """The server's loop: each stdin line is a JSON argv for ``onnxsim``; each reply line is
    ``{"rc": exit status, "out": what it printed}``. Ends at the end of its input."""
    import io

    if parent and sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    from onnxsim import main as onnxsim_main

    out_fd = os.dup(1)
    reply = os.fdopen(out_fd, "w")
    os.dup2(2, 1)  # what the simplifier writes to fd 1 directly must not corrupt the replies
    for line in sys.stdin:
        argv = json.loads(line)
        buf = io.StringIO()
        sys.argv = ["onnxsim", *argv]
        try:
            with contextlib.redirect_stdout(buf):
                rc = onnxsim_main()
            rc = int(rc or 0)
        except SystemExit as err:
            rc = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
        except Exception as err:  # noqa: BLE001 - a failing command, as the subprocess was
            print(f"{type(err).__name__}: {err}", file=buf)
            rc = 1
        reply.write(json.dumps({"rc": rc, "out": buf.getvalue()}) + "\n")
        reply.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
