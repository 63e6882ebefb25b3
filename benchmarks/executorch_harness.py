"""ExecuTorch's own operator tests beside ANPRED's oracle, on the same modules and inputs (issue 37,
deliverable 5; docs/executorch.md).

ExecuTorch's backend test suite ships in the wheel (``executorch/backends/test/suite/operators``, run by
pytest with its ``conftest.py``). Its runner compares each flow's output with the eager reference at
one tolerance for all, ``atol = 1e-1, rtol = 4e-2`` (``suite/runner.py``). This script runs it for the
flows ``xnnpack`` and ``xnnpack_static_int8_per_channel`` and records, per test case, their verdict and
error statistics, and the very inputs and outputs they compared (the harness's
``Tester.run_method_and_compare_outputs`` is wrapped: the random inputs it draws are drawn once and
passed to it explicitly, so its verdict is unchanged). On the same module and inputs it then computes:

* the float64 truth (the module in float64 on the inputs cast to float64);
* fp32: the module in eager PyTorch (their reference), ExecuTorch without delegate (portable kernels,
  :func:`anpred.backends.executorch_lower.lower`) and XNNPACK (their output);
* int8 (the static per-channel flow): the fake-quantized program (their reference), the same program on
  ExecuTorch's quantized portable kernels, and XNNPACK int8 (their output), plus the fp32 three;

and judges them with ANPRED's oracle (:class:`anpred.judge.populations.PopulationOracle`, defaults of
:class:`anpred.defaults.OracleConfig`; one anchor per output; the float64 execution as the
``onnx-reference-fp64`` scale): the fp32 verdict of ``xnnpack`` and, for int8, the budget and the
implementation verdicts of ``xnnpack-int8``; the culprit is every backend the oracle flags.

Usage (from the repository root; about 40 minutes for the whole operator suite on 2 cores)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/executorch_harness.py --out benchmarks/results/executorch-harness
    ... --filter test_conv2d   # a subset (pytest -k expression)

Writes ``cases.jsonl`` (one record per test case, as each is judged), ``cases.json`` and ``table.md`` (the per-operator
table and the counts) under ``--out`` and prints the counts.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FLOWS = ("xnnpack", "xnnpack_static_int8_per_channel")
CASES: list[dict] = []
_CURRENT: dict = {}
SINK: list[Path] = []  # the cases.jsonl being written


def _np(t) -> np.ndarray:
    import torch

    return t.detach().to(torch.float64).numpy() if t.is_floating_point() else t.detach().numpy()


def _outputs(x) -> list:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    return [t for t in (x.values() if isinstance(x, dict) else x) if isinstance(t, torch.Tensor)]


def install_capture() -> None:
    """Wrap the harness's comparison and its run_test so each case's model, inputs, reference and
    flow output are recorded in :data:`CASES` with its result."""
    from executorch.backends.test.harness import tester as tester_mod
    from executorch.backends.test.harness.stages import StageType
    from executorch.backends.test.suite import runner

    original_compare = tester_mod.Tester.run_method_and_compare_outputs
    original_run_test = runner.run_test

    def compare(self, stage=None, inputs=None, num_runs=1, **kw):
        inputs = inputs if inputs else next(self.generate_random_inputs())
        ref, _ = self._calculate_reference_output(self.stages[StageType.EXPORT].artifact, inputs)
        out = self.stages[stage or self.cur].run_artifact(inputs)
        _CURRENT.update(
            inputs=tuple(inputs),
            reference=_outputs(ref),
            output=_outputs(out),
            exported=self.stages[StageType.EXPORT].artifact,
        )
        return original_compare(self, stage=stage, inputs=inputs, num_runs=1, **kw)

    def run_test(model, inputs, flow, test_name, test_base_name, subtest_index, params, **kw):
        _CURRENT.clear()
        model_copy = copy.deepcopy(model)
        summary = original_run_test(model, inputs, flow, test_name, test_base_name, subtest_index, params, **kw)
        stats = [
            {"max": float(s.error_max), "mae": float(s.error_mae), "sqnr": float(s.sqnr)}
            for s in summary.tensor_error_statistics
        ]
        case = {
            "flow": flow.name,
            "test": test_name,
            "base": test_base_name,
            "subtest": subtest_index,
            "result": summary.result.name,
            "error": str(summary.error or "")[:300],
            "their_stats": stats,
            "model": model_copy,
            **_CURRENT,
        }
        CASES.append(row_of(case))  # judged at once, written at once: a cut run keeps what it did
        if SINK:
            with open(SINK[0], "a") as f:
                f.write(json.dumps(CASES[-1], default=str) + "\n")
        return summary

    tester_mod.Tester.run_method_and_compare_outputs = compare
    runner.run_test = run_test


def run_suite(flows: tuple[str, ...], filt: str | None, from_op: str | None = None) -> int:
    """ExecuTorch's operator suite under pytest for ``flows`` (its conftest.py parametrizes the flows);
    ``from_op``: only the operator files from ``test_<from_op>.py`` on, in name order (to resume)."""
    import pytest
    from executorch.backends.test import suite

    root = Path(suite.__file__).parent / "operators"
    marks = " or ".join(f"flow_{f}" for f in flows)
    files = [str(f) for f in sorted(root.glob("test_*.py")) if not from_op or f.stem >= f"test_{from_op}"]
    args = [
        *(files if from_op else [str(root)]),
        "-q",
        "-m",
        marks,
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "--rootdir",
        str(root.parent),
        "-W",
        "ignore",
    ]
    if filt:
        args += ["-k", filt]
    return pytest.main(args, plugins=[_Seeded()])


class _Seeded:
    """A pytest plugin: torch's and numpy's generators seeded (0) before each test, so that the random
    inputs the suite's tests and the harness draw are the same in every run (the figures reproducible)."""

    @staticmethod
    def pytest_runtest_setup(item):
        import torch

        torch.manual_seed(0)
        np.random.seed(0)


