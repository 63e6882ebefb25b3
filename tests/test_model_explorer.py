"""The error on the graph: a real drilled report (openvino's Softplus defect, tests/dashboard_runs.py)
exported for Model Explorer and loaded with Model Explorer's own Python packages: its ONNX adapter
converts the annotated anchored model, every node-data key is a node id of that graph, each file
parses as Model Explorer's ``ModelNodeData`` (strict) and the culprit node ``softplus`` is the one
coded 3 (culprit) and drawn magenta; Netron's view, the node ``metadata_props``, holds the same
numbers as the report."""

from __future__ import annotations

import json

import pytest
from isa_reasons import SAME_DATA

from dashboard_runs import net_runs

pytest.importorskip("model_explorer", reason="ai-edge-model-explorer not installed (requirements-explorer.txt)")
pytest.importorskip("model_explorer_onnx", reason="model-explorer-onnx not installed (requirements-explorer.txt)")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from anpred.cli import main

    runs = net_runs(tmp_path_factory.mktemp("dash"))
    out = tmp_path_factory.mktemp("me") / "me"
    # the hook of `anpred check`: --model-explorer DIR (the run judged anew, drilled, exported)
    assert main(["check", str(runs["bad"] / "run"), "--drill", "--model-explorer", str(out), "-q"]) == 1
    return runs, out


@pytest.mark.isa_independent(SAME_DATA)
def test_export_loads_in_model_explorer_and_names_the_culprit(exported):
    import dacite
    import onnx
    from model_explorer.node_data_builder import GraphNodeData, ModelNodeData
    from model_explorer_onnx.main import ONNXAdapter

    from anpred.report.json import read_json

    runs, out = exported
    index = json.loads((out / "index.json").read_text())
    assert index["culprits"] == {"openvino": "softplus"} and index["annotated"]
    # anpred test --model-explorer wrote the same export into its report folder
    from_test = json.loads((runs["bad"] / "model-explorer" / "index.json").read_text())
    assert from_test["culprits"] == index["culprits"] and from_test["files"] == index["files"]
    graphs = ONNXAdapter().convert(index["model"], {})["graphs"]
    main = next(g for g in graphs if g.id == index["graph"])
    ids = {n.id for n in main.nodes}
    report = read_json(runs["bad"] / "report.json")
    assert sorted(index["files"]) == sorted(
        f"{b}.{k}.json" for b in report.verdicts for k in ("carried", "local", "nrmse", "verdict")
    )
    data = {}
    for f in index["files"]:
        raw = json.loads((out / f).read_text())
        assert list(raw) == [main.id]
        md = ModelNodeData(
            graphsData={
                k: dacite.from_dict(GraphNodeData, v, config=dacite.Config(strict=True)) for k, v in raw.items()
            }
        )
        back = json.loads(md.to_json_string())[main.id]  # Model Explorer's own serialisation (adds its defaults)
        assert {k: back[k] for k in raw[main.id]} == raw[main.id]  # nothing lost or changed
        gd = md.graphsData[main.id]
        assert gd.results and set(gd.results) <= ids, set(gd.results) - ids
        data[f] = gd
    # the culprit: coded 3 and magenta for openvino; no other backend has one
    verdict = data["openvino.verdict.json"].results
    assert [k for k, r in verdict.items() if r.value == 3] == ["softplus"]
    assert data["openvino.nrmse.json"].results["softplus"].bgColor == "#ff00ff"
    assert all(r.value != 3 for r in data["ort.verdict.json"].results.values())
    # the numbers are the report's: nRMSE at each anchor on the node producing it
    v = report.verdicts["openvino"]
    node_of = {a["name"]: a["producer"] for a in report.anchors}
    origin_node = node_of[v.origin_anchor]
    assert verdict[origin_node].value in (2, 3)  # the origin (or the culprit itself, when it made the anchor)
    for c in report.cells:
        if c.backend == "ort" and c.anchor in node_of:
            assert data["ort.nrmse.json"].results[node_of[c.anchor]].value == pytest.approx(c.primary)
    culprit = report.verdicts["openvino"].culprit
    assert culprit["node"] == "softplus" and culprit["op_type"] == "Softplus"
    # per drilled stage: local and carried errors from the drill-down's profile
    prof = {p["stage"]: p for p in report.drill["stages"]["ort"]}
    stage_c0 = next(p for p in prof.values() if p["anchor"] == "anchor/00/t0" or p["stage"] == 0)
    assert data["ort.carried.json"].results["c0"].value == pytest.approx(stage_c0["carried"])
    assert data["ort.local.json"].results["c0"].value == pytest.approx(stage_c0["local"])
    # Netron: the same numbers as node metadata_props of the annotated anchored model
    m = onnx.load(index["model"])
    onnx.checker.check_model(m)
    props = {n.name: {p.key: p.value for p in n.metadata_props} for n in m.graph.node}
    assert props["softplus"]["anpred.openvino.verdict"] == "culprit"
    assert props["softplus"]["anpred.culprit"].startswith("openvino")
    assert float(props["c0"]["anpred.ort.nrmse"]) == pytest.approx(data["ort.nrmse.json"].results["c0"].value, rel=1e-3)
    assert "openvino: flagged" in {p.key: p.value for p in m.metadata_props}["anpred.verdicts"]


def test_model_explorer_config_takes_the_export(exported):
    """Model Explorer's own config API (what ``model-explorer MODEL --node_data_paths=...`` builds)
    accepts the anchored model and every node-data file."""
    import model_explorer

    _, out = exported
    index = json.loads((out / "index.json").read_text())
    cfg = model_explorer.config().add_model_from_path(index["model"])
    for f in index["files"]:
        cfg.add_node_data_from_path(str(out / f))
    enc = json.loads(__import__("urllib.parse").parse.unquote(cfg.to_url_param_value()))
    assert enc["models"] == [{"url": index["model"]}]
    assert sorted(enc["nodeData"]) == sorted(str(out / f) for f in index["files"])


def test_unnamed_nodes_get_ids_the_adapter_keeps(exported, tmp_path):
    """A model whose nodes have no names (many exporters write none) or duplicate ones: the annotated
    copy names every node uniquely, so every key is still a node id of Model Explorer's graph and the
    culprit is found by its output tensor."""
    import onnx
    from model_explorer_onnx.main import ONNXAdapter

    from anpred.report.json import read_json
    from anpred.report.model_explorer import export_model_explorer

    runs, _ = exported
    m = onnx.load(str(runs["bad"] / "run" / "model.onnx"))
    for k, n in enumerate(m.graph.node):
        n.name = "" if k % 2 else "dup"
    onnx.save(m, str(tmp_path / "unnamed.onnx"))
    report = read_json(runs["bad"] / "report.json")
    report.verdicts["openvino"].culprit = {"node": "softplus", "op_type": "Softplus", "output": "sp"}
    index = export_model_explorer(report, tmp_path / "unnamed.onnx", tmp_path / "me")
    names = [n.name for n in onnx.load(index["model"]).graph.node]
    assert "" not in names and len(set(names)) == len(names)
    (graph,) = [g for g in ONNXAdapter().convert(index["model"], {})["graphs"] if g.id == index["graph"]]
    ids = {n.id for n in graph.nodes}
    culprit = index["culprits"]["openvino"]
    assert (
        culprit in ids
        and next(n for n in onnx.load(index["model"]).graph.node if n.name == culprit).op_type == "Softplus"
    )
    for f in index["files"]:
        (gd,) = json.loads((tmp_path / "me" / f).read_text()).values()
        assert set(gd["results"]) <= ids
