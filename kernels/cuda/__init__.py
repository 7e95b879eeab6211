"""CUDA C sources for the CuPy backend, compiled with NVRTC on first use.

Only ``load_module`` imports CuPy, so importing this package costs nothing on a
machine without a GPU. The quant-independent kernels (norms, RoPE, attention,
argmax) form the common module; each quant type's products and embedding lookup
form their own module, compiled only when a model uses that type (a model has
two or three types: compiling all thirteen would cost every fresh process a minute).
CuPy caches each compiled binary on disk, keyed by source and options.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from echoline.kernels import quant_types as registry

HERE = Path(__file__).resolve().parent

#: NVRTC options. --fmad=false: the kernels write every fused multiply-add out,
#: so no instantiation can contract differently and break batch invariance.
OPTIONS = ("--std=c++17", "--fmad=false")

#: kernel-name stem -> the QT_* constant of quant.cuh (from ``kernels.quant_types``)
QUANT_TYPES = {t.kernel: t.cuda_constant for t in registry.QUANT_TYPES}

#: types with factored product kernels (quant.cuh codes8, kernel suffix _f)
FACTORED = frozenset(t.kernel for t in registry.QUANT_TYPES if t.cuda_factored)

#: types with tensor-core product kernels (quant.cuh tc_frag, kernels mt_<q>_n<NT>_m<MT>, and
#: mtw_<q>_n<NT>_s<ST> for very wide weights: tiles staged in shared memory, mts_<q>_n<NT>_w<KW>
#: for long rows: K split over blocks)
TENSOR = frozenset(t.kernel for t in registry.QUANT_TYPES if t.cuda_tensor)


def kernel_source(qtype: str | None = None) -> str:
    """kernels.cu with quant.cuh inlined; ``qtype`` None → the common kernels, "a+b" →
    the two-segment products of that pair, else that type's product and embedding
    kernels (NVRTC then needs no include path). Suffixes "@uN" and "@bN" compile the
    tensor-core products with N units in flight per warp and N resident 4-warp blocks per SM
    asked of the register allocator; "@aN" (alone: the common module) the attention with N
    resident blocks per SM; "@p1" every kernel releasing its programmatic dependents at its
    start (speed choices: the same bits); "@i1" the tensor-core products in their integer form
    (other bits: kernels.cu MT_INT8), with the few-row CUDA-core products that give the same
    bits (kernels.cu mtv kernels) and the many-row products staged in shared memory (mtb
    kernels: the same bits again); "@t8" the tensor-core products also with eight 8-row
    tiles per pass (kernels.cu MT_ROW_TILES8: the same bits); "@rN" N resident 4-warp blocks
    per SM asked for the products of 4 or 8 eight-row tiles per pass (MT_MINB_ROWS); "@w1"
    (with "@i1") the many-row products of 64 weight rows a block instead of 32 (mtbw kernels:
    the same bits); "@s1" (with "@i1") the signed-byte types (Q8_0, IQ4_NL, IQ4_XS) multiplying their
    codes as s8, without the offset's correction (MT_SIGNED: the same bits)."""
    prefix = ""
    int8 = False
    if qtype is not None and "@" in qtype:  # "q4_k@u2@b5": MT_UNITS 2, MT_MINB 5; "@a8"
        qtype, *opts = qtype.split("@")
        for opt in opts:
            macro = {
                "u": "MT_UNITS", "b": "MT_MINB", "a": "ATTN_MINB", "p": "PDL_EARLY", "i": "MT_INT8",
                "t": "MT_ROW_TILES8", "r": "MT_MINB_ROWS", "w": "MTB_WIDE",
                "s": "MT_SIGNED",
            }[opt[0]]
            prefix += f"#define {macro} {int(opt[1:])}\n"
            int8 = int8 or (opt[0] == "i" and int(opt[1:]) != 0)
        qtype = qtype or None  # "@a8": the common kernels
    src = prefix + (HERE / "kernels.cu").read_text()
    header = (HERE / "quant.cuh").read_text()
    src = src.replace('#include "quant.cuh"', header)
    if qtype is None:
        return "#define ECHOLINE_COMMON 1\n" + src
    if "+" in qtype:  # a pair "a+b": one launch for a two-type fused weight (mm2_a_b_*)
        a, b = qtype.split("+")
        qa, qb = QUANT_TYPES[a], QUANT_TYPES[b]
        tensor = f"MT2_ALL({a}, {qa}, {b}, {qb})\n" if a in TENSOR and b in TENSOR else ""
        if tensor and int8:  # the few-row CUDA-core products of the integer form
            tensor += f"MTV2_ALL({a}, {qa}, {b}, {qb})\n"
        return (
            src
            + f"\nMM2_ALL_R({a}, {qa}, {b}, {qb}, false, )\nMM2_ALL_R({a}, {qa}, {b}, {qb}, true, _f)\n"
            + tensor
        )
    qt = QUANT_TYPES[qtype]
    extra = f"MM_ALL_RF({qtype}, {qt})\n" if qtype in FACTORED else ""
    extra += f"MT_ALL({qtype}, {qt})\nMTW_ALL({qtype}, {qt})\nMTS_ALL({qtype}, {qt})\n" if qtype in TENSOR else ""
    extra += f"MTV_ALL({qtype}, {qt})\nMTB_ALL({qtype}, {qt})\n" if qtype in TENSOR and int8 else ""
    return src + f"\nMM_ALL_R({qtype}, {qt})\n{extra}EMBED_KERNEL({qtype}, {qt})\n"


@cache
def load_module(qtype: str | None = None) -> Any:
    """The compiled ``cupy.RawModule`` for ``qtype`` (None: common kernels), cached."""
    import cupy

    module = cupy.RawModule(code=kernel_source(qtype), options=OPTIONS)
    module.compile()
    return module
