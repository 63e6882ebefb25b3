"""Pre-run coverage (issue 18, deliverable 3): before running, each backend's own operator table says
which operators of the model it lacks; such a backend is not started, its status names the operators,
and the report lists it. Real tables (ONNX Runtime's schemas, OpenVINO's ONNX frontend), real runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _det_net(path):
    """Conv -> Relu -> Reshape to 4 matrices of 3x3 -> Det (opset 17): ONNX Runtime runs Det, OpenVINO
    2026.4's ONNX frontend has no conversion rule for it."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(4, 1, 3, 3)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 4, 3, 3], np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["m"], name="reshape"),
        helper.make_node("Det", ["m"], ["y"], name="det"),
    ]
    g = helper.make_graph(
        nodes,
        "det_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[w, shape],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def test_tables_name_the_missing_operator(tmp_path):
    from anpred.backends.coverage import precheck, unsupported_by

    path = _det_net(tmp_path / "det.onnx")
    rows = unsupported_by(path, {"ort": "ort", "openvino": "openvino", "torch-native": "torch-native"})
    assert rows["ort"]["ops"] == {} and rows["ort"]["basis"] == "ONNX Runtime's registered operator schemas"
    assert rows["openvino"]["ops"] == {"Det": "no conversion rule in OpenVINO's ONNX frontend"}
    assert rows["torch-native"]["basis"] == "" and rows["torch-native"]["ops"] == {}  # no table: not asked
    # a custom-domain operator: no schema in ONNX Runtime (named with its domain)
    m = onnx.load(str(path))
    m.graph.node[1].domain, m.graph.node[1].op_type = "my.ops", "FancyRelu"
    m.opset_import.append(helper.make_opsetid("my.ops", 1))
    onnx.save(m, str(tmp_path / "custom.onnx"))
    rows = precheck(tmp_path / "custom.onnx", {"ort": "ort", "ov": "openvino", "bad": "no-such-backend"})
    assert rows["ort"]["ops"] == {"my.ops::FancyRelu": "no ONNX Runtime schema for 'FancyRelu' in domain 'my.ops'"}
    assert set(rows["ov"]["ops"]) == {"my.ops::FancyRelu", "Det"}
    assert "unknown backend 'no-such-backend'" in rows["bad"]["error"] and rows["bad"]["ops"] == {}


def test_run_skips_a_backend_whose_table_lacks_an_operator(tmp_path, capsys):
    from anpred.cli import main
    from anpred.instrument import instrument_model
    from anpred.judge import check_run
    from anpred.run import run_model

    anchored, manifest = instrument_model(onnx.load(str(_det_net(tmp_path / "det.onnx"))))
    manifest.to_model(anchored)
    onnx.save(anchored, str(tmp_path / "anchored.onnx"))
    store = run_model(
        tmp_path / "anchored.onnx",
        ["ort", "openvino", "onnx-reference"],
        "random:uniform:n=2",
        tmp_path / "run",
        progress=True,
        timeout_s=600,
    )
    err = capsys.readouterr().err
    assert "pre-run coverage: openvino: cannot run the model: Det (no conversion rule" in err
    st = store.statuses()
    assert st["ort"].status == "ok" and st["onnx-reference"].status == "ok"
    assert st["openvino"].status == "unsupported" and st["openvino"].samples == 0
    assert st["openvino"].reason.startswith(
        "not run: the model uses 1 operator(s) missing from its OpenVINO's ONNX "
        "frontend (conversion without compilation) (pre-run coverage): Det:"
    )
    assert not (tmp_path / "run" / "logs" / "openvino.log").exists()  # never started
    # the end-of-run table cuts the long reason with "..." and gives it in full below (it was cut silently)
    from anpred.run import format_summary
    from anpred.run.outcome import REASON_WIDTH

    table = format_summary(store).splitlines()
    row = next(ln for ln in table if ln.startswith("openvino "))
    assert row.endswith(st["openvino"].reason[: REASON_WIDTH - 3] + "...")
    assert table[table.index("reasons in full:") + 1] == f"  openvino: {st['openvino'].reason}"
    assert store.meta["coverage"]["openvino"]["ops"] == {"Det": "no conversion rule in OpenVINO's ONNX frontend"}
    # the report lists it with the backends that did not run, with the operator
    rep = check_run(tmp_path / "run", allow_incomplete=True)
    assert rep.backends["openvino"]["coverage"]["ops"] == {"Det": "no conversion rule in OpenVINO's ONNX frontend"}
    assert "Det" in rep.unjudged_backends["openvino"]
    # ort and the reference agree on this small network: Det of a 3x3 matrix in float32
    assert main(["check", str(tmp_path / "run"), "--allow-incomplete"]) in (0, 1)
    out = capsys.readouterr().out
    assert "openvino: not judged: run status unsupported: not run: the model uses 1 operator(s)" in out


def test_precheck_off_runs_the_backend_and_it_fails_naming_the_operator(tmp_path):
    from anpred.instrument import instrument_model
    from anpred.run import run_model

    anchored, manifest = instrument_model(onnx.load(str(_det_net(tmp_path / "det.onnx"))))
    manifest.to_model(anchored)
    onnx.save(anchored, str(tmp_path / "anchored.onnx"))
    store = run_model(
        tmp_path / "anchored.onnx",
        ["ort", "openvino"],
        "random:uniform:n=1",
        tmp_path / "run",
        progress=False,
        timeout_s=600,
        precheck=False,
    )
    st = store.statuses()["openvino"]
    assert "coverage" not in store.meta
    assert st.status in ("unsupported", "failed") and "Det" in st.reason


@pytest.mark.parametrize("name", ["ort", "openvino"])
def test_real_models_from_wheels_have_no_missing_operator(name):
    """PP-OCRv4 det/rec/cls (rapidocr wheel) convert in both tables: no false refusal."""
    import importlib.util
    from pathlib import Path

    from anpred.backends import backend_class

    root = Path(importlib.util.find_spec("rapidocr_onnxruntime").origin).parent / "models"
    files = sorted(root.glob("*.onnx"))
    assert len(files) == 3
    for f in files:
        assert backend_class(name).unsupported_ops(onnx.load(str(f))) == {}, f.name


def test_answers_are_cached_by_model_and_library_versions(tmp_path, monkeypatch):
    from anpred.backends import coverage

    path = _det_net(tmp_path / "det.onnx")
    first = coverage.precheck(path, {"ov": "openvino"})
    assert first["ov"]["ops"] == {"Det": "no conversion rule in OpenVINO's ONNX frontend"}

    def no_child(*a, **k):
        raise AssertionError("a cached answer must not start the child process")

    monkeypatch.setattr(coverage, "_precheck_child", no_child)
    assert coverage.precheck(path, {"other-label": "openvino"})["other-label"] == first["ov"]
    monkeypatch.setattr(coverage, "_versions", lambda: {"openvino": ["0.0-other"]})  # other versions: asked anew
    with pytest.raises(AssertionError, match="cached answer"):
        coverage.precheck(path, {"ov": "openvino"})


# ~13 s: the coverage of every backend, converters asked: out of the default run's time budget; CI's slow run keeps it
@pytest.mark.slow
def test_cli_backends_with_a_model_names_the_missing_operator(tmp_path, capsys):
    import json

    from anpred.cli import main

    path = _det_net(tmp_path / "det.onnx")
    assert main(["backends", "--model", str(path)]) == 0
    out = capsys.readouterr().out
    assert "openvino: cannot run the model: Det (no conversion rule in OpenVINO's ONNX frontend)" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("ort "))
    assert " ok " in row
    assert main(["backends", "--model", str(path), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["openvino-fp16"]["coverage"]["ops"] == {"Det": "no conversion rule in OpenVINO's ONNX frontend"}
    assert rows["ort"]["coverage"]["ops"] == {}
    assert main(["backends", "--model", str(tmp_path / "missing.onnx")]) == 2


def _custom_net(tmp_path):
    """The Det network with its Relu replaced by ``my.ops::FancyRelu`` (a custom operator no library has)."""
    m = onnx.load(str(_det_net(tmp_path / "det.onnx")))
    m.graph.node[1].domain, m.graph.node[1].op_type = "my.ops", "FancyRelu"
    m.opset_import.append(helper.make_opsetid("my.ops", 1))
    onnx.save(m, str(tmp_path / "custom.onnx"))
    return tmp_path / "custom.onnx"


def test_reference_coverage_refuses_a_custom_domain_and_witness_claims_need_coverage(tmp_path):
    """A new user's custom operator: onnx-reference's coverage left other domains to the run, so it was
    added as a witness "that takes the model" and failed with NotImplementedError. Its table (and the
    float64 execution's, the same evaluator) now refuses a domain the evaluator has no kernels for,
    keeps ai.onnx.ml, and a witness is said to take the model only where its coverage says so."""
    from anpred.backends.coverage import unsupported_by
    from anpred.pipeline.witnesses import takes_model

    path = _custom_net(tmp_path)
    rows = unsupported_by(path, {"ref": "onnx-reference", "fp64": "onnx-reference-fp64", "ort": "ort"})
    why = (
        "onnx.reference has no kernel for domain 'my.ops' (it runs the ONNX domains and the model's own functions only)"
    )
    assert rows["ref"]["ops"] == rows["fp64"]["ops"] == {"my.ops::FancyRelu": why}
    assert not takes_model(rows["ref"]) and not takes_model(rows["fp64"])
    # ai.onnx.ml has the evaluator's own kernels: Binarizer is not refused, an unknown ml op is
    ml = helper.make_graph(
        [
            helper.make_node("Binarizer", ["x"], ["b"], domain="ai.onnx.ml", threshold=0.5),
            helper.make_node("Nope", ["b"], ["y"], domain="ai.onnx.ml"),
        ],
        "ml",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    onnx.save(helper.make_model(ml, opset_imports=opsets), str(tmp_path / "ml.onnx"))
    ml_rows = unsupported_by(tmp_path / "ml.onnx", {"ref": "onnx-reference"})
    assert list(ml_rows["ref"]["ops"]) == ["ai.onnx.ml::Nope"]
    # the det network: ort's table takes it, openvino's refuses Det, torch-native has no table (not claimed)
    det = unsupported_by(tmp_path / "det.onnx", {"ort": "ort", "ov": "openvino", "tn": "torch-native"})
    assert [takes_model(det[k]) for k in ("ort", "ov", "tn")] == [True, False, False]


def test_every_named_backend_refused_stops_before_running(tmp_path, capsys):
    """``-b ort,openvino`` on a model with a custom operator: the coverage refuses both, so the test
    stops before anything runs with one line naming the operator, exit 2, nothing written (it used to
    add a witness, start 4 workers, write a report and exit 2)."""
    from anpred.cli import main

    path = _custom_net(tmp_path)
    out = tmp_path / "out"
    before = set(tmp_path.rglob("*"))
    rc = main(["test", str(path), "-b", "ort,openvino", "-o", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err, err
    ov = "openvino: no conversion rule in OpenVINO's ONNX frontend"
    assert err == (
        "anpred: error: the pre-run coverage refuses the model on every backend named (ort, openvino): "
        "2 operator(s) they lack: my.ops::FancyRelu (ort: no ONNX Runtime schema for 'FancyRelu' in "
        f"domain 'my.ops'; {ov}), Det ({ov}); nothing was run or written"
    ), err
    assert set(tmp_path.rglob("*")) == before and not out.exists()


def test_a_named_backend_the_coverage_refuses_gives_no_vote_and_witnesses_make_up_for_it(tmp_path, monkeypatch):
    """A new user's ``-b ort,openvino,tvm`` on a model with a ``Constant`` holding ``value_float`` (TVM's
    frontend refuses it, found node by node): tvm stays among the named backends (the run says why it did
    not run) but was counted as a third voting family, so no witness was added, ort became the
    unjudged reference and the status was incomplete. Now the refused backend gives no vote: a witness
    and the float64 arbiter are added."""
    from anpred.pipeline.witnesses import plan_backends

    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))
    k = helper.make_node("Constant", [], ["k"], name="alpha", value_float=1.5)
    g = helper.make_graph(
        [k, helper.make_node("Mul", ["x", "k"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "cf",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    path = tmp_path / "cf.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    plan = plan_backends(["ort", "openvino", "tvm"], True, path, 1)
    assert plan.subjects == ["ort", "openvino", "tvm"]  # named: it stays, the run names the refusal
    roles = list(plan.witnesses.values())
    assert roles.count("witness") == 1 and roles[-1] == "arbiter", plan.to_dict()
    assert "give 2 voting fp32 families (onnxruntime, openvino)" in plan.why
