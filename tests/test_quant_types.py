"""The quant-type registry (``kernels/quant_types.py``) against what each backend implements.

The registry is the one list of types; these checks catch an entry without its kernels
(no ``QT_*`` constant in quant.cuh, no CPU relayout) or kernels that disagree with the
reference dequantization. No GPU needed: the CUDA side is checked in its sources.
"""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest
from echoline.engine.gguf_file import SUPPORTED_QTYPES
from echoline.kernels import cuda
from echoline.kernels.cpu.relayout import KINDS, dequantize_relayout
from echoline.kernels.mlx.affine import AFFINE_BITS
from echoline.kernels.quant_types import BY_KERNEL, QUANT_TYPES, QuantType

IDS = [t.kernel for t in QUANT_TYPES]


def test_every_table_reads_the_registry() -> None:
    assert len(BY_KERNEL) == len(QUANT_TYPES)  # each type named once
    assert set(SUPPORTED_QTYPES) == {t.qtype for t in QUANT_TYPES} == set(KINDS)
    assert cuda.QUANT_TYPES == {t.kernel: t.cuda_constant for t in QUANT_TYPES}
    assert cuda.FACTORED <= cuda.TENSOR <= set(cuda.QUANT_TYPES)
    assert set(AFFINE_BITS) <= set(SUPPORTED_QTYPES)


def test_cuda_constants_are_ggml_type_numbers() -> None:
    """quant.cuh's ``QT_*`` constants are ggml's type numbers, one per registry entry."""
    header = (cuda.HERE / "quant.cuh").read_text()
    defined = {m[1]: int(m[2]) for m in re.finditer(r"#define (QT_\w+) (\d+)", header)}
    for t in QUANT_TYPES:
        assert defined.get(t.cuda_constant) == int(t.qtype), t.name


@pytest.mark.parametrize("entry", QUANT_TYPES, ids=IDS)
def test_cpu_relayout_matches_the_reference(entry: QuantType) -> None:
    """Two rows of random blocks: the CPU relayout's values equal gguf's dequantization."""
    rng = np.random.default_rng(int(entry.qtype))
    cols = 2 * max(entry.block_elems, 256)
    row_bytes = cols // entry.block_elems * entry.block_bytes
    raw = rng.integers(0, 256, size=(2, row_bytes), dtype=np.uint8)
    if entry.qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        dtype = np.float32 if entry.qtype == gguf.GGMLQuantizationType.F32 else np.float16
        raw = rng.standard_normal((2, cols)).astype(dtype)
    else:
        # f16 scales from random bytes can be inf or NaN: keep every byte's top bit clear
        # in the scale positions by clearing it everywhere (values stay random)
        raw &= 0x3F
    want = entry.dequantize(raw).reshape(2, cols)
    got = dequantize_relayout(entry.qtype, raw, cols)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)
