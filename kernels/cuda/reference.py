"""numpy references of the CUDA kernels' own roundings, for tests and probes.

Why here: the tensor-core products round x to float16 in a specific way, and both the
tests and the device probes compare against x rounded exactly so; one definition keeps
them in step with ``quant.cuh``. Their integer form (``tensor_int8``) quantizes x to int8
with the GPU's approximate reciprocal, which numpy cannot repeat bit for bit: its
reference is a bound (``int8_error_bound``).
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


def int8_error_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The most the integer form's quantization of x can move W·x (float64, rows x cols):
    each (row, 32-group) of x becomes codes of step xd = amax / 127, so an element moves by
    at most about xd / 2 (0.51 xd: the reciprocal's error), and a product by Σ |w| xd / 2."""
    xs = np.abs(np.asarray(x, dtype=np.float64))
    grp = xs.reshape(xs.shape[0], -1, 32)
    step = np.broadcast_to(grp.max(axis=2, keepdims=True) / 127.0, grp.shape).reshape(xs.shape)
    return 0.51 * step @ np.abs(np.asarray(w, dtype=np.float64)).T
