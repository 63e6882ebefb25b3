"""Version bisection of the findings ledger's defects: the first release of a library whose backend
deviates from ONNX's expected outputs on a defect's repro.

``anpred campaign --bisect`` (anpred/campaign/bisect.py) bisects the consensus verdict of a campaign
configuration. A ledger defect is judged against the suite's expected outputs instead (most of the
ledger's repros are single-operator cases the oracle does not judge, or judges with a consensus that
is itself wrong), so this script bisects that judgment: for each probed release it installs the
package into its own folder (``pip install --no-deps --target``, the way
:func:`anpred.campaign.envs.prepare_version` does: the release runs against the venv's numpy,
protobuf, tensorflow ...), puts the folder first on ``PYTHONPATH`` and runs ``anpred conformance`` on
the repros (``benchmarks/results/findings/repros/``) with the one backend, in a conversion cache of its
own (``ANPRED_CACHE`` under the work folder: the shared cache is left alone). The standing of a case
at a release is the suite's word for the pair (``matches``, ``deviates``, ``failed``,
``unsupported``); a release whose backend did not import that release (the version the worker
records differs), could not be installed, or fails/does not support the case is skipped for that
case, never taken for the change (as ``git bisect skip``).

Search, per case: the newest candidate must deviate; the oldest runnable candidate (the first of
the releases at 0, 1/8, 1/4 ... 7/8 of the list that runs, narrowed by a binary search to the
oldest one after the last that does not: old releases fail with the venv's numpy or TensorFlow)
decides: if it deviates too the defect is "present in every release tried (oldest..newest)";
otherwise a binary search between them finds the first deviating release (about log2(n) probes;
the cases at the same probe run together, so one install serves them all). ``--all`` probes every
candidate instead (for packages with few releases).

Usage (from the repository root; heavy: each probe installs a release and runs the repros)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bisect_findings.py --package MNN --backend mnn \\
        --cases test_round,test_logsoftmax_large_number --all -o benchmarks/results/findings/bisect/mnn.json

then ``PYTHONPATH=$PWD .venv/bin/python benchmarks/bisect_findings.py record benchmarks/results/findings/bisect/*.json``
writes each defect's ``first_bad`` into ``notes.json`` (then regenerate docs/findings.md).

Writes ``-o`` (JSON): the command, the candidates, every probe (version, case, standing, reason,
imported version, seconds) and per case the answer: ``first_bad``, ``last_good``, or
``present_in_all`` with the oldest and newest releases that ran. Exit status 0; 2 on bad input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPROS = ROOT / "benchmarks" / "results" / "findings" / "repros"
#: backend -> the key of the package's version in the run record's ``versions[backend]``
VERSION_KEY = {
    "mnn": "mnn",
    "tf": "onnx2tf",
    "litert": "onnx2tf",
    "ort": "onnxruntime",
    "ncnn": "ncnn",
    "tvm": "tvm",
    "torch": "onnx2torch",
    "openvino": "openvino",
}


def install(package: str, version: str, work: Path, find_links: str | None) -> tuple[Path | None, str]:
    """The folder holding ``package==version`` (pip ``--no-deps --target``; reused when present) and
    an error text ('' when installed)."""
    target = work / "envs" / f"{package}-{version}"
    if (target / ".done").is_file():
        return target, ""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        "--target",
        str(target),
        f"{package}=={version}",
    ]
    if find_links:
        cmd[4:4] = ["--find-links", find_links]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return None, "pip install ran past 900 s"
    if proc.returncode != 0:
        return None, "cannot install: " + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
    (target / ".done").write_text(version)
    return target, ""


def run_cases(args, version: str, cases: list[str]) -> dict[str, dict]:
    """Each case's standing at ``version``: ``{case: {"standing", "reason", "imported", "seconds"}}``;
    ``standing`` None when the release could not be run on it."""
    t0 = time.time()
    target, err = install(args.package, version, args.work, args.find_links)
    if target is None:
        return {c: {"standing": None, "reason": err, "imported": None, "seconds": 0.0} for c in cases}
    # a folder per case list: anpred conformance resumes a folder only with the same plan
    tag = hashlib.sha256(",".join(cases).encode()).hexdigest()[:8]
    out = args.work / "runs" / f"{args.backend}-{version}-{tag}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(ROOT)]), ANPRED_CACHE=str(args.work / "cache"))
    cmd = [
        sys.executable,
        "-m",
        "anpred",
        "conformance",
        str(args.repros),
        "--cases",
        ",".join(cases),
        "--backends",
        args.backend,
        "-o",
        str(out),
        "--no-ray",
        "-q",
        "--timeout",
        str(args.timeout),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=args.timeout * len(cases) + 300
    )
    res_file = out / "conformance.json"
    if not res_file.is_file():
        tail = (proc.stderr or proc.stdout).strip()[-300:]
        return {
            c: {
                "standing": None,
                "reason": f"conformance failed: {tail}",
                "imported": None,
                "seconds": time.time() - t0,
            }
            for c in cases
        }
    res = json.loads(res_file.read_text())
    recorded = (res.get("versions") or {}).get(args.backend) or {}
    # the version the worker imported: the package's own key (pnnx under the ncnn backend), else the backend's
    imported = recorded.get(args.package.lower(), recorded.get(VERSION_KEY.get(args.backend, args.package)))
    found = {}
    for rec in res.get("records", []):
        if rec.get("case") not in cases:
            continue
        pair = (rec.get("backends") or {}).get(args.backend) or {}
        word = pair.get("truth")
        reason = pair.get("reason") or pair.get("error") or ""
        if imported is not None and str(imported) != version:
            word, reason = None, f"the worker imported {args.package} {imported}, not {version}"
        elif word not in ("matches", "deviates"):
            reason, word = f"{word}: {reason}"[:300], None
        found[rec["case"]] = {
            "standing": word,
            "reason": reason[:300],
            "imported": imported,
            "seconds": round(time.time() - t0, 1),
        }
    for c in cases:
        found.setdefault(
            c, {"standing": None, "reason": "no record", "imported": imported, "seconds": round(time.time() - t0, 1)}
        )
    return found


class Prober:
    """Probes releases for several cases at once and remembers every answer."""

    def __init__(self, args):
        self.args, self.seen, self.log = args, {}, []

    def standing(self, version: str, cases: list[str]) -> dict[str, str | None]:
        todo = [c for c in cases if (version, c) not in self.seen]
        if todo:
            for case, r in run_cases(self.args, version, todo).items():
                self.seen[(version, case)] = r
                self.log.append({"version": version, "case": case, **r})
                print(f"  {version:<14} {case:<45} {r['standing'] or 'skipped: ' + r['reason'][:90]}", flush=True)
        return {c: self.seen[(version, c)]["standing"] for c in cases}


def search(prober: Prober, cands: list[str], cases: list[str]) -> dict[str, dict]:
    """Per case: the first deviating release (binary search between the oldest runnable release, when
    it matches, and the newest), or present in all releases tried."""
    last = len(cands) - 1
    at_new = prober.standing(cands[last], cases)
    answer = {
        c: {
            "note": f"{cands[last]}: {at_new[c] or 'could not be run'}; nothing to bisect",
            "tried": _tried(prober, cands, c),
        }
        for c in cases
        if at_new[c] != "deviates"
    }
    live = [c for c in cases if at_new[c] == "deviates"]
    # the oldest runnable release: the first of a few spread ones that runs, then narrowed to the
    # oldest between it and the last one before it that does not (releases too old for the venv's
    # numpy/TensorFlow, or without the operator, fail to run: assumed contiguous at the old end)
    bounds: dict[str, list[int]] = {}
    below: dict[str, int] = {}
    for i in sorted({int(f * last) for f in (0, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 7 / 8)} | {last - 1}):
        need = [c for c in live if c not in bounds]
        if not need or i >= last:
            break
        for c, s in prober.standing(cands[i], need).items():
            if s is not None:
                bounds[c] = [below.get(c, -1), i]
            else:
                below[c] = i
    bounds.update({c: [below.get(c, -1), last] for c in live if c not in bounds})
    _narrow(prober, cands, bounds, lambda s: s is not None, skip=False)
    dev: dict[str, list[int]] = {}
    for c in live:
        old = bounds[c][1]
        # the newest release seen matching (the oldest runnable one, or another probed on the way)
        good = [i for i in range(len(cands)) if prober.seen.get((cands[i], c), {}).get("standing") == "matches"]
        if old == last:
            answer[c] = {"note": f"only {cands[last]} could be run of the releases tried"}
        elif not good:
            answer[c] = {"present_in_all": [cands[old], cands[last]], "tried": _tried(prober, cands, c)}
        else:
            dev[c] = [good[-1], last]
    skipped = _narrow(prober, cands, dev, lambda s: s == "deviates", skip=True)
    for c, (lo, hi) in dev.items():
        answer[c] = {
            "first_bad": cands[hi],
            "last_good": cands[lo],
            "skipped_between": [cands[i] for i in sorted(skipped[c]) if lo < i < hi],
            "tried": _tried(prober, cands, c),
        }
    return answer


def _tried(prober: Prober, cands: list[str], case: str) -> dict[str, str]:
    """The releases that ran on ``case``, oldest first, with their standing."""
    return {v: prober.seen[(v, case)]["standing"] for v in cands if prober.seen.get((v, case), {}).get("standing")}


def _narrow(prober: Prober, cands: list[str], bounds: dict[str, list[int]], is_hi, *, skip: bool) -> dict[str, set]:
    """Binary search of every case's ``[lo, hi]`` (``is_hi`` false at lo, true at hi) down to adjacent
    releases, in place; the cases at the same midpoint are probed together. ``skip``: a release that
    cannot be run on a case (standing None) is dropped from its search (returned per case)."""
    skipped: dict[str, set[int]] = {c: set() for c in bounds}
    while True:
        open_: dict[int, list[str]] = {}
        for c, (lo, hi) in bounds.items():
            mids = [i for i in range(lo + 1, hi) if i not in skipped[c]]
            if mids:
                open_.setdefault(mids[len(mids) // 2], []).append(c)
        if not open_:
            return skipped
        for i, cs in sorted(open_.items()):
            for c, s in prober.standing(cands[i], cs).items():
                if skip and s is None:
                    skipped[c].add(i)
                elif is_hi(s):
                    bounds[c][1] = i
                else:
                    bounds[c][0] = i


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "record":  # record RESULT.json ... : the answers into notes.json
        return record([Path(x) for x in argv[1:]], ROOT / "benchmarks" / "results" / "findings")
    p.add_argument("--package", required=True, help="the PyPI package to bisect (MNN, onnx2tf, ncnn, onnxruntime ...)")
    p.add_argument("--backend", required=True, help="the ANPRED backend that runs it (mnn, tf, ncnn, ort ...)")
    p.add_argument("--cases", required=True, help="comma-separated repro case names")
    p.add_argument("--versions", default=None, help="candidate releases, comma-separated (default: pip index versions)")
    p.add_argument("--since", default=None, help="only candidates at or after this release")
    p.add_argument("--all", action="store_true", help="probe every candidate (no search)")
    p.add_argument("--repros", type=Path, default=REPROS)
    p.add_argument("--find-links", default=None, help="a local wheel folder pip looks in too")
    p.add_argument("--timeout", type=int, default=300, help="per case, seconds (anpred conformance --timeout)")
    p.add_argument("--work", type=Path, default=Path("/tmp/anpred-bisect"), help="envs, runs and cache")
    p.add_argument("-o", "--output", type=Path, required=True)
    args = p.parse_args(argv)
    from packaging.version import Version

    from anpred.campaign.bisect import available_versions, order_versions

    cands = order_versions(args.versions.split(",")) if args.versions else available_versions(args.package)
    if args.since:
        cands = [v for v in cands if Version(v) >= Version(args.since)]
    cases = [c for c in args.cases.split(",") if c]
    missing = [c for c in cases if not (args.repros / c / "model.onnx").is_file()]
    if missing or not cands:
        print(f"no repro for {missing}" if missing else "no candidate release", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    prober = Prober(args)
    t0 = time.time()
    print(f"{args.package} on {args.backend}: {len(cands)} candidates {cands[0]}..{cands[-1]}", flush=True)
    if args.all:
        for v in cands:
            prober.standing(v, cases)
        answer = {c: _from_all(prober, cands, c) for c in cases}
    else:
        answer = search(prober, cands, cases)
    result = {
        "command": "PYTHONPATH=$PWD .venv/bin/python benchmarks/bisect_findings.py " + shlex.join(argv),
        "package": args.package,
        "backend": args.backend,
        "candidates": cands,
        "seconds": round(time.time() - t0, 1),
        "answer": answer,
        "probes": prober.log,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    for c, a in answer.items():
        print(f"{c}: {first_bad_text(args.package, a) or a.get('note')}")
    return 0


def _from_all(prober: Prober, cands: list[str], case: str) -> dict:
    """The answer from every candidate probed: the first deviating release after the last matching one."""
    ran = [(v, prober.seen[(v, case)]["standing"]) for v in cands if prober.seen[(v, case)]["standing"]]
    if not ran:
        return {"note": "no release could be run"}
    if ran[-1][1] != "deviates":
        return {"note": f"{ran[-1][0]}: {ran[-1][1]}; nothing to bisect", "tried": dict(ran)}
    good = [i for i, (_, s) in enumerate(ran) if s != "deviates"]
    if not good:
        return {"present_in_all": [ran[0][0], ran[-1][0]], "tried": dict(ran)}
    return {"first_bad": ran[good[-1] + 1][0], "last_good": ran[good[-1]][0], "tried": dict(ran)}


def first_bad_text(package: str, a: dict) -> str | None:
    """The ledger's ``first_bad`` text for one answer (None: nothing bisected)."""
    tried = a.get("tried") or {}
    if "first_bad" in a:
        back = [
            v
            for v, s in tried.items()
            if s == "deviates" and v in tried and list(tried).index(v) < list(tried).index(a["last_good"])
        ]
        also = f"; also deviating in the older {', '.join(back)}" if back else ""
        return f"{package} {a['first_bad']} (last good {a['last_good']}{also})"
    if "present_in_all" in a:
        return (
            f"present in every release tried ({package} {a['present_in_all'][0]}..{a['present_in_all'][1]}, "
            f"{len(tried)} tried)"
        )
    if tried and list(tried.values())[-1] == "matches":  # the newest release matches now: a flaky repro
        seen = ", ".join(f"{v} {s}" for v, s in tried.items())
        return f"not bisected: the repro matches at the newest release on re-run ({package}: {seen})"
    return None


