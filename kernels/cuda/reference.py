"""numpy references of the CUDA kernels' own roundings, for tests and probes.

Why here: the tensor-core products round x to float16 in a specific way, and both the
tests and the device probes compare against x rounded exactly so; one definition keeps
them in step with ``quant.cuh``.
"""

from __future__ import annotations

import numpy as np


def tc_round(x: np.ndarray) -> np.ndarray:
    """x as the tensor-core kernels round it (float64): each (row, 64-unit) scaled by the
    power of two that puts its largest |x| in [2^14, 2^15), rounded to f16, scaled back."""
    xs = np.asarray(x, dtype=np.float32)
    grp = xs.reshape(xs.shape[0], -1, 64)
    mx = np.abs(grp).max(axis=2, keepdims=True)
    e = np.maximum((mx.view(np.int32) >> 23) & 0xFF, 15).astype(np.int64)
    p = np.ldexp(1.0, 141 - e)
    return ((grp * p).astype(np.float32).astype(np.float16).astype(np.float64) / p).reshape(xs.shape)
