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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anpred.drill.runner import departs_rule, value_cells
from anpred.errors import AnpredError

__all__ = ["DrillCase", "drill_stage"]


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


@dataclass
class DrillCase:
    """One flagged backend's drill-down: ``runner`` (the drill's :class:`anpred.drill.runner.SubRunner`),
    ``backend`` (the flagged one), ``peers`` (every replayed backend, ``backend`` included), ``cfg`` (the
    oracle's :class:`anpred.defaults.OracleConfig`), ``drill`` (:class:`anpred.drill.DrillConfig`),
    ``shared``: the peers that showed the same departure in the stage (a shared defect)."""

    runner: Any
    backend: str
    peers: list[str]
    cfg: Any
    drill: Any
    shared: set[str] = field(default_factory=set)


@dataclass
class _StageSub:
    """The stage's subgraph ``sub`` (``own``: the backend's own version, or None), its inputs ``ins``
    (entries and graph inputs) and their values per sample ``sfeeds``."""

    sub: Any
    own: Any
    ins: list[str]
    sfeeds: list[dict[str, np.ndarray]]


def drill_stage(
    case: DrillCase, model, own_model, cut, feeds: list[dict[str, np.ndarray]], repro_dir: Path, work: Path
) -> dict[str, Any]:
    """Find the first operator of stage ``cut`` whose output ``backend`` departs at, and its repro.

    When that operator bears subgraphs (``If``, ``Loop``), its bodies are inlined into the stage
    (:class:`passes.control_flow.ControlFlowInlinePass`: a computed ``If`` condition becomes a
    ``Where`` over both branches, a ``Loop`` with a constant trip count is unrolled) and the search
    goes on among the inlined operators, one level down.

    Args:
        case: the backend, its peers, the runner and the rules (:class:`DrillCase`).
        model: the run's anchored model; ``own_model``: the model the backend ran, when its own.
        cut: the stage (:class:`anpred.drill.graphs.StageCut`).
        feeds: per sample, ONNX value -> consensus array (entries and graph inputs).
        repro_dir: where the repro goes; ``work``: scratch folder of the rounds.

    Returns:
        The culprit dict (see :func:`anpred.drill.drill.drill_run`).

    Raises:
        AnpredError: the deviation does not show in the stage replayed alone (no operator departs).
    """
    from anpred.drill.graphs import extract, producers, topo_values

    runner, backend, peers, cfg, drill = case.runner, case.backend, case.peers, case.cfg, case.drill
    runner_out = runner.out
    runner.out = work
    try:
        ins = list(dict.fromkeys([cut.values[e] for e in cut.entries] + list(cut.inputs)))
        outs = [cut.values[x] for x in cut.exits]
        sfeeds = [{v: f[v] for v in ins} for f in feeds]
        sub = extract(model, sfeeds[0], outs)
        own = extract(own_model, sfeeds[0], outs) if own_model is not None else None
        cands = topo_values(sub, exclude=set(ins))
        search = _Search(runner, backend, peers, cfg, drill, sfeeds)
        val, last = search.run(sub, own, cands, f"stage {cut.index}")
        node = producers(sub)[val]
        body_of = None
        body_note = ""
        if node.op_type in ("If", "Loop", "Scan"):  # one level further: into its bodies
            inner = _inlined(sub, own, node)
            if inner is None:
                body_note = (
                    f"{node.op_type} {node.name}: its bodies could not be inlined (passes.control_flow: "
                    "branches of different shapes, a data-dependent trip count, or Scan); the culprit is "
                    "the operator as a whole"
                )
            if inner is not None:
                sub2, own2 = inner
                label = node.name or node.output[0]
                body = [
                    v for v in topo_values(sub2, exclude=set(ins)) if producers(sub2)[v].name.startswith(label + "/")
                ]
                if body:
                    val2, last2 = search.run(sub2, own2, body, f"{node.op_type} {label} inlined")
                    if producers(sub2)[val2].name.startswith(label + "/"):
                        body_of, sub, own, val, last = label, sub2, own2, val2, last2
                        node = producers(sub)[val]
        cell = value_cells(last[1], {val: val})[val]
        mine = cell.get(backend)
        others = [c.stats.nrmse for b, c in cell.items() if b != backend and c.stats is not None]
        culprit = {
            "node": node.name,
            "op_type": node.op_type,
            "domain": node.domain or "ai.onnx",
            "output": val,
            "body_of": body_of,
            "note": body_note,
            "local_nrmse": float(mine.stats.nrmse) if mine is not None else None,
            "peers_nrmse": float(np.median(others)) if others else None,
            "rounds": search.rounds,
            "path": search.path,
            "stage_nodes": len(sub.graph.node),
        }
        culprit["shared_with"] = search.shared
        case.shared = set(search.shared)
        culprit.update(_repro(case, _StageSub(sub, own, ins, sfeeds), node, val, last, search.exposed, repro_dir))
        return culprit
    finally:
        runner.out = runner_out


