"""What a run is asked to do: the backends of a run (:class:`BackendSpec`) and the job one backend
worker process is given (:class:`WorkerJob`, the driver -> worker contract).

Contract of a worker job (``.work/<label>/job.json`` in the partial run folder, written by
:func:`anpred.run.driver.run_model`, read by ``python -m anpred.run.worker --worker JOB``)::

    {"store": run folder, "name": registry name, "label": the backend's label in the run,
     "family": status family, "options": backend constructor options (runner keys removed, except
     the testing hooks "_fault"/"_fault_at"), "model": the anchored ONNX to run, "mode": "tensors" |
     "stats", "samples": sample ids in run order, "status_path": where the worker writes its
     BackendStatus (JSON; "resources.json" beside it: peak RSS and loop seconds), "shared_dir": the
     folder of the run's shared-conversion records (:mod:`anpred.backends.shared`; "" for none)}

The worker's result is the :class:`~anpred.backends.base.BackendStatus` written to ``status_path``;
the driver completes it (crash, timeout) and stores it in the run folder (:mod:`anpred.run.store`).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from anpred.backends import REGISTRY, backend_class
from anpred.errors import BackendError
from anpred.onnx_io import to_json

__all__ = ["MODES", "FAULTS", "BackendSpec", "RunSettings", "WorkerJob", "split_threads", "usable_cores"]

#: run modes: ``tensors`` stores every anchor tensor, ``stats`` streaming statistics only
MODES = ("tensors", "stats")
#: testing hook faults a worker can inject into itself (``options["_fault"]``)
FAULTS = ("segfault", "abort", "exit", "hang", "raise")
_LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
# Families of backends whose module cannot be imported (recorded status still needs one).
_FAMILY_GUESS = {
    "ort": "onnxruntime",
    "openvino": "openvino",
    "onnx-reference": "onnx-reference",
    "torch": "torch",
    "tf": "tensorflow",
}


@dataclass
class RunSettings:
    """How :func:`anpred.run.driver.run_model` runs (its fields are also accepted by name there).

    Attributes:
        mode: ``tensors`` (store every anchor tensor) or ``stats`` (streaming statistics only).
        timeout_s: per backend limit in seconds for preparing and running all samples.
        overwrite: replace the run folder if it holds a run (only once the new run is complete).
        progress: show a tqdm bar per backend and print the summary table (stderr).
        preprocess: image preprocessing override (``yolo`` | ``imagenet`` | ``unit``).
        precheck: before running, ask every backend's operator table which operators of the model it
            lacks (:mod:`anpred.backends.coverage`, in a child process; ``meta["coverage"]``); a
            backend with a known missing operator is not started and gets status ``unsupported``
            naming the operators. False: run every backend.
        pool: a :class:`anpred.run.driver.WorkerPool` whose long-lived workers run the backends
            (prepared once for a stream of runs) instead of one new process per backend and run; mode
            ``tensors`` only. Its workers run the model file itself (not the run folder's copy),
            prepared by the first run: every run of one pool must use the same model. The pool holds
            its own memory bounds.
        guards: memory bounds, the bad-input rule, the shared-conversion folder
            (:class:`anpred.run.limits.RunGuards`; None: the defaults, bounds from the machine or
            ``ANPRED_MEMORY_BOUND``). Recorded in ``run.json["memory_bounds"]``.
    """

    mode: str = "tensors"
    timeout_s: float = 600
    overwrite: bool = False
    progress: bool = True
    preprocess: str | None = None
    precheck: bool = True
    pool: Any = None
    guards: Any = None


@dataclass
class BackendSpec:
    """One backend of a run.

    Attributes:
        name: registry name (:data:`anpred.backends.REGISTRY`).
        label: the backend's identity in the run (folder names, statuses); default ``name``. Two specs
            of one run must have different labels. Characters: ``[A-Za-z0-9_.+-]``.
        options: passed to the backend constructor, except the runner's own keys:
            ``model`` (path of an alternative anchored ONNX run by this backend only, e.g. a
            fault-injected copy), ``family`` (overrides the backend's family in the status),
            ``python_path`` (folders put first on the worker's ``PYTHONPATH``, after ``anpred``
            itself: another release of the backend's library, :mod:`anpred.campaign.envs`; recorded
            with the run, so the drill-down and its repro run that release too),
            ``_fault``/``_fault_at`` (testing hook: ``segfault`` | ``abort`` | ``exit`` | ``hang`` |
            ``raise`` in the worker at ``prepare`` or ``run`` (default), a real crash of that process).
    """

    name: str
    label: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.name not in REGISTRY:
            raise BackendError(f"unknown backend {self.name!r}; known backends: {', '.join(REGISTRY)}")
        self.label = self.label or self.name
        if not _LABEL_RE.match(self.label):
            raise BackendError(f"backend label {self.label!r} may hold only letters, digits and _ . + -")
        self.options = dict(self.options or {})
        fault = self.options.get("_fault")
        if fault is not None and fault not in FAULTS:
            raise BackendError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        pp = self.options.get("python_path")
        if pp is not None and (isinstance(pp, str) or not all(Path(str(f)).is_dir() for f in pp)):
            raise BackendError(f"backend {self.label}: python_path must be a list of existing folders (got {pp!r})")
        if "model" in self.options and not Path(self.options["model"]).is_file():
            raise BackendError(f"backend {self.label}: alternative model {self.options['model']} does not exist")

    @classmethod
    def coerce(cls, b: "str | BackendSpec") -> "BackendSpec":
        return b if isinstance(b, BackendSpec) else cls(name=str(b).strip())

    def family(self) -> str:
        if self.options.get("family"):
            return str(self.options["family"])
        try:
            return backend_class(self.name).family
        except BackendError:
            return _FAMILY_GUESS.get(self.name.split("-")[0], self.name)


def usable_cores() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``: a cpuset or ``taskset`` counts;
    ``os.cpu_count()`` where the call is missing), at least 1."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def split_threads(specs: list, cores: int | None = None) -> list[BackendSpec]:
    """``specs`` (names or :class:`BackendSpec`) as they run side by side, at once, each in its own
    process: every backend that takes a ``threads`` option
    (:attr:`anpred.backends.base.Backend.threads_option`) and was not given one gets
    ``max(1, cores // len(specs))`` intra-op threads; the others are returned as they are. Order and
    length are kept; the caller's specs are not changed. ``cores``: default :func:`usable_cores`
    (logical CPUs). The numpy backends' BLAS threads and TensorFlow's inter-op pool are not set.

    Why: each library's default is one thread per core, so N backends at once run N times as many
    threads as there are cores, and a multi-threaded kernel whose thread is descheduled waits for it
    at the end of every parallel region. With the cores divided (no more backends than cores) no
    thread waits for another that lost its core (docs/task.md, "Side by side", has the timings).
    A thread count can change a backend's rounding where the library splits a reduction among
    threads (PyTorch's, measured there).

    Raises:
        BackendError: an unknown backend name.
    """
    specs = [BackendSpec.coerce(b) for b in specs]
    n = max(1, (usable_cores() if cores is None else int(cores)) // max(1, len(specs)))
    out = []
    for s in specs:
        try:
            takes = getattr(backend_class(s.name), "threads_option", False)
        except BackendError:  # its anpred module cannot be imported: the run says so, as without the split
            takes = False
        if takes and "threads" not in s.options:
            s = BackendSpec(s.name, s.label, {**s.options, "threads": n})
        out.append(s)
    return out


@dataclass
class WorkerJob:
    """The job of one backend worker process (module docstring: the ``job.json`` contract)."""

    store: str
    name: str
    label: str
    family: str
    options: dict[str, Any]
    model: str
    mode: str
    samples: list[str]
    status_path: str
    shared_dir: str = ""

    def save(self, path: str | Path) -> None:
        """Write the job as JSON (:func:`anpred.onnx_io.to_json`: values JSON lacks become text)."""
        Path(path).write_text(to_json(asdict(self)))

    @classmethod
    def load(cls, path: str | Path) -> "WorkerJob":
        return cls(**json.loads(Path(path).read_text()))
