"""What the CPU decides, recorded and judged the same on every x86-64 CPU (issue 15).

Both sides are exercised on any machine: natively (whatever this CPU has) and, where ``qemu-x86_64``
is installed (``.ci/run`` installs Debian's ``qemu-user``), in a process emulating an AMD EPYC-Rome
(AVX2 and F16C; no AVX-512, VNNI or bf16), where OpenVINO and ONNX Runtime pick their kernels by
cpuid as on such a machine (tests/emulated_cpu.py)."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anpred.machine import RELEVANT_FLAGS, cpu_flags, int16_saturation_possible, kernel_isa, machine_info
from anpred.judge import BackendInfo

from isa_reasons import EMULATES_ITSELF

TESTS = Path(__file__).parent
AVX2_ONLY = ["sse4_2", "avx", "avx2", "fma", "f16c"]
# tests/emulated_cpu.py's saturation probe on kernels that sum u8*s8 pairs in saturating int16: 32 pairs
# of 255*127*2 clipped to 32767, times the scales 1/255 and 1/127, requantized on the output's uint8
# grid (calibrated range 0..64: step 64/255) -> 129 steps = 32.376
SATURATED = round(32 * 32767 / (255 * 127) / (64 / 255)) * 64 / 255


@pytest.mark.kernels
@pytest.mark.parametrize(
    "flags, u8s8, bf16, fp16",
    [
        (AVX2_ONLY, "avx2", "none", "storage"),
        (AVX2_ONLY + ["avx_vnni"], "avx-vnni", "none", "storage"),
        (AVX2_ONLY + ["avx512f", "avx512bw"], "avx512-core", "none", "storage"),
        (AVX2_ONLY + ["avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"], "avx512-vnni", "native", "storage"),
        (
            AVX2_ONLY
            + ["avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "avx512_fp16"],
            "amx",
            "native",
            "native",
        ),
        (["sse4_2"], "sse", "none", "none"),
    ],
)
def test_kernel_isa_from_flags(flags, u8s8, bf16, fp16):
    k = kernel_isa(flags)
    assert k == {"int8_u8s8": u8s8, "bf16": bf16, "fp16": fp16}
    assert int16_saturation_possible(flags) == (u8s8 in ("avx512-core", "avx2", "sse"))


@pytest.mark.kernels
def test_machine_flags_are_what_this_process_can_execute():
    """The recorded flags follow cpuid as executed here (numpy's dispatcher table), not /proc/cpuinfo."""
    feats = np.__dict__.get("_core")._multiarray_umath.__cpu_features__
    flags, source = cpu_flags()
    assert source == "cpuid"
    # avx_vnni by the instruction too (CPUID.(EAX=7,ECX=1):EAX[4]), never from the host's /proc/cpuinfo,
    # which an emulator passes through (the CI machine's AVX-VNNI showed up under qemu's EPYC-Rome)
    import cpuid

    assert ("avx_vnni" in flags) == (feats["AVX2"] and bool(cpuid.cpuid_count(7, 1)[0] >> 4 & 1))
    assert ("avx2" in flags) == feats["AVX2"] and ("avx512f" in flags) == feats["AVX512F"]
    assert ("avx512_vnni" in flags) == feats["AVX512VNNI"] and ("avx512_bf16" in flags) == feats["AVX512BF16"]
    assert set(flags) <= set(RELEVANT_FLAGS)
    mi = machine_info()
    assert mi["cpu_flags"] == flags and mi["kernels"] == kernel_isa(flags)


@pytest.mark.kernels
def test_oracle_judges_the_precision_computed_not_the_one_asked():
    """openvino-bf16 compiled to fp32 is judged with fp32's floor; it still does not vote (a variant)."""
    asked_bf16_got_fp32 = BackendInfo.make("openvino-bf16", "openvino", "fp32", requested="bf16")
    assert (asked_bf16_got_fp32.precision, asked_bf16_got_fp32.requested, asked_bf16_got_fp32.votes) == (
        "fp32",
        "bf16",
        False,
    )
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


@pytest.mark.kernels
def test_native_cpu_recorded_and_judged(tmp_path):
    """On this machine: what OpenVINO compiled a bf16 hint to and the u8s8 kernel family follow the CPU."""
    got = _run_emulated(tmp_path, emulate=False)
    k = kernel_isa(machine_info()["cpu_flags"])
    want_bf16 = "bf16" if k["bf16"] == "native" else "fp32"
    assert got["ov_hint"] == got["ov_effective"] == got["judged_as"] == want_bf16 and got["requested"] == "bf16"
    assert got["u8s8"] == k["int8_u8s8"] and got["ov_finite"] and not got["votes"]
    assert any(n.startswith("precision: openvino-bf16") for n in got["notes"]) == (want_bf16 != "bf16")
    assert any(n.startswith("kernels: ort-int8") for n in got["notes"]) == int16_saturation_possible(
        machine_info()["cpu_flags"]
    )
    # the kernel family's behaviour, not only its name: int16 pairs saturate exactly where it says so
    sat = got["saturation"]
    assert sat["fakequant"] == pytest.approx(64.0)
    want = SATURATED if int16_saturation_possible(machine_info()["cpu_flags"]) else 64.0
    assert sat["int8"] == pytest.approx(want, rel=1e-6), sat


def _qemu_version() -> tuple[int, ...]:
    exe = shutil.which("qemu-x86_64")
    if exe is None:
        return ()
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    try:
        return tuple(int(x) for x in out.split("version", 1)[1].split()[0].split(".")[:2])
    except (IndexError, ValueError):
        return ()


@pytest.mark.slow  # ~17 s; .ci/run's emulated run (-m kernels) covers this CPU on every submission
@pytest.mark.isa_independent(EMULATES_ITSELF)
@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or sys.platform != "linux",
    reason="emulates an x86-64 CPU in user mode: needs an x86-64 Linux host",
)
@pytest.mark.skipif(
    _qemu_version() < (7, 2),
    reason="needs qemu-x86_64 >= 7.2 (Debian package qemu-user; TCG emulates AVX2 from 7.2 on) "
    "to emulate a CPU without AVX-512/VNNI/bf16",
)
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
    assert got["notes"][0].startswith(
        "precision: openvino-bf16 was asked for bf16 but computed in fp32 (this CPU has no bf16"
    )
    assert got["notes"][1].startswith("kernels: ort-int8 ran ONNX Runtime's avx2 u8s8 kernels")
    # and they do saturate: 32 pairs of 255*127*2 clipped to 32767 (tests/emulated_cpu.py)
    assert got["saturation"]["int8"] == pytest.approx(SATURATED, rel=1e-6)
    assert got["saturation"]["fakequant"] == pytest.approx(64.0)


