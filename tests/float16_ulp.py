"""One float16 ULP of a tensor, the unit of the fp16 members' tolerances (tests/test_populations.py,
tests/test_fp16_conversion.py)."""

from __future__ import annotations

import numpy as np


def fp16_ulp(x: np.ndarray) -> float:
    """One float16 ULP at the largest |x| (2**(e - 10) for 2**e <= max|x| < 2**(e+1); normal range)."""
    m = float(np.abs(x).max())
    return 2.0 ** (np.floor(np.log2(m)) - 10) if m > 0 else 2.0**-24
