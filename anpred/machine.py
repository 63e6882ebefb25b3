"""Machine identity recorded with every run: CPU model and the instruction-set flags this process
sees (int8 and bf16 results differ by machine), core count, OS, Python; and what those flags mean for
the kernels the runtimes pick (:func:`kernel_isa`).

Flags come from the ``cpuid`` instruction as executed in this process (numpy's dispatcher table,
``numpy._core._multiarray_umath.__cpu_features__``, which also checks that the OS saves the wide
registers), so an emulated or masked CPU (``qemu-x86_64 -cpu EPYC-Rome``, a VM with AVX-512 hidden)
reports what the runtimes in it really see. Flags numpy does not probe (``avx_vnni``: CPUID.(EAX=7,
ECX=1):EAX[4]; ``amx_bf16``/``amx_tile``/``amx_int8``: CPUID.(EAX=7,ECX=0):EDX[22,24,25], usable only
where XCR0[17:18] are set) are read with the ``cpuid`` instruction too, through the ``cpuid`` package
(its ``cpuid_native`` extension). ``/proc/cpuinfo`` is the kernel's view of the *host*: an emulator
(qemu-user) shows the host's file, so it is used only where cpuid cannot be executed (non-x86 machines,
the package missing).
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache

# Flags that change numerics of reduced-precision kernels (x86 names from /proc/cpuinfo).
RELEVANT_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_bf16",
    "amx_int8",
    "amx_tile",
    "avx512_fp16",
)

# /proc/cpuinfo name -> numpy's __cpu_features__ name (cpuid probed in-process)
_NUMPY_NAMES = {
    "sse4_2": "SSE42",
    "avx": "AVX",
    "avx2": "AVX2",
    "fma": "FMA3",
    "f16c": "F16C",
    "avx512f": "AVX512F",
    "avx512bw": "AVX512BW",
    "avx512_vnni": "AVX512VNNI",
    "avx512_bf16": "AVX512BF16",
    "avx512_fp16": "AVX512FP16",
}


def _proc_cpuinfo() -> tuple[str, set[str]]:
    cpu, have = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not cpu:
                    cpu = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return cpu, have


def _cpuid_features() -> dict[str, bool]:
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as feats
    except ImportError:  # numpy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as feats
        except ImportError:
            return {}
    return dict(feats)


def _cpuid_extra(avx2: bool, avx512f: bool) -> dict[str, bool] | None:
    """``avx_vnni`` and the AMX flags from the cpuid instruction executed in this process, or None where
    it cannot be (no ``cpuid`` package, not x86). Bit positions: Intel SDM vol. 2A, CPUID leaf 07H;
    XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): SDM vol. 1, 13.2. AVX-VNNI needs the OS to save YMM
    state, which numpy's AVX2 entry already checks; AMX is used by the runtimes only on AVX-512 CPUs."""
    try:
        import cpuid
    except (ImportError, OSError):
        return None
    try:
        if cpuid.cpuid(0)[0] < 7:
            return {"avx_vnni": False, "amx_bf16": False, "amx_tile": False, "amx_int8": False}
        _, _, _, edx = cpuid.cpuid_count(7, 0)
        eax71 = cpuid.cpuid_count(7, 1)[0]
        amx_os = ((cpuid.xgetbv(0) >> 17) & 3) == 3 if (cpuid.cpuid(1)[2] >> 27) & 1 else False
    except Exception:  # noqa: BLE001 - a native probe that fails leaves /proc/cpuinfo as the source
        return None
    amx = avx512f and amx_os
    return {
        "avx_vnni": avx2 and bool(eax71 >> 4 & 1),
        "amx_bf16": amx and bool(edx >> 22 & 1),
        "amx_tile": amx and bool(edx >> 24 & 1),
        "amx_int8": amx and bool(edx >> 25 & 1),
    }


