"""What guards a run against what it runs: memory bounds of the backend workers, the bad-input rule,
the folder where a population's shared conversion records that it failed (:class:`RunGuards`), and
the watchdog that holds the memory bounds (:class:`MemoryWatch`).

Memory bounds (docs/run.md, "Memory bounds"): every backend worker process (with its children, e.g.
a converter it starts) may hold at most ``backend_memory`` bytes of resident memory (RSS), and the
run's processes together (the driver and its live workers) at most ``run_memory``. A worker over a
bound is killed with its process group and its status is ``failed`` with the bound named; the other
backends go on. The bounds are held by the driver polling the RSS of each worker's process tree with
``psutil`` every :data:`anpred.defaults.MEMORY_POLL_S` seconds, not by ``RLIMIT_AS`` or a cgroup:

- ``RLIMIT_AS`` bounds *virtual* address space, and runtimes reserve more of it than they touch, each
  by its own factor, which grows with the cores (glibc reserves a malloc arena per thread; the factors:
  docs/run.md, 'Memory bounds'): one limit on virtual memory is a different limit on resident memory
  for every runtime and machine, and it cannot bound the run as a whole;
- a cgroup needs a writable, delegated cgroup hierarchy, which a user process rarely has (on cgroup v1
  the process's own group belongs to the container or session manager).

Default (:func:`machine_bounds`): :data:`anpred.defaults.MEMORY_BOUND_SHARE` of the memory available
when the run starts, the smaller of the kernel's ``MemAvailable`` (``psutil.virtual_memory``) and the
room left under this process's cgroup limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), for
each worker and for the run as a whole. ``ANPRED_MEMORY_BOUND`` / ``ANPRED_RUN_MEMORY_BOUND`` (GiB;
``anpred run|test|campaign --memory-bound``) set them for every run of the process.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError

__all__ = ["RunGuards", "MemoryWatch", "machine_bounds", "parse_gib", "gib", "MEMORY_ENV", "RUN_MEMORY_ENV"]

#: environment variables holding the per-backend and the overall bound in GiB (the CLI's --memory-bound)
MEMORY_ENV = "ANPRED_MEMORY_BOUND"
RUN_MEMORY_ENV = "ANPRED_RUN_MEMORY_BOUND"
_GIB = 1 << 30
# Linux with CONFIG_PROC_CHILDREN (every distribution kernel): a process's children without a scan of /proc
_PROC_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def gib(n: float) -> str:
    """``n`` bytes as ``"6.0 GiB"`` (``"512 MiB"`` below 1 GiB)."""
    return f"{n / _GIB:.1f} GiB" if n >= _GIB else f"{n / (1 << 20):.0f} MiB"


def parse_gib(value: Any, what: str = "memory bound") -> int:
    """Bytes of a bound given in GiB (a number or its text). Raises AnpredError: not a positive number."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not v > 0:
        raise AnpredError(f"{what} must be a positive number of GiB (got {value!r})")
    return int(v * _GIB)


@dataclass
class RunGuards:
    """What a run guards against (a field left None takes its default at :meth:`resolved`).

    Attributes:
        backend_memory: bytes of RSS one backend worker (its process tree) may hold; None: the
            environment's ``ANPRED_MEMORY_BOUND`` (GiB), else :func:`machine_bounds`.
        run_memory: bytes the run's processes may hold together (driver and live workers); None:
            ``ANPRED_RUN_MEMORY_BOUND``, else :func:`machine_bounds`.
        bad_input_rule: raise InputError when every backend of the run failed on the same sample with a
            shape error (:func:`anpred.run.outcome.inputs_misfit`). False where the run holds only a part
            of the backends and the caller applies the rule over all of them (a campaign's
            single-backend runs, :mod:`anpred.campaign.engine`).
        shared_dir: the folder where the run's workers record a population's shared conversion that
            failed (:mod:`anpred.backends.shared`); None: the run's own work folder. A campaign gives
            each configuration one, shared by its single-backend runs.
    """

    backend_memory: int | None = None
    run_memory: int | None = None
    bad_input_rule: bool = True
    shared_dir: str | None = None

    def resolved(self, machine: dict[str, Any] | None = None) -> "RunGuards":
        """A copy with both memory bounds in bytes; ``machine``: :func:`machine_bounds` when already
        read (else read here if a bound needs it). Raises AnpredError on a malformed environment value."""
        vals = []
        for given, env in ((self.backend_memory, MEMORY_ENV), (self.run_memory, RUN_MEMORY_ENV)):
            if given is None and os.environ.get(env):
                given = parse_gib(os.environ[env], env)
            if given is None:
                machine = machine or machine_bounds()
                given = machine["bound"]
            vals.append(int(given))
        return RunGuards(vals[0], vals[1], self.bad_input_rule, self.shared_dir)

    def sources(self) -> dict[str, str]:
        """Where each bound comes from: ``given`` (this object), ``environment``, ``machine``."""
        return {
            k: "given" if v is not None else ("environment" if os.environ.get(env) else "machine")
            for k, v, env in (
                ("backend_memory", self.backend_memory, MEMORY_ENV),
                ("run_memory", self.run_memory, RUN_MEMORY_ENV),
            )
        }


