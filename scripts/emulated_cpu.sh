#!/usr/bin/env bash
# Make .venv/bin/python-emu: the venv's python, and every process it starts with sys.executable (ANPRED's
# backend workers), under an emulated AMD EPYC-Rome (qemu-x86_64 user mode, TCG): AVX2 and F16C, no
# AVX-512, VNNI or bf16, the CPU many users and reviewers have. Then check that it is one: numpy's cpuid
# table in the emulated process and in a child it starts must show AVX2 and no AVX512F.
# Exits non-zero, saying why, when qemu-x86_64 is missing or older than 7.2 (TCG emulates AVX2 from 7.2),
# the host is not x86-64 Linux, or the check fails: CI must not skip the emulated run silently.
# Usage: bash scripts/emulated_cpu.sh   (after scripts/setup.sh; idempotent). docs/run.md says more.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "emulated_cpu: $*" >&2; exit 1; }
[ -x .venv/bin/python ] || fail ".venv/bin/python missing: run scripts/setup.sh first"
[ "$(uname -s)/$(uname -m)" = "Linux/x86_64" ] || fail "needs an x86-64 Linux host (qemu user mode), not $(uname -s)/$(uname -m)"
QEMU=$(command -v qemu-x86_64) || fail "qemu-x86_64 not found: install Debian/Ubuntu's qemu-user (apt-get install -y qemu-user)"
ver=$("$QEMU" --version | sed -n 's/.*version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -1)
read -r major minor <<<"${ver:-0 0}"
if [ "$major" -lt 7 ] || { [ "$major" -eq 7 ] && [ "$minor" -lt 2 ]; }; then
  fail "$QEMU is version ${major}.${minor}; 7.2 or later is needed (TCG emulates AVX2 from 7.2 on)"
fi

# EPYC-Rome less the features TCG cannot emulate (each would print "TCG doesn't support requested
# feature" at every process start); none of them changes what the runtimes' kernels compute
CPU="EPYC-Rome,rdseed=off,sha-ni=off,rdpid=off,fxsr-opt=off,misalignsse=off,3dnowprefetch=off,osvw=off"
CPU="$CPU,topoext=off,perfctr-core=off,clzero=off,xsaveerptr=off,wbnoinvd=off,ibpb=off,amd-stibp=off"
CPU="$CPU,nrip-save=off,xsavec=off,xsaves=off"
# qemu-user does not follow execve: a child started as `python` would run natively. The wrapper passes
# its own absolute path as argv[0] (-0), so Python takes it for sys.executable (and finds the venv by
# it), and every child started with sys.executable comes back through the wrapper, emulated too.
NAME=${EMU_NAME:-python-emu}  # another name only to try the script beside an existing wrapper
EMU=".venv/bin/$NAME"
cat > "$EMU" <<EOF
#!/usr/bin/env bash
# made by scripts/emulated_cpu.sh: the venv's python under an emulated AVX2-only EPYC-Rome (qemu-user)
self="\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)/\$(basename "\${BASH_SOURCE[0]}")"
exec "$QEMU" -cpu "$CPU" -0 "\$self" "\$(dirname "\$self")/python" "\$@"
EOF
chmod +x "$EMU"

# the check: AVX2 without AVX-512 here and in a child started with sys.executable (a backend worker's way)
probe="$(mktemp -d)/probe.py"
cat > "$probe" <<'PY'
import json, subprocess, sys
try:
    from numpy._core._multiarray_umath import __cpu_features__ as f
except ImportError:  # numpy < 2
    from numpy.core._multiarray_umath import __cpu_features__ as f
me = {"AVX2": bool(f["AVX2"]), "AVX512F": bool(f["AVX512F"]), "executable": sys.executable}
if sys.argv[1:] == ["child"]:
    print(json.dumps(me))
    sys.exit(0)
out = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True, check=True).stdout
bad = {who: p for who, p in (("parent", me), ("child", json.loads(out)))
       if not p["AVX2"] or p["AVX512F"] or not p["executable"].endswith(sys.argv[1])}
if bad:
    sys.exit(f"emulated_cpu: not on the emulated AVX2-only CPU: {bad}")
print(f"emulated_cpu: {sys.executable} ready (EPYC-Rome: AVX2, no AVX-512; the process and its child checked)")
PY
"$EMU" "$probe" "$NAME" || fail "$EMU failed its check (qemu's or the probe's message above)"
rm -rf "$(dirname "$probe")"
