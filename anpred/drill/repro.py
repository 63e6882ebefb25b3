"""Drill-down inside one stage and the standalone repro of the operator it finds.

:func:`drill_stage` narrows a flagged backend's deviation from a stage to an operator
(:mod:`anpred.drill.drill`, step 2) and writes ``repro/<backend>/`` (step 3):

- ``model.onnx``: the operator alone (with its attributes, its weights as initializers and the
  Constant nodes it reads), or, when the operator alone does not show the deviation, the stage's
  subgraph up to it; ``model.<backend>.onnx`` too when the backend ran a model of its own;
- ``inputs.npz``: its inputs (the consensus values it received, in the sample where the backend
  deviates most);
- ``expected.npz``: the consensus of the repro run at its outputs; ``outputs/<backend>.npz``: each
  backend's own outputs (the flagged one and its peers);
- ``README.md``: what it shows and the one command that reruns it (``anpred test``, exit status 1
  when the backend is flagged again).

The repro is kept only after re-running it: the backend must again depart from its peers at the
operator's output (the localization rule), and no peer may be flagged.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from anpred.errors import AnpredError

__all__ = ["drill_stage"]


def _spread(values: list[str], lo: int, hi: int, k: int) -> list[int]:
    """At most ``k`` indices of ``values[lo:hi]`` evenly spread, the last one always included."""
    n = hi - lo
    if n <= k:
        return list(range(lo, hi))
    step = n / k
    idx = sorted({lo + min(n - 1, int(round((i + 1) * step)) - 1) for i in range(k)})
    if idx[-1] != hi - 1:
        idx[-1] = hi - 1
    return idx


def drill_stage(runner, model, own_model, cut, feeds: list[dict[str, np.ndarray]], backend: str,
                peers: list[str], cfg, drill, repro_dir: Path, work: Path) -> dict[str, Any]:
    """Find the first operator of stage ``cut`` whose output ``backend`` departs at, and its repro.

    Args:
        runner: the drill's :class:`anpred.drill.drill._Runner`.
        model: the run's anchored model; ``own_model``: the model ``backend`` ran, when its own.
        cut: the stage (:class:`anpred.drill.graphs.StageCut`).
        feeds: per sample, ONNX value -> consensus array (entries and graph inputs).
        backend: the flagged backend; ``peers``: every replayed backend (``backend`` included).
        cfg: the oracle's :class:`anpred.defaults.OracleConfig`; ``drill``: :class:`DrillConfig`.
        repro_dir: where the repro goes; ``work``: scratch folder of the rounds.

    Returns:
        The culprit dict (see :func:`anpred.drill.drill.drill_run`).

    Raises:
        AnpredError: the deviation does not show in the stage replayed alone (no operator departs).
    """
    from anpred.drill.drill import _departs_fn, _value_cells
    from anpred.drill.graphs import expose, extract, producers, topo_values

    runner_out = runner.out
    runner.out = work
    try:
        ins = list(dict.fromkeys([cut.values[e] for e in cut.entries] + list(cut.inputs)))
        outs = [cut.values[x] for x in cut.exits]
        sfeeds = [{v: f[v] for v in ins} for f in feeds]
        sub = extract(model, sfeeds[0], outs)
        own = extract(own_model, sfeeds[0], outs) if own_model is not None else None
        cands = topo_values(sub, exclude=set(ins))
        if own is not None:
            have = {v for n in own.graph.node for v in n.output}
            cands = [v for v in cands if v in have]
        prod = producers(sub)
        lo, hi, rounds, path = 0, len(cands), 0, []
        last_rep = None
        exposed_all: list[str] = []
        while True:
            idx = _spread(cands, lo, hi, max(2, drill.max_exposed))
            vals = [cands[i] for i in idx]
            models = {None: expose(sub, vals)}
            if own is not None:
                models[backend] = expose(own, vals)
            rounds += 1
            run_dir, rep = runner.run(f"round{rounds}", models, sfeeds, peers)
            departs = _departs_fn(rep, cfg)
            cells = _value_cells(rep, {v: v for v in vals})
            first = next((j for j, v in enumerate(vals) if departs(cells[v].get(backend))), None)
            if first is None:
                raise AnpredError(f"stage {cut.index} replayed alone from the consensus: {backend} departs from "
                                  f"its peers at none of its {len(vals)} exposed tensors (the deviation needs "
                                  "more than this stage: fusion across stages, or the error it received)")
            path.append({"round": rounds, "exposed": len(vals), "first": vals[first],
                         "op_type": prod[vals[first]].op_type})
            contiguous = idx == list(range(lo, hi))
            last_rep, exposed_all = (run_dir, rep), vals
            if contiguous or first == 0 and idx[0] == lo:
                culprit_val = vals[first]
                break
            lo, hi = (idx[first - 1] + 1 if first > 0 else lo), idx[first] + 1
        node = prod[culprit_val]
        cell = _value_cells(last_rep[1], {culprit_val: culprit_val})[culprit_val]
        mine = cell.get(backend)
        others = [c.stats.nrmse for b, c in cell.items() if b != backend and c.stats is not None]
        culprit = {"node": node.name, "op_type": node.op_type, "domain": node.domain or "ai.onnx",
                   "output": culprit_val,
                   "local_nrmse": float(mine.stats.nrmse) if mine is not None else None,
                   "peers_nrmse": float(np.median(others)) if others else None,
                   "rounds": rounds, "path": path, "stage_nodes": len(sub.graph.node)}
        culprit.update(_repro(runner, model, own_model, node, culprit_val, last_rep, exposed_all, sub, own,
                              sfeeds, ins, backend, peers, cfg, repro_dir))
        return culprit
    finally:
        runner.out = runner_out


def _repro(runner, model, own_model, node, out_val, last_rep, exposed, sub, own, sfeeds, ins, backend, peers,
           cfg, repro_dir: Path) -> dict[str, Any]:
    """Write and verify the repro of ``node`` (module docstring). Returns the culprit's repro keys."""
    from anpred.drill.drill import _departs_fn, _value_cells
    from anpred.drill.feed import backend_samples, consensus_samples
    from anpred.drill.graphs import expose, extract

    run_dir, rep = last_rep
    inits = {t.name for t in model.graph.initializer}
    consts = {v for n in sub.graph.node if n.op_type == "Constant" for v in n.output}
    node_ins = [v for v in node.input if v and v not in inits and v not in consts]
    need = [v for v in node_ins if v not in ins and v not in exposed]
    if need:  # the operator's inputs were not exposed in the last round: one more run exposes them
        models = {None: expose(sub, need + [out_val])}
        if own is not None:
            models[backend] = expose(own, need + [out_val])
        run_dir, rep = runner.run("inputs", models, sfeeds, peers)
    by_value = {a["value"]: a["name"] for a in rep.anchors if a.get("value")}
    inner = [v for v in node_ins if v not in ins]
    cons = dict(consensus_samples(run_dir, [by_value[v] for v in inner + [out_val]], exclude=(backend,)))
    mine = dict(backend_samples(run_dir, backend, [by_value[out_val]]))
    # the sample where the backend deviates most at the operator's output
    worst, best = 0, -1.0
    for i, sid in enumerate(sorted(cons)):
        c, x = cons[sid].get(by_value[out_val]), mine.get(sid, {}).get(by_value[out_val])
        if c is None or x is None:
            continue
        d = float(np.linalg.norm((x.astype(np.float64) - c).ravel()))
        if d > best:
            worst, best = i, d
    sid = sorted(cons)[worst]
    feed = {v: (sfeeds[worst][v] if v in ins else cons[sid][by_value[v]]) for v in node_ins}
    tries = [("operator", {v: feed[v] for v in node_ins}),
             ("stage prefix", {v: sfeeds[worst][v] for v in ins})]
    repro_dir = Path(repro_dir)
    for scope, inputs in tries:
        try:
            m = extract(model, inputs, list(node.output[:1]))
            mo = extract(own_model, inputs, list(node.output[:1])) if own_model is not None else None
        except AnpredError:
            continue
        models = {None: m, **({backend: mo} if mo is not None else {})}
        rdir, rrep = runner.run(f"repro-{scope.replace(' ', '-')}", models, [inputs], peers)
        departs = _departs_fn(rrep, cfg)
        cells = _value_cells(rrep, {out_val: out_val})[out_val]
        flagged_peers = [b for b in rrep.flagged_backends if b != backend]
        if departs(cells.get(backend)) and not flagged_peers:
            _write(repro_dir, m, mo, inputs, rdir, rrep, backend, peers, node, scope, cells)
            return {"repro": str(repro_dir), "reproduced": True, "scope": scope}
    return {"repro": None, "reproduced": False, "scope": None}


