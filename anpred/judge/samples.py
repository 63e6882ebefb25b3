"""Judging the samples of a run folder, one at a time: read each usable backend's stored tensors,
align them (:class:`anpred.align.Aligner`), add the parts of concatenated outputs, and feed the
consensus oracle and/or the threshold baseline.

Contract: :func:`judge_samples` takes a :class:`Judging` (the run and the report being filled, as
:func:`anpred.judge.check.usable_backends` leaves them), appends its notes (data flow, threshold
baseline) and the sample count to that report, and returns a :class:`Judged` whose oracle and
baseline are ready to ``finish()``. Nothing of a sample's tensors outlives its turn of the loop but
what the accumulators keep. An unreadable tensor file is a :class:`anpred.errors.JudgeError`
(:func:`read_tensors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anpred.defaults import OracleConfig
from anpred.errors import JudgeError
from anpred.align.rules import apply_rule
from anpred.judge.populations import PopulationOracle, populations_of, program_of
from anpred.judge.positions import DISTRIBUTION_POSITIONS, PositionSampler
from anpred.run.positions import GATHERED_SUFFIX
from anpred.judge.localize import DataFlow, run_dataflow
from anpred.judge.parts import OutputPart, add_part_views
from anpred.judge.struct import AnchorInfo, BackendInfo, CheckReport
from anpred.judge.threshold import ThresholdCheck

__all__ = [
    "Judged",
    "Judging",
    "SampleJudge",
    "aligned_sample",
    "run_aligner",
    "judge_samples",
    "judged_anchors",
    "quant_steps",
    "read_tensors",
    "tensor_file",
]


@dataclass
class Judging:
    """A run folder being judged.

    Attributes:
        store: the run (:class:`anpred.run.RunStore`).
        report: the report being filled (``report.oracle``: which oracle(s); ``report.backends``: the
            backend table).
        config: decision parameters.
        usable: the backends that can be judged, in run order.
        reference: the backend asked for as reference (None: chosen by ``config.reference_priority``).
        atol, rtol: the threshold baseline's tolerances.
    """

    store: Any
    report: CheckReport
    config: OracleConfig
    usable: list[str]
    reference: str | None = None
    atol: float = 1e-5
    rtol: float = 1e-5


@dataclass
class Judged:
    """What judged the samples: ``oracle`` (None unless the consensus oracle was asked for),
    ``threshold`` (None unless the baseline was), the ``parts`` judged beside the anchors and the
    aligner's report (``alignment``, :class:`anpred.align.AlignmentReport`)."""

    oracle: PopulationOracle | None
    threshold: ThresholdCheck | None
    parts: list[OutputPart]
    alignment: Any


def judge_samples(run: Judging) -> Judged:
    """Feed every sample of ``run`` to the oracle(s) it asks for (module docstring).

    Raises:
        AnpredError: a manifest pin is malformed (``AlignmentError``).
        JudgeError: a stored tensor file is unreadable.
    """
    judge = SampleJudge(run)
    judge.add_store(run.store)
    return judge.judged()


