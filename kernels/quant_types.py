"""The quant types echoline computes with: one entry per type, read by every backend.

Why one table: the GGUF reader's list of supported types, the CUDA kernel names and
constants, the CUDA factored and tensor-core variants, the CPU relayout's representation
and the MLX affine form used to be separate tables of the same thirteen types, and a new
type had to be added to each by hand. Now a new type is one ``QuantType`` entry here plus
its kernels (the per-type code in ``cuda/quant.cuh``, ``cpu/relayout.py`` and, where it
applies, ``mlx/affine.py``; the bit-level block readers in ``gguf_blocks.py``).

Block sizes and bytes are not restated: they are gguf's own (``GGML_QUANT_SIZES``), so the
layouts stay the upstream ones. Nothing here knows about models.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class QuantType:
    """One quant type and which kernels of each backend read it."""

    qtype: Q
    #: Kernel-name stem ("q4_k"): CUDA kernels are named after it, and quant.cuh's constant
    #: is ``QT_`` + its upper case.
    kernel: str
    #: CPU (``cpu/relayout.py``): inputs per scale block of the relaid weights, whether each
    #: block also has an offset (a min), and the weights' dtype (int8 codes, or float32 for
    #: the float types, which have no scales).
    cpu_block: int
    cpu_offset: bool
    cpu_weights: str
    #: CUDA: factored product kernels (quant.cuh codes8, kernel suffix ``_f``).
    cuda_factored: bool = False
    #: CUDA: tensor-core product kernels (quant.cuh tc_frag; ``mt_``/``mtw_``/``mts_`` kernels).
    cuda_tensor: bool = False
    #: MLX: bits of the affine code the type is rewritten to exactly (None: not rewritable).
    mlx_affine_bits: int | None = None

    @property
    def name(self) -> str:
        """gguf's name of the type ("Q4_K")."""
        return self.qtype.name

    @property
    def block_elems(self) -> int:
        """Weights per quant block (gguf's ``GGML_QUANT_SIZES``)."""
        return gguf.GGML_QUANT_SIZES[self.qtype][0]

    @property
    def block_bytes(self) -> int:
        """Bytes per quant block (gguf's ``GGML_QUANT_SIZES``)."""
        return gguf.GGML_QUANT_SIZES[self.qtype][1]

    @property
    def cuda_constant(self) -> str:
        """The ``QT_*`` constant of ``cuda/quant.cuh``."""
        return "QT_" + self.kernel.upper()

    def dequantize(self, raw: np.ndarray) -> np.ndarray:
        """Float32 values of ``raw`` blocks (the readable reference every kernel matches:
        gguf's own dequantization; the float types are only widened)."""
        if self.qtype in (Q.F32, Q.F16):
            return np.asarray(raw, dtype=np.float32)
        return np.asarray(gguf.quants.dequantize(np.asarray(raw), self.qtype), dtype=np.float32)


_F, _I = "float32", "int8"

#: Every supported type, in the order the CUDA tables list them.
QUANT_TYPES: tuple[QuantType, ...] = (
    QuantType(Q.F32, "f32", 32, False, _F),
    QuantType(Q.F16, "f16", 32, False, _F),
    QuantType(Q.BF16, "bf16", 32, False, _F),
    QuantType(Q.Q4_0, "q4_0", 32, False, _I, cuda_tensor=True, mlx_affine_bits=4),
    QuantType(Q.Q4_1, "q4_1", 32, True, _I, cuda_tensor=True, mlx_affine_bits=4),
    QuantType(Q.Q5_0, "q5_0", 32, False, _I, cuda_tensor=True, mlx_affine_bits=5),
    QuantType(Q.Q5_1, "q5_1", 32, True, _I, cuda_tensor=True, mlx_affine_bits=5),
    QuantType(Q.Q8_0, "q8_0", 32, False, _I, cuda_tensor=True, mlx_affine_bits=8),
    QuantType(Q.Q4_K, "q4_k", 32, True, _I, cuda_factored=True, cuda_tensor=True, mlx_affine_bits=4),
    QuantType(Q.Q5_K, "q5_k", 32, True, _I, cuda_tensor=True, mlx_affine_bits=5),
    QuantType(Q.Q6_K, "q6_k", 16, False, _I, cuda_factored=True, cuda_tensor=True),
    # non-linear 4-bit levels (int8 values of a fixed table) times a block scale
    QuantType(Q.IQ4_NL, "iq4_nl", 32, False, _I, cuda_tensor=True),
    QuantType(Q.IQ4_XS, "iq4_xs", 32, False, _I, cuda_tensor=True),
)

#: gguf quant type → its entry.
BY_QTYPE: dict[Q, QuantType] = {t.qtype: t for t in QUANT_TYPES}
#: Kernel-name stem → its entry.
BY_KERNEL: dict[str, QuantType] = {t.kernel: t for t in QUANT_TYPES}
#: The quant types echoline can compute with.
SUPPORTED_QTYPES: frozenset[Q] = frozenset(BY_QTYPE)