def _inlined(sub, own, node):
    """``(sub, own)`` with ``node``'s control flow inlined (:class:`passes.control_flow.ControlFlowInlinePass`),
    or None when the pass keeps it (e.g. branches of different shapes, a data-dependent trip count)."""
    import onnx

    from passes.control_flow import ControlFlowInlinePass

    label = node.name or node.output[0]
    out = []
    for m in (sub, own):
        if m is None:
            out.append(None)
            continue
        c = onnx.ModelProto()
        c.CopyFrom(m)
        res = ControlFlowInlinePass()(c)
        if label not in res.info.get("inlined", []):
            return None
        out.append(res.model)
    return out[0], out[1]


class _Search:
    """The k-ary search for the first departing tensor among candidates (module docstring)."""

    def __init__(self, runner, backend, peers, cfg, drill, sfeeds):
        self.runner, self.backend, self.peers, self.cfg, self.drill = runner, backend, peers, cfg, drill
        self.sfeeds = sfeeds
        self.rounds = 0
        self.path: list[dict[str, Any]] = []
        self.exposed: list[str] = []
        self.shared: list[str] = []  # other backends departing at the culprit's output too
        self._departs = None

    def _shared(self, per: dict[str, Any]) -> set[str]:
        """The other backends that depart from their peers at one exposed value (``per``: backend ->
        Cell; the localization rule of the round being read)."""
        return {b for b, c in per.items() if b != self.backend and self._departs(c)}

    def run(self, sub, own, cands: list[str], where: str):
        """``(culprit value, (run_dir, report) of the last round)``: the first departing value (topological
        order) none of whose ancestors among ``cands`` departs.

        Each round exposes at most ``max_exposed`` candidates, evenly spread; the next round keeps only
        the ancestors of the first departing exposed value (the value itself included) that were not
        seen not to depart, so a departing value on another branch than the cause is never taken for
        it. When every remaining candidate is exposed, the first departing one is the culprit: its
        inputs are entries (consensus) or candidates that do not depart.

        Raises:
            AnpredError: the backend departs at no candidate."""
        from anpred.drill.graphs import ancestors_of, expose, producers

        prod = producers(sub)
        if own is not None:
            have = {v for n in own.graph.node for v in n.output}
            cands = [v for v in cands if v in have]
        outs = {o.name for o in sub.graph.output}
        while True:
            # the stage's exits among the candidates are always exposed (the replay saw the backend depart
            # at one of them; a stage has at most max_cut_width of them), the rest evenly spread
            must = [i for i, v in enumerate(cands) if v in outs]
            k = max(2, self.drill.max_exposed)
            rest = [i for i in range(len(cands)) if i not in set(must)]
            pick = [rest[j] for j in _spread(rest, 0, len(rest), max(1, k - len(must)))] if rest else []
            idx = sorted(set(must) | set(pick))
            vals = [cands[i] for i in idx]
            models = {None: expose(sub, vals)}
            if own is not None:
                models[self.backend] = expose(own, vals)
            self.rounds += 1
            run_dir, rep = self.runner.run(f"round{self.rounds}", models, self.sfeeds, self.peers)
            departs = self._departs = departs_rule(rep, self.cfg)
            cells = value_cells(rep, {v: v for v in vals})
            dep = [j for j, v in enumerate(vals) if departs(cells[v].get(self.backend))]
            # a departure some other backend shows too (it departs there: a defect they share, e.g. a common
            # kernel library) is not taken for this backend's own cause while a departure of its own
            # follows; when all its departures are shared, the first one is the culprit (each backend that
            # shares it gets it)
            solo = [j for j in dep if not self._shared(cells[vals[j]])]
            first = solo[0] if solo else (dep[0] if dep else None)
            if first is None:
                raise AnpredError(
                    f"{where} replayed alone from the consensus: {self.backend} departs from its "
                    f"peers at none of its {len(vals)} exposed tensors (the deviation needs more "
                    "than this stage: fusion across stages, or the error it received)"
                )
            f = vals[first]
            self.path.append(
                {
                    "round": self.rounds,
                    "where": where,
                    "exposed": len(vals),
                    "first": f,
                    "op_type": prod[f].op_type,
                    "candidates": len(cands),
                    "shared_before": [vals[j] for j in dep if j < first],
                }
            )
            self.shared = sorted(self._shared(cells[f]))
            self.exposed = vals
            if len(vals) == len(cands):
                return f, (run_dir, rep)
            clean = set(vals[:first]) | {v for v in vals[first + 1 :] if not departs(cells[v].get(self.backend))}
            keep = ancestors_of(sub, f) | {f}
            cands = [v for v in cands if v in keep and v not in clean]


