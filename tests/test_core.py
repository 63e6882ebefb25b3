"""Core contracts: manifest round trip, naming, run store."""

import numpy as np
import pytest

from anpred.errors import AnpredError, OutputPathError
from anpred.manifest import Anchor, AnchorManifest, Stage
from anpred.naming import anchor_name, file_key, from_file_key, uniquify
from anpred.run import RunStore


def _manifest():
    a = Anchor(
        name=anchor_name(3, "model.4"),
        value="v",
        stage=3,
        order=7,
        producer="n",
        op_type="Conv",
        shape=[1, "c", 8, None],
        dtype="float32",
        layout="NCHW",
        scope="model.4",
    )
    return AnchorManifest(anchors=[a], stages=[Stage(0, 0, 7, 8, 8.0, [a.name])])


def test_names_are_deterministic_and_reversible():
    assert anchor_name(3, "/model.4/cv1 conv") == "anchor/03/model.4/cv1_conv"
    assert uniquify(["a", "b", "a", "a"]) == ["a", "b", "a#1", "a#2"]
    for n in ["anchor/03/a__b#1", "output/x%y"]:
        assert from_file_key(file_key(n)) == n
        assert "/" not in file_key(n)


def test_manifest_roundtrip_json_and_model():
    import onnx

    m = _manifest()
    m2 = AnchorManifest.from_json(m.to_json())
    assert m2 == m
    model = onnx.ModelProto()
    m.to_model(model)
    m.to_model(model)  # replaces, never duplicates
    assert sum(p.key == "anpred.manifest" for p in model.metadata_props) == 1
    assert AnchorManifest.from_model(model) == m
    with pytest.raises(AnpredError, match="schema"):
        AnchorManifest.from_dict({"schema": "other", "anchors": []})


def test_runstore_roundtrip_and_refuses_to_overwrite(tmp_path):
    m = _manifest()
    s = RunStore.create(tmp_path / "r", m, mode="tensors")
    s.add_sample("s0000", {"x": np.arange(3, dtype=np.float32)})
    s.write_anchors("ort", "s0000", {m.anchors[0].name: np.full((2, 2), 1.5, np.float16)})
    s.save_meta()
    r = RunStore.open(tmp_path / "r")
    assert r.sample_ids == ["s0000"]
    got = r.read_anchors("ort", "s0000")[m.anchors[0].name]
    assert got.dtype == np.float16 and float(got[1, 1]) == 1.5
    assert r.read_inputs("s0000")["x"].tolist() == [0.0, 1.0, 2.0]
    assert r.meta["machine"]["cores"] >= 1
    with pytest.raises(OutputPathError, match="already holds a run"):
        RunStore.create(tmp_path / "r", m)