#: package bisected -> the ledger libraries its answers belong to
LIBRARY_OF = {
    "MNN": ("MNN",),
    "onnxruntime": ("onnxruntime",),
    "ncnn": ("pnnx/ncnn",),
    "pnnx": ("pnnx/ncnn",),
    "onnx2tf": ("onnx2tf", "onnx2tf/tensorflow", "onnx2tf/litert"),
    "apache-tvm": ("tvm (relax frontend)",),
    "openvino": ("openvino",),
    "onnx2torch": ("onnx2torch/torch",),
}


def record(results: list[Path], findings: Path) -> int:
    """Write each bisected defect's ``first_bad`` (and ``bisect``: the command and the result file) into
    ``findings/notes.json`` by defect id: a defect is answered by the bisection of its library's package
    on its repro (its example case) with one of its backends; two packages (pnnx and ncnn) are joined."""
    defects = json.loads((findings / "defects.json").read_text())
    notes_path = findings / "notes.json"
    notes = json.loads(notes_path.read_text())
    found: dict[str, list[tuple[str, str]]] = {}
    for path in results:
        res = json.loads(path.read_text())
        rel = path.resolve().relative_to(ROOT)
        for k, d in defects.items():
            if k == "disputed" or d["library"] not in LIBRARY_OF.get(res["package"], ()):
                continue
            if res["backend"] not in d["backends"] or d["example"] not in res["answer"]:
                continue
            text = first_bad_text(res["package"], res["answer"][d["example"]])
            if text:
                found.setdefault(k, []).append((text, f"{res['command']} (result: {rel})"))
    for k, got in found.items():
        entry = notes.setdefault(k, {})
        entry["first_bad"] = "; ".join(t for t, _ in got)
        entry["bisect"] = "; ".join(c for _, c in got)
    notes_path.write_text(json.dumps(notes, indent=1) + "\n")
    print(f"{len(found)} defects given a first bad release in {notes_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