def _repro(
    case: DrillCase, stage: _StageSub, node, out_val: str, last_rep, exposed: list[str], repro_dir: Path
) -> dict[str, Any]:
    """Write and verify the repro of ``node`` (module docstring), cut out of the stage's subgraph
    ``sub`` (``own``: the backend's own version): the operator alone, else the smallest connected
    subgraph around it that reproduces (:class:`anpred.drill.grow.Growth`), else the stage prefix up to
    it. Returns the culprit's repro keys (``repro``, ``reproduced``, ``scope``, ``flagged_in_repro``,
    ``repro_nodes``: the node names the repro kept, ``repro_search``: each subgraph tried)."""
    from anpred.drill.grow import Growth

    drill, sfeeds, ins = case.drill, stage.sfeeds, stage.ins
    grow = Growth(stage.sub, node, out_val, max(1, drill.max_exposed))
    # the rings whose cut values one run can expose (max_exposed)
    sets: list[list[str]] = []
    for s in grow.rings():
        if sets and len(grow.values(sets + [s])) > drill.max_exposed:
            break
        sets.append(s)
    # the operator alone first, with the values the last round exposed (one more run if it did not)
    values = _Values(case, stage, out_val, last_rep, exposed)
    values.learn(grow.cut([grow.culprit])[0])
    trial = _Trial(case, stage, node, Path(repro_dir))

    def attempt(keys: list[str], scope: str) -> bool:
        cin, couts = grow.cut(keys)
        if any(v not in values.known for v in cin):
            return False
        return trial.run({v: values.known[v] for v in cin}, couts, scope, [grow.nodes[k].name or k for k in keys])

    runs = 1
    ok = attempt([grow.culprit], "operator")
    search: list[dict[str, Any]] = [{"nodes": 1, "kept": [node.name], "reproduced": ok}]
    if not ok and len(sets) > 1:
        values.learn(grow.values(sets))  # every value a grown subgraph may read at its cut: one run
        kept, n, log = grow.search(
            lambda k: attempt(k, "subgraph"), max(0, drill.max_repro_runs - 1), known_bad=[[grow.culprit]]
        )
        runs += n
        search += log
        ok = kept is not None
    if not ok and runs < drill.max_repro_runs:  # the whole stage up to the operator, from its entries
        ok = trial.run({v: sfeeds[values.worst][v] for v in ins}, [out_val], "stage prefix", None)
        search.append({"nodes": None, "kept": "stage prefix", "reproduced": ok})
    if not ok:
        return {
            "repro": None,
            "reproduced": False,
            "scope": None,
            "flagged_in_repro": False,
            "repro_nodes": [],
            "repro_search": search,
        }
    return {
        "repro": str(repro_dir),
        "reproduced": True,
        "scope": trial.scope,
        "flagged_in_repro": trial.flagged,
        "repro_nodes": trial.kept,
        "repro_search": search,
    }


