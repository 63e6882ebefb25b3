"""From the origin stage to the operator: isolated stage replay, automatic drill-down, standalone repro.

:func:`drill_run` takes a judged run (its folder and its :class:`anpred.judge.CheckReport`) and:

1. **Isolated stage replay** (every run it is asked for, flagged or not): all stages side by side in
   one model (:func:`anpred.drill.graphs.replay_model`), each fed with the *consensus* tensors of its
   entry anchors (:func:`anpred.drill.feed.consensus_samples`), run on every fp32 ONNX backend of the
   run (each in its own process, :func:`anpred.run.run_model`) and judged by the same oracle
   (:func:`anpred.judge.check_run`). The *local* error of a backend at a stage's exit anchor is its
   primary statistic there against the replay's consensus; the *carried* error is the normal run's.
   A stage *introduces* a deviation when the backend departs from its peers locally (the
   localization rule, :meth:`anpred.judge.localize.Localizer.departs`); it *carries* (or
   *amplifies*, when the carried error grows more than ``propagation_band`` over the stage) what it
   received otherwise.
2. **Drill-down** (flagged fp32 backends only): inside the first stage that introduces the deviation
   (else the traced origin stage), the stage's subgraph alone is cut out (the rest of the model and
   its fusions are untouched), its inner tensors are exposed (at most ``max_exposed`` per round:
   memory stays one stage's tensors), and it is replayed from the consensus entry tensors on the
   backend and its peers. Each round keeps only the ancestors of the first departing exposed tensor
   (k-ary; one round when the stage has at most ``max_exposed`` inner tensors) until every candidate
   was exposed: the first departing one is the culprit. A departure a peer shows too is passed over
   while one of the backend's own follows; an ``If``/``Loop`` culprit is inlined and searched one
   level down (:mod:`anpred.drill.repro`). Converter backends (torch, tf, ...) convert each subgraph
   anew (tf/litert conversions are cached by the subgraph's hash).
3. **Standalone repro** (:mod:`anpred.drill.repro`): that operator alone, on its real consensus input
   values, run again on the backend and its peers: kept only if the backend still departs from its
   peers there (else the stage prefix up to the operator is tried), written to ``repro/<backend>/``.

Everything is written under ``<out>/`` (default ``<run>/drill``); the report gains ``drill`` and
each drilled verdict its ``culprit``. Backends left out (native graphs, reduced precision, failed)
are named in the notes.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anpred.drill.repro import drill_stage
from anpred.drill.runner import SubRunner, departs_rule, load_full, run_specs, value_cells
from anpred.errors import AnpredError

__all__ = ["DrillConfig", "drill_run"]

#: backends that do not run the run's ONNX model (their own native graph): no subgraph to cut
NATIVE = ("torch-native", "tf-native", "executorch-native", "executorch-xnnpack-native")


@dataclass
class DrillConfig:
    """Bounds of the drill-down (documented defaults, docs/oracle.md "Drill-down").

    max_samples: samples of the run fed to the replays (the first ones; the oracle's floors need no
        more than a few; cost grows linearly with it).
    max_exposed: inner tensors exposed per drill round (memory: at most this many tensors of one
        stage per sample and backend; a stage with more inner tensors is bisected k-ary).
    timeout_s: per backend and per replay run, seconds.
    keep_runs: keep the drill rounds' run folders (``<out>/stage-<backend>/``; each holds copies of the
        subgraph models); by default only the replay run, ``repro/`` and ``drill.json`` stay.
    max_repro_runs: repro runs per culprit (the operator alone, each grown or minimised subgraph,
        :mod:`anpred.drill.grow`, and the stage prefix; each run is one sub-run on every replayed
        backend).
    neighbour_radius: dataflow edges around the anchor where a flagged backend departs first within
        which a node's value is compared with the backend's tensor there (:mod:`anpred.drill.neighbours`;
        one sub-run on the peers per flagged backend; 0: not done).
    """

    max_samples: int = 4
    max_exposed: int = 64
    timeout_s: float = 600.0
    keep_runs: bool = False
    max_repro_runs: int = 6
    neighbour_radius: int = 2


def _left_out(report, specs, statuses, left: list[str]) -> dict[str, str]:
    """Why each backend of ``left`` is not replayed, in the order the replay's conditions are checked:
    it did not run (its status and the first line of its reason), it runs a native graph or no spec
    of the run, it computed in reduced precision, it does not vote."""
    out = {}
    for b in left:
        st = statuses.get(b)
        if st is None or b not in specs:
            out[b] = "not a backend of this run's specs"
        elif st.status != "ok":
            out[b] = f"{st.status}: {(st.reason or 'no reason given').splitlines()[0][:160]}"
        elif b in NATIVE:
            out[b] = "a native graph: no ONNX subgraph of its own"
        elif report.backends[b]["precision"] != "fp32":
            out[b] = f"{report.backends[b]['precision']}: a reduced-precision copy, not replayed"
        else:
            out[b] = "not a voter here"
    return out


def drill_run(
    run_dir: str | Path,
    report,
    out_dir: str | Path | None = None,
    *,
    drill: DrillConfig | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Isolated stage replay, drill-down and repro of the judged run ``run_dir`` (module docstring).

    Args:
        run_dir: the run folder ``report`` judged (mode ``tensors``).
        report: its :class:`anpred.judge.CheckReport` (consensus oracle); gains ``drill`` and, per
            drilled backend, ``verdicts[b].culprit``.
        out_dir: where the replays and ``repro/`` go (default ``<run_dir>/drill``; replaced).
        drill: bounds (:class:`DrillConfig`).
        progress: show the sub-runs' progress bars (stderr).

    Returns:
        ``report.drill``: ``{"samples", "stages": {backend: [per stage: stage, anchor, local,
        carried, peers_local, role]}, "culprits": {backend: culprit}, "runs", "seconds", "notes"}``;
        a culprit is ``{"node", "op_type", "stage", "local_nrmse", "peers_nrmse", "repro",
        "reproduced", "scope", "path", "rounds"}`` (nRMSE unitless, pooled over the drill's samples).

    Raises:
        AnpredError: the run has no stored tensors (``stats`` mode) or no model file.
    """
    from anpred.defaults import OracleConfig
    from anpred.drill.graphs import replay_model, stage_cuts
    from anpred.run import RunStore

    t0 = time.perf_counter()
    drill = drill or DrillConfig()
    store = RunStore.open(run_dir)
    if store.meta.get("mode", "tensors") != "tensors":
        raise AnpredError(
            f"{run_dir}: a '{store.meta.get('mode')}' run stores no tensors; the drill-down needs a tensors run"
        )
    from dataclasses import fields

    known = {f.name for f in fields(OracleConfig)}
    cfg = OracleConfig.from_dict({k: v for k, v in (report.config or {}).items() if k in known})
    mpath = _model_path(store, run_dir)
    out = (Path(out_dir) if out_dir is not None else Path(store.root) / "drill").absolute()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    notes: list[str] = []
    specs = run_specs(store)
    statuses = store.statuses()
    part = [
        b
        for b in report.backends
        if b in specs
        and statuses[b].status == "ok"
        and b not in NATIVE
        and report.backends[b]["precision"] == "fp32"
        and report.verdicts.get(b) is not None
        and report.verdicts[b].votes
    ]
    left = [b for b in report.backends if b not in part]
    if left:
        notes.append(
            "drill: not replayed: "
            + "; ".join(f"{b} ({why})" for b, why in _left_out(report, specs, statuses, left).items())
        )
    alt = {b: Path(specs[b].options["model"]) for b in part if "model" in specs[b].options}
    model = load_full(mpath)
    models = {b: load_full(p) for b, p in alt.items()}
    manifest = store.manifest
    samples = store.sample_ids[: max(1, drill.max_samples)]
    runner = SubRunner(specs, out, drill.timeout_s, progress, cfg)
    result: dict[str, Any] = {"samples": len(samples), "stages": {}, "culprits": {}, "notes": notes}
    report.drill = result
    if len(part) < 2:
        notes.append("drill: fewer than two replayable backends: no replay")
        result.update(runs=0, seconds=round(time.perf_counter() - t0, 1))
        return result

    cuts = stage_cuts(model, manifest)
    entry_anchors = sorted({e for c in cuts for e in c.entries})
    by_name = {a.name: a for a in manifest.anchors}
    feeds = _consensus_feeds(store, run_dir, entry_anchors, samples, cfg)
    missing = [a for a in entry_anchors if any(by_name[a].value not in f for f in feeds)]
    if missing:
        notes.append(f"drill: no consensus at {', '.join(missing[:4])}: the stages they enter are not replayed")
        cuts = [c for c in cuts if not set(c.entries) & set(missing)]

    # 1. isolated stage replay: one model, every stage fed from the consensus
    rmodel, rin, rout = replay_model(model, cuts, feeds[0])
    rfeeds = [{new: f[v] for new, (_, v) in rin.items()} for f in feeds]
    ralt = {b: replay_model(m, cuts, feeds[0])[0] for b, m in models.items()}
    _, rrep = runner.run("replay", {None: rmodel, **ralt}, rfeeds, part)
    if rrep.problems:
        notes.append("drill: the stage replay could not be judged: " + "; ".join(rrep.problems)[:600])
    ctx = _Ctx(runner, report, Path(run_dir), model, models, cuts, feeds, samples, part, cfg, drill, out, notes)
    for b, prof in _stage_profiles(ctx, rrep, rout).items():
        result["stages"][b] = prof
        _use_roles(report.verdicts.get(b), prof, notes, b)
    # 2.-3. drill-down and repro for each flagged fp32 voter
    result["culprits"] = _culprits(ctx, result["stages"])
    # 4. a departure that is a neighbouring node's value (a fused activation returned for its input)
    result["neighbours"] = _neighbours(ctx)
    result.update(runs=runner.runs, seconds=round(time.perf_counter() - t0, 1))
    (out / "drill.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def _model_path(store, run_dir: str | Path) -> Path:
    """The run's model: ``model.onnx`` in the run folder, else the path its meta records.

    Raises:
        AnpredError: neither exists.
    """
    mpath = Path(store.root) / "model.onnx"
    if not mpath.is_file():
        mpath = Path(store.meta.get("model", {}).get("path", ""))
    if not mpath.is_file():
        raise AnpredError(f"{run_dir}: the run's model is not available (no model.onnx in the run folder)")
    return mpath


def _consensus_feeds(
    store, run_dir: str | Path, entry_anchors: list[str], samples: list[str], cfg
) -> list[dict[str, np.ndarray]]:
    """Per sample: its stored inputs and the consensus (oracle ``cfg``) at each of the ``entry_anchors``,
    under the anchor's ONNX value name (an anchor without a consensus there is left out)."""
    from anpred.drill.feed import consensus_samples

    by_name = {a.name: a for a in store.manifest.anchors}
    feeds: list[dict[str, np.ndarray]] = []
    cons = dict(consensus_samples(run_dir, entry_anchors, samples=samples, config=cfg))
    for sid in samples:
        f = dict(store.read_inputs(sid))
        for a, arr in cons[sid].items():
            f[by_name[a].value] = arr
        feeds.append(f)
    return feeds


@dataclass
class _Ctx:
    """What the drill's steps share: the sub-run ``runner``, the judged ``report`` of ``run_dir``, the
    run's anchored ``model`` (``models``: the backends' own), the stage ``cuts``, the consensus
    ``feeds`` of ``samples``, the replayed backends ``part``, the oracle ``cfg``, the ``drill`` bounds,
    the output folder ``out`` and the ``notes``."""

    runner: Any
    report: Any
    run_dir: Path
    model: Any
    models: dict[str, Any]
    cuts: list[Any]
    feeds: list[dict[str, np.ndarray]]
    samples: list[str]
    part: list[str]
    cfg: Any
    drill: DrillConfig
    out: Path
    notes: list[str]


def _stage_profiles(ctx: _Ctx, rrep, rout) -> dict[str, list[dict[str, Any]]]:
    """Per replayed backend, per stage exit anchor of the replay (``rrep``; ``rout``: replay output ->
    (stage, anchor)): the local and carried error and the stage's role (module docstring, step 1)."""
    report, cfg = ctx.report, ctx.cfg
    departs_r = departs_rule(rrep, cfg)
    cells = value_cells(rrep, {k: k for k in rout})
    band = cfg.propagation_band
    entries_of = {c.index: c.entries for c in ctx.cuts}
    out = {}
    for b in ctx.part:
        prof = []
        for new, (k, anchor) in rout.items():
            lc = cells.get(new, {}).get(b)
            cc = report.cell(anchor, b)
            peers = [c.primary for pb, c in cells.get(new, {}).items() if pb != b and c.primary is not None]
            local = lc.primary if lc is not None else None
            carried = cc.primary if cc is not None else None
            # what the stage received: the largest carried error at its entry anchors
            got = [x.primary for e in entries_of.get(k, []) if (x := report.cell(e, b)) is not None and x.primary]
            if lc is not None and departs_r(lc):
                role = "introduced"
            elif (
                cc is not None
                and cc.primary is not None
                and cc.peer_level is not None
                and cc.primary > cfg.origin_k * cc.peer_level
                and cc.primary > cfg.origin_floor_fraction * cc.floor
            ):
                role = "amplified" if got and carried / max(got) > band else "carried"
            else:
                role = "clean"
            prof.append(
                {
                    "stage": k,
                    "anchor": anchor,
                    "local": _f(local),
                    "carried": _f(carried),
                    "received": _f(max(got) if got else None),
                    "peers_local": _f(float(np.median(peers)) if peers else None),
                    "role": role,
                }
            )
        out[b] = prof
    return out


def _culprits(ctx: _Ctx, stages: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Drill-down and repro (steps 2-3) for each flagged voter of ``ctx.part``; ``stages``: the stage
    profiles. Returns backend -> culprit (also set as ``verdicts[b].culprit``)."""
    from anpred.drill.repro import DrillCase

    out, drill = ctx.out, ctx.drill
    found = {}
    for b in ctx.part:
        v = ctx.report.verdicts[b]
        if not v.flagged:
            continue
        intro = [p["stage"] for p in stages[b] if p["role"] == "introduced"]
        k = intro[0] if intro else v.origin_stage
        cut = next((c for c in ctx.cuts if c.index == k), None)
        if cut is None:
            ctx.notes.append(f"drill: {b}: origin stage {k} not replayable")
            continue
        try:
            culprit = drill_stage(
                DrillCase(ctx.runner, b, ctx.part, ctx.cfg, drill),
                ctx.model,
                ctx.models.get(b),
                cut,
                ctx.feeds,
                out / "repro" / b,
                out / f"stage-{b}",
            )
        except AnpredError as err:
            ctx.notes.append(f"drill: {b}: {err}")
            continue
        finally:
            if not drill.keep_runs:
                shutil.rmtree(out / f"stage-{b}", ignore_errors=True)
        culprit["stage"], culprit["backend"] = k, b
        culprit["located_by"] = "replay" if intro else "traced origin"
        found[b] = culprit
        v.culprit = culprit
    return found


def _neighbours(ctx: _Ctx) -> dict[str, Any]:
    """Per flagged backend of ``ctx.part``, the neighbouring node whose value it returned at the anchor
    where it departs first (:func:`anpred.drill.neighbours.neighbour_match`); backends without one are
    left out."""
    from anpred.drill.neighbours import Replayed, neighbour_match

    found: dict[str, Any] = {}
    runner = ctx.runner
    runner_out = runner.out
    runner.out = ctx.out / "neighbours"
    data = Replayed(runner, ctx.model, ctx.run_dir, ctx.report, ctx.feeds, ctx.samples, ctx.part)
    try:
        for b in ctx.part:
            v = ctx.report.verdicts[b]
            if not v.flagged or ctx.drill.neighbour_radius < 1:
                continue
            anchors = list(dict.fromkeys(a for a in (v.origin_anchor, v.first_flagged_anchor) if a))
            m = neighbour_match(data, b, anchors, ctx.drill.neighbour_radius)
            if m is not None:
                found[b] = m
    finally:
        runner.out = runner_out
        if not ctx.drill.keep_runs:
            shutil.rmtree(ctx.out / "neighbours", ignore_errors=True)
    return found


def _use_roles(v, prof: list[dict[str, Any]], notes: list[str], b: str) -> None:
    """The replay's roles in the backend's verdict: ``v.stage_roles`` (anchor -> role), and each
    propagation step into an anchor whose stage introduced a deviation of its own reads
    ``introduced`` (born there) instead of amplified/stable/appeared (what it received, grown)."""
    if v is None:
        return
    roles = {p["anchor"]: p["role"] for p in prof}
    v.stage_roles = roles
    for st in v.steps:
        if roles.get(st.dst) == "introduced" and st.kind in ("amplified", "stable", "appeared", "attenuated"):
            st.kind = "introduced"
    if v.flagged:
        intro = [p for p in prof if p["role"] == "introduced"]
        if intro and intro[0]["stage"] != v.origin_stage:
            notes.append(
                f"drill: {b}: the stage replay finds the deviation introduced in stage {intro[0]['stage']} "
                f"(local {intro[0]['local']:.3g} vs peers {intro[0]['peers_local'] or 0:.3g}), the traced "
                f"origin is stage {v.origin_stage}"
            )
        if len(intro) > 1:
            notes.append(
                f"drill: {b}: deviations introduced in {len(intro)} stages "
                f"({', '.join(str(p['stage']) for p in intro)}), not only carried from the first"
            )


def _f(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