def _portable(program, inputs) -> list:
    """``program`` (an ExportedProgram) on ExecuTorch without delegate, on ``inputs``."""
    from anpred.backends.executorch_lower import EtProgram, lower

    low = lower(program, "portable", "the test module")
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "m.pte"
        p.write_bytes(low.pte)
        return EtProgram(p).run([x.numpy() for x in _leaves(inputs)])


def _leaves(inputs) -> list:
    """The tensors of (possibly nested) inputs in order: a program's flat input list."""
    import torch
    from torch.utils._pytree import tree_leaves

    return [x for x in tree_leaves(inputs) if isinstance(x, torch.Tensor)]


def _fp32_runs(case: dict) -> dict[str, list]:
    """fp32 outputs of the case's module: eager, portable, XNNPACK; and the float64 truth."""
    import torch

    from anpred.backends.executorch_lower import EtProgram, lower

    model, inputs = case["model"].eval(), case["inputs"]
    with torch.no_grad():
        eager = [_np(t) for t in _outputs(model(*inputs))]
        m64 = copy.deepcopy(model).double()
        as64 = torch.utils._pytree.tree_map(
            lambda x: x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x, tuple(inputs)
        )
        truth = [_np(t) for t in _outputs(m64(*as64))]
        ep = torch.export.export(model, tuple(inputs), strict=False)
    runs = {"torch": eager, "fp64": truth, "executorch": [np.asarray(o, np.float64) for o in _portable(ep, inputs)]}
    if case["flow"] == "xnnpack":
        runs["xnnpack"] = [_np(t) for t in case["output"]]
    else:
        low = lower(ep, "xnnpack", "the test module")
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "m.pte"
            p.write_bytes(low.pte)
            runs["xnnpack"] = [
                np.asarray(o, np.float64) for o in EtProgram(p).run([x.numpy() for x in _leaves(inputs)])
            ]
    return runs


