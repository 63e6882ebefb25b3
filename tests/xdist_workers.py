"""How many pytest-xdist workers ``-n auto`` (pyproject's addopts) starts for this suite (issue 32: the
default run on every core of a 2-core machine, without swapping on a machine with less memory than cores).

The count: the CPUs this process may use (``os.sched_getaffinity``; a cgroup v2 CPU quota, ``cpu.max``,
lowers it, as in a container with ``--cpus``), at most one worker per :data:`WORKER_BYTES` of memory
(the smaller of the machine's available memory and what the cgroup's ``memory.max`` leaves), at least 1.
cgroup v1 limits are not read."""

from __future__ import annotations

import math
import os
from pathlib import Path

# Memory one worker of this suite may need: the default and slow runs' measured peak a worker, rounded up
# (docs/run.md, "The default run").
WORKER_BYTES = 3 * 2**30


def own_cgroup(proc_self_cgroup: Path = Path("/proc/self/cgroup"), mount: Path = Path("/sys/fs/cgroup")) -> Path:
    """The cgroup v2 folder of this process (``0::/path`` in ``/proc/self/cgroup``); ``mount`` when none."""
    try:
        for line in proc_self_cgroup.read_text().splitlines():
            if line.startswith("0::"):
                return mount / line[3:].lstrip("/")
    except OSError:
        pass
    return mount


def cgroup_cpus(cgroup: Path) -> int | None:
    """CPUs a cgroup v2 quota grants (``cpu.max``: ``quota period`` in microseconds; rounded up, at least
    1), None when unlimited or unreadable."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def cgroup_memory_left(cgroup: Path) -> int | None:
    """Bytes the cgroup v2 may still take (``memory.max`` - ``memory.current``), None when unlimited."""
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        return None if limit == "max" else max(0, int(limit) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        return None


def worker_count(cpus: int, available_bytes: int, cgroup: Path) -> int:
    """The count for ``cpus`` usable CPUs and ``available_bytes`` of the machine's memory, within the
    limits of ``cgroup`` (see the module docstring)."""
    quota = cgroup_cpus(cgroup)
    left = cgroup_memory_left(cgroup)
    memory = available_bytes if left is None else min(available_bytes, left)
    return max(1, min(cpus if quota is None else min(cpus, quota), memory // WORKER_BYTES))


def this_machines_count() -> int:
    """:func:`worker_count` for this process: its usable CPUs, the available memory (psutil), its cgroup."""
    import psutil

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return worker_count(cpus, psutil.virtual_memory().available, own_cgroup())
