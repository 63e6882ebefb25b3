"""``anpred conformance``: a folder of cases in ONNX's backend-test layout through the chosen backends,
on Ray like a campaign.

The cases still to run (those without a record in ``OUT/cases``) are cut into batches of ``batch``
cases; each batch is one Ray task (``num_cpus`` = the cores one batch's backends share, default all
the local cores: one batch at a time on a single machine, several on a cluster) that runs its cases
on one warm pool (:func:`anpred.conformance.runner.run_batch`). A task whose process dies is retried
by Ray (``retries``); its cases already recorded are not run again. Resume: run the same command
again; the plan (``OUT/plan.json``: folder, backends, selected cases) must be the same.

At the end every record is read back and summarized (:mod:`anpred.conformance.score`):
``OUT/conformance.json`` (compact: plan, summary, every record), ``OUT/matrix.tsv`` (case x backend),
``OUT/pairs.tsv`` (one line per pair with its reason) and the printed text.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anpred.conformance.cases import find_cases, load_case
from anpred.conformance.runner import SCHEMA, BatchOptions, run_batch
from anpred.conformance.score import format_summary, load_records, matrix_rows, summarize
from anpred.errors import AnpredError
from anpred.onnx_io import atomic_write_text

__all__ = ["ConformanceOptions", "run_conformance", "select_cases", "write_results", "FP32_BACKENDS"]

_ROOT = str(Path(__file__).resolve().parents[2]) + "/"  # the folder holding the anpred package
#: the fp32 backends of the suite run (the float64 execution included: the consensus' arbiter)
FP32_BACKENDS = [
    "ort",
    "openvino",
    "torch",
    "tf",
    "tvm",
    "mnn",
    "ncnn",
    "litert",
    "onnx-reference",
    "onnx-reference-fp64",
]


@dataclass
class ConformanceOptions:
    """``backends`` (default :data:`FP32_BACKENDS`), ``patterns`` (shell patterns of case names),
    ``dtype`` (``float32``: cases whose inputs and outputs are all float32; ``all``: every tensor
    case), ``timeout_s`` (per case and backend), ``batch`` (cases per Ray task), ``ray`` (False: the
    batches run in this process), ``address``/``num_cpus`` (Ray), ``retries``, ``keep_runs``,
    ``progress``."""

    backends: list[str] = field(default_factory=lambda: list(FP32_BACKENDS))
    patterns: list[str] | None = None
    dtype: str = "float32"
    timeout_s: float = 120.0
    batch: int = 100
    ray: bool = True
    address: str | None = None
    num_cpus: int | None = None
    retries: int = 1
    keep_runs: bool = False
    progress: bool = True


def select_cases(folder: str | Path | None, patterns: list[str] | None, dtype: str) -> tuple[list[Path], int]:
    """The case folders to run and how many tensor cases the folder holds. Raises InputError (no
    folder, no case) or AnpredError (an unknown ``dtype``)."""
    if dtype not in ("float32", "all"):
        raise AnpredError(f"conformance: unknown dtype selection {dtype!r} (float32 | all)")
    chosen = []
    tensors = 0
    for f in find_cases(folder, patterns):
        c = load_case(f)
        if c.kinds:
            continue
        tensors += 1
        if dtype == "all" or c.float32:
            chosen.append(f)
    return chosen, tensors


def folder_text(folder: Path) -> str:
    """How results name a case folder: inside this environment as ``<sys.prefix>/<relative path>``
    (the suite installed by scripts/setup.sh: the same text on every machine), else its path."""
    import sys

    try:
        return "<sys.prefix>/" + Path(folder).resolve().relative_to(Path(sys.prefix).resolve()).as_posix()
    except ValueError:
        return str(folder)


def _plan(out: Path, folder: Path, cases: list[Path], opts: ConformanceOptions) -> dict[str, Any]:
    plan = {
        "schema": SCHEMA,
        "folder": folder_text(folder),
        "backends": opts.backends,
        "dtype": opts.dtype,
        "patterns": opts.patterns,
        "cases": [c.name for c in cases],
    }
    path = out / "plan.json"
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("backends") != plan["backends"] or old.get("cases") != plan["cases"]:
            raise AnpredError(
                f"conformance: {out} holds a run of other backends or cases ({path}); "
                "give another output folder (or the same options to resume)"
            )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(plan, indent=1))
    return plan


def _run_on_ray(batches: list[list[str]], out: Path, bopts: BatchOptions, opts: ConformanceOptions) -> list[str]:
    """One Ray task per batch; returns the reasons of the batches that failed (their cases stay
    unrecorded: a re-run resumes them)."""
    import os

    import ray

    from anpred.campaign.engine import start_ray
    from anpred.run.spec import usable_cores

    start_ray(opts.address, opts.num_cpus)
    cpus = opts.num_cpus or usable_cores()
    task = ray.remote(num_cpus=cpus, max_retries=opts.retries)(run_batch)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    refs = {task.remote(b, str(out), bopts, False): b for b in batches}
    failed = []
    pending = list(refs)
    done_cases = 0
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            done_cases += len(ray.get(ready[0]))
        except Exception as err:  # noqa: BLE001 - a lost batch: reported, its cases resumable
            failed.append(f"batch from {Path(refs[ready[0]][0]).name}: {type(err).__name__}: {str(err)[:300]}")
        if opts.progress:
            print(f"conformance: {done_cases} case(s) recorded, {len(pending)} batch(es) left", flush=True)
    return failed


def run_conformance(folder: str | Path | None, out: str | Path, opts: ConformanceOptions) -> dict[str, Any]:
    """Run the cases of ``folder`` (default: the ONNX node suite, :func:`anpred.conformance.cases.default_folder`)
    on ``opts.backends`` into ``out`` (module docstring); returns the results (plan, summary, records,
    ``failed_batches``, ``seconds``). Raises InputError / AnpredError before anything runs for a bad
    folder, selection or output folder."""
    from anpred.backends import REGISTRY
    from anpred.conformance.cases import default_folder

    unknown = [b for b in opts.backends if b not in REGISTRY]
    if unknown:
        raise AnpredError(f"conformance: unknown backend(s) {', '.join(unknown)}; known: {', '.join(REGISTRY)}")
    t0 = time.perf_counter()
    root = Path(folder) if folder is not None else default_folder()
    cases, tensors = select_cases(root, opts.patterns, opts.dtype)
    if not cases:
        raise AnpredError(f"conformance: no {opts.dtype} case among the {tensors} tensor case(s) of {root}")
    out = Path(out)
    plan = _plan(out, root, cases, opts)
    todo = [str(c) for c in cases if not (out / "cases" / f"{c.name}.json").is_file()]
    if opts.progress:
        print(
            f"conformance: {len(cases)} {opts.dtype} case(s) of {tensors} in {root}; {len(cases) - len(todo)} "
            f"already recorded, {len(todo)} to run on {len(opts.backends)} backend(s)",
            flush=True,
        )
    bopts = BatchOptions(backends=list(opts.backends), timeout_s=opts.timeout_s, keep_runs=opts.keep_runs)
    failed: list[str] = []
    if todo:
        batches = [todo[i : i + opts.batch] for i in range(0, len(todo), max(1, opts.batch))]
        if opts.ray:
            failed = _run_on_ray(batches, out, bopts, opts)
        else:
            for b in batches:
                run_batch(b, out, bopts, progress=opts.progress)
    records = [r for r in load_records(out) if r["case"] in set(plan["cases"])]
    res = write_results(out, plan, records)
    res.update(failed_batches=failed, seconds=round(time.perf_counter() - t0, 1))
    return res


def write_results(out: Path, plan: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Summarize ``records`` and write ``conformance.json``, ``matrix.tsv`` and ``pairs.tsv`` in ``out``;
    returns ``{"plan", "summary", "records", "text"}``."""
    backends = list(plan["backends"])
    summary = summarize(records, backends)
    versions: dict[str, dict[str, str]] = {}
    for r in records:
        for b, row in r.get("backends", {}).items():
            if row.get("versions") and b not in versions:
                versions[b] = row["versions"]
    compact = [_compact(r) for r in records]
    doc = {
        "schema": SCHEMA,
        "plan": {k: v for k, v in plan.items() if k != "cases"},
        "versions": versions,
        "summary": {k: v for k, v in summary.items() if k not in ("missed", "false_alarms")},
        "missed": summary["missed"],
        "false_alarms": summary["false_alarms"],
        "records": compact,
    }
    atomic_write_text(out / "conformance.json", json.dumps(doc, separators=(",", ":")))
    atomic_write_text(
        out / "matrix.tsv",
        "\n".join("\t".join(r) for r in [["case", *backends], *matrix_rows(records, backends)]) + "\n",
    )
    pairs = ["case\tbackend\ttruth\tflagged\treason\toracle_reason"]
    for r in records:
        for b, row in r.get("backends", {}).items():
            pairs.append(
                "\t".join(
                    [
                        r["case"],
                        b,
                        row["truth"],
                        str(row.get("flagged", "")),
                        (row.get("reason") or "").replace("\t", " "),
                        (row.get("oracle_reason") or "").replace("\t", " "),
                    ]
                )
            )
    atomic_write_text(out / "pairs.tsv", "\n".join(pairs) + "\n")
    text = format_summary(summary, records, backends)
    return {"plan": plan, "summary": summary, "records": records, "text": text}


def _compact(rec: dict[str, Any]) -> dict[str, Any]:
    """A record for the results file: versions once per backend (in the file's ``versions``), reasons
    cut to 200 characters, the oracle's reason only where it flagged or could not judge the pair
    (``pairs.tsv`` keeps them all)."""
    r = dict(rec)
    rows = {}
    for b, row in rec.get("backends", {}).items():
        row = {k: v for k, v in row.items() if k != "versions" and v not in ("", None)}
        if row.get("flagged") is False and "oracle_reason" in row:
            del row["oracle_reason"]
        for k in ("reason", "oracle_reason"):
            if k in row:  # (tracebacks in reasons: paths inside this checkout made relative to it)
                row[k] = str(row[k]).replace(_ROOT, "")[:200]
        rows[b] = row
    r["backends"] = rows
    return r
