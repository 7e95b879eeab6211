"""The CUDA backend's speed choices, in one place (``CupyBackend.tuning``).

Why a dataclass apart from the backend: every field is a speed choice made per weight shape
or per launch, never one that lets a row's bits depend on how many rows share a pass, and
each default was set by a measurement on the H200. Keeping them together, with the figure
that set each one, makes an A/B run a matter of changing one field; keeping them out of
``cupy_backend`` lets this file import (and be tested) without CuPy. The measurements behind
the "round N" notes are in docs/history/cuda-rounds.md.

``CupyBackend`` exposes each field as an attribute of the same name that reads and writes
its ``tuning`` (``backend.tensor_products = False`` still works).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields


@dataclass
class CudaTuning:
    """Launch-shape and kernel-family choices of the CUDA backend (defaults: H200-measured)."""

    #: 4 columns per warp (multi-row CUDA-core products) once a launch has this many blocks per SM
    wide_min_blocks_per_sm: int = 2
    #: ... and at one or two rows once it has this many
    wide_min_blocks_one_row: int = 8
    #: fold the RMSNorm into products up to this many output columns; wider ones (the output
    #: head) take a separate norm launch (a fixed choice per weight: batch-invariant)
    norm_fuse_max_cols: int = 32768
    #: rows at least this long are shared by a block's 4 warps (fixed split-K, summed in warp
    #: order): a 1536 x 8960 down projection otherwise has one long chain per warp
    ksplit_min_k: int = 4096
    #: gated (gate|up) products always block-shared
    ksplit_gated: bool = False
    #: Q4_K / Q6_K CUDA-core products sum codes * x per 8-weight chunk and apply the chunk's
    #: scale (and min) once (kernels.cu mm_body F): a fixed policy, all row counts alike
    factored_products: bool = True
    #: ... for weights of at most this many output columns (Qwen q|k|v, o, down): the head
    #: (124 -> 139 us) and gate|up at 16 rows (87 -> 110 us) measured slower factored
    factored_max_cols: int = 4096
    #: a fused weight of two quant types (Qwen q|k Q4_K + v Q6_K) runs as one launch
    fuse_segment_pairs: bool = True
    #: tensor-core products (kernels.cu mt_body): mma.sync with x rounded to f16 per
    #: (row, 64-unit) after a power-of-two scaling; the same kernels for every row count, one
    #: row included, so decode and verify stay bit-identical. Per weight: all its segments
    #: must be TENSOR types (else the CUDA-core kernels run it)
    tensor_products: bool = True
    #: ... for weights with rows shorter than this (Qwen-1.5B's 8960-long down projection
    #: measured 16.0 vs 12.1 us at one row on the tensor cores) ...
    tensor_max_in: int = 4096
    #: ... and at most this many output columns (Qwen's 151936-column head: 168 vs 124 us)
    tensor_max_cols: int = 65536
    #: ... in the integer form (kernels.cu MT_INT8, module suffix "@i1"): x quantized to int8
    #: per (row, 32-group), each group's dot product one exact integer mma over the stored
    #: code bytes (no f16 decoding). Other bits than the f16 form (coarser x, as llama.cpp's
    #: q8_1), the same batch invariance: the form is fixed per weight, never by row count.
    #: On for every weight (Env ``ECHOLINE_CUDA_INT8=0|1``) ...
    tensor_int8: bool = False
    #: ... else for weights whose rows and columns both reach this (0: none; Env
    #: ``ECHOLINE_CUDA_INT8_MIN_DIM=N``, N up to 4096): the 7B's,
    #: none of Qwen 0.5B's or 1.5B's. H100, 7B-shaped Q4_K_M file, ``bench decode``, one call:
    #: 209.8 tok/s against 180.0 in the f16 form, 16 rows 7.59 against 9.65 ms (2026-12-07)
    tensor_int8_min_dim: int = 3584
    #: x quantized once per product (kernels.cu xprep8) for the integer form's mt_body kernels
    #: from this many rows (0: never, every column tile quantizes x itself; the same bits;
    #: Env ``ECHOLINE_CUDA_INT8_XPREP_MIN_ROWS=N``).
    #: The 7B shape above: 209.8 tok/s with it at every row count, 187.4 without
    tensor_int8_xprep_min_rows: int = 1
    #: ... and up to this many rows on the CUDA cores (kernels.cu mtv kernels: each group's
    #: exact integer dot product by dp4a, then mt_body's float steps in its order: the same
    #: bits as the weight's tensor-core family, so the row count may pick it; 0: never, at
    #: most 4; Env ``ECHOLINE_CUDA_INT8_MV_ROWS=N``). At one row mt_body computes a whole
    #: 8-row tile's mma and float epilogue to keep one row. H100, 7B-shaped Q4_K_M file,
    #: ``bench decode`` (2026-12-07, with the wide code loads): 254.5-255.8 tok/s against
    #: 209.7-209.8 off; before those loads two rows took 4.90-5.09 ms against 4.92-5.06 on
    #: the tile (no gain) and four 7.29 against 5.10-5.22 (a loss): so one row only
    tensor_int8_mv_rows: int = 1
    #: ... and from this many rows on the staged many-row kernels (kernels.cu mtb kernels:
    #: each step's weights and x staged in shared memory once for a block's 32 or 64 rows and
    #: its K slots, each slot's units in the family's order through mt_i8_step, the slots
    #: added in order: the same bits as the weight's tensor-core family, so the row count may
    #: pick it; 0: never; Env ``ECHOLINE_CUDA_INT8_BATCH_MIN_ROWS=N``). H100, 7B-shaped
    #: Q4_K_M file, ``bench decode`` in one call (2026-12-07): a 64-row forward 15.40 ms
    #: against 20.87 (x3.96 one row against x5.26), 32 rows 10.26 against 10.75, one row
    #: unchanged; ``tools.cuda.exact_7b`` all exact with them on
    tensor_int8_batch_min_rows: int = 17
    #: ... with this many weight rows a block: 32, or 64 (kernels.cu mtbw kernels, modules
    #: "@w1": twice the warps, so each staged step of x serves twice the weight rows and x's
    #: share of the staged bytes falls from about two thirds to one half; the same bits). Env
    #: ``ECHOLINE_CUDA_INT8_BATCH_WEIGHT_ROWS=32|64``. 32: measured on an H100 (random Q8_0
    #: 7B-shaped file, with signed codes on, five interleaved rounds), 64 weight rows make a
    #: whole forward of 64 rows 3 % faster (11.70-11.85 ms against 12.11-12.23) but one of 32
    #: rows 8 % slower (8.29-8.38 against 7.65-7.70); taking them from 48 rows only would need
    #: both modules of a type built (126-128 registers; Q6_K spills 16-52 bytes)
    tensor_int8_batch_weight_rows: int = 32
    #: the integer form's signed-byte types (Q8_0, IQ4_NL, IQ4_XS: codes stored as s8, read
    #: in offset form) multiplied as s8 (kernels.cu MT_SIGNED, modules "@s1"): the same exact
    #: integer sums without the offset's correction (one mma in three per group and step, a
    #: multiply-subtract per output; the same bits). Env ``ECHOLINE_CUDA_INT8_SIGNED=0|1``.
    #: On since measured (H100, random Q8_0 7B-shaped file, `bash tools/cuda/int8_run.sh
    #: batchw` and `batchwbench`, five interleaved rounds of bench decode): a whole forward of
    #: 32 rows 7.65-7.70 ms against 8.08-8.23, 64 rows 12.11-12.23 against 12.65-12.86, one
    #: and 16 rows unchanged; its tests (bits equal to the offset form, every launch family)
    #: and ``tools.cuda.exact_7b`` all exact
    tensor_int8_signed_codes: bool = True
    #: 64-weight units a tensor-core product warp loads before its math (kernels.cu MT_UNITS;
    #: 1 or 2): bytes in flight, never bits; 2 made every launch slower (decode x1.025
    #: SmolLM2, x1.045 Qwen).
    #: Env ``ECHOLINE_CUDA_TENSOR_UNITS`` (A/B on real models)
    tensor_units: int = 1
    #: ... two 16-column tiles per warp once a launch has this many blocks per SM
    tensor_wide_min_blocks: int = 4
    #: ... else more warps per block (K split 8 or 16 ways) until this many warps per SM
    tensor_min_warps_per_sm: int = 8
    #: ... or until a warp would get fewer than this many 64-weight units of a row (KW sets
    #: the order of a row's sums, so this is by shape only). 1 gives Qwen 0.5B's q|k|v and o
    #: (896 inputs, 14 units) KW 16 instead of 8: H200, ``bench_device --narrow``, 2026-12-03,
    #: synthetic Qwen 0.5B decode 1.134 -> 1.056 ms (x0.93), 16 rows 1.595 -> 1.588 ms; the
    #: 1.5B (24 units) unchanged. Env ``ECHOLINE_CUDA_TENSOR_MIN_UNITS_PER_WARP=1|2``
    tensor_min_units_per_warp: int = 1
    #: ... and a launch of 9-17 rows runs its 8-row passes in parallel blocks (grid y) while
    #: that keeps it within this many warps per SM (0: never). A row's value does not depend
    #: on the block that computes it, so this is a speed choice per launch. Measured
    #: (H200): SmolLM2's narrow launches gain (k=16 -9 %, k=17 -19 %), Qwen's wider ones lost 3 % split
    tensor_row_split_warps_per_sm: int = 20
    #: ... and only while the split grid fits in one wave of resident blocks (H200, 2026-12-03):
    #: since KW 16 (``tensor_min_units_per_warp``) a narrow weight's block is 16 warps, one
    #: per SM, so Qwen 0.5B's 72-tile q|k|v split in two (144 blocks) ran a second wave on
    #: 12 SMs. The same bits either way. Env ``ECHOLINE_CUDA_TENSOR_ROW_SPLIT_ONE_WAVE=0|1``
    tensor_row_split_one_wave: bool = True
    #: the most 8-row tiles a tensor-core block computes per pass over its weights (NT) in
    #: launches past 32 rows. 8 (modules "@t8", kernels.cu MT_ROW_TILES8) would run a 64-row
    #: verify (or prefill chunk) in one pass instead of two, each weight unit read and unpacked
    #: once; kernels with 16 warps splitting K stay at 4 (their reduction array would pass
    #: 48 KiB), and so do the wide (head) kernels, whose tiles are staged in shared memory. The
    #: same bits either way (rows never share arithmetic). 4 until measured on a device
    #: (``bash tools/cuda/int8_run.sh nt8`` and ``nt8bench``): written and compiled
    #: (nvcc, sm_90) on 2026-12-07 with no device time left. Env
    #: ``ECHOLINE_CUDA_TENSOR_MAX_ROW_TILES=4|8``
    tensor_max_row_tiles: int = 4
    #: very wide weights (the output heads: at least ``tensor_wide_min_cols`` output columns,
    #: one quant type) on the tensor cores through the staged kernels (kernels.cu mtw_body):
    #: one-warp blocks stage whole 16-column tiles (16 consecutive rows of blocks)
    #: into shared memory with 16-byte cp.async copies and run mt_body on them (MT 1, KW 1).
    #: Qwen2.5-0.5B's 151936 x 896 Q8_0 head, 1 / 8 / 16 rows: 60.2 / 80.7 / 119.7 us, against
    #: 55.5 / 170.8 / 347.2 on the CUDA cores and 72.2 / 79.4 / 100.0 with mt_body.
    #: Env ``ECHOLINE_CUDA_TENSOR_WIDE=0|1`` (A/B on real models)
    tensor_wide: bool = True
    #: ... from this many output columns (above ``tensor_max_cols``: the heads of Qwen2.5;
    #: SmolLM2's 49152-column head stays on mt_body: 15.4 / 28.2 us wide vs 18.4 / 25.5 at
    #: 1 / 16 rows, a wash)
    tensor_wide_min_cols: int = 65537
    #: ... tiles staged per warp: 2 = the next tile's copy in flight while one computes (a
    #: speed choice: the same bits). 2 measured slower (76.6 / 159.3 us at 1 / 16 rows on the
    #: Qwen head, persistent grid): the kernel is bound by its per-tile math, and 2 stages
    #: halve the warps that fit per SM. Env ``ECHOLINE_CUDA_TENSOR_WIDE_STAGES=1|2``
    tensor_wide_stages: int = 1
    #: ... a grid of as many blocks as are resident at once, each striding over the tiles
    #: (True), or one block per tile (False; a speed choice: the same bits). One per tile:
    #: 60.2 vs 69.1 us at one row on the Qwen head.
    #: Env ``ECHOLINE_CUDA_TENSOR_WIDE_PERSISTENT=0|1``
    tensor_wide_persistent: bool = False
    #: ... shared memory one block may use (stages x 16 rows of blocks plus the kernel's
    #: reduction array; capped by the device's opt-in limit); wider rows keep the other
    #: kernels. Past 48 KiB the kernel opts in to more. At 48 KiB the Coder-7B's Q6_K head
    #: (2940-byte rows: 47,040 staged bytes + 2,304 of reduction with 2 warps) missed by 192
    #: bytes and ran on the CUDA cores: 1,370 / 5,760 us at 16 / 64 rows (H100), a quarter
    #: of a 64-row verify. It is a shape rule (which family a weight runs on, so its bits),
    #: never a row-count one. Env ``ECHOLINE_CUDA_TENSOR_WIDE_MAX_SMEM_KIB=48..227``
    tensor_wide_max_smem: int = 96 * 1024
    #: ... warps per block splitting each staged tile's 64-weight units (1, 2 or 4; kernels.cu
    #: mtw_body's KW). It sets the order of a row's sums, so it is fixed per weight (this
    #: setting), never by the row count. Why more than one: ncu of the Qwen head (H200, 2026-12-03)
    #: read it bound by each warp's serial math with ~14 one-warp blocks per SM (shared memory
    #: allows no more), so a tile's math can go to more warps at the same shared memory. Two
    #: stages only with one warp. H200 (``tools.cuda.wide_probe``), the Qwen 0.5B head at 1 /
    #: 8 / 16 rows: 1 warp 54.2 / 76.1 / 107.5 us, **2** 52.9 / 56.4 / 71.8, 4 65.9 / 68.3 /
    #: 84.2; the 1.5B's Q6_K head 120.9 / 145.8 / 219.2, 111.2 / 113.7 / 160.5, 113.5 /
    #: 114.8 / 143.8. Env ``ECHOLINE_CUDA_TENSOR_WIDE_WARPS=1|2|4``
    tensor_wide_warps: int = 2
    #: ... and a launch of more than 8 rows splits its rows into up to this many groups of
    #: whole passes, each a block of its own on the same tile (the tile staged again, from
    #: L2): more blocks of shorter math. A speed choice per launch, the same bits. Off: the
    #: second staging costs more than the shorter math saves (Qwen 0.5B head at 16 rows: 123.2
    #: vs 107.5 us with one warp, 100.1 vs 71.8 with two).
    #: Env ``ECHOLINE_CUDA_TENSOR_WIDE_ROW_GROUPS=1|2|4``
    tensor_wide_row_groups: int = 1
    #: weights with rows at least ``tensor_split_min_in`` long (Qwen's 4864- and 8960-input
    #: down projections, past ``tensor_max_in``) on the tensor cores with K split over blocks
    #: (kernels.cu mts kernels): ``tensor_split_warps`` warps per block and as many
    #: blocks per 16-column tile as the chip needs (``_tensor_splits``), the warps' sums added
    #: in one fixed order by the tile's last block (the bits of mt_body with KW = all warps).
    #: No fused norm or gated epilogue. Env ``ECHOLINE_CUDA_TENSOR_SPLIT=0|1``
    tensor_split: bool = True
    #: ... from this many inputs
    tensor_split_min_in: int = 4096
    #: ... warps per block (2 or 4). Env ``ECHOLINE_CUDA_TENSOR_SPLIT_WARPS=2|4``
    tensor_split_warps: int = 4
    #: ... blocks per tile doubled (2, 4, 8, 16) until the launch has this many blocks per SM
    #: or the warps would outnumber the 64-weight units
    tensor_split_blocks_per_sm: int = 2
    #: ... 64-weight units a warp loads before its math (1 or 2; 2 only with 4 warps per block):
    #: bytes in flight, never bits. Env ``ECHOLINE_CUDA_TENSOR_SPLIT_UNITS=1|2``
    tensor_split_units: int = 1
    #: ... the tile's blocks as one thread-block cluster (sm_90+, 4 or 8 blocks of 4 warps)
    #: adding the warps' sums through distributed shared memory (kernels.cu mtc kernels)
    #: instead of scratch planes, a fence and an atomic counter: the same bits. Qwen 0.5B
    #: down (Q4_K / Q6_K): 6.7 / 7.9 us at one row against 7.5 / 8.7, 9.0 / 10.7 at 16 rows
    #: against 11.8 / 12.9; Qwen 0.5B shape decode 940 vs 930 tok/s. 2 units in flight
    #: measured slower (917). Env ``ECHOLINE_CUDA_TENSOR_SPLIT_CLUSTER=0|1``
    tensor_split_cluster: bool = True
    #: 4-warp blocks per SM the tensor-product kernels ask the register allocator for
    #: (kernels.cu MT_MINB, second __launch_bounds__ argument): a speed choice, the same
    #: bits. At 105 registers 4 blocks fit, and Qwen 0.5B's gate|up (608 blocks) ran 1.15
    #: waves (ncu). H200, synthetic shapes, decode tok/s (verify 16 rows, ms), 1 / 5 / 6 / 8:
    #: Qwen 0.5B 857.5 / **930.9** / 925.3 / 905.0 (1.690 / **1.581** / 1.586 / 1.650), Qwen
    #: 1.5B 427.6 / **494.3** / 477.8 / 425.5 (3.166 / **3.054** / 3.240 / 3.616).
    #: Env ``ECHOLINE_CUDA_TENSOR_MIN_BLOCKS=1..8``
    tensor_min_blocks: int = 5
    #: ... the same for the products of 4 or 8 eight-row tiles per pass (launches past 16
    #: rows: long verify rounds, prefill chunks); 0: ``tensor_min_blocks``. Why apart: at 5
    #: (96 registers) ptxas spills the accumulators of the two-tile (MT 2) kernels there
    #: (nvcc 13.0, sm_90, integer form: the 7B's gate|up ``mt_q4_k_n4_m2_w4`` stores 252
    #: bytes and loads 444; 168 registers unbounded, so 3 would fit it; NT 8 needs 204, so 2).
    #: 0 until measured on a device (``bash tools/cuda/int8_run.sh nt8``). A speed choice,
    #: the same bits. Env ``ECHOLINE_CUDA_TENSOR_MIN_BLOCKS_ROWS=1..8``
    tensor_min_blocks_rows: int = 0
    #: x converted to the tensor cores' f16 form once per product (kernels.cu xprep) instead
    #: of once per column tile, for products of at least this many rows on mt_body's kernels
    #: (mt, mt2, mts, mtc); 0: never. The same bits either way (one conversion routine, the
    #: norm's sum of squares in the consumer's warp order), so the row threshold is a speed
    #: choice only. Off: the conversion is not what a 16-row product waits on (Qwen 0.5B
    #: shape, verify 16 rows 1.718 ms without, 1.730 from 9 rows, 1.732 always; always
    #: costs one-row decode 7 %: a launch per product). Env ``ECHOLINE_CUDA_XPREP_MIN_ROWS=N``
    tensor_xprep_min_rows: int = 0
    #: ... and for the wide-weight kernels (mtw: the heads, whose 9,496 tiles each converted
    #: x again): decode 1.198 -> 1.184 ms, 16 rows 1.718 -> 1.690 on the Qwen 0.5B shape.
    #: Env ``ECHOLINE_CUDA_XPREP_WIDE_MIN_ROWS=N``
    tensor_xprep_wide_min_rows: int = 1
    #: (row, head) items of one GQA group per attention block (its 8 warps loop over them):
    #: a speed choice only, each item computes alike in any block (a sweep on the H200)
    attn_items: int = 8
    #: blocks per SM the CUDA-core attention asks the register allocator for (kernels.cu
    #: ATTN_MINB) in launches of at least ``attn_min_blocks_min_rows`` rows: a speed choice,
    #: the same bits (so it may follow the row count). At 39 registers 6 blocks of 256
    #: threads fit and Qwen 0.5B's 16-row launch (952 blocks) ran 1.2 waves. H200, synthetic
    #: shapes, context 1024, ms at 1 / 8 / 16 rows, 1 vs 7 blocks: Qwen 0.5B 1.080 / 1.272 /
    #: 1.647 vs 1.091 / 1.224 / 1.521; Qwen 1.5B 2.020 / 2.313 / 3.226 vs 2.059 / 2.272 /
    #: 3.121. Env ``ECHOLINE_CUDA_ATTN_MIN_BLOCKS=1..8``
    attn_min_blocks: int = 7
    attn_min_blocks_min_rows: int = 2
    #: (row, head) items a warp of the CUDA-core attention takes at once (1, 2 or 4;
    #: kernels.cu attn_partial_d<n>_g<IPW>) in launches of at least
    #: ``attn_items_per_warp_min_rows`` rows: a lane then reads each K and V element from
    #: shared memory once for all of them. A speed choice, the same bits. H200 (2026-12-03),
    #: Qwen 0.5B shape, context 1024, ms at 8 / 16 rows: 1 item 1.203 / 1.595; 2 items (4
    #: blocks) 1.160 / 1.481; 4 items (2 blocks) 1.212 / 1.473 (one row 1.03 in all).
    #: Env ``ECHOLINE_CUDA_ATTN_ITEMS_PER_WARP=1|2|4``
    attn_items_per_warp: int = 2
    attn_items_per_warp_min_rows: int = 2
    #: resident blocks per SM asked of the register allocator for those grouped kernels
    #: (their items' registers: ATTN_MINB 7 would spill). Env ``ECHOLINE_CUDA_ATTN_GROUP_MIN_BLOCKS``
    attn_group_min_blocks: int = 4
    #: keys per attention split: fixed for the backend's life (batch invariance)
    attn_split: int = 32
    #: attention on the tensor cores for every model (kernels.cu attn_tc_body): a GQA
    #: group's (row, head) items are the M dimension of 3xTF32 mma tiles, so a row computes
    #: alike in any tile. Off: for small groups the CUDA-core kernel is quicker at one row
    #: (see the next field, which turns it on by shape). Splits of 32 keys only.
    #: Env ``ECHOLINE_CUDA_TENSOR_ATTENTION=0|1`` (A/B on real models)
    tensor_attention: bool = False
    #: ... and, short of that, for the models whose GQA groups have at least this many
    #: query heads a kv head (0: none): a 16-row verify's items then fill the tiles (Qwen
    #: 0.5B's groups of 7: 112 items, 7 tiles a kv head). By shape only, so the same for
    #: every row count. H200, context 1,024, one layer, µs at 1 / 16 rows (2026-12-03,
    #: ``attn_probe --time``): Qwen 0.5B 6.6 / 10.4 on the tensor cores against 6.3 / 12.2;
    #: SmolLM2 (groups of 3) 6.8 / 10.1 against 6.0 / 10.4, so it stays on the CUDA cores.
    #: Env ``ECHOLINE_CUDA_TENSOR_ATTENTION_MIN_GROUP=0..16``
    tensor_attention_min_group: int = 6
    #: warps of a tensor-core attention block: 8 while a call has at most this many
    #: sixteen-item tiles a kv head (one-row decode: few blocks, each on a shorter path),
    #: else 4 (more blocks resident). The same bits (H200, 2026-12-03).
    #: Env ``ECHOLINE_CUDA_TENSOR_ATTENTION_W8_MAX_TILES=0..8``
    tensor_attention_w8_max_tiles: int = 1
    #: ... and blocks of two tiles sharing one staging of the split's K and V from this many
    #: tiles a kv head (0: never). Env ``ECHOLINE_CUDA_TENSOR_ATTENTION_PAIRS_MIN_TILES=0..8``
    tensor_attention_pairs_min_tiles: int = 3
    #: launch every kernel with programmatic stream serialization (PDL, sm_90 and later;
    #: kernels/cuda/launch.py): the next kernel is set up while one runs, and its blocks
    #: wait at ``griddepcontrol.wait`` for its results, so the gaps of a chain of ~200
    #: small launches per step overlap. The same bits (every kernel waits before its first
    #: global access). H200, synthetic shapes, context 1024, 2026-12-03 (``bench_device
    #: --pdl``): the chained plain loop, tok/s plain / released at exit / at start: Qwen
    #: 1.5B 490.1 / **510.6** / 453.3, Qwen 0.5B 986.5 / **1003.2** / 974.8, SmolLM2
    #: 1147.3 / **1196.9** / 1188.9; 16 rows (ms) 3.199 / 3.104, 1.624 / 1.571, 1.299 /
    #: 1.189 plain / at exit. Env ``ECHOLINE_CUDA_PDL=0|1``
    programmatic_launch: bool = True
    #: ... and each kernel releasing the next one's blocks at its start (kernels.cu
    #: PDL_EARLY, module suffix "@p1") rather than as its own blocks exit: slower on the
    #: larger shapes above (the waiting blocks take the first free SM slots, so a grid can
    #: pack onto few SMs). Env ``ECHOLINE_CUDA_PDL_EARLY=0|1``
    programmatic_early: bool = False

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> CudaTuning:
        """The defaults with the developer A/B overrides of the environment applied.

        Only well-formed values count (``0|1`` and ``1|2``); anything else keeps the default,
        so a stray value cannot pick an untested kernel."""
        env = os.environ if environ is None else environ
        tuning = cls()
        flag = env.get("ECHOLINE_CUDA_TENSOR_ATTENTION")
        if flag in ("0", "1"):
            tuning.tensor_attention = flag == "1"
        for name, field, ok in (
            ("ECHOLINE_CUDA_TENSOR_WIDE", "tensor_wide", ("0", "1")),
            ("ECHOLINE_CUDA_TENSOR_WIDE_PERSISTENT", "tensor_wide_persistent", ("0", "1")),
            ("ECHOLINE_CUDA_TENSOR_WIDE_STAGES", "tensor_wide_stages", ("1", "2")),
            ("ECHOLINE_CUDA_TENSOR_WIDE_WARPS", "tensor_wide_warps", ("1", "2", "4")),
            ("ECHOLINE_CUDA_TENSOR_WIDE_ROW_GROUPS", "tensor_wide_row_groups", ("1", "2", "4")),
            ("ECHOLINE_CUDA_TENSOR_SPLIT", "tensor_split", ("0", "1")),
            ("ECHOLINE_CUDA_TENSOR_SPLIT_WARPS", "tensor_split_warps", ("2", "4")),
            ("ECHOLINE_CUDA_TENSOR_SPLIT_UNITS", "tensor_split_units", ("1", "2")),
            ("ECHOLINE_CUDA_TENSOR_SPLIT_CLUSTER", "tensor_split_cluster", ("0", "1")),
            ("ECHOLINE_CUDA_TENSOR_MIN_UNITS_PER_WARP", "tensor_min_units_per_warp", ("1", "2")),
            ("ECHOLINE_CUDA_TENSOR_ROW_SPLIT_ONE_WAVE", "tensor_row_split_one_wave", ("0", "1")),
            ("ECHOLINE_CUDA_TENSOR_MAX_ROW_TILES", "tensor_max_row_tiles", ("4", "8")),
            ("ECHOLINE_CUDA_ATTN_ITEMS_PER_WARP", "attn_items_per_warp", ("1", "2", "4")),
            ("ECHOLINE_CUDA_TENSOR_ATTENTION_W8_MAX_TILES", "tensor_attention_w8_max_tiles",
             tuple(str(i) for i in range(9))),
            ("ECHOLINE_CUDA_TENSOR_ATTENTION_PAIRS_MIN_TILES", "tensor_attention_pairs_min_tiles",
             tuple(str(i) for i in range(9))),
            ("ECHOLINE_CUDA_TENSOR_ATTENTION_MIN_GROUP", "tensor_attention_min_group",
             tuple(str(i) for i in range(17))),
            ("ECHOLINE_CUDA_INT8", "tensor_int8", ("0", "1")),
            ("ECHOLINE_CUDA_INT8_MV_ROWS", "tensor_int8_mv_rows", ("0", "1", "2", "3", "4")),
            ("ECHOLINE_CUDA_PDL", "programmatic_launch", ("0", "1")),
            ("ECHOLINE_CUDA_PDL_EARLY", "programmatic_early", ("0", "1")),
            ("ECHOLINE_CUDA_INT8_SIGNED", "tensor_int8_signed_codes", ("0", "1")),
            ("ECHOLINE_CUDA_INT8_BATCH_WEIGHT_ROWS", "tensor_int8_batch_weight_rows", ("32", "64")),
        ):
            value = env.get(name)
            if value in ok:
                kind = type(getattr(tuning, field))
                setattr(tuning, field, value == "1" if kind is bool else int(value))
        for name, field in (
            ("ECHOLINE_CUDA_TENSOR_MIN_BLOCKS", "tensor_min_blocks"),
            ("ECHOLINE_CUDA_TENSOR_MIN_BLOCKS_ROWS", "tensor_min_blocks_rows"),
            ("ECHOLINE_CUDA_ATTN_MIN_BLOCKS", "attn_min_blocks"),
            ("ECHOLINE_CUDA_ATTN_GROUP_MIN_BLOCKS", "attn_group_min_blocks"),
        ):
            blocks = env.get(name, "")
            if blocks in tuple("12345678"):
                setattr(tuning, field, int(blocks))
        for name, field in (
            ("ECHOLINE_CUDA_XPREP_MIN_ROWS", "tensor_xprep_min_rows"),
            ("ECHOLINE_CUDA_XPREP_WIDE_MIN_ROWS", "tensor_xprep_wide_min_rows"),
            ("ECHOLINE_CUDA_INT8_XPREP_MIN_ROWS", "tensor_int8_xprep_min_rows"),
            ("ECHOLINE_CUDA_INT8_MIN_DIM", "tensor_int8_min_dim"),
            ("ECHOLINE_CUDA_INT8_BATCH_MIN_ROWS", "tensor_int8_batch_min_rows"),
        ):
            value = env.get(name, "")
            if value.isdigit() and int(value) <= 4096:
                setattr(tuning, field, int(value))
        kib = env.get("ECHOLINE_CUDA_TENSOR_WIDE_MAX_SMEM_KIB", "")
        if kib.isdigit() and 48 <= int(kib) <= 227:
            tuning.tensor_wide_max_smem = int(kib) * 1024
        units = env.get("ECHOLINE_CUDA_TENSOR_UNITS")
        if units in ("1", "2"):
            tuning.tensor_units = int(units)
        return tuning


class TunedAttribute:
    """A backend attribute that reads and writes the same-named field of ``obj.tuning``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, objtype: type | None = None) -> object:
        if obj is None:
            return getattr(CudaTuning, self.name)
        return getattr(obj.tuning, self.name)

    def __set__(self, obj: object, value: object) -> None:
        setattr(obj.tuning, self.name, value)


def install_tuned_attributes(cls: type) -> type:
    """Class decorator: one ``TunedAttribute`` per ``CudaTuning`` field on ``cls``."""
    for f in fields(CudaTuning):
        attr = TunedAttribute()
        attr.__set_name__(cls, f.name)
        setattr(cls, f.name, attr)
    return cls