class _Values:
    """The consensus values of the stage's inner tensors in the sample where the backend deviates most
    at the culprit's output (``worst``: its index in the stage feeds), learnt from the last drill round
    or from one more run that exposes the missing ones (:meth:`learn`)."""

    def __init__(self, case: DrillCase, stage: _StageSub, out_val: str, last_rep, exposed: list[str]):
        self.case, self.stage, self.out_val = case, stage, out_val
        self.run_dir, self.rep = last_rep
        self.exposed = set(exposed)
        self.worst: int | None = None
        self.known: dict[str, np.ndarray] = {}

    def learn(self, values: list[str]) -> None:
        """Know ``values`` (inner values or stage inputs): one run exposing the inner ones unless the
        last run exposed them all."""
        from anpred.drill.feed import backend_samples, consensus_samples
        from anpred.drill.graphs import expose

        case, stage = self.case, self.stage
        inner = [v for v in dict.fromkeys(values + [self.out_val]) if v not in stage.ins]
        if any(v not in self.exposed for v in inner):
            models = {None: expose(stage.sub, inner)}
            if stage.own is not None:
                models[case.backend] = expose(stage.own, inner)
            self.run_dir, self.rep = case.runner.run(f"inputs{len(self.known)}", models, stage.sfeeds, case.peers)
            self.exposed = set(inner)
        by_value = {a["value"]: a["name"] for a in self.rep.anchors if a.get("value")}
        inner = [v for v in inner if v in by_value]
        cons = dict(consensus_samples(self.run_dir, [by_value[v] for v in inner], exclude=(case.backend,)))
        order = sorted(cons)
        if self.worst is None:  # the sample where the backend deviates most at the operator's output
            mine = dict(backend_samples(self.run_dir, case.backend, [by_value[self.out_val]]))
            best = -1.0
            self.worst = 0
            for i, sid in enumerate(order):
                c, x = cons[sid].get(by_value[self.out_val]), mine.get(sid, {}).get(by_value[self.out_val])
                if c is None or x is None:
                    continue
                d = float(np.linalg.norm((x.astype(np.float64) - c).ravel()))
                if d > best:
                    self.worst, best = i, d
            self.known.update({v: stage.sfeeds[self.worst][v] for v in stage.ins})
        sid = order[self.worst]
        self.known.update({v: cons[sid][by_value[v]] for v in inner if by_value[v] in cons[sid]})


class _Trial:
    """One candidate repro: cut out, run on the backend and its peers, kept (written) when it
    reproduces: the backend departs from its peers at the culprit's output and no peer is flagged (but
    those that showed the same departure in the stage). The last kept one is in ``repro_dir``."""

    def __init__(self, case: DrillCase, stage: _StageSub, node, repro_dir: Path):
        self.case, self.sub, self.own, self.node, self.repro_dir = case, stage.sub, stage.own, node, repro_dir
        self.scope, self.flagged, self.kept = None, False, []
        self.n = 0

    def run(self, inputs: dict[str, np.ndarray], outs: list[str], scope: str, kept: list[str] | None) -> bool:
        from anpred.drill.graphs import extract

        case = self.case
        out_val = outs[0]
        try:
            m = extract(self.sub, inputs, outs)
            mo = extract(self.own, inputs, outs) if self.own is not None else None
        except AnpredError:
            return False
        self.n += 1
        models = {None: m, **({case.backend: mo} if mo is not None else {})}
        name = f"repro-{scope.replace(' ', '-')}" + (f"-{self.n}" if scope == "subgraph" else "")
        rdir, rrep = case.runner.run(name, models, [inputs], case.peers)
        departs = departs_rule(rrep, case.cfg)
        cells = value_cells(rrep, {out_val: out_val})[out_val]
        # no peer flagged, except those that showed the same departure in the stage (a shared defect)
        flagged_peers = [b for b in rrep.flagged_backends if b != case.backend and b not in case.shared]
        if not (departs(cells.get(case.backend)) and not flagged_peers):
            return False
        flagged = case.backend in rrep.flagged_backends
        data_nodes = kept if kept is not None else [n.name for n in m.graph.node if n.op_type != "Constant"]
        _write(self.repro_dir, (m, mo), inputs, (rdir, rrep), case, self.node, _Kept(scope, cells, flagged, data_nodes))
        self.scope, self.flagged, self.kept = scope, flagged, data_nodes
        return True


@dataclass
class _Kept:
    """What a kept repro shows: its ``scope``, the culprit output's ``cells`` (backend -> Cell), whether
    the backend is ``flagged`` there, the operators it ``kept``."""

    scope: str
    cells: dict[str, Any]
    flagged: bool
    kept: list[str]