class SampleJudge:
    """The oracle(s) of a run, fed store by store (:func:`judge_samples` feeds one; a streamed dataset
    run, :mod:`anpred.pipeline.stream`, feeds one store per chunk of samples, each deleted after).
    ``positions``: judge every intermediate anchor of more than that many elements on that many sampled
    positions (:mod:`anpred.judge.positions`; None: every element); anchors a worker stored as their
    sampled positions (:mod:`anpred.run.positions`) are taken as they are.

    Raises (constructor): AnpredError: a manifest pin is malformed (``AlignmentError``).
    """

    def __init__(self, run: Judging, positions: int | None = None):
        store, report, cfg = run.store, run.report, run.config
        self.run = run
        consensus = report.oracle in ("consensus", "both")
        flow = run_dataflow(store, cfg.split_outputs) if consensus else DataFlow()
        if flow.note:
            report.notes.append(flow.note)
        self.flow = flow
        binfos = [
            BackendInfo.make(
                b,
                report.backends[b]["family"],
                report.backends[b]["precision"],
                cfg,
                requested=report.backends[b].get("precision_requested") or None,
            )
            for b in run.usable
        ]
        for bi in binfos:  # known defects of its library that the model reaches (anpred.backends.reference_defects)
            bi.defects = (report.backends[bi.name].get("versions") or {}).get("reference_defects", "")
            # the reduced program it ran: one population per program (anpred.judge.populations)
            bi.program = program_of(report.backends[bi.name].get("versions"))
        self.binfos = binfos
        self.oracle = (
            PopulationOracle(
                judged_anchors(store.manifest, flow.parts),
                binfos,
                cfg,
                reference=run.reference,
                descendants=flow.descendants,
                steps=self._steps(store, binfos),
            )
            if consensus
            else None
        )
        if self.oracle is not None:  # each population's natural units: the steps of the program its members ran
            for key, members in self.oracle.groups.items():
                steps = quant_steps(store, [m.name for m in members], report.notes)
                if key in self.oracle.pops:
                    self.oracle.pops[key].steps = steps
                if key != members[0].precision:  # several programs of one precision: each member's own
                    self.oracle.main.member_steps.update({m.name: steps for m in members})
        self.threshold = _threshold_check(run, binfos) if report.oracle in ("threshold", "both") else None
        self.aligner = run_aligner(store, run.usable)
        self.names = set(store.manifest.names())
        self.sampler = PositionSampler(store.manifest, positions) if positions else None
        if self.sampler is not None and self.oracle is not None and cfg.primary != "wasserstein":
            # the Wasserstein distance on DISTRIBUTION_POSITIONS positions of every larger tensor (outputs
            # judged in full, intermediate anchors judged on K): its sort was the largest part of a
            # streamed page's judging (docs/task.md)
            self.oracle.main.distribution_k = min(positions, DISTRIBUTION_POSITIONS)

    def _steps(self, store, binfos: list[BackendInfo]) -> dict[str, float]:
        """The run's int8 quantization steps (:func:`quant_steps`); its note that they differ between
        backends only where one program's members differ (several programs differ by design, and each
        member is then given its own program's steps)."""
        notes: list[str] = []
        steps = quant_steps(store, self.run.usable, notes)
        if all(key == members[0].precision for key, members in populations_of(binfos).items()):
            self.run.report.notes.extend(notes)
        return steps

    def add_store(self, store, ids: dict[str, str] | None = None, each=None) -> None:
        """Judge every sample of ``store`` (a run over the same model and backends); ``ids``: its
        sample id -> the id recorded in the report (default: the same); ``each(sid, tensors)`` is
        called with every sample's aligned tensors (``{anchor: {backend: array}}``) after judging.

        Raises:
            JudgeError: a stored tensor file is unreadable.
        """
        for sid in store.sample_ids:
            tensors, unaligned, absent = aligned_sample(
                store, self.aligner, self.run.usable, sid, self.names, self.flow.parts
            )
            if self.sampler is not None:
                self.sampler.apply(tensors)
            rid = (ids or {}).get(sid, sid)
            if self.oracle is not None:
                self.oracle.add(tensors, unaligned, sample_id=rid, absent=absent)
            if self.threshold is not None:
                self.threshold.add(tensors)
            self.run.report.samples += 1
            if each is not None:
                each(rid, tensors)

    def judged(self) -> Judged:
        return Judged(
            oracle=self.oracle, threshold=self.threshold, parts=self.flow.parts, alignment=self.aligner.report()
        )


def quant_steps(store, usable: list[str], notes: list[str]) -> dict[str, float]:
    """anchor -> int8 quantization step, from the usable backends' run records (``quant_steps``: the
    scale of the DequantizeLinear that produces the anchor in the QDQ model they ran). Members of one
    population run one converted model, so their steps agree; where they do not (a backend given
    another model), the first backend's is kept and a note names the anchors."""
    steps: dict[str, float] = {}
    differ: set[str] = set()
    for b, st in store.statuses().items():
        if b not in usable:
            continue
        for a, v in (getattr(st, "quant_steps", None) or {}).items():
            if a in steps and not np.isclose(steps[a], v, rtol=1e-6, atol=0):
                differ.add(a)
            steps.setdefault(a, float(v))
    if differ:
        notes.append(
            f"int8 quantization steps differ between backends at {len(differ)} anchor(s) "
            f"(e.g. {sorted(differ)[0]}): the first backend's step is used for the natural units"
        )
    return steps


def judged_anchors(manifest, parts: list[OutputPart]) -> list[AnchorInfo]:
    """The manifest's anchors in its order, each output's ``parts`` just before it (their values
    precede it in the data flow), with the output's stage and dtype."""
    parts_of: dict[str, list[OutputPart]] = {}
    for p in parts:
        parts_of.setdefault(p.output, []).append(p)
    anchors = []
    for a in manifest.anchors:
        anchors.extend(
            AnchorInfo(p.name, a.stage, "part", "Concat", a.dtype, part_of=a.name) for p in parts_of.get(a.name, [])
        )
        anchors.append(AnchorInfo(a.name, a.stage, a.kind, a.op_type, a.dtype))
    return anchors


