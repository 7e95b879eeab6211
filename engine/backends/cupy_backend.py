"""CUDA backend: GGUF blocks stay quantized in GPU memory, kernels from kernels/cuda.

Why this shape: on a GPU a decode step is bound by kernel launches and weight
reads, not arithmetic. Weights are uploaded exactly as stored (no dequantized
copy: 4-5 bits a weight instead of 32), fused weights (q|k|v, gate|up) become one
launch per quant type, and a whole forward can be captured as a CUDA graph
(``run_graph``) so each launch costs ~1 µs instead of ~8 µs of Python.

Every op is batch-invariant (see kernels/cuda/kernels.cu), and every op decides
its launch shape from array shapes only, never from device values, so a forward
is capturable: positions and token ids may be passed as device arrays.

CuPy is imported here and nowhere else in the engine (optional extra ``echoline[cuda]``).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import cupy
import gguf
import numpy as np
from echoline.engine.backends.base import Array, Backend
from echoline.engine.backends.cuda_tuning import CudaTuning, install_tuned_attributes
from echoline.engine.errors import EcholineError
from echoline.engine.gguf_file import QuantTensor
from echoline.kernels.cuda import FACTORED, TENSOR, load_module
from echoline.kernels.cuda.launch import ProgrammaticKernel
from echoline.kernels.cuda.launch import available as pdl_available
from echoline.kernels.quant_types import QUANT_TYPES

Q = gguf.GGMLQuantizationType
#: gguf quant type -> kernel-name stem (``kernels.quant_types``)
_KERNEL_NAMES: dict[Q, str] = {t.qtype: t.kernel for t in QUANT_TYPES}
#: kernel-name stem -> (weights, bytes) of one of its blocks (gguf's table)
_BLOCKS: dict[str, tuple[int, int]] = {t.kernel: gguf.GGML_QUANT_SIZES[t.qtype] for t in QUANT_TYPES}
_MM_WARPS = 4  # must match MM_WARPS in kernels.cu


def _wide_static_smem(warps: int) -> int:
    """Static shared memory of a wide-weight block of ``warps`` warps at the most 8-row tiles
    per pass (NT = 4): kernels.cu MT_SMEM(4, 1, warps) floats."""
    return 4 * ((warps - 1) * 4 * 4 * 32 + warps * 4 * 8)

#: items one CUDA-core attention block may take (kernels.cu ATTN_MAX_ITEMS)
_ATTN_MAX_ITEMS = 256
_ROW_TILES = (1, 2, 4, 8, 16)  # rows per pass the matmul kernels are built for
_COLS_PER_WARP = 4  # output columns per warp for wide launches (kernels.cu MM_KERNEL)
_ACT = {"silu": 1, "gelu": 2}  # kernels.cu act_glu
#: A forward shape is captured as a CUDA graph on its GRAPH_AFTER-th use on one KV cache
#: (``run_graph``); 1 (the default) captures at once. Env: developer A/B only. Measured on
#: the H200 (2026-12-02, SmolLM2, bench spec, 1 vs 2): chat 0.69/0.77x vs 0.87/0.77x, copy
#: 3.18x vs 3.08x, edit 2.57x vs 2.13x: no gain, so captures per cache are not what makes
#: chat slower than plain (docs/history/cuda-rounds.md).
GRAPH_AFTER = int(os.environ.get("ECHOLINE_GRAPH_AFTER", "1"))
#: Every capture runs its step eagerly first (1), or only a key's first capture on the
#: backend does (0, the default: later captures of that key, on other caches' buffers,
#: capture at once and replay). Env: developer A/B only.
GRAPH_EAGER_EVERY = os.environ.get("ECHOLINE_GRAPH_EAGER_EVERY", "0") == "1"


@dataclass
class Segment:
    """Consecutive output rows of a fused weight that share one quant type."""

    kernel: str
    data: Any  # cupy uint8 (rows, row_bytes), blocks as stored in the file
    rows: int
    row_bytes: int
    col_offset: int


@dataclass
class CudaWeight:
    """A fused (out, in) matrix: one or more segments, outputs concatenated."""

    segments: list[Segment]
    out_features: int
    in_features: int


@dataclass
class CapturedGraph:
    """A captured forward: replay after copying new inputs into ``inputs``."""

    graph: Any
    inputs: list[Any]
    output: Any
    pool: Any  # private memory pool holding every buffer the graph touches
    stream: Any


#: Rows up to this long take argmax_rows' single block; longer ones its two-launch form
#: in parts of ARGMAX_CHUNK ids (same ids).
ARGMAX_ONE_BLOCK_MAX = 16384
ARGMAX_CHUNK = 4096

#: Pinned host slots for ``copy_to_host_async``: a chain holds at most two copies in flight,
#: and a slot is reused only after SLOTS more copies, long after its value was read.
_PINNED_SLOT = 16
_PINNED_SLOTS = 16


class HostCopy:
    """A device → pinned-host copy in flight; ``value`` waits for it (once) and keeps it."""

    def __init__(self, event: Any, view: np.ndarray) -> None:
        self._event = event
        self._view = view
        self._value: np.ndarray | None = None

    def value(self) -> np.ndarray:
        if self._value is None:
            self._event.synchronize()
            self._value = self._view.astype(np.int64)
        return self._value


def _raw_bytes(t: QuantTensor) -> np.ndarray:
    data = np.ascontiguousarray(np.asarray(t.data))
    return data.view(np.uint8).reshape(t.rows, -1)


def _row_tile(n: int) -> int:
    for r in _ROW_TILES:
        if n <= r:
            return r
    return _ROW_TILES[-1]


#: arrival counters of the split-K tensor products (one per (x, y) block of a launch)
_SPLIT_COUNTERS = 1 << 16


def _i32(v: int) -> np.int32:
    return np.int32(v)


def _seg_res(res: Any, seg: Segment) -> Any:
    """The residual / bias columns of one segment of a fused weight (None stays None)."""
    if res is None:
        return None
    return res[seg.col_offset :] if res.ndim == 1 else res[:, seg.col_offset :]


def _pair_args(
    w: CudaWeight,
    a: Segment,
    b: Segment,
    nblk_a: int,
    x2: Any,
    ldx: int,
    n: int,
    out: Any,
    width: int,
    norm: Any,
    eps: float,
    res: Any,
    ldr: int,
) -> tuple:
    """The arguments a two-segment launch (mm2_* / mt2_*) starts with: both segments'
    blocks, x, both outputs, the norm weight and both residual slices."""
    return (
        a.data, np.int64(a.row_bytes), _i32(a.rows), _i32(nblk_a),
        b.data, np.int64(b.row_bytes), _i32(b.rows), _i32(w.in_features),
        x2, _i32(ldx), _i32(n), out[:, a.col_offset :], out[:, b.col_offset :], _i32(width),
        norm, np.float32(eps), _seg_res(res, a), _seg_res(res, b), _i32(ldr),
    )  # fmt: skip


#: the x arguments of a tensor-core launch that converts x itself (no xprep)
_NO_XPREP = (None, None, None)


class _AttnCall(NamedTuple):
    """One attention call's arrays and sizes, handed to its pass-1 launcher."""

    q2: Any
    ldq: int
    k_cache: Any
    v_cache: Any
    pos: Any
    n: int
    heads: int
    kvh: int
    hd: int
    split: int
    nsplit: int
    window: int
    scale: float
    opart: Any
    mpart: Any
    lpart: Any


