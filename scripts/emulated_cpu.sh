#!/usr/bin/env bash
# Make .venv/bin/python-emu: the venv's python, and every process it starts with sys.executable (ANPRED's
# backend workers), under an emulated AMD EPYC-Rome (qemu-x86_64 user mode, TCG): AVX2 and F16C, no
# AVX-512, VNNI or bf16, the CPU many users and reviewers have. docs/run.md says more.
#
# The emulator must pass a check before it is used: in the emulated process and in a child it starts,
# numpy's cpuid table shows AVX2 and no AVX512F, and numpy's AVX2 argsort of floats is right (qemu 7.2,
# Debian 12's qemu-user, emulates some AVX2 instruction wrongly: argsort of 100 float32 values comes back
# unsorted, and the oracle's statistics with it; qemu 10 is right). Tried in order: $QEMU_X86_64, the
# copy fetched earlier (.venv/anpred-qemu/), the system's qemu-x86_64, then a fresh copy of Debian's
# static qemu-user from bookworm-backports (apt-get with a private list folder: nothing is installed).
# Exits non-zero, saying why, when none passes: CI must not skip the emulated run silently.
# Usage: bash scripts/emulated_cpu.sh   (after scripts/setup.sh; idempotent)
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "emulated_cpu: $*" >&2; exit 1; }
[ -x .venv/bin/python ] || fail ".venv/bin/python missing: run scripts/setup.sh first"
[ "$(uname -s)/$(uname -m)" = "Linux/x86_64" ] || fail "needs an x86-64 Linux host (qemu user mode), not $(uname -s)/$(uname -m)"
NAME=${EMU_NAME:-python-emu}  # another name only to try the script beside an existing wrapper
EMU=".venv/bin/$NAME"
FETCHED=.venv/anpred-qemu/qemu-x86_64

# EPYC-Rome less the features TCG cannot emulate (each would print "TCG doesn't support requested
# feature" at every process start); none of them changes what the runtimes' kernels compute
CPU="EPYC-Rome,rdseed=off,sha-ni=off,rdpid=off,fxsr-opt=off,misalignsse=off,3dnowprefetch=off,osvw=off"
CPU="$CPU,topoext=off,perfctr-core=off,clzero=off,xsaveerptr=off,wbnoinvd=off,ibpb=off,amd-stibp=off"
CPU="$CPU,nrip-save=off,xsavec=off,xsaves=off"

# qemu-user does not follow execve: a child started as `python` would run natively. The wrapper passes
# its own absolute path as argv[0] (-0), so Python takes it for sys.executable (and finds the venv by
# it), and every child started with sys.executable comes back through the wrapper, emulated too.
write_wrapper() {
  cat > "$EMU" <<EOF
#!/usr/bin/env bash
# made by scripts/emulated_cpu.sh: the venv's python under an emulated AVX2-only EPYC-Rome ($("$1" --version | head -1))
self="\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)/\$(basename "\${BASH_SOURCE[0]}")"
exec "$1" -cpu "$CPU" -0 "\$self" "\$(dirname "\$self")/python" "\$@"
EOF
  chmod +x "$EMU"
}

PROBE="$(mktemp -d)/probe.py"
trap 'rm -rf "$(dirname "$PROBE")"' EXIT
cat > "$PROBE" <<'PY'
import json, subprocess, sys
import numpy as np
try:
    from numpy._core._multiarray_umath import __cpu_features__ as f
except ImportError:  # numpy < 2
    from numpy.core._multiarray_umath import __cpu_features__ as f
x = np.random.default_rng(0).standard_normal(1000)
sorted_ok = all(bool(np.all(np.diff(x.astype(t)[np.argsort(x.astype(t))]) >= 0)) for t in (np.float32, np.float64))
me = {"AVX2": bool(f["AVX2"]), "AVX512F": bool(f["AVX512F"]), "argsort": sorted_ok, "executable": sys.executable}
if sys.argv[1:2] == ["child"]:
    print(json.dumps(me))
    sys.exit(0)
out = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True, check=True).stdout
bad = {who: p for who, p in (("parent", me), ("child", json.loads(out)))
       if not p["AVX2"] or p["AVX512F"] or not p["argsort"] or not p["executable"].endswith(sys.argv[1])}
if bad:
    sys.exit(f"not an AVX2-only CPU computing right, or a child not emulated: {bad}")
PY

try() {  # try QEMU: the wrapper made with it passes the check
  [ -n "$1" ] && [ -x "$1" ] || return 1
  set -- "$(realpath "$1")"  # the workers start elsewhere: an absolute path in the wrapper
  write_wrapper "$1"
  if msg=$("$EMU" "$PROBE" "$NAME" 2>&1); then
    echo "emulated_cpu: $EMU ready: $("$1" --version | head -1), EPYC-Rome (AVX2, no AVX-512; checked in a process and its child)"
    return 0
  fi
  echo "emulated_cpu: $1 ($("$1" --version | head -1)) fails the check: $(echo "$msg" | grep -v "TCG doesn't support" | tail -1)" >&2
  rm -f "$EMU"
  return 1
}

fetch() {  # Debian's static qemu-user from bookworm-backports into .venv/anpred-qemu (apt's own client)
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || return 1
  local d o
  d=$(mktemp -d)
  mkdir -p "$d/lists/partial" "$d/cache/archives/partial" "$d/x"
  echo "deb http://deb.debian.org/debian bookworm-backports main" > "$d/sources.list"
  o=(-q -o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$d/lists"
     -o "Dir::Cache=$d/cache" -o APT::Sandbox::User=root)
  if apt-get "${o[@]}" update >/dev/null && (cd "$d" && apt-get "${o[@]}" download qemu-user/bookworm-backports >/dev/null) &&
     dpkg-deb --fsys-tarfile "$d"/qemu-user_*.deb | tar -x -C "$d/x" ./usr/bin/qemu-x86_64; then
    mkdir -p "$(dirname "$FETCHED")"
    mv "$d/x/usr/bin/qemu-x86_64" "$FETCHED"
  fi
  rm -rf "$d"
  [ -x "$FETCHED" ]
}

try "${QEMU_X86_64:-}" || try "$FETCHED" || try "$(command -v qemu-x86_64 || true)" ||
  { echo "emulated_cpu: fetching Debian's qemu-user from bookworm-backports" && fetch && try "$FETCHED"; } ||
  fail "no qemu-x86_64 passes the check; install qemu-user >= 10 (Debian: bookworm-backports or trixie) or set QEMU_X86_64"