def judge(case: dict) -> dict:
    """ANPRED's oracle on the case's outputs (module docstring)."""
    from anpred.defaults import OracleConfig
    from anpred.judge.populations import PopulationOracle
    from anpred.judge.struct import AnchorInfo, BackendInfo

    runs = _fp32_runs(case)
    runs["onnx-reference-fp64"] = runs.pop("fp64")  # the float64 execution under the arbiter's name
    infos = [
        BackendInfo("torch", "torch"),
        BackendInfo("executorch", "executorch"),
        BackendInfo("xnnpack", "xnnpack"),
        BackendInfo("onnx-reference-fp64", "onnx-reference-fp64", "fp64", votes=False, requested="fp64"),
    ]
    if case["flow"] != "xnnpack":
        runs["torch-pt2e-int8"] = [_np(t) for t in case["reference"]]
        runs["executorch-int8"] = [np.asarray(o, np.float64) for o in _portable(case["exported"], case["inputs"])]
        runs["xnnpack-int8"] = [_np(t) for t in case["output"]]
        infos += [
            BackendInfo(b, f, "int8", votes=False, requested="int8")
            for b, f in (("torch-pt2e-int8", "torch"), ("executorch-int8", "executorch"), ("xnnpack-int8", "xnnpack"))
        ]
    n = len(runs["onnx-reference-fp64"])
    anchors = [AnchorInfo(f"output/{i}", 0, "output") for i in range(n)]
    oracle = PopulationOracle(anchors, infos, OracleConfig())
    oracle.add(
        {
            a.name: {b: runs[b][i].reshape(runs["onnx-reference-fp64"][i].shape) for b in runs if i < len(runs[b])}
            for i, a in enumerate(anchors)
        }
    )
    res = oracle.finish()
    target = "xnnpack" if case["flow"] == "xnnpack" else "xnnpack-int8"
    v = res.verdicts.get(target)
    truth, got = runs["onnx-reference-fp64"], runs[target]
    err = [float(np.sqrt(np.sum((g - t) ** 2) / max(np.sum(t**2), 1e-300))) for g, t in zip(got, truth)]
    out = {
        "anpred": "flagged" if v is not None and v.flagged else ("consistent" if v is not None else "unjudged"),
        "culprit": sorted(b for b, bv in res.verdicts.items() if bv.flagged and b != "onnx-reference-fp64"),
        "nrmse_vs_fp64": max(err) if err else None,
        "max_abs_vs_fp64": max(float(np.max(np.abs(g - t))) if g.size else 0.0 for g, t in zip(got, truth)),
    }
    if v is not None and getattr(v, "implementation", None) is not None:
        out["implementation"] = "flagged" if v.implementation.flagged else "consistent"
    if case["flow"] != "xnnpack":
        # the quantizer annotates some operators only (conv, linear, add, ...): the others stay fp32
        out["quantized"] = any("quantize_per" in str(n.target) for n in case["exported"].graph.nodes)
        base = [
            float(np.sqrt(np.sum((g - t) ** 2) / max(np.sum(t**2), 1e-300)))
            for g, t in zip(runs["torch-pt2e-int8"], truth)
        ]
        out["fake_quant_nrmse_vs_fp64"] = max(base) if base else None
    return out


def row_of(c: dict) -> dict:
    """The JSON record of a captured case, ANPRED's verdict included where it was compared."""
    row = {k: v for k, v in c.items() if k not in ("model", "inputs", "reference", "output", "exported")}
    if c.get("output") is not None and c["result"] in ("SUCCESS", "OUTPUT_MISMATCH_FAIL"):
        try:
            row.update(judge(c))
        except Exception as err:  # noqa: BLE001 - a case ANPRED cannot redo is listed as such
            row["anpred_error"] = f"{type(err).__name__}: {str(err)[:200]}"
    return row


def summarize(rows: list[dict]) -> dict:
    """The counts of docs/executorch.md: their pass where ANPRED flags, their fail where ANPRED finds
    the result within the precision's cost."""
    out = {}
    for flow in FLOWS:
        r = [x for x in rows if x["flow"] == flow and "anpred" in x]
        passed = [x for x in r if x["result"] == "SUCCESS"]
        failed = [x for x in r if x["result"] == "OUTPUT_MISMATCH_FAIL"]
        out[flow] = {
            "compared": len(r),
            "their_pass": len(passed),
            "their_output_mismatch": len(failed),
            "their_pass_anpred_flags": sum(x["anpred"] == "flagged" for x in passed),
            "their_fail_anpred_within_cost": sum(x["anpred"] == "consistent" for x in failed),
            "not_compared": sum(1 for x in rows if x["flow"] == flow and "anpred" not in x),
            "results": dict(sorted(collections.Counter(x["result"] for x in rows if x["flow"] == flow).items())),
        }
        if flow != "xnnpack":  # the quantized program itself against float64, whatever the verdicts
            out[flow]["their_pass_program_nrmse_over_0.5"] = sum(
                (x.get("fake_quant_nrmse_vs_fp64") or 0) > 0.5 for x in passed
            )
    return out


