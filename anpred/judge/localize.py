"""Localization: where a flagged backend's deviation was born and how it travelled.

Contract: :class:`Localizer` works on the cells the oracle decided (:class:`anpred.judge.struct.Cell`,
one per judged (anchor, backend)) and the run's data flow (:func:`anchor_descendants`); it changes
cells only in :meth:`Localizer.mark_sustained` (sustained departures flagged) and fills the origin and
propagation fields of a :class:`anpred.judge.struct.BackendVerdict` in :meth:`Localizer.localize`.
Rules (``docs/oracle.md``, parameters in :class:`anpred.defaults.OracleConfig`):

- **departs**: a voting backend departs from its peers at an anchor when ``S > origin_k *
  median(S_peers)`` and ``S > origin_floor_fraction * floor`` (a part must also reach its range); a
  flagged or NaN/Inf cell always departs; a reduced-precision variant departs only where flagged.
- **origin**: traced back from the first flagged anchor (manifest = topological order) along the data
  flow to the earliest ancestor anchor from which the backend departs without a break.
- **sustained departure**: ``sustained_anchors`` or more judged anchors in a row along the data flow at
  which a voting backend departs are flagged, even below the floor.
- **propagation**: the ratio of ``S`` between consecutive judged anchors of the profile (the origin and
  its data-flow descendants; without the data flow, all judged anchors in manifest order); a part and
  its own output are not two links of one chain.

:func:`run_dataflow` reads the data flow (and the parts of concatenated outputs,
:func:`anpred.judge.parts.output_parts`) from the ONNX model a run used, with one graph index
(:func:`passes.graph.build_index`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from anpred.defaults import OracleConfig
from anpred.errors import AnpredError, GraphError
from anpred.judge.parts import OutputPart, output_parts
from anpred.judge.struct import AnchorInfo, BackendInfo, BackendVerdict, Cell, Step
from passes.graph import build_index

__all__ = ["DataFlow", "Localizer", "anchor_descendants", "run_dataflow"]


class Localizer:
    """Origin tracing, sustained departures and the propagation profile over the judged anchors.

    Args:
        anchors: the judged anchors (manifest anchors and kept parts) in manifest (topological) order.
        backends: name -> :class:`BackendInfo`.
        config: decision parameters.
        descendants: anchor name -> names of the anchors downstream of it (:func:`anchor_descendants`);
            None: the data flow is unknown, the manifest order stands for it.
        part_of: part name -> its output anchor's name (for every part, judged or not).
    """

    def __init__(
        self,
        anchors: list[AnchorInfo],
        backends: dict[str, BackendInfo],
        config: OracleConfig,
        descendants: dict[str, set[str]] | None,
        part_of: dict[str, str],
    ):
        self.anchors = list(anchors)
        self.backends = backends
        self.cfg = config
        self.descendants = descendants
        self.part_of = part_of

    def successors(self, names: list[str]) -> dict[str, list[str]]:
        """Immediate successors among the judged anchors ``names`` (topological order): ``q`` follows
        ``p`` when ``q`` is downstream of ``p`` with no judged anchor between them on the data flow;
        without the data flow, the next anchor in manifest order."""
        if self.descendants is None:
            return {p: names[i + 1 : i + 2] for i, p in enumerate(names)}
        out = {}
        for i, p in enumerate(names):
            down = self.down(p)
            later = [q for q in names[i + 1 :] if q in down]
            out[p] = [q for q in later if not any(q in self.down(r) for r in later if r != q)]
        return out

    def down(self, name: str) -> set[str]:
        """Anchors downstream of ``name`` in the data flow, without the edge from a part of an output to
        that output (the output contains the part: not a further anchor of the same chain)."""
        down = self.descendants.get(name, set()) if self.descendants is not None else set()
        owner = self.part_of.get(name)
        return down - {owner} if owner else down

    def mark_sustained(self, cells: dict[tuple[str, str], Cell]) -> None:
        """Flag the cells of a voting backend that lie on a run of at least ``sustained_anchors``
        judged anchors, each the immediate successor of the previous along the data flow, at all of
        which the backend departs from its peers (:meth:`departs`). Longest runs by dynamic
        programming over the topological order (ending at / starting from each anchor)."""
        m = self.cfg.sustained_anchors
        for b in self.backends:
            names = [a.name for a in self.anchors if (a.name, b) in cells]
            dep = {n for n in names if self.departs(cells[(n, b)])}
            if len(dep) < m:
                continue
            succ = self.successors(names)
            end = {n: 1 for n in dep}
            for p in names:
                if p in dep:
                    for q in succ[p]:
                        if q in dep:
                            end[q] = max(end[q], end[p] + 1)
            start: dict[str, int] = {}
            for p in reversed(names):
                if p in dep:
                    start[p] = 1 + max((start[q] for q in succ[p] if q in dep), default=0)
            for n in names:
                if n not in dep or end[n] + start[n] - 1 < m:
                    continue
                c = cells[(n, b)]
                if c.flagged:
                    continue
                ratio = c.primary / c.peer_level if c.peer_level else math.inf
                c.flagged = True
                c.reason = (
                    f"sustained departure: > {self.cfg.origin_k:g} x peers' median at {end[n] + start[n] - 1} "
                    f"anchors in a row along the data flow ({self.cfg.primary} {c.primary:.3g} = {ratio:.3g} x "
                    f"peers' median {c.peer_level:.3g} here; floor {c.floor:.3g})"
                )

    def departs(self, c: Cell) -> bool:
        """``c``'s backend departs from its peers at that anchor (localization rule, module docstring).
        Only a voting backend can depart below the flagging threshold: a reduced-precision variant
        departs from its fp32 peers everywhere by design, so for it only flagged cells count (its
        origin stays the first flagged anchor and the sustained rule never fires)."""
        if c.nonfinite or c.flagged:
            return True
        if c.peer_level is None or not self.backends[c.backend].votes:
            return False
        if c.range_ratio is not None and not c.range_ratio > self.cfg.origin_floor_fraction * c.floor:
            return False  # a part: the deviation must also reach its range (the part range rule)
        return c.primary > self.cfg.origin_k * c.peer_level and c.primary > self.cfg.origin_floor_fraction * c.floor

    def trace_origin(
        self, profile: list[tuple[AnchorInfo, Cell]], first: tuple[AnchorInfo, Cell]
    ) -> tuple[AnchorInfo, Cell]:
        """The origin of a flagged backend: the earliest judged anchor ``o`` (topological order) that is
        ``first`` or an ancestor of it, such that the backend departs from its peers (:meth:`departs`)
        at ``o`` and at every judged anchor that lies downstream of ``o`` and upstream of ``first``.
        Ancestry from the run's data flow; without it, every anchor before ``first`` in manifest order
        counts as upstream (parallel branches then break chains, so the origin stays later)."""
        names = [a.name for a, _ in profile]
        fi = names.index(first[0].name)
        before = profile[:fi]
        if self.descendants is not None:
            up = [(a, c) for a, c in before if first[0].name in self.down(a.name)]
        else:
            up = list(before)
        origin = first
        for i in range(len(up) - 1, -1, -1):  # walk back, latest first (manifest order: stop at a break)
            a, c = up[i]
            if self.descendants is not None:
                # only anchors on a path a -> first must depart; those checked already did
                between = [(b, d) for b, d in up[i + 1 :] if b.name in self.down(a.name)]
            else:
                between = up[i + 1 :]
            if self.departs(c) and all(self.departs(d) for _, d in between):
                origin = (a, c)
            elif not self.departs(c) and self.descendants is None:
                break
        return origin

    def localize(self, v: BackendVerdict, profile: list[tuple[AnchorInfo, Cell]]) -> None:
        """Fill ``v``'s origin (flagged backends), propagation profile and steps, ``output_flagged``,
        ``non_monotonic`` and ``propagation`` from ``profile``: its judged (anchor, cell) pairs in
        manifest order (see :class:`anpred.judge.struct.BackendVerdict`)."""
        flagged = [(a, c) for a, c in profile if c.flagged]
        if flagged:
            v.first_flagged_anchor = flagged[0][0].name
            o_a, o_c = self.trace_origin(profile, flagged[0])
            v.origin_anchor, v.origin_stage = o_a.name, o_a.stage
            if o_a.name != v.first_flagged_anchor:
                ratio = o_c.primary / o_c.peer_level if o_c.peer_level else math.inf
                v.origin_traced = (
                    f"traced back from {v.first_flagged_anchor}: departs from its peers from "
                    f"{o_a.name} on ({self.cfg.primary} {o_c.primary:.3g} = {ratio:.3g} x peers' "
                    f"median, below the flagging threshold {o_c.threshold:.3g})"
                )
        # propagation between consecutive anchors of the profile: for a flagged backend with the data
        # flow known, the origin and its judged descendants (topological order); else all judged anchors
        # Parts of outputs are left out of the path unless the origin is one (a part -> output step is
        # dilution, not propagation): the profile and the trend end at the whole output; an output whose
        # part is flagged counts as flagged (not masked).
        part_pairs: dict[str, list[tuple[AnchorInfo, Cell]]] = {}
        for a, c in profile:
            if a.part_of:
                part_pairs.setdefault(a.part_of, []).append((a, c))

        def out_flagged(a: AnchorInfo, c: Cell, reach: set[str] | None) -> bool:
            return c.flagged or any(
                pc.flagged for pa, pc in part_pairs.get(a.name, []) if reach is None or pa.name in reach
            )

        path = [(a, c) for a, c in profile if not a.part_of or a.name == v.origin_anchor]
        reach = None
        if flagged and self.descendants is not None:
            reach = self.down(v.origin_anchor)
            path = [(a, c) for a, c in path if a.name == v.origin_anchor or a.name in reach]
            v.profile_basis = "dataflow"
        v.profile_anchors = [a.name for a, _ in path]
        band = self.cfg.propagation_band
        for (a0, c0), (a1, c1) in zip(path, path[1:]):
            if math.isinf(c0.primary) and math.isinf(c1.primary):
                r, kind = 1.0, "stable"  # against an all-zero consensus at both (nRMSE inf): no ratio, it persists
            elif c0.primary > 0:
                r = c1.primary / c0.primary
                kind = "amplified" if r > band else ("attenuated" if r < 1 / band else "stable")
            else:
                r = None
                kind = "appeared" if c1.primary > 0 else "clean"
            c1_flagged = c1.flagged or (a1.kind == "output" and out_flagged(a1, c1, reach))
            if c0.flagged and not c1_flagged and kind != "amplified":
                kind = "vanished" if c1.primary <= c1.threshold else kind
            v.steps.append(Step(a0.name, a1.name, r, kind))
        outputs = [(a, c) for a, c in profile if a.kind == "output"]
        v.output_flagged = any(out_flagged(a, c, None) for a, c in outputs)
        if flagged:
            origin_idx = next(i for i, (a, _) in enumerate(path) if a.name == v.origin_anchor)
            after = v.steps[origin_idx:]
            ups = any(s.kind == "amplified" for s in after)
            downs = any(s.kind == "attenuated" for s in after)
            v.non_monotonic = ups and downs
            # masked: the output anchor(s) downstream of the origin (and their parts it reaches) are clean
            # while it is flagged
            outs = [(a, c) for a, c in path if a.kind == "output"] if v.profile_basis == "dataflow" else outputs
            if outs and not any(out_flagged(a, c, reach) for a, c in outs):
                v.propagation = "masked"
            else:
                last = outs[-1][1] if outs else path[-1][1]
                origin = next(c for a, c in path if a.name == v.origin_anchor)
                r = last.primary / origin.primary if origin.primary > 0 else math.inf
                v.propagation = "amplified" if r > band else ("attenuated" if r < 1 / band else "stable")


def anchor_descendants(model, values: dict[str, str], index=None) -> dict[str, set[str]]:
    """Which anchors lie downstream of which, in the data flow of ``model``.

    Args:
        model: an ``onnx.ModelProto`` or the path of an ONNX file (external weights are not read).
        values: anchor name -> its ONNX value name (manifest ``anchor.value``).
        index: ``passes.graph.build_index(model.graph)`` when the caller has it already.

    Returns:
        anchor name -> the set of anchor names computed (directly or not) from it; an anchor is not its
        own descendant. One iterative forward sweep over the topologically ordered nodes
        (:func:`passes.graph.build_index`), each value carrying the bit set (a Python int) of the
        anchors it depends on: O(nodes x anchors / 64). Values read inside sub-graphs count as inputs
        of the node that owns the sub-graph.

    Raises:
        GraphError: the graph cannot be indexed (cycle, dangling input ...) or an anchor's value is
            neither produced in it nor one of its inputs (the model does not match the manifest).
        ModelLoadError: ``model`` is a path that cannot be read as ONNX.
    """
    if not hasattr(model, "graph"):
        from anpred.onnx_io import load_model

        model = load_model(model, load_external=False)
    idx = index if index is not None else build_index(model.graph)
    names = list(values)
    bit_of: dict[str, int] = {}
    for i, n in enumerate(names):
        val = values[n]
        if val not in idx.producer and val not in idx.graph_inputs and val not in idx.initializers:
            raise GraphError(
                f"anchor {n!r}: value {val!r} is not in the model's graph (does the model match the manifest?)"
            )
        bit_of[val] = bit_of.get(val, 0) | (1 << i)
    anc: dict[str, int] = {v: b for v, b in bit_of.items() if v in idx.graph_inputs or v in idx.initializers}
    for pos in range(len(idx.nodes)):
        mask = 0
        for v in idx.inputs[pos]:
            mask |= anc.get(v, 0)
        for v in idx.outputs[pos]:
            anc[v] = mask | bit_of.get(v, 0)
    out: dict[str, set[str]] = {n: set() for n in names}
    for j, n in enumerate(names):
        mask = anc.get(values[n], 0) & ~(1 << j)
        i = 0
        while mask:
            if mask & 1:
                out[names[i]].add(n)
            mask >>= 1
            i += 1
    return out


@dataclass
class DataFlow:
    """The data flow of a run's model as the judge uses it (:func:`run_dataflow`).

    Attributes:
        descendants: anchor (and part) name -> the anchors and parts downstream of it
            (:func:`anchor_descendants`); None when the data flow is unknown.
        parts: the :class:`anpred.judge.parts.OutputPart` of every concatenated output, in manifest
            order of the outputs.
        note: why the data flow is unknown (empty when it is known).
    """

    descendants: dict[str, set[str]] | None = None
    parts: list[OutputPart] = field(default_factory=list)
    note: str = ""


def run_dataflow(store, split_outputs: bool) -> DataFlow:
    """The data flow of the ONNX model a run used (``RUN_DIR/model.onnx``, else the file ``run.json``
    names as the model's ``path``), with one graph index for the parts and the data flow.

    Args:
        store: the run (:class:`anpred.run.RunStore`: ``root``, ``meta``, ``manifest``).
        split_outputs: find the parts of concatenated outputs (``OracleConfig.split_outputs``).

    Returns:
        A :class:`DataFlow`; with ``descendants`` None and a ``note`` (propagation then follows the
        manifest order) when no model is there or it does not match the manifest. Never raises an
        :class:`AnpredError`.
    """
    from anpred.onnx_io import load_model

    manifest = store.manifest
    cands = [store.root / "model.onnx"]
    mp = (store.meta.get("model") or {}).get("path")
    if mp:
        cands.append(Path(mp))
    path = next((p for p in cands if p.is_file()), None)
    if path is None:
        return DataFlow(
            note="propagation: no model.onnx in the run folder (nor at the model's recorded path): "
            "the data flow is unknown"
        )
    values = {a.name: a.value for a in manifest.anchors}
    try:
        model = load_model(path, load_external=False)
        idx = build_index(model.graph)  # one index for the parts and the data flow
        parts: list[OutputPart] = []
        if split_outputs:
            outs = {a.name: a.value for a in manifest.anchors if a.kind == "output"}
            found = output_parts(model, outs, skip_values=set(values.values()), index=idx)
            parts = [p for o in outs for p in found.get(o, [])]
        desc = anchor_descendants(model, {**values, **{p.name: p.value for p in parts}}, index=idx)
    except AnpredError as err:
        return DataFlow(note=f"propagation: cannot read the data flow from {path}: {err}")
    return DataFlow(descendants=desc, parts=parts)