def _threshold_check(run: Judging, binfos: list[BackendInfo]) -> ThresholdCheck:
    """The baseline on the output anchors (else the last stage's) against the reference (asked for,
    else the first usable in ``reference_priority``, else the first voter); a note says so."""
    manifest, usable, cfg = run.store.manifest, run.usable, run.config
    outputs = [a.name for a in manifest.anchors if a.kind == "output"] or [
        a.name for a in manifest.anchors if a.stage == max(x.stage for x in manifest.anchors)
    ]
    ref = (
        run.reference
        or next((b for b in cfg.reference_priority if b in usable), None)
        or next((b.name for b in binfos if b.votes), usable[0])
    )
    run.report.notes.append(
        f"threshold baseline: element-wise |x-r| <= atol={run.atol:g} or |x-r|/|r| <= "
        f"rtol={run.rtol:g} on {len(outputs)} output anchor(s) against {ref}"
    )
    return ThresholdCheck(outputs, usable, ref, run.atol, run.rtol)


def run_aligner(store, usable: list[str]):
    """An :class:`anpred.align.Aligner` over the usable backends' run records.

    Raises:
        AnpredError: a manifest pin is malformed (``AlignmentError``).
    """
    from anpred.align import Aligner

    statuses = {k: v for k, v in store.statuses().items() if k in usable}
    return Aligner(store.manifest, statuses)


def aligned_sample(store, aligner, usable: list[str], sid: str, names: set[str], parts: list[OutputPart]):
    """One sample read and aligned: ``(tensors, unaligned, absent)`` for :meth:`Oracle.add`
    (``unaligned``: ``{(anchor, backend): reason}``; ``absent``: backends that stored nothing for it);
    stored anchors the manifest does not know are ignored."""
    raw, absent, pre = {}, {}, {}
    for b in usable:
        t = read_tensors(store, b, sid)
        if not t and (
            store.meta["backends"].get(b, {}).get("status") != "ok" or not tensor_file(store, b, sid).exists()
        ):
            absent[b] = "no tensors stored for this sample"
            continue
        # (a backend that ran every sample and stored an empty file for this one returned no value: its
        # outputs are missing where the voting families agree, anpred.judge.deviations)
        raw[b] = {k: v for k, v in t.items() if k in names}
        for k, v in t.items():  # stored by the worker as the anchor's sampled positions (anpred.run.positions)
            if k.endswith(GATHERED_SUFFIX) and k[: -len(GATHERED_SUFFIX)] in names:
                pre[(k[: -len(GATHERED_SUFFIX)], b)] = v
    res = aligner.align(sid, raw)
    tensors = res.tensors
    unaligned = {(a, b): str(why) for a, per in res.unaligned.items() for b, why in per.items()}
    if pre:
        decisions = aligner.decisions
        for (a, b), v in pre.items():
            d = decisions.get((a, b))
            if d is None:
                unaligned[(a, b)] = "stored as sampled positions without an alignment decision"
                continue
            values = {k: d.rule[k] for k in ("cast", "dequantize") if k in d.rule}  # what acts on values
            tensors.setdefault(a, {})[b] = apply_rule(values, v, None).reshape(-1)
    add_part_views(tensors, unaligned, parts)
    return tensors, unaligned, absent


def tensor_file(store, backend: str, sample_id: str) -> Path:
    """The file that holds (or would hold) ``backend``'s anchors of one sample."""
    return store.anchor_file(backend, sample_id) or store.backend_dir(backend) / f"{sample_id}.safetensors"


def read_tensors(store, backend: str, sample_id: str) -> dict[str, np.ndarray]:
    """``store.read_anchors`` (empty when that backend stored nothing for the sample) with unreadable
    files turned into a :class:`JudgeError` (exit 2) that names the file and what to do."""
    import zipfile

    try:
        return store.read_anchors(backend, sample_id)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as err:
        path = tensor_file(store, backend, sample_id)
        raise JudgeError(
            f"{path}: unreadable tensor file ({type(err).__name__}: {err}); re-run backend "
            f"{backend!r} or delete the file to judge the run without that sample"
        ) from err
