"""Running cases through warm workers and judging each (case, backend) twice.

:func:`run_batch` takes a list of case folders and runs them one after the other on one
:class:`anpred.run.warm.WarmPool` (each backend's process, imports and converter stay up from case to
case; the backends side by side, the cores divided, :func:`anpred.run.spec.split_threads`): per case
one run folder (:func:`anpred.run.run_model` with the pool, no coverage precheck: a backend's
``prepare`` names a missing operator itself), then

1. **the oracle**: the run judged by the consensus (:func:`anpred.judge.usable_backends` ->
   :func:`anpred.judge.judge_samples` -> :func:`anpred.judge.finish`, the public steps of
   ``anpred check``); the consensus it formed at each output is kept
   (``oracle.main.formed_consensus``, after a split or a merge too) to tell whether the consensus itself is right;
2. **the ground truth**: each backend's aligned outputs against the expected outputs with the suite's
   tolerance (:mod:`anpred.conformance.truth`); ``random`` for a graph that draws random numbers
   (:data:`RANDOM_OPS`: ONNX fixes no generator, so the suite's expected outputs, one generator's draw,
   bind no backend; such pairs count neither as matching nor as deviating).

Inputs that are weights: for a backend whose converter needs parameters as initializers
(:attr:`anpred.backends.base.Backend.constant_weights`) the case's weight inputs
(:func:`passes.bind_inputs.weight_inputs`) are bound to the fed values (:func:`passes.bind_inputs.bind_inputs`)
in a copy of the model that this backend alone runs (its ``model`` option); the other backends take
them as inputs. The record names what was bound, per backend.

Each case's record (:func:`case_record`) is written to ``OUT/cases/<case>.json`` once judged; a case
with a record is done (resume). The run folder is removed unless ``keep_runs``.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anpred.conformance.cases import Case, load_case
from anpred.conformance.truth import compare, truth_of
from anpred.onnx_io import atomic_write_text

__all__ = [
    "BatchOptions",
    "run_batch",
    "case_record",
    "judge_case",
    "anchored_copy",
    "default_max_rss",
    "CASES_DIR",
    "SCHEMA",
]

SCHEMA = "anpred.conformance/1"
#: per-case records under the output folder
CASES_DIR = "cases"
_ARBITRATED = "closer to the float64 execution"
#: the generator operators of the ONNX standard (their outputs are draws; ONNX fixes no generator)
RANDOM_OPS = frozenset(
    {"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike"}
)


@dataclass
class BatchOptions:
    """How a batch runs: ``backends`` (registry names, run side by side with the cores divided),
    ``timeout_s`` (per case and backend: prepare and run), ``keep_runs`` (keep each case's run
    folder under ``OUT/runs``), ``side_by_side`` (False: the backends one after the other),
    ``max_rss_bytes`` (a worker above it is killed, :class:`anpred.run.warm.WarmPool`; None: the
    default, :func:`default_max_rss`)."""

    backends: list[str]
    timeout_s: float = 120.0
    keep_runs: bool = False
    side_by_side: bool = True
    max_rss_bytes: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def default_max_rss() -> int:
    """A worker's resident-memory limit in a conformance run: an eighth of the machine's physical
    memory (``os.sysconf``; ten workers side by side), at least 2 GiB, well above what a single-node
    case needs on any backend (docs/conformance.md, 'Measured: worker memory'); the limit stops a
    library that allocates without bound (docs/conformance.md) before it starves the machine."""
    import os

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(2 << 30, total // 8)


def _bound_specs(case: Case, specs: list, work: Path) -> tuple[list, dict[str, list[str]]]:
    """``specs`` with a ``model`` option (the case's weight inputs bound) for the backends whose
    converter needs them constant; returns ``(specs, {label: bound input names})``."""
    from anpred.backends import backend_class
    from anpred.errors import AnpredError
    from anpred.onnx_io import load_model, save_model
    from anpred.run.spec import BackendSpec
    from passes.bind_inputs import bind_inputs, weight_inputs

    need = [s for s in specs if getattr(backend_class(s.name), "constant_weights", False)]
    if not need:
        return specs, {}
    model = load_model(case.model)
    names = [n for n in weight_inputs(model) if n in case.inputs]
    if not names:
        return specs, {}
    try:
        bound, _ = bind_inputs(model, {n: case.inputs[n] for n in names})
    except AnpredError:  # a value bind_inputs cannot bind (no numeric dtype): run the case as it is
        return specs, {}
    path = work / "bound" / f"{case.name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(bound, path)
    out, done = [], {}
    for s in specs:
        if s in need:
            s = BackendSpec(s.name, s.label, {**s.options, "model": str(path)})
            done[s.label] = names
        out.append(s)
    return out, done


#: the ONNX graph's own layout of a float tensor by rank (ONNX operators are channels-first): the
#: canonical layout of an output anchor, so that the aligner takes a backend's tensor that comes back
#: in the graph's layout as it is even where its dimensions are equal (``C == W``) instead of calling
#: it ambiguous, and applies a backend's declared channels-last transform (onnx2tf) as usual
ONNX_LAYOUTS = {3: "NCW", 4: "NCHW", 5: "NCDHW"}


def anchored_copy(case: Case, work: Path) -> Path:
    """A copy of the case's model in ``work/models/<case>/model.onnx`` with its manifest beside it
    (``model.anchors.json``: the graph outputs as anchors, :func:`anpred.run.model.load_anchored`,
    each float output of rank 3-5 in the ONNX layout, :data:`ONNX_LAYOUTS`). Returns the copy's path."""
    from anpred.run.model import load_anchored

    folder = work / "models" / case.name
    folder.mkdir(parents=True, exist_ok=True)
    dst = folder / "model.onnx"
    shutil.copyfile(case.model, dst)
    _, manifest, _ = load_anchored(dst)
    for a in manifest.anchors:
        if a.shape is not None and a.dtype.startswith(("float", "bfloat")):
            a.layout = ONNX_LAYOUTS.get(len(a.shape), a.layout)
    manifest.save(folder / "model.anchors.json")
    return dst


def _raw_where_unaligned(
    store, backends: list[str], sid: str, expected: dict[str, np.ndarray], aligned: dict[str, dict[str, np.ndarray]]
) -> None:
    """Where the aligner left an output out for a backend, its stored tensor as returned, when that
    cannot hide a layout: the expected shape itself, a rank of 0 or 1 (a scalar the aligner does not
    take), or another element count (then the ground truth names the wrong shape). A tensor of the
    right size in another shape of rank >= 2 stays out (``no output of the expected shape``)."""
    from anpred.judge.samples import read_tensors

    for b in backends:
        missing = [a for a in expected if a not in aligned.get(b, {})]
        if not missing:
            continue
        raw = read_tensors(store, b, sid)
        for a in missing:
            t, ref = raw.get(a), expected[a]
            if t is None:
                continue
            t = np.asarray(t)
            if t.shape == ref.shape or t.ndim <= 1 or ref.ndim <= 1 or t.size != ref.size:
                aligned.setdefault(b, {})[a] = t.astype(np.float64) if t.dtype.kind == "f" else t


def judge_case(run_dir: Path, case: Case) -> dict[str, Any]:
    """The two judgments of one run folder of ``case`` (module docstring): per backend its run status,
    ground truth and oracle verdict; the consensus against the expected outputs."""
    from anpred.judge import finish, judge_samples, usable_backends
    from anpred.judge.samples import aligned_sample, run_aligner
    from anpred.naming import output_anchor_name
    from anpred.run.store import RunStore

    store = RunStore.open(run_dir)
    statuses = store.statuses()
    random_ops = sorted(set(case.op.split("+")) & RANDOM_OPS)
    expected = {output_anchor_name(o): e for o, e in zip(case.outputs, case.expected)}
    ok = [b for b, st in statuses.items() if st.status == "ok"]
    aligned: dict[str, dict[str, np.ndarray]] = {}
    if ok:
        aligner = run_aligner(store, ok)
        sid = store.sample_ids[0]
        tensors, _, _ = aligned_sample(store, aligner, ok, sid, set(expected), [])
        for anchor, per in tensors.items():
            for b, t in per.items():
                aligned.setdefault(b, {})[anchor] = t
        _raw_where_unaligned(store, ok, sid, expected, aligned)
    run = usable_backends(run_dir, oracle="consensus", allow_incomplete=True)
    report, consensus = run.report, {}
    if not report.problems:
        judged = judge_samples(run)
        if judged.oracle is not None:
            consensus = dict(judged.oracle.main.formed_consensus)  # wherever formed (splits, merges too)
        report = finish(run, judged)
    backends = {}
    for b, st in statuses.items():
        row: dict[str, Any] = {
            "status": st.status,
            "versions": st.versions,
            "seconds_prepare": round(st.seconds_prepare, 3),
            "seconds_run": round(st.seconds_run, 4),
        }
        if st.status == "ok":
            fp64 = st.precision == "fp64"
            matches, why, per = truth_of(
                aligned.get(b, {}), expected, case.rtol, case.atol, None if fp64 else st.dtypes
            )
            row.update(truth="matches" if matches else "deviates", reason=why)
            if not matches:
                row["outputs"] = per
            if random_ops:  # the expected outputs are one generator's draw: they bind no backend
                row.update(
                    truth="random",
                    reason=f"the graph draws random numbers ({', '.join(random_ops)}): "
                    "ONNX fixes no generator, the expected outputs bind no backend",
                )
        else:
            row.update(
                truth="unsupported" if st.status == "unsupported" else "failed",
                reason=f"{st.status}: {st.reason}" if st.status not in ("failed", "unsupported") else st.reason,
            )
        v = report.verdicts.get(b)
        if v is not None and st.status == "ok" and b not in report.unjudged_backends:
            cells = [c for c in report.cells if c.backend == b]
            row["flagged"] = bool(v.flagged)
            row["oracle"] = v.status
            reasons = [c.reason for c in cells if c.reason]
            row["oracle_reason"] = reasons[0][:300] if reasons else ""
            row["arbitrated"] = any(_ARBITRATED in (c.reason or "") for c in cells)
        elif st.status == "ok":
            row["oracle"] = "unjudged"
            row["oracle_reason"] = str(report.unjudged_backends.get(b, "not judged"))[:300]
        backends[b] = row
    # the consensus is judged where it was formed (an output no backend could be judged at has none)
    wrong = {
        a: compare(consensus[a], e, case.rtol, case.atol)
        for a, e in expected.items()
        if a in consensus and not random_ops
    }
    return {
        "backends": backends,
        "oracle_status": report.status,
        "consensus_mode": {a: m for a, m in report.consensus.items() if a in expected},
        "consensus_wrong": any(not t.ok for t in wrong.values()) if wrong else None,
        "consensus_reason": next((t.reason for t in wrong.values() if not t.ok), ""),
        "notes": [n for n in report.notes if _ARBITRATED in n][:3],
    }


def case_record(
    case: Case, judged: dict[str, Any] | None, bound: dict[str, list[str]], seconds: float, error: str = ""
) -> dict[str, Any]:
    """The compact record of one case (written to ``OUT/cases/<case>.json``)."""
    rec = {
        "schema": SCHEMA,
        "case": case.name,
        "op": case.op,
        "opset": case.opset,
        "dtypes": case.dtypes(),
        "rtol": case.rtol,
        "atol": case.atol,
        "bound": bound,
        "seconds": round(seconds, 3),
    }
    if error:
        rec["error"] = error
    if judged is not None:
        rec.update(judged)
    return rec


def _one_case(folder: Path, out: Path, pool, specs: list, opts: BatchOptions) -> dict[str, Any]:
    """Run and judge one case; returns its record (an error that stops the case is recorded, not raised)."""
    from anpred.errors import AnpredError
    from anpred.inputs import ArraySamples
    from anpred.run.driver import run_model

    t0 = time.perf_counter()
    case = load_case(folder)
    if case.kinds:
        return case_record(case, None, {}, 0.0, error="not a tensor case: " + "; ".join(case.kinds))
    run_dir = out / "runs" / case.name
    try:
        cspecs, bound = _bound_specs(case, specs, out / ".work")
        model = anchored_copy(case, out / ".work")
        run_model(
            model,
            cspecs,
            ArraySamples([(case.name, case.inputs)], {"kind": "arrays", "case": case.name}),
            run_dir,
            progress=False,
            precheck=False,
            pool=pool,
            overwrite=True,
        )
        judged = judge_case(run_dir, case)
    except AnpredError as err:
        return case_record(case, None, {}, time.perf_counter() - t0, error=f"{type(err).__name__}: {err}")
    except Exception as err:  # noqa: BLE001 - ANPRED's own failure on this case: recorded, the next case runs
        import traceback

        return case_record(
            case,
            None,
            {},
            time.perf_counter() - t0,
            error=f"internal: {type(err).__name__}: {err} ({traceback.format_exc(limit=-2)[-300:]})",
        )
    finally:
        if not opts.keep_runs:
            shutil.rmtree(run_dir, ignore_errors=True)
            (out / ".work" / "bound" / f"{case.name}.onnx").unlink(missing_ok=True)
            shutil.rmtree(out / ".work" / "models" / case.name, ignore_errors=True)
    return case_record(case, judged, bound, time.perf_counter() - t0)


def run_batch(folders: list[str], out: str | Path, opts: BatchOptions, progress: bool = False) -> list[str]:
    """Run and judge the cases in ``folders`` (their records written to ``out/cases``; cases with a
    record are skipped) on one warm pool. Returns the names of the cases recorded now."""
    from anpred.run.spec import split_threads
    from anpred.run.warm import WarmPool

    out = Path(out)
    (out / CASES_DIR).mkdir(parents=True, exist_ok=True)
    todo = [Path(f) for f in folders if not (out / CASES_DIR / f"{Path(f).name}.json").is_file()]
    done: list[str] = []
    if not todo:
        return done
    specs = split_threads(opts.backends) if opts.side_by_side else list(opts.backends)
    from anpred.run.spec import BackendSpec

    specs = [BackendSpec.coerce(s) for s in specs]
    work = out / ".work" / f"pool-{todo[0].name}-{int(time.time())}"
    with WarmPool(
        work,
        timeout_s=opts.timeout_s,
        side_by_side=opts.side_by_side,
        max_rss_bytes=opts.max_rss_bytes or default_max_rss(),
    ) as pool:
        for i, folder in enumerate(todo):
            rec = _one_case(folder, out, pool, specs, opts)
            atomic_write_text(out / CASES_DIR / f"{folder.name}.json", json.dumps(rec, separators=(",", ":")))
            done.append(folder.name)
            if progress:
                print(f"[{i + 1}/{len(todo)}] {folder.name}: {_line(rec)}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return done


def _line(rec: dict[str, Any]) -> str:
    """One progress line: the backends by ground truth, the flagged ones, the seconds."""
    if rec.get("error"):
        return rec["error"][:160]
    by: dict[str, list[str]] = {}
    for b, row in rec.get("backends", {}).items():
        by.setdefault(row["truth"], []).append(b + ("!" if row.get("flagged") else ""))
    return "; ".join(f"{k} {','.join(v)}" for k, v in sorted(by.items())) + f" ({rec['seconds']:.1f} s)"