@pytest.mark.kernels
def test_backend_computing_another_precision_is_judged_and_reported_as_computed(tmp_path):
    """The whole path on any CPU: a run record in which ``openvino-bf16`` was asked for bf16 and computed
    in fp32 (what OpenVINO does on a CPU without bf16 instructions: here OpenVINO's f32 plugin itself
    computes it, the record says bf16 was asked) -> ``check_run`` judges it as fp32 (fp32 floor, consistent
    at fp32 noise, no vote) -> the JSON report, the terminal table (``fp32*``) and the HTML report say so."""
    from onnx import TensorProto, helper, numpy_helper

    from anpred.defaults import OracleConfig
    from anpred.instrument import instrument_model
    from anpred.judge import check_run
    from anpred.onnx_io import save_model
    from anpred.report.html import write_html
    from anpred.report.text import format_text
    from anpred.run import BackendSpec, RunStore, run_model

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i, (cin, cout) in enumerate([(3, 8), (8, 8), (8, 4)]):
        w = (rng.normal(size=(cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        x = f"r{i}"
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 4, 16, 16])],
        inits,
    )
    anchored, man = instrument_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), stages=3)
    path = tmp_path / "m.onnx"
    save_model(anchored, path)
    store = run_model(
        path,
        ["ort", "onnx-reference", "openvino", BackendSpec("openvino", label="openvino-bf16")],
        "random:uniform:seed=1:n=2",
        tmp_path / "run",
        progress=False,
    )
    st = store.statuses()["openvino-bf16"]
    assert st.status == "ok" and (st.precision, st.precision_requested) == ("fp32", "fp32")
    st.precision_requested = "bf16"  # the record of a CPU without bf16: bf16 asked, fp32 compiled
    RunStore.open(tmp_path / "run").set_status(st)
    rep = check_run(tmp_path / "run")
    v = rep.verdicts["openvino-bf16"]
    assert (v.precision, v.precision_requested, v.votes, v.status) == ("fp32", "bf16", False, "consistent")
    assert rep.backends["openvino-bf16"]["precision_requested"] == "bf16"
    for c in rep.cells:
        if c.backend == "openvino-bf16":
            stage = next(a.stage for a in man.anchors if a.name == c.anchor)
            assert c.floor == pytest.approx(OracleConfig().floor_at("fp32", stage))  # not bf16's 0.3
            assert c.primary < c.floor
    # the reason is given where the run's machine record shows a CPU without bf16 instructions (the
    # note's cause then), and left out where the CPU has them (fp32 was computed for another reason)
    machine = RunStore.open(tmp_path / "run").meta["machine"]
    why = (
        " (this CPU has no bf16 instructions: neither avx512_bf16 nor amx_bf16)"
        if (machine["kernels"]["bf16"] == "none")
        else ""
    )
    assert machine["kernels"] == kernel_isa(machine["cpu_flags"])
    assert [n for n in rep.notes if n.startswith("precision: ")] == [
        f"precision: openvino-bf16 was asked for bf16 but computed in fp32{why}; judged as fp32"
    ]
    # the reference backends were asked for what they computed: no note, no asterisk
    assert rep.verdicts["openvino"].precision_requested == "" and rep.verdicts["openvino"].votes
    text = format_text(rep)
    row = next(ln for ln in text.splitlines() if ln.startswith("openvino-bf16 "))
    assert "fp32*" in row
    assert "fp32*: openvino-bf16 was asked for bf16 but computed in fp32, and is judged as fp32" in text
    write_html(rep, tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert "fp32 (bf16 asked)" in html and "<b>precision</b>" in html
    # JSON round trip keeps both
    again = type(rep).from_dict(json.loads(json.dumps(rep.to_dict())))
    assert again.verdicts["openvino-bf16"].precision_requested == "bf16"
