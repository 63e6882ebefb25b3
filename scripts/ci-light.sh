#!/usr/bin/env bash
# The light core, proved in a fresh venv (called by .ci/run): `pip install ".[ort,openvino,test]"` from
# this clone and nothing else, its size and time; `anpred backends` (which extra brings each missing
# backend); `anpred test` on a small model with the two runtimes, judged against a consensus that the
# core's own witnesses complete; then the tests that need nothing else (those needing a missing extra
# skip with their reason). PYTHON=python3.12 (or python3.10) tries another Python.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/anpred-light.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
t0=$(date +%s)
"$VPY" -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored: it is neither" || true
# not editable: what a user gets from a clone (a built wheel of this tree)
set +e
"$VPY" -m pip install -q ".[ort,openvino,test]" 2>&1 | grep -vE "is ignored: it is neither|BuildBackendWarning|^ *!!|^ *\*+$|Please be careful|name as your package|may take precedence|with strategy|^ *$"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then echo "ci-light: pip install failed (exit $rc)" >&2; exit "$rc"; fi
t1=$(date +%s)
echo "ci-light: .[ort,openvino,test] installed in $((t1 - t0)) s with $("$VPY" --version); venv $(du -sm "$WORK/venv" | cut -f1) MiB, $("$VPY" -m pip list --format=freeze 2>/dev/null | wc -l) packages"
for heavy in torch tensorflow tvm MNN ncnn ai_edge_litert ray ultralytics; do
  if "$VPY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$heavy') is None)"; then
    echo "ci-light: $heavy is installed in the light venv; it must not be" >&2; exit 1
  fi
done
cd "$WORK"  # the installed package, not this tree
export ANPRED_CACHE="$WORK/cache"  # empty: no conversion and no measured cost from another run
"$WORK/venv/bin/anpred" backends
"$VPY" - <<'PY'
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
rng = np.random.default_rng(0)
w = numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w")
w2 = numpy_helper.from_array(rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32), "w2")
nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Sigmoid", ["c2"], ["s"]),
         helper.make_node("GlobalAveragePool", ["s"], ["y"])]
g = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 1, 1])], initializer=[w, w2])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
onnx.save(m, "small.onnx")
PY
t2=$(date +%s)
"$WORK/venv/bin/anpred" test small.onnx -b ort,openvino -o out -q --inputs random:normal:n=3 > test.txt
t3=$(date +%s)
cat test.txt
"$VPY" - <<'PY'
import json
t = json.load(open("out/test.json"))
rep = json.load(open("out/report.json"))
roles = {b: r.get("role") for b, r in rep["backends"].items()}
assert t["status"] == "consistent", (t["status"], rep["incomplete"])
assert roles["ort"] == roles["openvino"] == "subject" and "witness" in roles.values(), roles
for b in ("ort", "openvino"):
    assert rep["verdicts"][b]["judged_anchors"] == len(rep["anchors"]), b
print("ci-light: anpred test judged ort and openvino with witnesses", [b for b, r in roles.items() if r != "subject"])
PY
echo "ci-light: anpred test took $((t3 - t2)) s"
cd - >/dev/null
# the tests that need nothing beyond the light core (a test needing a missing extra skips, saying which)
"$VPY" -m pytest -q -p no:cacheprovider tests/test_first_minutes.py tests/test_light.py -m "not slow"
