"""Machine identity recorded with every run: CPU model and instruction-set flags (int8 and bf16
results differ by machine), core count, OS, Python."""

from __future__ import annotations

import os
import platform
from functools import lru_cache

# Flags that change numerics of reduced-precision kernels (x86 names from /proc/cpuinfo).
RELEVANT_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
                  "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile", "avx512_fp16")


@lru_cache(maxsize=1)
def machine_info() -> dict:
    cpu, flags = platform.processor() or "", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not cpu:
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    flags = [f for f in RELEVANT_FLAGS if f in have]
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_flags": flags,
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }
