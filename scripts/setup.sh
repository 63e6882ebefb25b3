#!/usr/bin/env bash
# Set up ANPRED in ./.venv (Python 3.11): the tested dependency set, the packages that must be
# installed without their declared dependencies, and ANPRED itself (editable). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
.venv/bin/python -m pip install -q -r requirements.txt 2>&1 | grep -v "is ignored" || true
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt 2>&1 | grep -v "is ignored" || true
.venv/bin/python -m pip install -q --no-deps -e . 2>&1 | grep -vE "is ignored|BuildBackendWarning|^ *!!|^ *\*+|Please be careful|name as your package|with strategy|^ *$" || true
.venv/bin/python -c "import anpred, onnx, onnxruntime, openvino, torch, tensorflow, onnx2tf; print('anpred set up: torch', torch.__version__, '| onnxruntime', onnxruntime.__version__, '| openvino', openvino.__version__.split('-')[0], '| tensorflow', tensorflow.__version__)"
