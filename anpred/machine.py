"""Machine identity recorded with every run: CPU model and the instruction-set flags this process
sees (int8 and bf16 results differ by machine), core count, OS, Python; and what those flags mean for
the kernels the runtimes pick (:func:`kernel_isa`).

Flags come from the ``cpuid`` instruction as executed in this process (numpy's dispatcher table,
``numpy._core._multiarray_umath.__cpu_features__``, which also checks that the OS saves the wide
registers), so an emulated or masked CPU (``qemu-x86_64 -cpu EPYC-Rome``, a VM with AVX-512 hidden)
reports what the runtimes in it really see. ``/proc/cpuinfo`` is the kernel's view of the host and is
used only for flags numpy does not probe (``avx_vnni``, ``amx_*``), and as the whole source where numpy
has no table (non-x86 machines).
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache

# Flags that change numerics of reduced-precision kernels (x86 names from /proc/cpuinfo).
RELEVANT_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
                  "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile", "avx512_fp16")

# /proc/cpuinfo name -> numpy's __cpu_features__ name (cpuid probed in-process)
_NUMPY_NAMES = {"sse4_2": "SSE42", "avx": "AVX", "avx2": "AVX2", "fma": "FMA3", "f16c": "F16C",
                "avx512f": "AVX512F", "avx512bw": "AVX512BW", "avx512_vnni": "AVX512VNNI",
                "avx512_bf16": "AVX512BF16", "avx512_fp16": "AVX512FP16"}


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


def cpu_flags() -> tuple[list[str], str]:
    """``(flags, source)``: the :data:`RELEVANT_FLAGS` this process can execute, in that order, and
    where they were read (``"cpuid"``, ``"cpuid+cpuinfo"`` or ``"cpuinfo"``).

    A flag numpy probes is taken from cpuid alone. ``avx_vnni`` and the AMX flags come from
    /proc/cpuinfo, kept only where cpuid shows the ISA they build on (AVX2, resp. AVX-512F), so an
    emulated CPU without those does not inherit the host's."""
    _, have = _proc_cpuinfo()
    feats = _cpuid_features()
    if not feats or not feats.get("SSE2", False) or platform.machine().lower() not in ("x86_64", "amd64"):
        return [f for f in RELEVANT_FLAGS if f in have], "cpuinfo"
    flags = []
    for f in RELEVANT_FLAGS:
        if f in _NUMPY_NAMES:
            ok = bool(feats.get(_NUMPY_NAMES[f], False))
        elif f == "avx_vnni":
            ok = f in have and bool(feats.get("AVX2", False))
        else:  # amx_*
            ok = f in have and bool(feats.get("AVX512F", False))
        if ok:
            flags.append(f)
    extra = any(f in have for f in RELEVANT_FLAGS if f not in _NUMPY_NAMES)
    return flags, ("cpuid+cpuinfo" if extra else "cpuid")


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
    return {"int8_u8s8": u8s8,
            "bf16": "native" if {"avx512_bf16", "amx_bf16"} & f else "none",
            "fp16": "native" if "avx512_fp16" in f else ("storage" if "f16c" in f else "none")}


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