def table(rows: list[dict]) -> str:
    lines = [
        (
            "| flow | test | their verdict (atol 1e-1, rtol 4e-2) | their max abs / SQNR dB | ANPRED | culprit | "
            "nRMSE vs float64 | max abs vs float64 |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in rows:
        if "anpred" not in x:
            continue
        st = x["their_stats"][0] if x["their_stats"] else {}
        verdict = x["anpred"] + (f" (impl. {x['implementation']})" if "implementation" in x else "")
        if x.get("quantized") is False:
            verdict += " (not quantized)"
        lines.append(
            f"| {x['flow']} | {x['test']} | {x['result']} | {st.get('max', float('nan')):.3g} / "
            f"{st.get('sqnr', float('nan')):.1f} | {verdict} | {', '.join(x['culprit']) or '-'} | "
            f"{x['nrmse_vs_fp64']:.2e} | {x['max_abs_vs_fp64']:.2e} |"
        )
    return "\n".join(lines) + "\n"


def operator_of(base: str, ops: list[str]) -> str:
    """The operator of a test (``test_conv2d_simple`` -> ``conv2d``): the longest operator test file
    name (``operators/test_<op>.py``) the test's base name starts with."""
    hits = [op for op in ops if base.startswith(f"test_{op}")]
    return max(hits, key=len) if hits else base


def operator_table(rows: list[dict]) -> str:
    """One row per operator: both flows' verdicts side by side (docs/executorch.md)."""
    from executorch.backends.test import suite

    ops = sorted(f.stem[5:] for f in (Path(suite.__file__).parent / "operators").glob("test_*.py"))
    per: dict[str, dict[str, list]] = {}
    for x in rows:
        per.setdefault(operator_of(x.get("base") or x["test"], ops), {}).setdefault(x["flow"], []).append(x)

    def cell(xs: list[dict]) -> str:
        done = [x for x in xs if "anpred" in x]
        if not done:
            why = sorted({x["result"] for x in xs})
            return f"- ({', '.join(why)}) | - | - | -"
        ok = sum(x["result"] == "SUCCESS" for x in done)
        flagged = [x for x in done if x["anpred"] == "flagged"]
        culprits = sorted({c for x in flagged for c in x["culprit"]})
        imp = sum(x.get("implementation") == "flagged" for x in done)
        worst = max((x["nrmse_vs_fp64"] or 0.0) for x in done)
        unq = sum(x.get("quantized") is False for x in done)
        return (
            f"{ok}/{len(done)}"
            + (f" ({unq} not quantized)" if unq else "")
            + f" | {len(flagged)}"
            + (f" (impl. {imp})" if imp else "")
            + f" | {', '.join(culprits) or '-'} | {worst:.1e}"
        )

    lines = [
        (
            "| operator | xnnpack: their pass / compared | ANPRED flags | culprit | max nRMSE vs float64 | "
            "int8: their pass / compared | ANPRED flags (budget; impl.) | culprit | max nRMSE vs float64 |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for op in sorted(per):
        lines.append(f"| {op} | {cell(per[op].get(FLOWS[0], []))} | {cell(per[op].get(FLOWS[1], []))} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--filter", default=None, help="pytest -k expression")
    ap.add_argument("--from-op", default=None, help="resume: the operator test files from test_<OP>.py on")
    ap.add_argument("--summarize", action="store_true", help="only rebuild table.md and the counts from cases.jsonl")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.summarize:  # the tables of a run cut short, from its cases.jsonl
        rows = [json.loads(ln) for ln in (out / "cases.jsonl").read_text().splitlines() if ln.strip()]
        (out / "table.md").write_text(table(rows))
        (out / "operators.md").write_text(operator_table(rows))
        print(json.dumps(summarize(rows), indent=1))
        return 0
    if not args.from_op:  # a resumed run (--from-op) appends to the cases of the run it continues
        (out / "cases.jsonl").unlink(missing_ok=True)
    SINK.append(out / "cases.jsonl")
    install_capture()
    t0 = time.perf_counter()
    run_suite(FLOWS, args.filter, args.from_op)
    t_suite = time.perf_counter() - t0
    # every case of the run, those of the run a --from-op resume continues included
    rows = (
        [json.loads(ln) for ln in (out / "cases.jsonl").read_text().splitlines() if ln.strip()]
        if (out / "cases.jsonl").is_file()
        else CASES
    )
    summary = {
        "counts": summarize(rows),
        "seconds_suite": round(t_suite, 1),
        "seconds_total": round(time.perf_counter() - t0, 1),
        "command": " ".join(sys.argv),
    }
    (out / "cases.json").write_text(json.dumps({"summary": summary, "cases": rows}, indent=1, default=str))
    (out / "table.md").write_text(table(rows))
    (out / "operators.md").write_text(operator_table(rows))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
