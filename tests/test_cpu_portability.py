"""What the CPU decides, recorded and judged the same on every x86-64 CPU (issue 15).

Both sides are exercised on any machine: natively (whatever this CPU has) and, where ``qemu-x86_64``
is installed (``.ci/run`` installs Debian's ``qemu-user``), in a process emulating an AMD EPYC-Rome
(AVX2 and F16C; no AVX-512, VNNI or bf16), where OpenVINO and ONNX Runtime pick their kernels by
cpuid as on such a machine (tests/emulated_cpu.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anpred.machine import RELEVANT_FLAGS, cpu_flags, int16_saturation_possible, kernel_isa, machine_info
from anpred.judge import BackendInfo

TESTS = Path(__file__).parent
AVX2_ONLY = ["sse4_2", "avx", "avx2", "fma", "f16c"]


@pytest.mark.parametrize("flags, u8s8, bf16, fp16", [
    (AVX2_ONLY, "avx2", "none", "storage"),
    (AVX2_ONLY + ["avx_vnni"], "avx-vnni", "none", "storage"),
    (AVX2_ONLY + ["avx512f", "avx512bw"], "avx512-core", "none", "storage"),
    (AVX2_ONLY + ["avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"], "avx512-vnni", "native", "storage"),
    (AVX2_ONLY + ["avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16",
                  "avx512_fp16"], "amx", "native", "native"),
    (["sse4_2"], "sse", "none", "none"),
])
def test_kernel_isa_from_flags(flags, u8s8, bf16, fp16):
    k = kernel_isa(flags)
    assert k == {"int8_u8s8": u8s8, "bf16": bf16, "fp16": fp16}
    assert int16_saturation_possible(flags) == (u8s8 in ("avx512-core", "avx2", "sse"))


def test_machine_flags_are_what_this_process_can_execute():
    """The recorded flags follow cpuid as executed here (numpy's dispatcher table), not /proc/cpuinfo."""
    feats = np.__dict__.get("_core")._multiarray_umath.__cpu_features__
    flags, source = cpu_flags()
    assert source.startswith("cpuid")
    assert ("avx2" in flags) == feats["AVX2"] and ("avx512f" in flags) == feats["AVX512F"]
    assert ("avx512_vnni" in flags) == feats["AVX512VNNI"] and ("avx512_bf16" in flags) == feats["AVX512BF16"]
    assert set(flags) <= set(RELEVANT_FLAGS)
    mi = machine_info()
    assert mi["cpu_flags"] == flags and mi["kernels"] == kernel_isa(flags)


def test_oracle_judges_the_precision_computed_not_the_one_asked():
    """openvino-bf16 compiled to fp32 is judged with fp32's floor; it still does not vote (a variant)."""
    asked_bf16_got_fp32 = BackendInfo.make("openvino-bf16", "openvino", "fp32", requested="bf16")
    assert (asked_bf16_got_fp32.precision, asked_bf16_got_fp32.requested, asked_bf16_got_fp32.votes) == ("fp32", "bf16", False)
    real_bf16 = BackendInfo.make("openvino-bf16", "openvino", "bf16", requested="bf16")
    assert (real_bf16.precision, real_bf16.requested, real_bf16.votes) == ("bf16", "bf16", False)
    # runs written before the requested precision was recorded: the reduced-precision table decides
    assert BackendInfo.make("ort-fp16", "onnxruntime", "fp16").requested == "fp16"
    fp32 = BackendInfo.make("ort", "onnxruntime", "fp32")
    assert (fp32.precision, fp32.requested, fp32.votes) == ("fp32", "fp32", True)


def _run_emulated(tmp_path, emulate: bool) -> dict:
    cmd = [sys.executable, str(TESTS / "emulated_cpu.py"), str(tmp_path)]
    if emulate:
        cmd = [shutil.which("qemu-x86_64"), "-cpu", "EPYC-Rome"] + cmd
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=TESTS.parent)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_native_cpu_recorded_and_judged(tmp_path):
    """On this machine: what OpenVINO compiled a bf16 hint to and the u8s8 kernel family follow the CPU."""
    got = _run_emulated(tmp_path, emulate=False)
    k = kernel_isa(machine_info()["cpu_flags"])
    want_bf16 = "bf16" if k["bf16"] == "native" else "fp32"
    assert got["ov_hint"] == got["ov_effective"] == got["judged_as"] == want_bf16 and got["requested"] == "bf16"
    assert got["u8s8"] == k["int8_u8s8"] and got["ov_finite"] and not got["votes"]
    assert any(n.startswith("precision: openvino-bf16") for n in got["notes"]) == (want_bf16 != "bf16")
    assert any(n.startswith("kernels: ort-int8") for n in got["notes"]) == int16_saturation_possible(
        machine_info()["cpu_flags"])


@pytest.mark.skipif(shutil.which("qemu-x86_64") is None or sys.platform != "linux",
                    reason="needs qemu-x86_64 (Debian package qemu-user) to emulate a CPU without AVX-512/VNNI/bf16")
def test_emulated_cpu_without_avx512_vnni_bf16(tmp_path):
    """Under an emulated EPYC-Rome: no AVX-512/VNNI/bf16 seen, OpenVINO compiles the bf16 hint to fp32 and
    the run is judged as fp32 with a note saying so; ONNX Runtime's int8 runs its AVX2 u8s8 kernels and
    the report says their int16 intermediates can saturate."""
    got = _run_emulated(tmp_path, emulate=True)
    assert got["cpu_flags"] == AVX2_ONLY, got["cpu_flags"]
    assert got["kernels"] == {"int8_u8s8": "avx2", "bf16": "none", "fp16": "storage"}
    assert got["ov_hint"] == "fp32" and got["ov_effective"] == "fp32" and got["ov_finite"]
    assert (got["judged_as"], got["requested"], got["votes"]) == ("fp32", "bf16", False)
    assert got["u8s8"] == "avx2"
    assert got["notes"][0].startswith("precision: openvino-bf16 was asked for bf16 but computed in fp32 (this CPU has no bf16")
    assert got["notes"][1].startswith("kernels: ort-int8 ran ONNX Runtime's avx2 u8s8 kernels")