def _write(repro_dir: Path, models, inputs, run, case: DrillCase, node, shown: _Kept) -> None:
    """Write the repro folder (module docstring): ``models`` = (model, the backend's own or None),
    ``run`` = (run folder, report) of the run that reproduced it."""
    import json
    import os

    from anpred.defaults import OracleConfig
    from anpred.drill.feed import backend_samples, consensus_samples
    from anpred.onnx_io import save_model

    m, mo = models
    rdir, rrep = run
    backend, peers = case.backend, case.peers
    scope, cells, flagged, kept = shown.scope, shown.cells, shown.flagged, shown.kept
    spec = case.runner.specs[backend]
    registry_name, python_path = spec.name, spec.options.get("python_path")
    if repro_dir.exists():
        shutil.rmtree(repro_dir)
    (repro_dir / "outputs").mkdir(parents=True)
    save_model(m, repro_dir / "model.onnx")
    if mo is not None:
        save_model(mo, repro_dir / f"model.{backend}.onnx")
    np.savez(repro_dir / "inputs.npz", **inputs)
    names = [a["name"] for a in rrep.anchors if a["kind"] == "output"]
    values = {a["name"]: a.get("value", a["name"]) for a in rrep.anchors}
    ((sid, cons),) = list(consensus_samples(rdir, names, exclude=(backend,)))
    np.savez(repro_dir / "expected.npz", **{values[a]: x for a, x in cons.items()})
    for b in peers:
        for _, t in backend_samples(rdir, b, names):
            np.savez(repro_dir / "outputs" / f"{b}.npz", **{values[a]: x for a, x in t.items()})
    mine = cells.get(backend)
    others = sorted(f"{b} {c.primary:.3g}" for b, c in cells.items() if b != backend)
    # the oracle settings the repro was verified with, when they are not the defaults
    defaults = OracleConfig().to_dict()
    changed = {k: v for k, v in rrep.config.items() if k in defaults and v != defaults[k]}
    cfg_opt = ""
    if changed:
        (repro_dir / "oracle.json").write_text(json.dumps(changed, indent=1))
        cfg_opt = " --config oracle.json"
    # a backend run on another release of its library (a campaign's runtime version): the same folders
    env = f"PYTHONPATH={os.pathsep.join(python_path)} " if python_path else ""
    cmd = (
        f"{env}anpred test model.onnx --inputs inputs.npz --backends {','.join(peers)} --stages 1{cfg_opt} "
        f"-o rerun --overwrite"
    )
    ratio = (mine.primary / mine.peer_level) if mine.peer_level else float("inf")
    from anpred.backends import REGISTRY

    if mo is not None or backend not in REGISTRY:  # the CLI cannot give this backend its own model/label
        opts = f"{{'model': 'model.{backend}.onnx'}}" if mo is not None else "{}"
        rerun = (
            (
                f"{backend} ran its own version of the model: `model.{backend}.onnx`. "
                if mo is not None
                else f"{backend} is a label of the Python API (backend {registry_name}). "
            )
            + "Rerun it through the Python API (it prints the flagged backends):\n\n"
            "    python -c \"from anpred.run import BackendSpec, run_model; "
            "from anpred.judge import check_run; s = run_model('model.onnx', "
            f"[*{[p for p in peers if p != backend]!r}, "
            f"BackendSpec({registry_name!r}, {backend!r}, {opts})], 'inputs.npz', 'rerun', overwrite=True); "
            "print(check_run(s.root).flagged_backends)\"\n\n"
            "(`anpred test model.onnx ...` below runs `model.onnx` on the registry backends only.)\n\n"
            f"    {cmd.replace(backend + ',', '').replace(',' + backend, '')}\n"
        )
    elif flagged:
        rerun = f"Rerun (exit status 1 while {backend} is flagged):\n\n    {cmd}\n"
    else:
        rerun = (
            f"{backend} departs from its peers here ({ratio:.3g} x their median) but stays below the "
            f"floor ({mine.floor:.3g}): the command exits 0 and lists {backend}'s deviation; compare "
            f"`outputs/{backend}.npz` with `expected.npz`:\n\n    {cmd}\n"
        )
    (repro_dir / "README.md").write_text(
        f"# {backend}: {node.op_type} `{node.name}` departs from its peers\n\n"
        f"Scope: {scope} ({len(kept) or len(m.graph.node)} operator(s): {', '.join(kept) or node.name}"
        + ("; grown from the culprit because the operator alone does not reproduce" if scope == "subgraph" else "")
        + f"); inputs: the consensus values {'this operator' if scope == 'operator' else 'these operators'} "
        f"received (`inputs.npz`).\n"
        f"{backend}'s {rrep.config.get('primary', 'nrmse')} against the consensus of the others: "
        f"{mine.primary:.3g} ({ratio:.3g} x the peers' median; flagged: {'yes' if flagged else 'no'}); "
        f"peers: {', '.join(others)}.\n"
        f"`expected.npz`: the consensus; `outputs/<backend>.npz`: each backend's own outputs.\n\n{rerun}"
    )
    if mo is None and backend in REGISTRY:  # the same command as a script
        (repro_dir / "reproduce.sh").write_text(
            f"#!/bin/sh\n# exits 1 while {backend} is flagged\ncd \"$(dirname \"$0\")\"\nexec {cmd}\n"
        )
