"""How many pytest-xdist workers ``-n auto`` (pyproject's addopts) starts: tests/conftest.py's
``pytest_xdist_auto_num_workers`` and tests/xdist_workers.py (issue 32: the default run on both cores of
a 2-core machine). The cgroup files are written here as the kernel shows them (cgroup v2)."""

from __future__ import annotations

import os
import shlex
import tomllib
from pathlib import Path
from types import SimpleNamespace

import conftest
import psutil
import xdist_workers as xw

GIB = 2**30


def _cgroup(tmp_path: Path, cpu_max: str | None = None, memory_max: str | None = None, current: int = 0) -> Path:
    if cpu_max is not None:
        (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    if memory_max is not None:
        (tmp_path / "memory.max").write_text(memory_max + "\n")
        (tmp_path / "memory.current").write_text(f"{current}\n")
    return tmp_path


def test_workers_are_the_usable_cpus_when_memory_allows(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    cpus = len(os.sched_getaffinity(0))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=(cpus + 1) * xw.WORKER_BYTES))
    monkeypatch.setattr(xw, "own_cgroup", lambda: _cgroup(tmp_path, "max 100000", "max"))
    assert conftest.pytest_xdist_auto_num_workers(None) == cpus


def test_memory_bounds_the_workers_and_one_always_runs(tmp_path):
    unlimited = _cgroup(tmp_path)
    assert xw.worker_count(8, 2 * xw.WORKER_BYTES + 1, unlimited) == 2
    assert xw.worker_count(8, xw.WORKER_BYTES // 2, unlimited) == 1


def test_a_cgroup_quota_and_memory_limit_lower_the_count(tmp_path):
    # `docker run --cpus 1.5 --memory 8g`: cpu.max "150000 100000", memory.max 8 GiB with 1 GiB in use
    cg = _cgroup(tmp_path, "150000 100000", str(8 * GIB), current=1 * GIB)
    assert xw.cgroup_cpus(cg) == 2 and xw.cgroup_memory_left(cg) == 7 * GIB
    assert xw.worker_count(16, 64 * GIB, cg) == 2  # the quota: 1.5 CPUs rounded up
    cg = _cgroup(tmp_path, "400000 100000", str(8 * GIB), current=3 * GIB)
    assert xw.worker_count(16, 64 * GIB, cg) == 1  # 5 GiB left in the cgroup: one worker of 3 GiB
    assert xw.cgroup_cpus(_cgroup(tmp_path, "max 100000")) is None


def test_the_own_cgroup_is_read_from_proc(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("1:cpu:/\n0::/user.slice/ci-job.scope\n")
    assert xw.own_cgroup(proc, tmp_path / "mnt") == tmp_path / "mnt" / "user.slice" / "ci-job.scope"
    assert xw.own_cgroup(tmp_path / "absent", tmp_path / "mnt") == tmp_path / "mnt"


def test_the_environment_variable_wins(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=0))
    assert conftest.pytest_xdist_auto_num_workers(None) == 3


def test_the_default_run_asks_for_the_workers_and_the_test_extra_brings_them():
    root = Path(conftest.__file__).resolve().parent.parent
    with open(root / "pyproject.toml", "rb") as f:
        cfg = tomllib.load(f)
    addopts = shlex.split(cfg["tool"]["pytest"]["ini_options"]["addopts"])
    assert addopts[addopts.index("-n") + 1] == "auto"
    assert any(r.startswith("pytest-xdist") for r in cfg["project"]["optional-dependencies"]["test"])
