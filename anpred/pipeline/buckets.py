"""Samples of different shapes, run in shape buckets and judged together.

Every converter and runtime here compiles a model for one set of input shapes. Given samples of
several shape sets (sentences of different lengths, utterances, word images of different widths;
:func:`anpred.pipeline.shapes.scan_inputs`), the model is instrumented once with the dimensions that
differ left dynamic, so every bucket has the same anchors; each bucket then runs its own copy with
static shapes (:func:`anpred.pipeline.shapes.bucket_model`: one converted model per shape set, cached
by content like any conversion) into its own run folder, and :func:`merge_runs` adopts every
bucket's samples into one run store under the instrumented model's manifest (whose anchors keep the
dynamic dimensions symbolic: the aligner resolves them per sample), which is judged as one run.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from anpred.pipeline.progress import log

__all__ = ["write_buckets", "run_buckets", "merge_runs", "bucket_lines"]


def write_buckets(buckets: list, folder: Path) -> list[Path]:
    """Each bucket's samples as ``folder/b<k>/s<NNNN>.npz`` (one file per sample, the arrays the
    buckets kept); returns the bucket folders."""
    import numpy as np

    out = []
    for k, b in enumerate(buckets):
        d = folder / f"b{k}"
        d.mkdir(parents=True, exist_ok=True)
        for i, arrays in enumerate(b.arrays):
            np.savez(d / f"s{i:04d}.npz", **arrays)
        out.append(d)
    return out


def run_buckets(anchored_path: Path, names: list[str], buckets: list, tmp: Path, opts) -> list:
    """Run every bucket's copy of the anchored model (``anchored_path``, manifest in its metadata) on
    its samples into ``tmp/.buckets/b<k>/run``, then merge them into ``tmp/run``
    (:func:`merge_runs`). ``opts``: the :class:`anpred.options.TestOptions` (timeout, quiet). Returns the
    per-bucket run stores' statuses ``[{backend: BackendStatus}]``; the merged store is ``tmp/run``."""
    from anpred.onnx_io import load_model, save_model
    from anpred.pipeline.shapes import bucket_model
    from anpred.run import RunStore, run_model
    from anpred.run.model import copy_model

    proto = load_model(anchored_path, load_external=False)
    folders = write_buckets(buckets, tmp / ".buckets" / "inputs")
    stores = []
    for k, (b, inputs) in enumerate(zip(buckets, folders)):
        work = tmp / ".buckets" / f"b{k}"
        work.mkdir(parents=True, exist_ok=True)
        save_model(
            bucket_model(proto, b.shapes), work / "anchored.onnx", source_path=anchored_path, copy_external_data=True
        )
        log(f"shape bucket {k + 1}/{len(buckets)} ({b.text()}): {len(b.sources)} sample(s)", opts.output.quiet)
        stores.append(
            run_model(
                work / "anchored.onnx",
                names,
                str(inputs),
                work / "run",
                mode="tensors",
                timeout_s=opts.run.timeout_s,
                progress=not opts.output.quiet,
            )
        )
    statuses = merge_runs(stores, buckets, tmp / "run", RunStore.open(stores[0].root).manifest)
    merged = RunStore.open(tmp / "run")  # the model with its dynamic dimensions, for the judge's data flow
    merged.meta["model"].update(copy_model(anchored_path, proto, tmp / "run"))
    merged.meta["model"]["path"] = str(anchored_path)
    merged.save_meta()
    shutil.rmtree(tmp / ".buckets", ignore_errors=True)
    return statuses


def _merged_status(name: str, statuses: list, buckets: list):
    """One backend's status over the buckets: ``ok`` where at least one bucket ran (the buckets it
    did not run are named in its reason, and their samples are gaps of the verdict), else the first
    bucket's status; samples and seconds summed."""
    from anpred.backends.base import BackendStatus

    sts = [s.get(name) for s in statuses]
    ok = [s for s in sts if s is not None and s.status == "ok"]
    base = BackendStatus.from_dict((ok[0] if ok else next(s for s in sts if s is not None)).to_dict())
    base.samples = sum(s.samples for s in sts if s is not None)
    base.seconds_prepare = sum(s.seconds_prepare for s in sts if s is not None)
    base.seconds_run = sum(s.seconds_run for s in sts if s is not None)
    bad = [
        f"bucket {k + 1} ({buckets[k].text()}): {s.status}: {s.reason.splitlines()[0][:200] if s.reason else ''}"
        for k, s in enumerate(sts)
        if s is not None and s.status != "ok"
    ]
    if ok and bad:
        base.reason = "; ".join(bad)
    return base


def merge_runs(stores: list, buckets: list, out: Path, manifest) -> list[dict[str, Any]]:
    """Adopt every bucket run's samples (inputs and tensors moved, ids renumbered ``s0000, ...``) into
    a new run store ``out`` with ``manifest``; its meta takes the first run's model, machine and
    backend specs, the pre-run coverage, every bucket's input shapes (``inputs.buckets``) and the
    backends' resources summed. Returns the buckets' statuses ``[{backend: BackendStatus}]``."""
    from anpred.run import RunStore

    first = stores[0]
    merged = RunStore.create(
        out,
        manifest,
        model=dict(first.meta.get("model") or {}),
        inputs={
            **first.meta.get("inputs", {}),
            "input_shapes": "varies by sample",
            "buckets": [b.shapes for b in buckets],
        },
    )
    statuses = [s.statuses() for s in stores]
    n = 0
    for k, s in enumerate(stores):
        ids = []
        for smp in list(s.meta["samples"]):
            sid = f"s{n:04d}"
            merged.adopt_sample(
                sid,
                s,
                smp["id"],
                source=buckets[k].sources[len(ids)] if len(ids) < len(buckets[k].sources) else smp.get("source", ""),
            )
            ids.append(sid)
            n += 1
        buckets[k].ids = ids
    for key in ("backend_specs", "coverage", "machine"):
        if key in first.meta:
            merged.meta[key] = first.meta[key]
    res: dict[str, dict[str, Any]] = {}
    for s in stores:
        for b, r in (s.meta.get("resources") or {}).items():
            acc = res.setdefault(b, {})
            for k, v in r.items():
                acc[k] = acc.get(k, 0) + v if isinstance(v, (int, float)) and not isinstance(v, bool) else v
    merged.meta["resources"] = res
    for name in dict.fromkeys(b for st in statuses for b in st):
        merged.meta["backends"][name] = _merged_status(name, statuses, buckets).to_dict()
    merged.save_meta()
    (out / "logs").mkdir(exist_ok=True)
    for k, s in enumerate(stores):
        for f in (s.root / "logs").glob("*.log"):
            shutil.copyfile(f, out / "logs" / f"{f.stem}.b{k}.log")
    return statuses


def bucket_lines(buckets: list, statuses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per bucket for ``test.json`` and the report: its shapes, samples (ids in the merged
    run, sources) and the backends that did not run it, with why."""
    out = []
    for k, b in enumerate(buckets):
        bad = {
            n: f"{st.status}: {st.reason.splitlines()[0][:200] if st.reason else ''}"
            for n, st in statuses[k].items()
            if st.status != "ok"
        }
        out.append(
            {
                "bucket": k + 1,
                "shapes": {n: list(s) for n, s in b.shapes.items()},
                "samples": list(getattr(b, "ids", [])),
                "sources": list(b.sources),
                "not_run": bad,
            }
        )
    return out