def _write(repro_dir: Path, m, mo, inputs, rdir, rrep, backend, peers, node, scope, cells) -> None:
    from anpred.drill.feed import backend_samples, consensus_samples
    from anpred.onnx_io import save_model

    if repro_dir.exists():
        shutil.rmtree(repro_dir)
    (repro_dir / "outputs").mkdir(parents=True)
    save_model(m, repro_dir / "model.onnx")
    if mo is not None:
        save_model(mo, repro_dir / f"model.{backend}.onnx")
    np.savez(repro_dir / "inputs.npz", **inputs)
    names = [a["name"] for a in rrep.anchors if a["kind"] == "output"]
    values = {a["name"]: a.get("value", a["name"]) for a in rrep.anchors}
    (sid, cons), = list(consensus_samples(rdir, names, exclude=(backend,)))
    np.savez(repro_dir / "expected.npz", **{values[a]: x for a, x in cons.items()})
    for b in peers:
        for _, t in backend_samples(rdir, b, names):
            np.savez(repro_dir / "outputs" / f"{b}.npz", **{values[a]: x for a, x in t.items()})
    mine = cells.get(backend)
    others = sorted(f"{b} {c.primary:.3g}" for b, c in cells.items() if b != backend)
    cmd = (f"anpred test model.onnx --inputs inputs.npz --backends {','.join(peers)} --stages 1 "
           f"-o rerun --overwrite")
    own = (f"\n{backend} ran its own version of the model: `model.{backend}.onnx` (give it to {backend} "
           "with `anpred run`'s Python API, `BackendSpec(..., options={'model': ...})`).\n") if mo is not None else ""
    (repro_dir / "README.md").write_text(
        f"# {backend}: {node.op_type} `{node.name}` departs from its peers\n\n"
        f"Scope: {scope} ({len(m.graph.node)} node(s)); inputs: the consensus values this "
        f"{'operator' if scope == 'operator' else 'stage'} received (`inputs.npz`).\n"
        f"{backend}'s {rrep.config.get('primary', 'nrmse')} against the consensus of the others: "
        f"{mine.primary:.3g}; peers: {', '.join(others)}.\n"
        f"`expected.npz`: the consensus; `outputs/<backend>.npz`: each backend's own outputs.\n{own}\n"
        f"Rerun (exit status 1 while {backend} is flagged):\n\n    {cmd}\n")
