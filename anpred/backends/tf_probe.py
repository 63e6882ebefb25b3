"""onnx2tf asked node by node: the pre-run coverage below the operator name of the ``tf`` and ``litert``
backends (:mod:`anpred.backends.converter_probe`).

onnx2tf's operator table (``onnx2tf/ops/<OpType>.py``) says whether it has a converter for an operator;
the converter states further limits on attributes and inputs when it meets them (``GridSample``: "The
current implementation of GridSample supports only mode=[...]", ``MaxPool``: "Dilated MaxPool with
strides is not supported for 3D and above", ``NotImplementedError``), printed as onnx2tf ``ERROR:`` lines
before its ``sys.exit(1)``, or raised. :func:`onnx2tf_refusals` converts a one-node model of each node
(:class:`~anpred.backends.converter_probe.NodeProbe`, answers cached by node content) with onnx2tf as the
backend calls it (``Constant`` nodes folded, :func:`~anpred.backends.tf_prepare.prepare_for_onnx2tf`, the
calibration file in the working directory, onnxsim served warm, ``onnx2tf.convert(...,
disable_model_save=True, non_verbose=True)``), on the graph the backend gives onnx2tf (control flow
inlined, recurrent nodes unrolled, multi-axis Slices split).

Importing TensorFlow and onnx2tf costs seconds, so the conversions run in one worker process
(:class:`Onnx2tfWorker`, ``python -m anpred.backends.tf_probe``) that imports them once, started at the
first signature not in the cache, within :data:`~anpred.defaults.ONNX2TF_PROBE_BUDGET_S` per model
(its start included); nodes not probed within it are not refused.

A refusal is only what onnx2tf states: its ``sys.exit`` after its ``ERROR:`` lines (their first line),
a ``NotImplementedError``, "OP is not yet implemented", or a crash of the worker that comes back in a
fresh one. Any other exception (TensorFlow's shape and type checks, onnx2tf's bugs) may come from the
node being alone (its inputs are graph inputs, which onnx2tf transposes to channels-last) and is not a
refusal; a node with a 0-d input computed in the model is not asked (onnx2tf makes a 0-d graph input a
rank-1 one, which it is not in the model). Measurements: docs/backends-converters.md, "Pre-run coverage".
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import selectors
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["ONNX2TF_NODE_BASIS", "Onnx2tfWorker", "onnx2tf_probe", "onnx2tf_refusals", "convert_alone"]

#: how :func:`onnx2tf_refusals` knows (the backend's ``node_basis``)
ONNX2TF_NODE_BASIS = (
    "onnx2tf on a one-node model of each node, in one warm worker (what onnx2tf states: its "
    "ERROR lines before sys.exit, NotImplementedError; cached by content)"
)
#: the probe's own revision, part of every cache key (a change of what counts as a refusal asks anew)
REVISION = "anpred.tf_probe/1"  # (bump when what counts as a refusal changes)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def convert_alone(path: Path, scratch: Path, whole: bool = False) -> dict[str, str]:
    """In this process (TensorFlow and onnx2tf imported): onnx2tf on the model at ``path`` as the ``tf``
    backend converts (module docstring), in ``scratch`` (a folder holding onnx2tf's calibration file;
    the model is written there). Returns ``{"refused": "" | onnx2tf's statement, "note": the error when
    not a statement ("" when it converted), "node": the ONNX node onnx2tf names in its log (the model's
    name), "" when none}``. ``whole``: the model is a whole model, not a one-node one (its 0-d inputs
    are asked: the backend gives them to onnx2tf as they are)."""
    import onnx
    import onnx2tf

    from anpred.backends.convert import fold_constant_nodes, working_directory
    from anpred.backends.onnxsim_warm import warm_onnxsim
    from anpred.backends.tf_prepare import prepare_for_onnx2tf

    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    if not whole and any(vi.name not in inits and not vi.type.tensor_type.shape.dim for vi in model.graph.input):
        return {"refused": "", "note": "not asked: a 0-d input alone is a rank-1 graph input for onnx2tf", "node": ""}
    fold_constant_nodes(model)
    renamed = prepare_for_onnx2tf(model)["node_names"]
    src = scratch / f"{path.stem}.onnx"
    onnx.save(model, str(src))
    log = io.StringIO()
    out = {"refused": "", "note": "", "node": ""}
    try:
        with working_directory(scratch), warm_onnxsim(), contextlib.redirect_stdout(log):
            km = onnx2tf.convert(
                input_onnx_file_path=str(src),
                output_folder_path=str(scratch / "o2t"),
                disable_model_save=True,
                non_verbose=True,
            )
        if km is None:
            out["note"] = "onnx2tf returned no model"
    except SystemExit:
        out["refused"] = f"onnx2tf stops on this node: {_first_error(log.getvalue())}"
    except NotImplementedError as err:
        out["refused"] = f"NotImplementedError: {_first_line(str(err))}"
    except Exception as err:  # noqa: BLE001 - not a stated limit (alone: the node may convert in its model)
        if isinstance(err, ModuleNotFoundError) and "OP is not yet implemented" in _ANSI.sub("", log.getvalue()):
            out["refused"] = _first_error(log.getvalue())
        else:
            out["note"] = f"{type(err).__name__}: {_first_line(str(err))}"
    finally:
        src.unlink(missing_ok=True)
        _clear_session()
    m = re.search(r"onnx_op_name:\s*(\S+)", _ANSI.sub("", log.getvalue()))
    if m:
        out["node"] = renamed.get(m.group(1), m.group(1))
    return out


def _clear_session() -> None:
    """Free what one conversion left in TensorFlow's and tf_keras's global state (a worker converts many)."""
    try:
        import tf_keras

        tf_keras.backend.clear_session()
    except Exception:  # noqa: BLE001 - only memory is at stake
        pass


def _first_line(text: str, limit: int = 240) -> str:
    """The first line of ``text`` (ANSI colours and onnx2tf's ``ERROR:`` prefix removed), cut at ``limit``."""
    text = _ANSI.sub("", text).strip().removeprefix("ERROR:").strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[:limit] + " ..."


def _first_error(log: str) -> str:
    """The first of onnx2tf's ``ERROR:`` lines in ``log`` (ANSI colours and the prefix removed), with the
    line after it when the message goes on there; else the log's last line."""
    lines = [_ANSI.sub("", ln).strip() for ln in log.splitlines()]
    lines = [ln for ln in lines if ln]
    for i, ln in enumerate(lines):
        if ln.startswith("ERROR:"):
            return _first_line(ln[len("ERROR:") :].strip() or (lines[i + 1] if i + 1 < len(lines) else ""))
    return _first_line(lines[-1]) if lines else "no message"


class Onnx2tfWorker:
    """One child process (``python -m anpred.backends.tf_probe``) that imports TensorFlow and onnx2tf once
    and converts one-node models on request (:func:`convert_alone`). Started at the first :meth:`ask`;
    a worker that dies or passes its time is killed and a new one starts at the next request.

    Attributes:
        started_s: seconds the last start took (imports included), 0 before.
    """

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.started_s = 0.0

    def _start(self, timeout_s: float) -> subprocess.Popen | None:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "anpred.backends.tf_probe", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        if _read_line(proc, timeout_s) is None:  # its "ready" line: the imports are done
            _kill(proc)
            return None
        self.started_s = time.perf_counter() - t0
        return proc

    def ask(self, path: Path, deadline: float, whole: bool = False) -> dict[str, Any]:
        """onnx2tf on the one-node model at ``path`` (``whole``: a whole model) in the worker, answered (its
        start included) before ``deadline`` (a ``time.perf_counter()`` value): ``{"refused", "note",
        "node"}`` (:func:`convert_alone`), or ``{"crashed": signal or exit status}`` when the worker died
        during it, ``{"timeout": True}`` when it did not answer in time (the worker is killed in both
        cases)."""
        with self.lock:
            if time.perf_counter() >= deadline:
                return {"timeout": True}
            if self.proc is None or self.proc.poll() is not None:
                self.proc = self._start(deadline - time.perf_counter())
                if self.proc is None:
                    return {"timeout": True}
            proc = self.proc
            try:
                proc.stdin.write((json.dumps({"path": str(path), "whole": whole}) + "\n").encode())
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
            line = _read_line(proc, deadline - time.perf_counter())
            if line:
                return json.loads(line)
            rc = proc.poll()
            _kill(proc)
            self.proc = None
            return {"timeout": True} if rc is None else {"crashed": -rc if rc < 0 else rc}

    def close(self) -> None:
        with self.lock:
            if self.proc is not None:
                try:
                    self.proc.stdin.close()
                    self.proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    _kill(self.proc)
            self.proc = None


def _read_line(proc: subprocess.Popen, timeout_s: float) -> bytes | None:
    """One reply line of ``proc`` within ``timeout_s`` seconds; None at its end or past the time."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=max(0.0, timeout_s)):
            return None
    line = proc.stdout.readline()
    return line or None


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


#: how a probe's answer marks an error of onnx2tf that is not a statement (cached as such): checked on the
#: whole model before it is a refusal
ALONE = "fails alone: "
#: how it marks a crash of the worker that came back in a fresh one (checked likewise)
CRASH = "crashes alone: "


def onnx2tf_probe(budget_s: float | None = None):
    """The onnx2tf :class:`~anpred.backends.converter_probe.NodeProbe` of the pre-run coverage, its
    conversions in one :class:`Onnx2tfWorker` within ``budget_s`` seconds (default
    :data:`~anpred.defaults.ONNX2TF_PROBE_BUDGET_S`, the worker's start included); the worker is the
    probe's ``worker`` attribute (close it when done), the deadline its ``deadline``. An answer is ""
    (converts), onnx2tf's statement, or one marked :data:`ALONE` / :data:`CRASH` (not yet a refusal:
    :func:`onnx2tf_refusals` checks it on the whole model)."""
    import importlib.metadata as md

    from anpred.backends.converter_probe import NodeProbe
    from anpred.defaults import ONNX2TF_PROBE_BUDGET_S

    budget = ONNX2TF_PROBE_BUDGET_S if budget_s is None else float(budget_s)
    worker = Onnx2tfWorker()
    deadline = time.perf_counter() + budget

    def convert(path: Path, _scratch: Path) -> str | None:
        answer = worker.ask(path, deadline)
        if "crashed" in answer:
            # a crash alone is asked again in a fresh worker: one that does not come back is not the node's
            again = worker.ask(path, deadline)
            if "crashed" not in again:
                answer = again
            else:
                return f"{CRASH}the onnx2tf worker died (signal or status {answer['crashed']}), twice"
        if "refused" not in answer:
            return None  # no answer in time: not refused, not cached
        if answer["refused"]:
            return answer["refused"]
        return f"{ALONE}{answer['note']}" if answer["note"] and not answer["note"].startswith("not asked") else ""

    probe = NodeProbe(
        "onnx2tf", f"onnx2tf {md.version('onnx2tf')} tensorflow {_tf_version()} {REVISION}", convert, budget
    )
    probe.worker, probe.deadline = worker, deadline
    return probe


def _tf_version() -> str:
    """TensorFlow's version from its distribution's metadata (importing it costs seconds)."""
    import importlib.metadata as md

    for dist in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return "?"


def onnx2tf_refusals(model, budget_s: float | None = None) -> dict[str, str]:
    """``{op key: reason}`` of the nodes of ``model`` (an ``onnx.ModelProto``, weights loaded; not
    modified) onnx2tf refuses (module docstring), probed alone on the graph the ``tf`` backend gives
    onnx2tf: ``Constant`` nodes folded, control flow inlined, recurrent nodes unrolled, multi-axis Slices
    split. A statement of onnx2tf alone is a refusal; an unstated error or a crash alone only where the
    whole model (every input static; converted in the same worker, within the same budget) fails at a
    node of that operator (that error then the reason) or crashes too; none where the whole model
    converts, or was not converted. Never raises: a graph that cannot be prepared is not probed (``{}``)."""
    import onnx

    from anpred.backends.convert import fold_constant_nodes
    from anpred.backends.tf_prepare import prepare_for_onnx2tf

    m = onnx.ModelProto()
    m.CopyFrom(model)
    try:
        fold_constant_nodes(m)
        prepare_for_onnx2tf(m)
    except Exception:  # noqa: BLE001 - the backend's own preparation fails: the run names it
        return {}
    probe = onnx2tf_probe(budget_s)
    try:
        found = probe.refusals(m)
        pending = {
            k: why
            for k, why in found.items()
            if why.startswith(f"onnx2tf: {ALONE}") or why.startswith(f"onnx2tf: {CRASH}")
        }
        out = {k: why for k, why in found.items() if k not in pending}
        if pending:
            out.update(_checked_whole(model, pending, probe))
        return out
    except Exception:  # noqa: BLE001 - the probe's own failure refuses nothing
        return {}
    finally:
        probe.worker.close()


def _checked_whole(model, pending: dict[str, str], probe) -> dict[str, str]:
    """The refusals among ``pending`` (``{op key: reason}`` marked :data:`ALONE` / :data:`CRASH`) that
    the whole ``model`` confirms (:func:`onnx2tf_refusals`), converted in ``probe.worker`` before
    ``probe.deadline``."""
    import tempfile

    from anpred.onnx_io import save_model

    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name not in inits and any(not d.HasField("dim_value") or d.dim_value <= 0 for d in dims):
            return {}  # the backend fixes dynamic dimensions to the run's shapes: not known here
    with tempfile.TemporaryDirectory(prefix="anpred-tf-probe-whole-") as tmp:
        path = Path(tmp) / "whole.onnx"
        save_model(model, path)
        answer = probe.worker.ask(path, probe.deadline, whole=True)
    if "crashed" in answer:
        return {k: why for k, why in pending.items() if why.startswith(f"onnx2tf: {CRASH}")}
    if "refused" not in answer or not answer["node"]:
        return {}  # converted, out of time, or a failure without a node: nothing confirmed
    node = next((n for n in model.graph.node if (n.name or n.output[0]) == answer["node"]), None)
    if node is not None:
        keys = [_op_key(node)]
    else:  # an unnamed node, named "<OpType>_<index>" by onnx2tf's simplification
        op = re.sub(r"_\d+$", "", answer["node"])
        keys = sorted({_op_key(n) for n in model.graph.node if n.op_type == op})
    key = next((k for k in keys if k in pending), "")
    if not key:
        return {}
    return {
        key: f"onnx2tf fails on this node in the model: {answer['refused'] or answer['note']} "
        f"(node {answer['node']!r}; it fails alone too)"
    }


def _op_key(node) -> str:
    """The coverage's operator key of ``node`` (:func:`anpred.onnx_io.model_ops`)."""
    dom = "" if node.domain in ("", "ai.onnx") else node.domain
    return f"{dom}::{node.op_type}" if dom else node.op_type


def serve(parent: int = 0) -> None:
    """The worker's loop: imports TensorFlow and onnx2tf, writes a ``{"ready": true}`` line, then answers
    each stdin line ``{"path": one-node model, "whole": bool}`` with one line (:func:`convert_alone`'s
    dict). Ends at the end of its input, or within a second after process ``parent`` ends."""
    import tempfile

    if parent:
        # not PR_SET_PDEATHSIG: it fires when the parent *thread* that started the worker ends (a probe's
        # thread pool), not the parent process
        threading.Thread(target=_exit_without, args=(parent,), daemon=True).start()
    import sysconfig

    # onnx2tf runs the onnxsim command: the interpreter's scripts folder first on PATH, as the backend does
    os.environ["PATH"] = os.pathsep.join(p for p in (sysconfig.get_path("scripts"), os.environ.get("PATH")) if p)
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what TensorFlow and onnx2tf write to fd 1 must not corrupt the replies
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
    import onnx2tf  # noqa: F401 - the seconds of TensorFlow's import, paid once
    import tf_keras  # noqa: F401

    from anpred.backends.convert import onnx2tf_calibration_file

    with tempfile.TemporaryDirectory(prefix="anpred-tf-probe-") as tmp:
        scratch = Path(tmp)
        onnx2tf_calibration_file(scratch)  # once: every conversion reads it from its working directory
        reply.write(json.dumps({"ready": True}) + "\n")
        reply.flush()
        for line in sys.stdin:
            req = json.loads(line)
            reply.write(json.dumps(convert_alone(Path(req["path"]), scratch, bool(req.get("whole")))) + "\n")
            reply.flush()


def _exit_without(parent: int) -> None:
    """End this process within a second after process ``parent`` (its parent) ends."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