@install_tuned_attributes
class CupyBackend(Backend):
    """GGUF-block matrix products and fused ops on one CUDA device."""

    name = "cuda"
    batch_invariant = True
    #: graphs bake buffer addresses: caches must be plain linear buffers (no window rings)
    linear_cache_only = True
    #: Transformer.forward replays a graph for up to this many rows (decode and verify)
    graph_max_rows = 64
    #: verify up to 64 rows (63 drafts): ``Backend.verify_max_rows`` says why
    verify_max_rows = 64
    #: decode steps can feed each other on the device (``argmax_feed``: engine/step_chain.py);
    #: not while graphs are captured late (ECHOLINE_GRAPH_AFTER), which runs steps eagerly
    graph_chain = GRAPH_AFTER == 1
    # Speed choices (tensor_products, attn_split, …): fields of ``self.tuning``
    # (engine/backends/cuda_tuning.py), readable and writable here as attributes.

    def __init__(self) -> None:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise EcholineError("no CUDA device visible to CuPy")
        self._mod = load_module()
        self.tuning = CudaTuning.from_env()  # environment overrides: A/B on real models
        self._fn: dict[tuple[str, str | None, int, int, int, bool, bool], Any] = {}
        self._pinned: tuple[Any, np.ndarray] | None = None  # copy_to_host_async's slots
        self._pinned_next = 0
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        self._sm_count = int(props["multiProcessorCount"])
        self._cc_major = int(props.get("major", 0))  # thread-block clusters from 9 (Hopper)
        # programmatic dependent launch: sm_90+, and a driver that captures it into graphs
        driver = cupy.cuda.runtime.driverGetVersion()
        self._pdl_ok = self._cc_major >= 9 and pdl_available(driver)
        # resident blocks of the wide-weight kernels: shared memory per SM and per block
        self._smem_per_sm = int(props.get("sharedMemPerMultiprocessor", 233472))
        self._smem_reserved = int(props.get("reservedSharedMemPerBlock", 1024))
        self._smem_optin = int(props.get("sharedMemPerBlockOptin", 48 * 1024))  # one block's most
        self._resident_fit: dict[tuple[int, int], int] = {}
        # split-K tensor products: one arrival counter per (x, y) block of a launch, zero
        # between launches (each tile's last block resets its own); launches in one stream
        # never overlap, so one array serves them all
        self._split_counters = cupy.zeros(_SPLIT_COUNTERS, dtype=cupy.int32)
        # last host positions uploaded: a forward hands one array to every layer
        self._pos_host: np.ndarray | None = None
        self._pos_dev: Any = None
        self._graphs: dict[Any, CapturedGraph] = {}
        # graph keys already run eagerly once (kernels loaded): later captures skip that run
        self._eager_keys: set[Any] = set()
        #: why the last capture without an eager run failed (it then ran eagerly), if one did
        self.cold_capture_fallback: str | None = None
        # graphs that read one owner's buffers (a KV cache): freed with the owner
        self._owned: weakref.WeakKeyDictionary[Any, tuple[Hashable, dict[Any, CapturedGraph]]] = (
            weakref.WeakKeyDictionary()
        )
        self._uploads: dict[tuple[str, int, int, int], tuple[np.ndarray, Any]] = {}

    # ---- kernels -------------------------------------------------------------------------
    def _k(
        self, name: str, qtype: str | None = None, attn_blocks: int = 1, int8: bool = False
    ) -> Any:
        """Kernel ``name`` of the common module, or of ``qtype``'s module (built on first use);
        ``attn_blocks``: the attention build asking for that many resident blocks per SM;
        ``int8``: a tensor-core product's integer form (``_int8``)."""
        pdl = self.programmatic_launch and self._pdl_ok
        early = pdl and self.programmatic_early
        tiles8 = self.tensor_max_row_tiles == 8
        rows_minb = self.tensor_min_blocks_rows
        signed = int8 and self.tensor_int8_signed_codes
        wide_rows = int8 and self.tensor_int8_batch_weight_rows == 64
        key = (name, qtype, self.tensor_units, self.tensor_min_blocks, int8, attn_blocks, pdl, early, tiles8,
               rows_minb, signed, wide_rows)  # fmt: skip
        fn = self._fn.get(key)
        if fn is None:
            if qtype is not None and name.startswith("mt"):  # module builds of the products
                if int8:  # the integer form (other bits: fixed per weight, _int8)
                    qtype = f"{qtype}@i1"
                if self.tensor_units != 1:  # more loads in flight
                    qtype = f"{qtype}@u{self.tensor_units}"
                if self.tensor_min_blocks != 1:  # fewer registers, more blocks per SM
                    qtype = f"{qtype}@b{self.tensor_min_blocks}"
                if rows_minb:  # the register bound of the kernels past 16 rows
                    qtype = f"{qtype}@r{rows_minb}"
                if tiles8:  # also the kernels of eight 8-row tiles per pass
                    qtype = f"{qtype}@t8"
                if wide_rows:  # its staged many-row kernels are mtbw's (the same bits)
                    qtype = f"{qtype}@w1"
                if signed:  # s8 codes for the signed-byte types (the same bits)
                    qtype = f"{qtype}@s1"
            if qtype is None and name.startswith("attn_partial") and attn_blocks != 1:
                qtype = f"@a{attn_blocks}"
            if early:  # every module: each kernel releases the next one at its start
                qtype = f"{qtype or ''}@p1"
            mod = self._mod if qtype is None else load_module(qtype)
            fn = mod.get_function(name)
            if pdl:  # the same kernel, launched to overlap the one before it
                fn = ProgrammaticKernel(fn)
            self._fn[key] = fn
        return fn

    # ---- device inputs -------------------------------------------------------------------
    def device_ints(self, values: Any) -> Any:
        """int32 device array of ids/positions; device int32 arrays pass through untouched.

        Host arrays are uploaded once and reused while the same values come back
        (a forward hands one positions array to every layer's rope and attention).
        """
        if isinstance(values, cupy.ndarray):
            return values if values.dtype == cupy.int32 else values.astype(cupy.int32)
        host = np.ascontiguousarray(values, dtype=np.int32).reshape(-1)
        last = self._pos_host
        if last is not None and last.shape == host.shape and np.array_equal(last, host):
            return self._pos_dev
        dev = cupy.asarray(host)
        self._pos_host, self._pos_dev = host.copy(), dev
        return dev

    @staticmethod
    def _rows(x: Any, width: int) -> tuple[Any, int]:
        """x as (rows, width) float32 with unit inner stride, plus its row stride (elements).

        Split views (the q|k|v parts of one product) keep their row stride instead
        of being copied; anything irregular or misaligned for 16-byte loads is copied.
        """
        if x.ndim != 2 or x.shape[1] != width:
            x = x.reshape(-1, width)
        if x.dtype != cupy.float32:
            x = x.astype(cupy.float32)
        n = int(x.shape[0])
        if x.strides[1] == 4 and x.data.ptr % 16 == 0 and (n <= 1 or x.strides[0] % 16 == 0):
            return x, (x.strides[0] // 4 if n > 1 else width)
        return cupy.ascontiguousarray(x), width

    # ---- weights -------------------------------------------------------------------------
    def prepare_matrix(self, tensors: list[QuantTensor]) -> CudaWeight:
        if not tensors:
            raise EcholineError("prepare_matrix needs at least one tensor")
        cols = tensors[0].cols
        segments: list[Segment] = []
        offset = 0
        group: list[QuantTensor] = []

        def flush() -> None:
            nonlocal offset
            if not group:
                return
            if len(group) == 1:
                raw, data = _raw_bytes(group[0]), self._upload(group[0])
            else:
                raw = np.concatenate([_raw_bytes(t) for t in group], axis=0)
                data = cupy.asarray(raw)
            rows = raw.shape[0]
            segments.append(
                Segment(_KERNEL_NAMES[group[0].qtype], data, rows, raw.shape[1], offset)
            )
            offset += rows
            group.clear()

        for t in tensors:
            if t.cols != cols:
                raise EcholineError(
                    f"fused tensors differ in input size: {t.name} has {t.cols}, expected {cols}"
                )
            if t.qtype not in _KERNEL_NAMES:
                raise EcholineError(
                    f"CUDA backend cannot read {t.name}'s quant type {t.qtype.name}"
                )
            if group and group[0].qtype != t.qtype:
                flush()
            group.append(t)
        flush()
        return CudaWeight(segments, offset, cols)

    def _upload(self, t: QuantTensor) -> Any:
        """One device copy per file tensor (a tied embedding is both table and output).

        The cache keeps the host array alive, so its address cannot be reused by
        another array while the key stands.
        """
        host = np.asarray(t.data)
        key = (t.name, int(host.__array_interface__["data"][0]), host.nbytes, int(t.qtype))
        hit = self._uploads.get(key)
        if hit is None:
            hit = (host, cupy.asarray(_raw_bytes(t)))
            self._uploads[key] = hit
        return hit[1]

    def prepare_vector(self, values: np.ndarray) -> Any:
        return cupy.asarray(np.ascontiguousarray(values, dtype=np.float32).reshape(-1))

    def prepare_embedding(self, table: QuantTensor) -> CudaWeight:
        return self.prepare_matrix([table])

    # ---- ops -----------------------------------------------------------------------------
    def embed(self, table: CudaWeight, ids: Any) -> Any:
        seg = table.segments[0]
        dev_ids = self.device_ints(ids)
        n = int(dev_ids.shape[0])
        k = table.in_features
        out = cupy.empty((n, k), dtype=cupy.float32)
        if n:
            grid = ((k // 8 + 127) // 128, n)
            self._k("embed_" + seg.kernel, seg.kernel)(
                grid, (128,), (seg.data, np.int64(seg.row_bytes), _i32(k), dev_ids, out)
            )
        return out

    def matmul(self, x: Array, w: CudaWeight) -> Any:
        return self._product(x, w)

    def norm_matmul(
        self, x: Array, weight: Any, eps: float, w: CudaWeight, bias: Any = None
    ) -> Any:
        """matmul(rms_norm(x) * weight) (+ bias) in one launch per segment (kernels.cu mm_body)."""
        if w.out_features > self.norm_fuse_max_cols:
            return self._product(self.rms_norm(x, weight, eps), w, residual=bias)
        return self._product(x, w, norm=weight, eps=eps, residual=bias)

    def norm_matmul_glu(
        self, x: Array, weight: Any, eps: float, w: CudaWeight, n_ff: int, gelu: bool
    ) -> Any:
        """act(gate) * up of the normed x, gate|up = w; fused when gate and up share a
        quant type (one segment), else the product and then one activation kernel."""
        act = _ACT["gelu" if gelu else "silu"]
        if len(w.segments) == 1 and w.out_features == 2 * n_ff:
            return self._product(x, w, norm=weight, eps=eps, act=act)
        gate, up = self.split(self._product(x, w, norm=weight, eps=eps), [n_ff, n_ff])
        return self._glu(gate, up, act)

    def matmul_add(self, x: Array, w: CudaWeight, residual: Any) -> Any:
        """residual + x @ W.T, the add done by the product's epilogue."""
        return self._product(x, w, residual=residual)

    def _product(
        self,
        x: Array,
        w: CudaWeight,
        norm: Any = None,
        eps: float = 0.0,
        residual: Any = None,
        act: int = 0,
    ) -> Any:
        """One launch per segment; every option keeps each row's reduction order fixed."""
        x2, ldx = self._rows(x, w.in_features)
        n = int(x2.shape[0])
        width = w.out_features // 2 if act else w.out_features
        out = cupy.empty((n, width), dtype=cupy.float32)
        if n == 0:
            return out
        res, ldr = None, 0
        if residual is not None:
            if residual.ndim == 1:  # a bias row, broadcast over rows
                res = residual if residual.dtype == cupy.float32 else residual.astype(cupy.float32)
            else:
                res, ldr = self._rows(residual, w.out_features)
        splits = 0 if act or norm is not None else self._tensor_splits(w)
        if self._few_rows_product(w, splits, x2, ldx, n, out, width, norm, eps, res, ldr, act):
            return out
        if self._many_rows_product(w, splits, x2, ldx, n, out, width, norm, eps, res, ldr, act):
            return out
        if splits:
            self._split_product(w, splits, x2, ldx, n, out, width, res, ldr)
            return out
        if not act and self._tensor_wide(w):
            self._wide_product(w, x2, ldx, n, out, width, norm, eps, res, ldr)
            return out
        if self._tensor(w):
            self._tensor_product(w, x2, ldx, n, out, width, norm, eps, res, ldr, act)
            return out
        tile = _row_tile(n)
        # by weight and op only, never by row count: batch-invariant
        ksplit = w.in_features >= self.ksplit_min_k or (bool(act) and self.ksplit_gated)
        if len(w.segments) == 2 and not act and self.fuse_segment_pairs:
            self._pair_product(w, x2, ldx, n, out, width, norm, eps, res, ldr, tile, ksplit)
            return out
        for seg in w.segments:
            out_cols = seg.rows // 2 if act else seg.rows
            if ksplit:
                cols_per_warp = 2 if act else 1
                per_block = 1
            else:
                cols_per_warp = self._cols_per_warp(tile, out_cols, gated=bool(act))
                per_block = _MM_WARPS * (cols_per_warp // 2 if act else cols_per_warp)
            grid = ((out_cols + per_block - 1) // per_block,)
            self._k(
                f"mm_{seg.kernel}_r{tile}_c{cols_per_warp}{self._suffix(seg.kernel, w)}", seg.kernel
            )(
                grid,
                (32 * _MM_WARPS,),
                (
                    seg.data,
                    np.int64(seg.row_bytes),
                    _i32(out_cols),
                    _i32(w.in_features),
                    x2,
                    _i32(ldx),
                    _i32(n),
                    out[:, seg.col_offset :],
                    _i32(width),
                    norm,
                    np.float32(eps),
                    _seg_res(res, seg),
                    _i32(ldr),
                    _i32(act),
                    _i32(out_cols),
                    _i32(int(ksplit)),
                ),
            )
        return out

    def _int8_family(self, w: CudaWeight, splits: int, act: int) -> tuple[int, int] | None:
        """(kwg, the norm's kwg) of the tensor-core family ``w`` takes at every row count (mt,
        mts / mtc or mtw), or None where none does. kwg, the family's warps sharing a row's
        units, fixes the order of the sums: the mtv and mtb kernels follow it, so the row
        count may choose them."""
        if splits:
            return splits * self.tensor_split_warps, 0
        if not act and self._tensor_wide(w):
            return self._wide_warps(), self._wide_warps()
        if self._tensor(w):
            kw = self._tensor_shape(w, act)[1]
            return kw, kw
        return None

    def _many_rows_product(
        self, w: CudaWeight, splits: int, x2: Any, ldx: int, n: int, out: Any, width: int,
        norm: Any, eps: float, res: Any, ldr: int, act: int,
    ) -> bool:  # fmt: skip
        """The integer form's many-row products (kernels.cu mtb kernels), from
        ``tensor_int8_batch_min_rows`` rows; False where they do not apply. A block stages
        each step's weights (``tensor_int8_batch_weight_rows``: 32 rows, or 64 on the mtbw
        kernels) and x (a pass of 32 or 64 rows) in shared memory for SL K slots of the family
        (SL = kwg for kwg 1 or 2, else 4; kwg / SL blocks a tile, their sums added through
        scratch planes). One launch per segment: a column's bits are its own type's whichever
        launch computes it."""
        least = self.tensor_int8_batch_min_rows
        if not (least and n >= least and self._int8(w)):
            return False
        family = self._int8_family(w, splits, act)
        if family is None:
            return False
        kwg, kw_norm = family
        sl = kwg if kwg < 4 else 4
        if kwg % sl:
            return False
        z = kwg // sl
        nt = 2 if n <= 32 else 4
        rows = 16 * nt
        wb = 2 if self.tensor_int8_batch_weight_rows == 64 else 1  # 32-row weight blocks a block
        prefix = "mtbw" if wb == 2 else "mtb"
        xstride = {1: 64, 2: 192, 4: 320}[sl]  # must match kernels.cu MtbGeom<SL>::XS
        xp = self._xprep(x2, ldx, n, w.in_features, norm, kw_norm, 1, True)
        for seg in w.segments:
            out_cols = seg.rows // 2 if act else seg.rows
            nblk = -(-out_cols // ((16 if act else 32) * wb))
            qk, bsz = _BLOCKS[seg.kernel]
            step = bsz if qk == 256 else sl * (64 // qk) * bsz  # a step's bytes of one row
            wspan = -(-step // 16) * 16 + 16  # the 16-aligned span around them
            wspan += 16 if wspan % 32 == 0 else 0  # rows 4 banks apart: no conflicts
            smem = 3 * (32 * wb * wspan + rows * xstride + rows * sl * 8)
            fn = self._k(f"{prefix}_{seg.kernel}_s{sl}_n{nt}", seg.kernel, int8=True)
            if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
                fn.max_dynamic_shared_size_bytes = smem  # the opt-in past 48 KiB
            if z > 1 and nblk > _SPLIT_COUNTERS:
                raise EcholineError(f"many-row launch of {nblk} blocks: too many tiles")
            part = cupy.empty((kwg, n, nblk * 32 * wb), dtype=cupy.float32) if z > 1 else None
            fn(
                (nblk, 1, z),
                (64 * sl * wb,),
                (
                    seg.data, np.int64(seg.row_bytes), _i32(out_cols), _i32(w.in_features), _i32(n),
                    out[:, seg.col_offset :], _i32(width), np.float32(eps), _seg_res(res, seg), _i32(ldr),
                    _i32(act), _i32(out_cols), _i32(bsz), _i32(wspan), *xp, part,
                    self._split_counters,
                ),  # fmt: skip
                shared_mem=smem,
            )
        return True

    def _few_rows_product(
        self, w: CudaWeight, splits: int, x2: Any, ldx: int, n: int, out: Any, width: int,
        norm: Any, eps: float, res: Any, ldr: int, act: int,
    ) -> bool:  # fmt: skip
        """The integer form's few-row products on the CUDA cores (kernels.cu mtv kernels),
        where ``n`` is at most ``tensor_int8_mv_rows``; False where they do not apply.

        They give the bits of the tensor-core family ``w`` takes at every row count (mt,
        mts / mtc or mtw): ``kwg``, that family's warps sharing a row's units, fixes the order
        of the sums, so choosing them by row count keeps decode == verify."""
        if not (0 < n <= self.tensor_int8_mv_rows <= 4 and self._int8(w)):
            return False
        family = self._int8_family(w, splits, act)
        if family is None:
            return False
        kwg, kw_norm = family  # kw_norm: the norm's sum-of-squares order (xprep8's kwg)
        rows = 1 if n == 1 else 2 if n == 2 else 4
        smem = rows * (w.in_features // 16) * 4  # x's half-group sums (kernels.cu mtv_body)
        # a block of 128 threads, 128 / kwg columns; its sums and the slots' partial sums
        # (``red``: 128 * rows * 2 floats) within the 48 KiB a block gets without opting in
        if kwg > 128 or 128 % kwg or smem + 128 * rows * 2 * 4 > 48 * 1024:
            return False
        xp = self._xprep(x2, ldx, n, w.in_features, norm, kw_norm, 1, True)
        per_block = 128 // kwg
        segs = w.segments
        groups = [segs] if len(segs) == 2 and not act else [[seg] for seg in segs]
        for group in groups:
            a, b = group[0], group[-1]
            cols_a = a.rows // 2 if act else a.rows
            nblk_a = -(-cols_a // per_block)
            nblk = nblk_a + (-(-b.rows // per_block) if len(group) == 2 else 0)
            name = "_".join(seg.kernel for seg in group)
            self._k(f"mtv_{name}_r{rows}", "+".join(seg.kernel for seg in group), int8=True)(
                (nblk,),
                (128,),
                (
                    a.data, np.int64(a.row_bytes), _i32(cols_a), _i32(nblk_a),
                    b.data, np.int64(b.row_bytes), _i32(b.rows if len(group) == 2 else 0),
                    _i32(w.in_features), _i32(kwg), _i32(n), *xp, np.float32(eps),
                    out[:, a.col_offset :], out[:, b.col_offset :], _i32(width),
                    _seg_res(res, a), _seg_res(res, b), _i32(ldr), _i32(act), _i32(cols_a),
                ),  # fmt: skip
                shared_mem=smem,
            )
        return True

    def _tensor(self, w: CudaWeight) -> bool:
        """Whether ``w`` runs on the tensor-core kernels: by flag, quant types and shape
        only, so every row count of one weight runs the same kernels (batch-invariant)."""
        return (
            self.tensor_products
            and w.in_features % 64 == 0
            and w.in_features < self.tensor_max_in
            and w.out_features <= self.tensor_max_cols
            and all(seg.kernel in TENSOR for seg in w.segments)
        )

    def _int8(self, w: CudaWeight) -> bool:
        """Whether ``w``'s tensor-core products take the integer form (kernels.cu MT_INT8): by
        setting and shape only, so every row count of one weight computes alike."""
        return self.tensor_int8 or 0 < self.tensor_int8_min_dim <= min(w.in_features, w.out_features)

    def _xprep_rows(self, int8: bool) -> int:
        """The row count from which mt_body's kernels read x prepared once per product, for
        a weight in the integer form (``int8``: ``_int8``) or the f16 form."""
        return self.tensor_int8_xprep_min_rows if int8 else self.tensor_xprep_min_rows

    def _tensor_wide(self, w: CudaWeight) -> bool:
        """Whether ``w`` runs on the staged wide-weight kernels (kernels.cu mtw_body): by flag,
        quant type and shape only (the output heads), so every row count of one weight runs
        the same kernel (batch-invariant). Gated products never come here."""
        if not (self.tensor_products and self.tensor_wide and len(w.segments) == 1):
            return False
        seg = w.segments[0]
        return (
            seg.kernel in TENSOR
            and w.in_features % 64 == 0
            and w.out_features >= self.tensor_wide_min_cols
            # the staged tiles plus the kernel's static reduction array (kernels.cu
            # MT_SMEM(NT, 1, KW) floats at the largest NT, so the choice stays shape-only)
            # within the setting and the device's opt-in limit (_wide_product opts in past
            # the 48 KiB a block gets without it)
            and self.tensor_wide_stages * 16 * seg.row_bytes + _wide_static_smem(self._wide_warps())
            <= min(self.tensor_wide_max_smem, self._smem_optin)
            and seg.data.data.ptr % 16 == 0  # 16-byte copies (every upload is aligned)
        )

    def _tensor_splits(self, w: CudaWeight) -> int:
        """Blocks per 16-column tile for a split-K tensor product of ``w`` (kernels.cu mts
        kernels), or 0 when ``w`` takes another family. By flag, types and shape only: the
        split count sets the order of a row's sums (warp order over all blocks), so it must
        never follow the row count. Only plain products and residual/bias epilogues come
        here (the caller excludes norms and gated products: ops fixed per weight)."""
        if not (self.tensor_products and self.tensor_split):
            return 0
        if (
            w.in_features % 64
            or w.in_features < self.tensor_split_min_in
            or w.out_features > self.tensor_max_cols
            or not all(seg.kernel in TENSOR for seg in w.segments)
        ):
            return 0
        tiles = sum((seg.rows + 15) // 16 for seg in w.segments)
        units = w.in_features // 64
        kw = self.tensor_split_warps
        splits = 2
        while (
            splits < 16
            and tiles * splits < self.tensor_split_blocks_per_sm * self._sm_count
            and 2 * splits * kw <= units
        ):
            splits *= 2
        return splits

    def _split_cluster(self, splits: int) -> bool:
        """Whether a split-K product of ``splits`` blocks per tile runs as clusters (mtc
        kernels: built for 4 or 8 blocks of 4 warps, on sm_90 and later)."""
        return (
            self.tensor_split_cluster
            and self._cc_major >= 9
            and splits in (4, 8)
            and self.tensor_split_warps == 4
        )

    def _split_product(
        self, w: CudaWeight, splits: int, x2: Any, ldx: int, n: int, out: Any, width: int,
        res: Any, ldr: int,
    ) -> None:  # fmt: skip
        """Split-K launches, one per segment, ``splits`` blocks per tile (``_tensor_splits``):
        grid (tiles, row blocks, splits); clusters (mtc) or scratch planes (mts)."""
        kw = self.tensor_split_warps
        cluster = self._split_cluster(splits)
        units = 2 if self.tensor_split_units == 2 and kw == 4 else 1
        int8 = self._int8(w)
        xp = self._xprep(x2, ldx, n, w.in_features, None, 0, self._xprep_rows(int8), int8)
        for seg in w.segments:
            tiles = (seg.rows + 15) // 16
            nt, gy = self._row_passes(n, tiles * splits * kw, kw)
            if cluster:  # one cluster per tile: no scratch planes, no counters
                self._k(f"mtc_{seg.kernel}_n{nt}_w4_s{splits}", seg.kernel, int8=int8)(
                    (tiles, gy, splits),
                    (128,),
                    (
                        seg.data, np.int64(seg.row_bytes), _i32(seg.rows), _i32(w.in_features),
                        x2, _i32(ldx), _i32(n), out[:, seg.col_offset :], _i32(width),
                        _seg_res(res, seg), _i32(ldr), *xp,
                    ),  # fmt: skip
                )
                continue
            if tiles * gy > _SPLIT_COUNTERS:
                raise EcholineError(f"split-K launch of {tiles} x {gy} blocks: too many tiles")
            part = cupy.empty((splits * kw, n, seg.rows), dtype=cupy.float32)
            self._k(f"mts_{seg.kernel}_n{nt}_w{kw}_u{units}", seg.kernel, int8=int8)(
                (tiles, gy, splits),
                (32 * kw,),
                (
                    seg.data, np.int64(seg.row_bytes), _i32(seg.rows), _i32(w.in_features),
                    x2, _i32(ldx), _i32(n), out[:, seg.col_offset :], _i32(width),
                    _seg_res(res, seg), _i32(ldr), part, self._split_counters, *xp,
                ),  # fmt: skip
            )

    def _wide_warps(self) -> int:
        """Warps per wide-weight block (kernels.cu mtw_body's KW): the setting, one with two
        stages (built only so)."""
        return 1 if self.tensor_wide_stages == 2 else self.tensor_wide_warps

    def _wide_product(
        self, w: CudaWeight, x2: Any, ldx: int, n: int, out: Any, width: int,
        norm: Any, eps: float, res: Any, ldr: int,
    ) -> None:  # fmt: skip
        """One mtw_body launch: blocks of ``_wide_warps`` warps over (16-column tile, row
        group) items staged in shared memory. The row groups, NT (8-row tiles per pass) and
        the grid follow the row count and the chip; none changes a value (each tile is
        mt_body with MT 1 and KW fixed per weight)."""
        seg = w.segments[0]
        kw = self._wide_warps()
        groups = min(self.tensor_wide_row_groups, -(-n // 8)) if n > 8 else 1
        span = -(-n // groups)
        nt = 1 if span <= 8 else 2 if span <= 16 else 4
        stages = self.tensor_wide_stages
        smem = stages * 16 * seg.row_bytes
        int8 = self._int8(w)
        fn = self._k(f"mtw_{seg.kernel}_n{nt}_s{stages}_w{kw}", seg.kernel, int8=int8)
        if smem + _wide_static_smem(kw) > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem  # the opt-in past 48 KiB (_tensor_wide)
        xp = self._xprep(x2, ldx, n, w.in_features, norm, kw, self.tensor_xprep_wide_min_rows, int8)
        items = (seg.rows + 15) // 16 * groups
        grid = min(items, self._resident_blocks(fn, smem, kw)) if self.tensor_wide_persistent else items
        fn(
            (grid,),
            (32 * kw,),
            (
                seg.data, np.int64(seg.row_bytes), _i32(seg.rows), _i32(w.in_features),
                x2, _i32(ldx), _i32(n), out, _i32(width), norm, np.float32(eps), res, _i32(ldr),
                _i32(groups), *xp,
            ),  # fmt: skip
            shared_mem=smem,
        )

    def _resident_blocks(self, fn: Any, smem: int, warps: int = 1) -> int:
        """Blocks of ``warps`` warps of ``fn`` with ``smem`` bytes of tiles resident at once
        on the chip (registers: 4 partitions of 16K in 256-register steps per warp; shared
        memory; at most 32 blocks and 64 warps per SM)."""
        key = (id(fn), smem)
        fit = self._resident_fit.get(key)
        if fit is None:
            regs = int(getattr(fn, "num_regs", 128)) or 128
            per_warp = -(-regs * 32 // 256) * 256
            static = int(getattr(fn, "shared_size_bytes", 0))
            by_smem = self._smem_per_sm // (smem + static + self._smem_reserved)
            by_regs = 4 * (16384 // per_warp) // warps
            fit = max(1, min(32, 64 // warps, by_regs, by_smem)) * self._sm_count
            self._resident_fit[key] = fit
        return fit

    def _tensor_shape(self, w: CudaWeight, act: int) -> tuple[int, int]:
        """(MT, KW) for ``w``: 16-column tiles per warp and warps splitting K per block.

        Both depend on the weight's shape only. KW sets the order in which a row's
        partial sums are added (warp order), so it must never follow the row count; MT
        only moves columns between warps. Narrow weights get more warps per block (KW 8
        or 16, each taking every KW-th 64-weight unit) so the chip has enough warps.
        """
        per_tile = 8 if act else 16
        cols = w.out_features // 2 if act else w.out_features
        tiles = (cols + per_tile - 1) // per_tile
        need = self.tensor_min_warps_per_sm * self._sm_count
        if tiles // 2 >= self.tensor_wide_min_blocks * self._sm_count:
            return 2, 4
        units = w.in_features // 64
        for kw in (4, 8):
            if tiles * kw >= need or self.tensor_min_units_per_warp * kw > units:
                return 1, kw
        return 1, 16

    def _row_passes(self, n: int, warps: int, kw: int = 4) -> tuple[int, int]:
        """(NT, grid y) of a tensor-core launch of ``n`` rows whose column blocks hold
        ``warps`` warps in all, ``kw`` warps a block.

        Up to 8 rows: one pass. 9-17 rows: one 8-row pass per block row (grid y) while the
        launch stays within ``tensor_row_split_warps_per_sm``, else 8-row tiles per pass
        (``_row_tiles``). Neither choice changes a value (rows never share arithmetic)."""
        if n <= 8:
            return 1, 1
        rows8 = (n + 7) // 8
        cap = self.tensor_row_split_warps_per_sm * self._sm_count
        if n <= 17 and warps * rows8 <= cap:
            return 1, rows8
        return self._row_tiles(n, kw), 1

    def _row_tiles(self, n: int, kw: int) -> int:
        """NT of a one-block-row launch of ``n`` (> 8) rows: 2 up to 16 rows, 4 up to 32,
        past that ``tensor_max_row_tiles`` where the kernel is built for it (KW at most 8:
        kernels.cu MT_NT8)."""
        if n <= 16:
            return 2
        if n <= 32 or kw > 8:
            return 4
        return self.tensor_max_row_tiles

    def _tensor_product(
        self, w: CudaWeight, x2: Any, ldx: int, n: int, out: Any, width: int,
        norm: Any, eps: float, res: Any, ldr: int, act: int,
    ) -> None:  # fmt: skip
        """mt_body launches: 8-row tiles per pass (NT) follow the row count (values do not
        depend on it); MT and KW follow the weight (``_tensor_shape``)."""
        mt, kw = self._tensor_shape(w, act)
        per_block = mt * (8 if act else 16)
        xblocks = sum(
            ((seg.rows // 2 if act else seg.rows) + per_block - 1) // per_block
            for seg in w.segments
        )
        pair = len(w.segments) == 2 and not act and self.fuse_segment_pairs
        nt, gy = self._row_plan(w, n, mt, kw, xblocks, pair)
        int8 = self._int8(w)
        xp = self._xprep(x2, ldx, n, w.in_features, norm, kw, self._xprep_rows(int8), int8)

        if pair:
            a, b = w.segments
            nblk_a = (a.rows + per_block - 1) // per_block
            nblk_b = (b.rows + per_block - 1) // per_block
            self._tensor_kernel(w, nt, mt, kw, pair)(
                (nblk_a + nblk_b, gy),
                (32 * kw,),
                _pair_args(w, a, b, nblk_a, x2, ldx, n, out, width, norm, eps, res, ldr) + xp,
            )
            return
        for seg in w.segments:
            out_cols = seg.rows // 2 if act else seg.rows
            self._k(f"mt_{seg.kernel}_n{nt}_m{mt}_w{kw}", seg.kernel, int8=int8)(
                ((out_cols + per_block - 1) // per_block, gy),
                (32 * kw,),
                (
                    seg.data, np.int64(seg.row_bytes), _i32(out_cols), _i32(w.in_features),
                    x2, _i32(ldx), _i32(n), out[:, seg.col_offset :], _i32(width),
                    norm, np.float32(eps), _seg_res(res, seg), _i32(ldr), _i32(act), _i32(out_cols),
                    *xp,
                ),  # fmt: skip
            )

    def _row_plan(
        self, w: CudaWeight, n: int, mt: int, kw: int, xblocks: int, pair: bool
    ) -> tuple[int, int]:
        """``_row_passes``, and a split only while its grid fits in one wave of resident
        blocks (``tensor_row_split_one_wave``): a second wave of whole blocks costs more than
        the passes the split spreads. Neither choice changes a value."""
        nt, gy = self._row_passes(n, xblocks * kw, kw)
        if gy > 1 and self.tensor_row_split_one_wave:
            fn = self._tensor_kernel(w, 1, mt, kw, pair)
            if xblocks * gy > self._resident_blocks(fn, 0, kw):
                return self._row_tiles(n, kw), 1
        return nt, gy

    def _tensor_kernel(self, w: CudaWeight, nt: int, mt: int, kw: int, pair: bool) -> Any:
        """mt_body's kernel for ``w`` (the pair kernel of a two-type weight, else the first
        segment's): the one whose residency decides a row split."""
        int8 = self._int8(w)
        if pair:
            a, b = w.segments
            name = f"mt2_{a.kernel}_{b.kernel}_n{nt}_m{mt}_w{kw}"
            return self._k(name, f"{a.kernel}+{b.kernel}", int8=int8)
        seg = w.segments[0]
        return self._k(f"mt_{seg.kernel}_n{nt}_m{mt}_w{kw}", seg.kernel, int8=int8)

    def _xprep(
        self, x2: Any, ldx: int, n: int, k: int, norm: Any, kwg: int, min_rows: int,
        int8: bool = False,
    ) -> tuple:  # fmt: skip
        """x in the tensor cores' f16 form (``int8``: the integer form's int8 codes and group
        scales, kernels.cu xprep8), converted once for the whole product (kernels.cu
        xprep), as the launch's last three arguments; or ``_NO_XPREP`` below ``min_rows``
        rows (0: never), where every column tile converts x itself. Both give the same bits,
        so the threshold may follow the row count. ``kwg``: the consumer's warps sharing a
        row's units, the order of a fused norm's sum of squares."""
        if not min_rows or n < min_rows:
            return _NO_XPREP
        units = k // 64
        # the integer form (int8): 16 words and two group scales a unit, from xprep8
        h = cupy.empty((n, units, 16 if int8 else 32), dtype=cupy.uint32)
        s = cupy.empty((n, units, 2) if int8 else (n, units), dtype=cupy.float32)
        ss = cupy.empty((n,), dtype=cupy.float32) if norm is not None else None
        threads = min(1024, -(-4 * units // 32) * 32)
        self._k("xprep8" if int8 else "xprep")(
            (n,), (threads,), (x2, _i32(ldx), _i32(n), _i32(k), norm, _i32(kwg), h, s, ss)
        )
        return h, s, ss

    def _factored(self, w: CudaWeight) -> bool:
        """Whether ``w``'s products use the factored kernels: by weight shape only, so
        every row count of one weight runs the same kernels (batch-invariant)."""
        return self.factored_products and w.out_features <= self.factored_max_cols

    def _suffix(self, kernel: str, w: CudaWeight) -> str:
        """ "_f" for the factored kernels of a type that has them, where ``w`` takes them."""
        return "_f" if kernel in FACTORED and self._factored(w) else ""

    def _pair_product(
        self, w: CudaWeight, x2: Any, ldx: int, n: int, out: Any, width: int,
        norm: Any, eps: float, res: Any, ldr: int, tile: int, ksplit: bool,
    ) -> None:  # fmt: skip
        """Both segments of a two-type weight (Qwen q|k Q4_K + v Q6_K) in one launch
        (kernels.cu MM2_KERNEL): each column runs the mm_body its own launch would."""
        a, b = w.segments
        cols = 1 if ksplit else self._cols_per_warp(tile, w.out_features)
        per_block = 1 if ksplit else _MM_WARPS * cols
        nblk_a = (a.rows + per_block - 1) // per_block
        nblk_b = (b.rows + per_block - 1) // per_block
        pair = f"{a.kernel}+{b.kernel}"
        suffix = "_f" if self._factored(w) else ""

        self._k(f"mm2_{a.kernel}_{b.kernel}_r{tile}_c{cols}{suffix}", pair)(
            (nblk_a + nblk_b,),
            (32 * _MM_WARPS,),
            _pair_args(w, a, b, nblk_a, x2, ldx, n, out, width, norm, eps, res, ldr)
            + (_i32(int(ksplit)),),
        )

    def _cols_per_warp(self, tile: int, out_cols: int, gated: bool = False) -> int:
        """Weight columns per warp: several only when the launch still fills the chip.

        Any choice gives bit-identical values (it moves work between warps, not the
        order of a reduction), so this is purely a speed decision. Gated products take
        gate/up pairs: 2 or 4 columns.
        """
        # one or two rows: wide only for very large grids (the output head), where four
        # columns' weight loads in flight per warp beat one (measured in bench_device)
        need = (
            self.wide_min_blocks_per_sm * self._sm_count
            if tile > 2
            else self.wide_min_blocks_one_row * self._sm_count
        )
        if gated:  # at one row 2 pairs per warp measured slower (19.3 vs 20.5 us, Qwen-1.5B)
            return 4 if tile > 2 and out_cols // (_MM_WARPS * 2) >= need else 2
        return _COLS_PER_WARP if out_cols // (_MM_WARPS * _COLS_PER_WARP) >= need else 1

    def rms_norm(self, x: Array, weight: Any, eps: float) -> Any:
        d = int(x.shape[-1])
        x2, ldx = self._rows(x, d)
        rows = int(x2.shape[0])
        out = cupy.empty(tuple(x.shape), dtype=cupy.float32)
        if rows:
            self._k("rms_norm")(
                (rows,), (256,), (x2, _i32(ldx), weight, _i32(d), np.float32(eps), out)
            )
        return out

    def rope(self, x: Array, positions: Any, base: float, neox: bool) -> Any:
        n, heads, hd = (int(s) for s in x.shape)
        x2, ldx = self._rows(x.reshape(n, heads * hd), heads * hd)
        pos = self.device_ints(positions)
        out = cupy.empty((n, heads, hd), dtype=cupy.float32)
        total = n * heads * (hd // 2)
        if total:
            blocks = min((total + 255) // 256, 4 * self._sm_count)
            self._k("rope")(
                (blocks,),
                (256,),
                (
                    x2,
                    _i32(ldx),
                    pos,
                    _i32(n),
                    _i32(heads),
                    _i32(hd),
                    np.float64(base),
                    _i32(int(neox)),
                    out,
                ),
            )
        return out

    def rope_store(
        self, q, k, v, positions, start, base: float, neox: bool, k_cache, v_cache
    ) -> Any:
        """rope(q), and rope(k) / v written to the caches at ``positions``: one launch.

        Rows go to cache[positions[i]] (``start`` is positions[0] by the op's contract
        and not needed): the write position stays out of the launch arguments, so a
        captured graph stays valid for every step.
        """
        n, heads, hd = (int(s) for s in q.shape)
        kvh = int(k.shape[1])
        q2, ldq = self._rows(q.reshape(n, heads * hd), heads * hd)
        k2, ldk = self._rows(k.reshape(n, kvh * hd), kvh * hd)
        v2, ldv = self._rows(v.reshape(n, kvh * hd), kvh * hd)
        pos = self.device_ints(positions)
        out = cupy.empty((n, heads, hd), dtype=cupy.float32)
        total = n * (heads + kvh) * (hd // 2) + n * kvh * hd
        if total:
            blocks = min((total + 255) // 256, 4 * self._sm_count)
            self._k("rope_store")(
                (blocks,),
                (256,),
                (
                    q2,
                    _i32(ldq),
                    k2,
                    _i32(ldk),
                    v2,
                    _i32(ldv),
                    pos,
                    _i32(n),
                    _i32(heads),
                    _i32(kvh),
                    _i32(hd),
                    np.float64(base),
                    _i32(int(neox)),
                    out,
                    k_cache,
                    v_cache,
                ),
            )
        return out

    def split_size(self, head_dim: int) -> int:
        """Keys per attention split: fixed, never chosen per call (batch invariance).

        32 keys (one per lane) gives many short blocks: at 2k context the GPU has
        ~100+ blocks in flight instead of a few long ones (measured 28 µs with 128).
        """
        return self.attn_split

    def attention(self, q, k_cache, v_cache, positions, window, scale) -> Any:
        call, out = self._attention_call(q, k_cache, v_cache, positions, window, scale)
        if call is None:
            return out
        if self._tensor_attention(call):
            self._attention_tc(call)
        else:
            self._attention_cc(call)
        self._attention_combine(call, out)
        return out

    def _tensor_attention(self, c: _AttnCall) -> bool:
        """Whether pass 1 runs on the tensor cores: by the model's shape only (the GQA
        group), never by the row count, since the two families differ in their bits."""
        if c.split != 32:
            return False
        group = c.heads // c.kvh
        return self.tensor_attention or 0 < self.tensor_attention_min_group <= group

    def _attention_call(
        self, q: Any, k_cache: Any, v_cache: Any, positions: Any, window: int, scale: float
    ) -> tuple[_AttnCall | None, Any]:
        """The arrays and sizes both passes take, and the output (no call for zero rows)."""
        n, heads, hd = (int(s) for s in q.shape)
        cap, kvh, _ = (int(s) for s in k_cache.shape)
        if hd % 32 or hd > 256 or heads % kvh:
            raise EcholineError(
                f"CUDA attention needs head_dim a multiple of 32 up to 256 (got {hd})"
            )
        q2, ldq = self._rows(q.reshape(n, heads * hd), heads * hd)
        pos = self.device_ints(positions)
        split = self.split_size(hd)
        nsplit = (cap + split - 1) // split
        out = cupy.empty((n, heads * hd), dtype=cupy.float32)
        if n == 0:
            return None, out
        call = _AttnCall(
            q2, ldq, k_cache, v_cache, pos, n, heads, kvh, hd, split, nsplit,
            max(0, int(window)), float(scale),
            cupy.empty((n, heads, nsplit, hd), dtype=cupy.float32),
            cupy.empty((n, heads, nsplit), dtype=cupy.float32),
            cupy.empty((n, heads, nsplit), dtype=cupy.float32),
        )  # fmt: skip
        return call, out

    def _attention_combine(self, c: _AttnCall, out: Any) -> None:
        """Pass 2: each (row, head)'s splits merged in a fixed order (kernels.cu attn_combine)."""
        self._k("attn_combine")(
            (c.heads, c.n),
            (256,),
            (
                c.opart, c.mpart, c.lpart, c.pos, _i32(c.heads), _i32(c.hd), _i32(c.split),
                _i32(c.window), _i32(c.nsplit), out,
            ),  # fmt: skip
        )

    def _attention_tc(self, c: _AttnCall) -> None:
        """Pass 1 on the tensor cores (kernels.cu attn_tc_body): blocks of 8 warps on one
        sixteen-item tile while the call has at most ``tensor_attention_w8_max_tiles`` tiles
        a kv head (one-row decode: few blocks, so the shorter path per block); from
        ``tensor_attention_pairs_min_tiles`` tiles, blocks of two tiles that share one
        staging of the split's K and V; else 4 warps on one tile. The same bits in every
        form, so the choice may follow the row count."""
        items = c.n * (c.heads // c.kvh)
        tiles = (items + 15) // 16
        pairs = 0 < self.tensor_attention_pairs_min_tiles <= tiles
        if tiles <= self.tensor_attention_w8_max_tiles:
            suffix, warps, per_block = "_w8", 8, 1
        elif pairs:
            suffix, warps, per_block = "_t2", 8, 2
        else:
            suffix, warps, per_block = "", 4, 1
        # K and V as f32, the tiles' q vectors as hi/lo planes, two 16 x 32 score planes a tile
        hd, split = c.hd, c.split
        smem = (split * (2 * hd + 12) + per_block * (32 * (hd + 4) + 32 * (split + 4))) * 4
        chunks = (tiles + per_block - 1) // per_block
        self._attention_pass(f"attn_tc_d{hd // 32}{suffix}", c, chunks, 32 * warps, smem)

    def _attention_cc(self, c: _AttnCall) -> None:
        """Pass 1 on the CUDA cores: a warp per (row, head) item, one key per lane; from
        ``attn_items_per_warp_min_rows`` rows a warp takes ``attn_items_per_warp`` items
        at once (kernels ``_g2`` / ``_g4``: K and V read once for all of them; splits of 32
        keys only). The same bits either way, so the choice follows the row count."""
        items = c.n * (c.heads // c.kvh)
        ipw = self.attn_items_per_warp
        if ipw not in (2, 4) or c.n < self.attn_items_per_warp_min_rows or c.split != 32:
            ipw = 1
        per_block = min(self.attn_items * ipw, _ATTN_MAX_ITEMS)
        chunks = (items + per_block - 1) // per_block
        smem = (c.split * (2 * c.hd + 1) + min(items, per_block) * c.hd) * 4
        # fewer registers for more resident blocks pays from 2 rows on and costs one-row
        # decode ~1 %: the same bits either way (kernels.cu ATTN_MINB), so it may follow n
        if ipw > 1:
            blocks = self.attn_group_min_blocks
        else:
            blocks = self.attn_min_blocks if c.n >= self.attn_min_blocks_min_rows else 1
        name = f"attn_partial_d{c.hd // 32}" + (f"_g{ipw}" if ipw > 1 else "")
        self._attention_pass(name, c, chunks, 256, smem, per_block, blocks)

    def _attention_pass(
        self, name: str, c: _AttnCall, chunks: int, threads: int, smem: int, per_block: int = 0,
        blocks: int = 1,
    ) -> None:  # fmt: skip
        """Launch pass 1 ``name`` over splits, kv heads and item chunks. The CUDA-core kernel
        (``per_block`` > 0) also takes the split size and its items per block, and is built
        for ``blocks`` resident blocks per SM; the tensor-core one has all three built in."""
        part = self._k(name, attn_blocks=blocks)
        if part.max_dynamic_shared_size_bytes < smem:
            part.max_dynamic_shared_size_bytes = smem
        split = (_i32(c.split),) if per_block else ()
        tail = (_i32(per_block),) if per_block else ()
        args = (c.q2, _i32(c.ldq), c.k_cache, c.v_cache, c.pos, _i32(c.n), _i32(c.heads))
        args += (_i32(c.kvh), *split, _i32(c.window), np.float32(c.scale), _i32(c.nsplit))
        args += (c.opart, c.mpart, c.lpart, *tail)
        # the splits vary slowest: blocks past every position are dispatched last
        grid = (chunks, c.kvh, c.nsplit)
        part(grid, (threads,), args, shared_mem=smem)

    def silu_mul(self, gate, up) -> Any:
        return self._glu(gate, up, _ACT["silu"])

    def gelu_tanh_mul(self, gate, up) -> Any:
        return self._glu(gate, up, _ACT["gelu"])

    def _glu(self, gate: Any, up: Any, act: int) -> Any:
        """act(gate) * up with the fused epilogue's arithmetic (kernels.cu act_glu)."""
        shape = tuple(gate.shape)
        width = int(shape[-1])
        g2, ldg = self._rows(gate, width)
        u2, ldu = self._rows(up, width)
        n = int(g2.shape[0])
        out = cupy.empty((n, width), dtype=cupy.float32)
        total = n * width
        if total:
            blocks = min((total + 255) // 256, 4 * self._sm_count)
            self._k("glu_act")(
                (blocks,),
                (256,),
                (g2, _i32(ldg), u2, _i32(ldu), _i32(n), _i32(width), _i32(act), out),
            )
        return out.reshape(shape)

    def add(self, a, b) -> Any:
        return cupy.add(a, b, dtype=cupy.float32)

    def scale(self, x, factor: float) -> Any:
        return cupy.multiply(x, np.float32(factor), dtype=cupy.float32)

    # ---- cache storage -------------------------------------------------------------------
    def swap_buffers(self, a: Any, b: Any, rows: int | None = None) -> None:
        """One kernel (kernels.cu swap_values) per pair of buffers, over their first
        ``rows`` rows: no temporary and a third of the launches of a copy-based swap."""
        if a.shape != b.shape or not (a.flags.c_contiguous and b.flags.c_contiguous):
            super().swap_buffers(a, b, rows)
            return
        width = a.size // max(1, a.shape[0])
        n = a.size if rows is None else min(rows, a.shape[0]) * width
        if n:
            blocks = min((n + 255) // 256, 4 * self._sm_count)
            self._k("swap_values")((blocks,), (256,), (a, b, np.int64(n)))

    def empty_cache(self, capacity: int, n_kv_heads: int, head_dim: int) -> Any:
        return cupy.zeros((capacity, n_kv_heads, head_dim), dtype=cupy.float32)

    def write_cache(self, cache: Any, start: Any, rows: Any) -> None:
        """cache[start:start+n] = rows; ``start`` may also be a positions array (host or device).

        Passing the positions array (row i goes to cache[positions[i]]) keeps the write
        position out of the launch arguments, so a captured graph stays valid for
        every step: model code should prefer it.
        """
        n = int(rows.shape[0])
        width = int(cache.shape[1] * cache.shape[2])
        rows2, ldr = self._rows(rows.reshape(n, width), width)
        if isinstance(start, (int, np.integer)):
            dst, first = None, int(start)
            if first + n > cache.shape[0]:
                raise EcholineError(
                    f"cache of {cache.shape[0]} rows cannot hold rows up to {first + n}"
                )
        else:
            dst, first = self.device_ints(start), 0
        total = n * width
        if total:
            blocks = min((total + 255) // 256, 4 * self._sm_count)
            self._k("write_cache")(
                (blocks,), (256,), (cache, rows2, _i32(ldr), _i32(n), _i32(width), dst, _i32(first))
            )

    def grow_cache(self, cache: Any, capacity: int) -> Any:
        new = cupy.zeros((capacity,) + tuple(cache.shape[1:]), dtype=cache.dtype)
        new[: cache.shape[0]] = cache
        return new

    # ---- results -------------------------------------------------------------------------
    def to_host(self, x) -> np.ndarray:
        return cupy.asnumpy(x) if isinstance(x, cupy.ndarray) else np.asarray(x)

    def argmax_device(self, logits: Any, feed: tuple[Any, Any] | None = None) -> Any:
        """Greedy ids as a device int32 array (capturable: no host copy).

        Rows longer than ``ARGMAX_ONE_BLOCK_MAX`` (the vocabularies of real models) take two
        launches, parts then a warp per row (one 1,024-thread block took 12.9 µs of a Qwen
        decode step); same ids either way, the lowest among equal maxima. ``feed``: the
        (ids, positions) inputs of a one-row graph, given the last row's id and the next
        position (``argmax_feed``)."""
        x2, ld = self._rows(logits, int(logits.shape[-1]))
        rows, vocab = int(x2.shape[0]), int(x2.shape[1])
        out = cupy.empty((rows,), dtype=cupy.int32)
        if not out.size:
            return out
        if vocab <= ARGMAX_ONE_BLOCK_MAX and feed is None:
            self._k("argmax_rows")((rows,), (1024,), (x2, _i32(ld), _i32(vocab), out))
            return out
        parts = (vocab + ARGMAX_CHUNK - 1) // ARGMAX_CHUNK
        pv = cupy.empty((rows, parts), dtype=cupy.float32)
        pi = cupy.empty((rows, parts), dtype=cupy.int32)
        self._k("argmax_part")((parts, rows), (256,), (x2, _i32(ld), _i32(vocab), _i32(ARGMAX_CHUNK), pv, pi))
        ids, pos = feed if feed is not None else (out, out)
        self._k("argmax_final")((rows,), (32,), (pv, pi, _i32(parts), out, _i32(feed is not None), ids, pos))
        return out

    def argmax_feed(self, logits: Any, ids_dev: Any, pos_dev: Any) -> Any:
        """Greedy ids, and a one-row graph's static inputs made the next decode step's: the
        last row's id becomes the input id and the position moves on by one, on the device,
        so the next replay needs nothing from the host (engine/step_chain.py)."""
        return self.argmax_device(logits, feed=(ids_dev, pos_dev))

    def argmax(self, logits: Array) -> np.ndarray:
        if not isinstance(logits, cupy.ndarray):
            return np.argmax(np.asarray(logits), axis=-1)
        ids = self.argmax_device(logits).get().astype(np.int64)
        return ids.reshape(tuple(logits.shape[:-1]))

    def synchronize(self) -> None:
        cupy.cuda.Device().synchronize()

    # ---- CUDA graphs ---------------------------------------------------------------------
    def run_graph(
        self,
        key: Any,
        fn: Callable[..., Any],
        inputs: Sequence[np.ndarray] | Callable[[], Sequence[np.ndarray]],
        owner: Any = None,
        generation: Hashable = None,
        fed: bool = False,
    ) -> Any:
        """fn(*device_inputs) → device array, replayed as a CUDA graph cached under ``key``.

        ``inputs`` are small host arrays (token ids, positions) with fixed shapes per
        key; they are copied into static device buffers that ``fn`` receives. The first
        call for a key runs ``fn`` eagerly (compiles kernels, fills a private memory
        pool, does the real work) and then captures it; later calls copy the inputs
        and replay. The returned array is the graph's static output: read it (argmax,
        to_host) before the next call with the same key overwrites it.

        ``fn`` must decide launch shapes from shapes only and must not read device
        values on the host (every op of this backend obeys that when it is given the
        device inputs), and write_cache must receive the positions array, not an int.
        Growing or replacing a KV cache invalidates graphs: call ``drop_graphs``, or
        pass ``owner`` (the cache: its graphs die with it) and ``generation`` (what
        identifies its buffers, e.g. capacity): a new generation drops the old graphs.

        ``fed``: the graph's static inputs already hold this call's inputs (the previous
        replay of this key wrote them on the device: ``argmax_feed``), so a replay copies
        nothing and never waits for the host. ``inputs`` may then be a callable, asked only
        when the graph must first be captured (and so run eagerly from host inputs).
        """
        store = self._graphs
        if owner is not None:
            held = self._owned.get(owner)
            if held is None or held[0] != generation:
                if held is not None:
                    self.synchronize()
                held = (generation, {})
                self._owned[owner] = held
            store = held[1]
        cached = store.get(key)
        if cached is not None and fed:
            cached.graph.launch(stream=cupy.cuda.get_current_stream())
            return cached.output
        if callable(inputs):
            inputs = inputs()
        if cached is None and GRAPH_AFTER > 1:
            # Capture only a shape that comes back: a capture costs about an eager run
            # more, and a speculative round's row count is often used once per cache
            # (chat traffic tried many widths on each new cache and ran 0.84x plain).
            # Eager and replayed runs launch the same kernels, so the bits are the same.
            uses = store.get(("uses", key), 0) + 1
            store[("uses", key)] = uses
            if uses < GRAPH_AFTER:
                return fn(*self._statics(cupy.asarray(self._pack(inputs)), inputs))
        if cached is not None:
            packed = self._pack(inputs)
            if packed.shape != cached.inputs[0].shape:
                raise EcholineError(f"graph {key!r} was captured for other input shapes")
            # One stream for everything (the caller's): graphs replayed on private streams
            # raced each other (one graph's cache writes vs the next one's reads).
            current = cupy.cuda.get_current_stream()
            cached.inputs[0].set(packed, stream=current)  # one copy for all inputs
            cached.graph.launch(stream=current)
            return cached.output
        if GRAPH_EAGER_EVERY or key not in self._eager_keys:
            return self._capture_new(store, key, fn, inputs, eager=True)
        try:
            return self._capture_new(store, key, fn, inputs, eager=False)
        except Exception as exc:  # noqa: BLE001 - a step that cannot be captured cold: the
            # eager path runs it as before (and raises again if it is a real error); the
            # reason is kept for the probes (``cold_capture_fallback``)
            self.cold_capture_fallback = f"{key!r}: {type(exc).__name__}: {exc}"
            self.synchronize()
            return self._capture_new(store, key, fn, inputs, eager=True)

    def _capture_new(self, store: dict, key: Any, fn: Callable[..., Any], inputs: Any, eager: bool) -> Any:
        """Capture ``fn`` for ``key`` into ``store`` and return this call's result, a copy
        outside the graph's pool (which dies with the cache's buffers).

        ``eager``: run ``fn`` first, then capture. A key's first capture on this backend
        needs it: the run compiles and loads the kernels, makes any lazy state outside a
        capture and does the real work. A key captured before (on another cache's buffers)
        is captured at once and replayed instead: the eager run cost about a forward more
        (~28 ms with the capture on SmolLM2, whose eager forward is host-bound), paid on
        every new cache capacity for every row count; the kernels are the same, so are the
        bits."""
        pool = cupy.cuda.MemoryPool()
        with cupy.cuda.using_allocator(pool.malloc):  # on the caller's stream
            packed = cupy.asarray(self._pack(inputs))
            statics = self._statics(packed, inputs)
            ran = fn(*statics) if eager else None
        result = None if ran is None else cupy.array(ran, copy=True)  # the default pool
        del ran
        self.synchronize()
        graph = self._store_capture(store, key, fn, packed, statics, pool)
        if eager:
            self._eager_keys.add(key)
            return result
        graph.graph.launch(stream=cupy.cuda.get_current_stream())
        return cupy.array(graph.output, copy=True)

    def _store_capture(
        self, store: dict, key: Any, fn: Callable[..., Any], packed: Any, statics: list[Any], pool: Any
    ) -> CapturedGraph:
        """Capture ``fn`` on the static inputs into ``store[key]`` (buffers from ``pool``)."""
        stream = cupy.cuda.Stream(non_blocking=True)  # capture only: nothing runs on it
        with stream, cupy.cuda.using_allocator(pool.malloc):
            output = self._capture(stream, fn, statics)
        upload = getattr(output[0], "upload", None)
        if upload is not None:  # the first replay would otherwise pay the upload (~0.5 ms)
            upload(cupy.cuda.get_current_stream())
        captured = CapturedGraph(output[0], [packed], output[1], pool, stream)
        store[key] = captured
        return captured

    @staticmethod
    def _statics(packed: Any, inputs: Sequence[np.ndarray]) -> list[Any]:
        """The packed device buffer cut back into one view per input."""
        statics, at = [], 0
        for h in inputs:
            size = int(np.size(h))
            statics.append(packed[at : at + size])
            at += size
        return statics

    @staticmethod
    def _pack(inputs: Sequence[np.ndarray]) -> np.ndarray:
        """All graph inputs as one int32 host array (one host-to-device copy per replay)."""
        return np.concatenate([np.asarray(h, dtype=np.int32).reshape(-1) for h in inputs])

    @staticmethod
    def _capture(stream: Any, fn: Callable[..., Any], statics: list[Any]) -> tuple[Any, Any]:
        """Capture fn on ``stream``; relaxed mode lets the pool grow mid-capture if it must."""
        try:
            stream.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
        except (TypeError, AttributeError):  # a CuPy without the mode argument
            stream.begin_capture()
        try:
            output = fn(*statics)
        finally:
            graph = stream.end_capture()
        return graph, output

    def has_graph(self, key: Any, owner: Any = None, generation: Hashable = None) -> bool:
        """Whether ``run_graph(key, …, owner, generation)`` would replay a captured graph."""
        if owner is None:
            return key in self._graphs
        held = self._owned.get(owner)
        return held is not None and held[0] == generation and key in held[1]

    def copy_to_host_async(self, x: Any) -> HostCopy:
        """Start copying a small int32 device array to pinned host memory; ``HostCopy.value``
        waits for it. Why: a decode step's id can travel while the next step already runs."""
        n = int(x.size)
        if n > _PINNED_SLOT:
            raise ValueError(f"copy_to_host_async takes at most {_PINNED_SLOT} values, not {n}")
        if self._pinned is None:
            mem = cupy.cuda.alloc_pinned_memory(4 * _PINNED_SLOT * _PINNED_SLOTS)
            self._pinned = (mem, np.frombuffer(mem, np.int32, _PINNED_SLOT * _PINNED_SLOTS))
        slot = self._pinned_next
        self._pinned_next = (slot + 1) % _PINNED_SLOTS
        view = self._pinned[1][slot * _PINNED_SLOT : slot * _PINNED_SLOT + n]
        stream = cupy.cuda.get_current_stream()
        x = cupy.ascontiguousarray(x, dtype=cupy.int32)
        cupy.cuda.runtime.memcpyAsync(view.ctypes.data, x.data.ptr, 4 * n,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        event = cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        return HostCopy(event, view)

    def drop_graphs(self) -> None:
        """Forget captured graphs (after a cache grows or weights change); the next capture
        of every key runs eagerly first again."""
        self.synchronize()
        self._graphs.clear()
        self._owned.clear()
        self._eager_keys.clear()
