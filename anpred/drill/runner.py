"""Running subgraphs for the drill-down: a (sub)model on the drill's backends, each in its own warm
worker process (:func:`anpred.run.run_model` on a :class:`anpred.run.warm.WarmPool`), judged by the oracle
(:func:`anpred.judge.check_run`); and reading the judged cells by ONNX value name with the localization rule
(:meth:`anpred.judge.localize.Localizer.departs`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from anpred.errors import AnpredError

__all__ = ["SubRunner", "run_specs", "load_full", "value_cells", "departs_rule"]


class SubRunner:
    """Runs a (sub)model on the drill's backends from a list of input dicts, judges it, counts runs.

    The replays of one drill-down (the stage replay, the operator search, the repro's verification)
    run on warm workers (:class:`anpred.run.warm.WarmPool`, started at the first run): each backend's
    process, imports and converter stay up from one replay model to the next instead of starting again
    for each; a crash or timeout still costs that replay only. The workers end when the runner is
    closed or collected (:meth:`close`)."""

    def __init__(self, specs: dict[str, Any], out: Path, timeout_s: float, progress: bool, config):
        self.specs, self.out, self.timeout_s = specs, out, timeout_s
        self.progress, self.config = progress, config
        self.runs = 0
        self.pool = None

    def _pool(self):
        if self.pool is None:
            import weakref

            from anpred.run.warm import WarmPool

            self.pool = WarmPool(self.out / ".workers", timeout_s=self.timeout_s)
            self._end = weakref.finalize(self, _end_pool, self.pool)  # (drill_run drops the runner when it returns)
        return self.pool

    def close(self) -> None:
        """End the warm workers (the next run starts new ones)."""
        if self.pool is not None:
            self._end()
            self.pool = None

    def run(self, name: str, models: dict[str | None, Any], feeds: list[dict[str, np.ndarray]], backends: list[str]):
        """Run ``models[None]`` (``models[b]``: backend ``b``'s own version) on ``backends`` with
        ``feeds``; returns ``(run_dir, CheckReport)``."""
        from anpred.instrument import instrument_model
        from anpred.judge import check_run
        from anpred.onnx_io import save_model
        from anpred.run import BackendSpec, run_model

        d = self.out / name
        if d.exists():
            shutil.rmtree(d)
        (d / "inputs").mkdir(parents=True)
        for i, f in enumerate(feeds):
            np.savez(d / "inputs" / f"{i:04d}.npz", **f)
        # one stage and no boundary of its own: the graph outputs are the anchors, with their layouts
        # (anpred.instrument: NCHW/NHWC/... from the graph, so that the aligner is not left guessing)
        anchored, _ = instrument_model(models[None], stages=1)
        save_model(anchored, d / "model.onnx")
        specs = []
        for b in backends:
            s = self.specs[b]
            opts = {k: v for k, v in s.options.items() if k != "model"}
            if b in models:
                save_model(models[b], d / f"model.{b}.onnx")
                opts["model"] = str(d / f"model.{b}.onnx")
            specs.append(BackendSpec(s.name, b, opts))
        self.runs += 1
        store = run_model(
            d / "model.onnx",
            specs,
            d / "inputs",
            d / "run",
            timeout_s=self.timeout_s,
            overwrite=True,
            progress=self.progress,
            precheck=False,
            pool=self._pool(),
        )
        return store.root, check_run(store.root, config=self.config, allow_incomplete=True)


def run_specs(store) -> dict[str, Any]:
    """backend label -> the :class:`anpred.run.BackendSpec` it ran with (recorded, else its name)."""
    from anpred.run import BackendSpec

    out = {}
    recorded = store.meta.get("backend_specs") or {}
    for b in store.statuses():
        r = recorded.get(b)
        try:
            out[b] = BackendSpec(r["name"], b, r.get("options") or {}) if r else BackendSpec(b)
        except AnpredError:
            continue  # a label that is not a registry name and was not recorded: not re-runnable
    return out


def load_full(path: str | Path):
    """The ONNX model at ``path`` with its external weights loaded."""
    from anpred.onnx_io import load_model

    return load_model(path, load_external=True)


def value_cells(rep, values: dict[str, str]) -> dict[str, dict[str, Any]]:
    """ONNX value -> backend -> Cell of a sub-run's report (its anchors are its graph outputs)."""
    by_anchor = {a["name"]: a for a in rep.anchors}
    man_values = {a: by_anchor[a].get("value") for a in by_anchor}
    out: dict[str, dict[str, Any]] = {}
    for c in rep.cells:
        v = man_values.get(c.anchor)
        if v is None:
            continue
        out.setdefault(v, {})[c.backend] = c
    return {v: out.get(v, {}) for v in values}


def departs_rule(rep, config):
    """``cell -> bool``: the localization rule (:meth:`anpred.judge.localize.Localizer.departs`) for the
    backends of the judged report ``rep``."""
    from anpred.judge.localize import Localizer
    from anpred.judge.struct import BackendInfo

    binfos = {
        b: BackendInfo.make(b, rep.backends[b]["family"], rep.backends[b]["precision"], config) for b in rep.backends
    }
    loc = Localizer([], binfos, config, None, {})
    return lambda c: c is not None and loc.departs(c)


def _end_pool(pool) -> None:
    """Close a warm pool and remove its job folders and logs."""
    pool.close()
    shutil.rmtree(pool.work, ignore_errors=True)
