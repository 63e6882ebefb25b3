"""How many pytest-xdist workers ``-n auto`` (pyproject's addopts) starts: tests/conftest.py's
``pytest_xdist_auto_num_workers`` (issue 32: the default run on both cores of a 2-core machine)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import conftest
import psutil


def _available(monkeypatch, n_bytes):
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=n_bytes))


def test_workers_are_the_usable_cpus_when_memory_allows(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    cpus = len(os.sched_getaffinity(0))
    _available(monkeypatch, (cpus + 1) * conftest.XDIST_WORKER_BYTES)
    assert conftest.pytest_xdist_auto_num_workers(None) == cpus


def test_memory_bounds_the_workers_and_one_always_runs(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    _available(monkeypatch, 2 * conftest.XDIST_WORKER_BYTES + 1)
    assert conftest.pytest_xdist_auto_num_workers(None) == 2
    _available(monkeypatch, conftest.XDIST_WORKER_BYTES // 2)
    assert conftest.pytest_xdist_auto_num_workers(None) == 1


def test_the_environment_variable_wins(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    _available(monkeypatch, 0)
    assert conftest.pytest_xdist_auto_num_workers(None) == 3


def test_the_default_run_asks_for_the_workers_and_the_test_extra_brings_them():
    import shlex
    import tomllib

    root = conftest.__file__.rsplit("/tests/", 1)[0]
    with open(f"{root}/pyproject.toml", "rb") as f:
        cfg = tomllib.load(f)
    addopts = shlex.split(cfg["tool"]["pytest"]["ini_options"]["addopts"])
    assert addopts[addopts.index("-n") + 1] == "auto"
    assert any(r.startswith("pytest-xdist") for r in cfg["project"]["optional-dependencies"]["test"])