def _cgroup_room() -> tuple[int | None, str]:
    """Bytes left under this process's cgroup memory limit and the file it came from; (None, "") when
    no limit applies (none set, or the files are not readable)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, ""
    for ln in lines:
        hid, ctrl, path = (ln.split(":", 2) + ["", ""])[:3]
        if hid == "0" and ctrl == "":  # cgroup v2
            root, names = Path("/sys/fs/cgroup"), ("memory.max", "memory.current")
        elif "memory" in ctrl.split(","):  # cgroup v1
            root, names = Path("/sys/fs/cgroup/memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        # the group's folder; in a container whose cgroup namespace is not its own, the mount's root is it
        for base in (root / path.lstrip("/"), root):
            try:
                text = (base / names[0]).read_text().strip()
                if text == "max" or int(text) >= 1 << 60:  # v1 writes "no limit" as a page-rounded 2^63
                    break
                return max(0, int(text) - int((base / names[1]).read_text().strip())), str(base / names[0])
            except (OSError, ValueError):
                continue
    return None, ""


def machine_bounds() -> dict[str, Any]:
    """The default bound of this machine now: ``{"available": bytes, "source": what limited it,
    "share": MEMORY_BOUND_SHARE, "bound": share x available}``. Available: the smaller of
    ``psutil.virtual_memory().available`` (Linux ``MemAvailable``) and the room under this process's
    cgroup limit."""
    import psutil

    from anpred.defaults import MEMORY_BOUND_SHARE

    avail, source = int(psutil.virtual_memory().available), "MemAvailable"
    room, cg = _cgroup_room()
    if room is not None and room < avail:
        avail, source = room, f"cgroup limit ({cg})"
    return {"available": avail, "source": source, "share": MEMORY_BOUND_SHARE, "bound": int(avail * MEMORY_BOUND_SHARE)}


def _descendants(pid: int) -> list[int]:
    """``pid`` and its descendants: Linux's ``/proc/<pid>/task/<tid>/children`` (no scan of every
    process: ``psutil``'s ``children(recursive=True)`` reads all of ``/proc``, many times slower:
    docs/run.md, 'Memory bounds'), else ``psutil``."""
    if not _PROC_CHILDREN:
        return _psutil_descendants(pid)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:  # ended
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):  # the thread ended meanwhile
                continue
    return out


def _psutil_descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


def _tree_memory(pid: int) -> tuple[int, int]:
    """``(RSS, virtual size)`` in bytes of process ``pid`` and all its descendants ((0, 0) when gone)."""
    import psutil

    rss = vms = 0
    for q in _descendants(pid):
        try:
            mi = psutil.Process(q).memory_info()
        except psutil.Error:  # ended between the listing and the reading
            continue
        rss, vms = rss + mi.rss, vms + mi.vms
    return rss, vms


def _own_rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class MemoryWatch:
    """The driver-side watchdog of a run's memory bounds (module docstring).

    Register each worker with :meth:`watch` (the leader of its own process group), call :meth:`check`
    while waiting for it (at least every :attr:`interval` seconds), :meth:`forget` it when it ended.
    ``peak[label]`` / ``peak_vms[label]``: the largest RSS / virtual size seen of that worker's tree
    (bytes; the virtual size is recorded to show why ``RLIMIT_AS`` is not used)."""

    def __init__(self, guards: RunGuards | None = None):
        from anpred.defaults import MEMORY_POLL_S

        guards = guards or RunGuards()
        machine = machine_bounds()
        g = guards.resolved(machine)
        self.backend_bytes, self.run_bytes = int(g.backend_memory), int(g.run_memory)
        #: what ``run.json`` records as ``memory_bounds``: both bounds, their sources, the machine's figure
        self.record = {
            "backend_bytes": self.backend_bytes,
            "run_bytes": self.run_bytes,
            "source": guards.sources(),
            "machine": machine,
        }
        self.interval = MEMORY_POLL_S
        self.pids: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.peak_vms: dict[str, int] = {}
        self.killed: dict[str, str] = {}
        self._last = 0.0

    def watch(self, label: str, pid: int) -> None:
        self.pids[label] = pid
        self.killed.pop(label, None)

    def forget(self, label: str) -> None:
        self.pids.pop(label, None)

    def reason(self, label: str, stage: str) -> str:
        """The status reason of a worker this watch killed: the bound and the RSS seen, the ``stage``
        (e.g. ``"running samples (0/1 samples done)"``), what to do."""
        cause = self.killed[label]
        advice = (
            f"raise it with {RUN_MEMORY_ENV}=GIB"
            if "overall" in cause
            else f"raise it with --memory-bound GIB ({MEMORY_ENV}) if the model needs more"
        )
        return f"{cause} while {stage}; killed: {advice}"

    def check(self, force: bool = False) -> dict[str, str]:
        """Sample the watched workers (at most once per :attr:`interval` unless ``force``); kill the
        process group of each worker over ``backend_bytes``, and, while the run's processes together
        are over ``run_bytes``, of the largest one. Returns label -> reason of those killed now."""
        now = time.monotonic()
        if not self.pids or (not force and now - self._last < self.interval):
            return {}
        self._last = now
        mem = {b: _tree_memory(pid) for b, pid in self.pids.items()}
        rss = {b: m[0] for b, m in mem.items()}
        for b, (r, v) in mem.items():
            self.peak[b] = max(self.peak.get(b, 0), r)
            self.peak_vms[b] = max(self.peak_vms.get(b, 0), v)
        out = {}
        for b, r in rss.items():
            if r > self.backend_bytes:
                out[b] = f"{b}: exceeded the memory bound of {gib(self.backend_bytes)} per backend (RSS {gib(r)})"
        live = {b: r for b, r in rss.items() if b not in out}
        driver = _own_rss()  # the run's processes: the driver and its live workers
        while live and driver + sum(live.values()) > self.run_bytes:
            b = max(live, key=live.get)
            out[b] = (
                f"{b}: exceeded the run's overall memory bound of {gib(self.run_bytes)} (the run's processes "
                f"together: RSS {gib(driver + sum(live.values()))}, this worker {gib(live[b])}, the largest)"
            )
            del live[b]
        for b in out:
            try:
                os.killpg(self.pids[b], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.killed[b] = out[b]
            self.forget(b)
        return out