def cpu_flags() -> tuple[list[str], str]:
    """``(flags, source)``: the :data:`RELEVANT_FLAGS` this process can execute, in that order, and
    where they were read: ``"cpuid"`` (all by the instruction, in this process), ``"cpuid+cpuinfo"``
    (numpy's table by cpuid; ``avx_vnni``/AMX from /proc/cpuinfo, kept only where cpuid shows the ISA
    they build on, because the ``cpuid`` package is missing) or ``"cpuinfo"`` (no cpuid: non-x86).

    Under an emulator (``qemu-x86_64 -cpu EPYC-Rome``) /proc/cpuinfo is the host's, so only the
    ``"cpuid"`` source is exact there."""
    _, have = _proc_cpuinfo()
    feats = _cpuid_features()
    if not feats or not feats.get("SSE2", False) or platform.machine().lower() not in ("x86_64", "amd64"):
        return [f for f in RELEVANT_FLAGS if f in have], "cpuinfo"
    avx2, avx512f = bool(feats.get("AVX2", False)), bool(feats.get("AVX512F", False))
    extra = _cpuid_extra(avx2, avx512f)
    source = "cpuid"
    if extra is None:
        extra = {
            "avx_vnni": "avx_vnni" in have and avx2,
            **{f: f in have and avx512f for f in ("amx_bf16", "amx_tile", "amx_int8")},
        }
        source = "cpuid+cpuinfo"
    flags = [f for f in RELEVANT_FLAGS if (bool(feats.get(_NUMPY_NAMES[f], False)) if f in _NUMPY_NAMES else extra[f])]
    return flags, source


def kernel_isa(flags: list[str] | tuple[str, ...]) -> dict[str, str]:
    """What the CPU flags decide about the kernels the runtimes dispatch to (x86-64).

    Returns ``{"int8_u8s8": ..., "bf16": ..., "fp16": ...}``:

    - ``int8_u8s8``: ONNX Runtime's MLAS u8s8 GEMM/conv kernel family, chosen by cpuid at load
      (``onnxruntime/core/mlas/lib/platform.cpp``): ``amx`` (AMX-INT8), ``avx512-vnni`` / ``avx-vnni``
      (VPDPBUSD(S): exact int32 accumulation), else ``avx512-core`` / ``avx2`` (VPMADDUBSW: pairs of
      u8·s8 products summed in *saturating int16*, the cause of ORT's documented "U8S8 saturation" on
      CPUs without VNNI; ``quantize_static(reduce_range=True)`` is its remedy) or ``sse``.
    - ``bf16``: ``native`` where AVX512_BF16 or AMX-BF16 exists (OpenVINO honours a bf16 precision
      hint only there), else ``none`` (a bf16 hint compiles to fp32).
    - ``fp16``: ``native`` where AVX512_FP16 exists (OpenVINO's f16 inference precision on x86), else
      ``storage`` (F16C conversions only: float16 tensors computed in fp32 or emulated).
    """
    f = set(flags)
    if "amx_int8" in f:
        u8s8 = "amx"
    elif "avx512_vnni" in f:
        u8s8 = "avx512-vnni"
    elif "avx_vnni" in f:
        u8s8 = "avx-vnni"
    elif {"avx512f", "avx512bw"} <= f:
        u8s8 = "avx512-core"
    elif "avx2" in f:
        u8s8 = "avx2"
    else:
        u8s8 = "sse"
    return {
        "int8_u8s8": u8s8,
        "bf16": "native" if {"avx512_bf16", "amx_bf16"} & f else "none",
        "fp16": "native" if "avx512_fp16" in f else ("storage" if "f16c" in f else "none"),
    }


def int16_saturation_possible(flags: list[str] | tuple[str, ...]) -> bool:
    """True where ONNX Runtime's u8s8 int8 kernels sum pairs of products in saturating int16
    (``avx512-core``, ``avx2``, ``sse``; see :func:`kernel_isa`)."""
    return kernel_isa(flags)["int8_u8s8"] in ("avx512-core", "avx2", "sse")


@lru_cache(maxsize=1)
def machine_info() -> dict:
    """The machine as recorded in ``run.json`` (``meta["machine"]``): ``cpu`` (model name),
    ``cpu_flags`` (:func:`cpu_flags`), ``cpu_flags_source``, ``kernels`` (:func:`kernel_isa`),
    ``cores``, ``machine``, ``os``, ``python``, ``hostname``."""
    cpu, _ = _proc_cpuinfo()
    flags, source = cpu_flags()
    return {
        "cpu": cpu or platform.processor() or "",
        "cpu_flags": flags,
        "cpu_flags_source": source,
        "kernels": kernel_isa(flags),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }
