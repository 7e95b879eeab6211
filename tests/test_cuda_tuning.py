"""CudaTuning: the CUDA backend's speed choices (no CuPy needed to test them)."""

from __future__ import annotations

from dataclasses import fields

from echoline.engine.backends.cuda_tuning import CudaTuning, install_tuned_attributes


def test_environment_overrides_take_only_well_formed_values() -> None:
    assert CudaTuning.from_env({}) == CudaTuning()
    t = CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_ATTENTION": "1", "ECHOLINE_CUDA_TENSOR_UNITS": "2"})
    assert t.tensor_attention is True and t.tensor_units == 2
    assert CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_ATTENTION": "0"}).tensor_attention is False
    odd = CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_ATTENTION": "yes", "ECHOLINE_CUDA_TENSOR_UNITS": "3"})
    assert odd == CudaTuning()
    assert CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_WIDE": "0"}).tensor_wide is False
    assert CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_WIDE": "1"}) == CudaTuning()
    assert CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_WIDE": "off"}) == CudaTuning()
    t = CudaTuning.from_env(
        {"ECHOLINE_CUDA_TENSOR_WIDE_STAGES": "2", "ECHOLINE_CUDA_TENSOR_WIDE_PERSISTENT": "1"}
    )
    assert (t.tensor_wide_stages, t.tensor_wide_persistent) == (2, True)
    t = CudaTuning.from_env(
        {"ECHOLINE_CUDA_TENSOR_WIDE_STAGES": "0", "ECHOLINE_CUDA_TENSOR_WIDE_PERSISTENT": "yes"}
    )
    assert t == CudaTuning()
    w8 = "ECHOLINE_CUDA_TENSOR_ATTENTION_W8_MAX_TILES"
    assert CudaTuning.from_env({w8: "0"}).tensor_attention_w8_max_tiles == 0
    assert CudaTuning.from_env({w8: "9"}) == CudaTuning.from_env({w8: "x"}) == CudaTuning()


def test_wide_kernel_defaults_take_only_the_heads() -> None:
    """The staged wide kernel starts past the tensor-core column limit (the output heads,
    e.g. Qwen2.5's 151936 columns); its default tiles take the small models' heads without a
    shared-memory opt-in, and the Coder-7B's Q6_K and Q8_0 heads within one an sm_86 allows."""
    t = CudaTuning()
    assert t.tensor_wide and t.tensor_wide_min_cols == t.tensor_max_cols + 1
    assert t.tensor_wide_min_cols <= 151936
    assert t.tensor_wide_stages in (1, 2) and t.tensor_wide_max_smem <= 99 * 1024
    # Qwen2.5-0.5B's Q8_0 head (896 inputs: 952-byte rows) and 1.5B's Q6_K head (1260)
    for row_bytes in (952, 1260):
        assert t.tensor_wide_stages * 16 * row_bytes <= 48 * 1024 - 2304
    # 3584 inputs: Q6_K 14 x 210 bytes, Q8_0 112 x 34, with 2 warps' reduction (2304 bytes)
    for row_bytes in (14 * 210, 112 * 34):
        assert t.tensor_wide_stages * 16 * row_bytes + 2304 <= t.tensor_wide_max_smem


def test_wide_max_smem_from_env() -> None:
    """The wide kernel's shared-memory bound takes 48 to 227 KiB and nothing else."""
    key = "ECHOLINE_CUDA_TENSOR_WIDE_MAX_SMEM_KIB"
    assert CudaTuning.from_env({key: "48"}).tensor_wide_max_smem == 48 * 1024
    assert CudaTuning.from_env({key: "227"}).tensor_wide_max_smem == 227 * 1024
    for bad in ("47", "228", "x", ""):
        assert CudaTuning.from_env({key: bad}).tensor_wide_max_smem == CudaTuning().tensor_wide_max_smem


def assert_env_pair(keys: tuple[str, str], fields: tuple[str, str], good: tuple[str, str], bad: tuple[str, ...]) -> None:
    """Two settings read from the environment: ``good`` values set both fields, each of ``bad``
    (given to both) leaves every setting at its default."""
    t = CudaTuning.from_env(dict(zip(keys, good, strict=True)))
    assert tuple(getattr(t, f) for f in fields) == tuple(int(v) for v in good)
    for value in bad:
        assert CudaTuning.from_env(dict.fromkeys(keys, value)) == CudaTuning()


def test_wide_warps_and_row_groups_from_env() -> None:
    """The wide kernel's warps per tile and row groups take 1, 2 or 4 and nothing else."""
    assert_env_pair(("ECHOLINE_CUDA_TENSOR_WIDE_WARPS", "ECHOLINE_CUDA_TENSOR_WIDE_ROW_GROUPS"),
                    ("tensor_wide_warps", "tensor_wide_row_groups"), ("2", "4"), ("3", "8", "0", "two"))
    assert CudaTuning().tensor_wide_warps in (1, 2, 4) and CudaTuning().tensor_wide_row_groups in (1, 2, 4)


def test_backend_attributes_read_and_write_the_tuning() -> None:
    @install_tuned_attributes
    class Holder:
        def __init__(self) -> None:
            self.tuning = CudaTuning()

    a, b = Holder(), Holder()
    for f in fields(CudaTuning):
        assert getattr(a, f.name) == getattr(a.tuning, f.name)
        assert getattr(Holder, f.name) == f.default  # the class reads the defaults
    a.tensor_products = False
    a.attn_split = 64
    assert a.tuning.tensor_products is False and a.tuning.attn_split == 64
    assert b.tensor_products is True and b.attn_split == 32  # per instance, not shared


def test_split_k_knobs_and_defaults() -> None:
    """The split-K tensor products take the rows the other tensor kernels leave (from
    ``tensor_max_in`` on: Qwen's 4864- and 8960-input down projections); their environment
    overrides take only 0|1 and 2|4 (the warps per block the module builds)."""
    t = CudaTuning()
    assert t.tensor_split and t.tensor_split_min_in == t.tensor_max_in <= 4864
    assert t.tensor_split_warps in (2, 4)
    assert CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_SPLIT": "0"}).tensor_split is False
    assert CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_SPLIT_WARPS": "2"}).tensor_split_warps == 2
    odd = {"ECHOLINE_CUDA_TENSOR_SPLIT": "no", "ECHOLINE_CUDA_TENSOR_SPLIT_WARPS": "8"}
    assert CudaTuning.from_env(odd) == CudaTuning()


def test_split_k_cluster_and_units_overrides() -> None:
    t = CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_SPLIT_CLUSTER": "0", "ECHOLINE_CUDA_TENSOR_SPLIT_UNITS": "2"})
    assert t.tensor_split_cluster is False and t.tensor_split_units == 2
    assert CudaTuning().tensor_split_units == 1
    odd = {"ECHOLINE_CUDA_TENSOR_SPLIT_CLUSTER": "on", "ECHOLINE_CUDA_TENSOR_SPLIT_UNITS": "4"}
    assert CudaTuning.from_env(odd) == CudaTuning()


def test_xprep_thresholds_and_overrides() -> None:
    """xprep row thresholds: numbers only (0 turns it off), anything else keeps the default."""
    t = CudaTuning()
    assert t.tensor_xprep_min_rows >= 0 and t.tensor_xprep_wide_min_rows >= 0
    got = CudaTuning.from_env(
        {"ECHOLINE_CUDA_XPREP_MIN_ROWS": "0", "ECHOLINE_CUDA_XPREP_WIDE_MIN_ROWS": "17"}
    )
    assert (got.tensor_xprep_min_rows, got.tensor_xprep_wide_min_rows) == (0, 17)
    for odd in ("-1", "on", "1e3", "99999", ""):
        assert CudaTuning.from_env({"ECHOLINE_CUDA_XPREP_MIN_ROWS": odd}) == CudaTuning()


def test_min_blocks_override() -> None:
    assert CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_MIN_BLOCKS": "5"}).tensor_min_blocks == 5
    for odd in ("0", "9", "five"):
        assert CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_MIN_BLOCKS": odd}) == CudaTuning()


def test_min_units_per_warp_override() -> None:
    assert CudaTuning().tensor_min_units_per_warp in (1, 2)
    got = CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_MIN_UNITS_PER_WARP": "1"})
    assert got.tensor_min_units_per_warp == 1
    assert CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_MIN_UNITS_PER_WARP": "3"}) == CudaTuning()


def test_attention_items_per_warp_override() -> None:
    """Items per warp of the grouped attention kernels: 1, 2 or 4 (kernels built for those),
    anything else keeps the default; its resident blocks are a digit 1-8."""
    for value in ("1", "2", "4"):
        t = CudaTuning.from_env({"ECHOLINE_CUDA_ATTN_ITEMS_PER_WARP": value})
        assert t.attn_items_per_warp == int(value)
    for odd in ("3", "8", "two", ""):
        assert CudaTuning.from_env({"ECHOLINE_CUDA_ATTN_ITEMS_PER_WARP": odd}) == CudaTuning()
    t = CudaTuning.from_env({"ECHOLINE_CUDA_ATTN_GROUP_MIN_BLOCKS": "2"})
    assert t.attn_group_min_blocks == 2
    assert CudaTuning.from_env({"ECHOLINE_CUDA_ATTN_GROUP_MIN_BLOCKS": "9"}) == CudaTuning()


def test_int8_form_override() -> None:
    """The integer form of the tensor-core products: forced for every weight by "1" only,
    by default for weights of the 7B's size (both sides at least 3584) and larger; its x
    quantized once per product from one row; the thresholds take numbers only."""
    t = CudaTuning()
    assert t.tensor_int8 is False and t.tensor_int8_min_dim == 3584
    assert t.tensor_int8_xprep_min_rows == 1
    assert CudaTuning.from_env({"ECHOLINE_CUDA_INT8": "1"}).tensor_int8 is True
    got = CudaTuning.from_env(
        {"ECHOLINE_CUDA_INT8_MIN_DIM": "0", "ECHOLINE_CUDA_INT8_XPREP_MIN_ROWS": "0"}
    )
    assert (got.tensor_int8_min_dim, got.tensor_int8_xprep_min_rows) == (0, 0)
    for odd in ("yes", "2", "", "-1"):
        assert CudaTuning.from_env({"ECHOLINE_CUDA_INT8": odd}) == CudaTuning()
        assert CudaTuning.from_env({"ECHOLINE_CUDA_INT8_MIN_DIM": odd + "x"}) == CudaTuning()


def test_int8_few_row_products_override() -> None:
    """The integer form's CUDA-core products (kernels.cu mtv) take one row by default (two
    and four measured no faster); 0 turns them off; only 0-4 are taken."""
    assert CudaTuning().tensor_int8_mv_rows == 1
    for rows in ("0", "2", "4"):
        got = CudaTuning.from_env({"ECHOLINE_CUDA_INT8_MV_ROWS": rows})
        assert got.tensor_int8_mv_rows == int(rows)
    for odd in ("5", "-1", "one", ""):
        assert CudaTuning.from_env({"ECHOLINE_CUDA_INT8_MV_ROWS": odd}) == CudaTuning()


def test_int8_many_row_products_override() -> None:
    """The integer form's staged many-row products (kernels.cu mtb) take a row count from
    which they run (17 by default: a verify past 16 rows; 0: never); only digits are taken."""
    assert CudaTuning().tensor_int8_batch_min_rows == 17
    for rows in ("0", "24", "33"):
        got = CudaTuning.from_env({"ECHOLINE_CUDA_INT8_BATCH_MIN_ROWS": rows})
        assert got.tensor_int8_batch_min_rows == int(rows)
    for odd in ("-1", "many", "", "1e3"):
        assert CudaTuning.from_env({"ECHOLINE_CUDA_INT8_BATCH_MIN_ROWS": odd}) == CudaTuning()


def test_int8_many_row_weight_rows_override() -> None:
    """Their weight rows a block: 32 by default (the mtb kernels), 64 on the mtbw ones; no
    other value is taken."""
    assert CudaTuning().tensor_int8_batch_weight_rows == 32
    got = CudaTuning.from_env({"ECHOLINE_CUDA_INT8_BATCH_WEIGHT_ROWS": "64"})
    assert got.tensor_int8_batch_weight_rows == 64
    for odd in ("48", "128", "", "sixty-four"):
        assert CudaTuning.from_env({"ECHOLINE_CUDA_INT8_BATCH_WEIGHT_ROWS": odd}) == CudaTuning()


def test_row_pass_settings_from_env() -> None:
    """The kernels past 16 rows: their register bound takes 1-8 and their tiles per pass 4 or
    8, nothing else; both off by default (the modules as before)."""
    assert_env_pair(("ECHOLINE_CUDA_TENSOR_MIN_BLOCKS_ROWS", "ECHOLINE_CUDA_TENSOR_MAX_ROW_TILES"),
                    ("tensor_min_blocks_rows", "tensor_max_row_tiles"), ("3", "8"), ("0", "9", "2.5", "x"))
    assert (CudaTuning().tensor_min_blocks_rows, CudaTuning().tensor_max_row_tiles) == (0, 4)


def test_row_pass_module_suffixes() -> None:
    """"@t8" and "@rN" reach the kernel source as MT_ROW_TILES8 and MT_MINB_ROWS (defined
    before the file's defaults, which they override); a module without them defines neither."""
    from echoline.kernels.cuda import kernel_source

    src = kernel_source("q4_k@i1@b5@r3@t8")
    head = src[: src.index("#ifndef MT_UNITS")]
    assert "#define MT_ROW_TILES8 8" in head and "#define MT_MINB_ROWS 3" in head and "#define MT_MINB 5" in head
    plain = kernel_source("q4_k@i1@b5")
    assert "#define MT_ROW_TILES8 8" not in plain and "#define MT_MINB_ROWS 3" not in plain
    assert "#define MT_ROW_TILES8 0" in plain and "#define MT_MINB_ROWS 0" in plain  # the defaults


def test_wide_many_row_module_suffix() -> None:
    """"@w1" reaches the kernel source as MTB_WIDE (the mtbw kernels are built only there, in
    place of the mtb ones)."""
    from echoline.kernels.cuda import kernel_source

    src = kernel_source("q8_0@i1@b5@w1")
    assert "#define MTB_WIDE 1" in src[: src.index("#ifndef MT_UNITS")]
    assert "#define MTB_WIDE 1" not in kernel_source("q8_0@i1@b5")
    assert "MTB_ALL(NAME, QT) MTB_SET(mtbw, NAME, QT, 2)\n" in src  # what MTB_WIDE makes of MTB_ALL


def test_signed_codes_setting_and_module_suffix() -> None:
    """On by default (measured faster, the same bits); ECHOLINE_CUDA_INT8_SIGNED takes 0 or 1
    only; "@s1" reaches the kernel source as MT_SIGNED."""
    from echoline.kernels.cuda import kernel_source

    assert CudaTuning().tensor_int8_signed_codes is True
    assert CudaTuning.from_env({"ECHOLINE_CUDA_INT8_SIGNED": "0"}).tensor_int8_signed_codes is False
    assert CudaTuning.from_env({"ECHOLINE_CUDA_INT8_SIGNED": "1"}) == CudaTuning()
    for odd in ("2", "yes", ""):
        assert CudaTuning.from_env({"ECHOLINE_CUDA_INT8_SIGNED": odd}) == CudaTuning()
    src = kernel_source("q8_0@i1@b5@s1")
    assert "#define MT_SIGNED 1" in src[: src.index("#ifndef MT_UNITS")]
    assert "#define MT_SIGNED 1" not in kernel_source("q8_0@i1@b5")


def test_ptxas_register_report_of_the_row_pass_builds() -> None:
    """``tools.cuda.ptxas_regs`` (where nvcc is installed): the two-tile kernel of four 8-row
    tiles a pass spills at the default bound and not under "@r3", and "@t8" adds the
    eight-tile kernels."""
    import shutil

    import pytest

    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    from tools.cuda.ptxas_regs import kernel_registers

    default = kernel_registers("q4_k@i1@b5")
    bounded = kernel_registers("q4_k@i1@b5@r3@t8")
    assert default["mt_q4_k_n4_m2_w4"][1] > 0 and bounded["mt_q4_k_n4_m2_w4"][1] == 0
    assert "mt_q4_k_n8_m2_w4" in bounded and "mt_q4_k_n8_m2_w4" not in default
    assert default["mt_q4_k_n1_m1_w4"] == bounded["mt_q4_k_n1_m1_w4"]  # NT 1: the same bound


def test_sass_mix_counts_opcodes_per_kernel() -> None:
    """``tools.cuda.sass_mix`` reads cuobjdump's listing: opcodes by stem, predicated ones too,
    each kernel apart; header and encoding lines are not instructions."""
    from tools.cuda.sass_mix import opcode_counts

    sass = """
        code for sm_90
                Function : mtb_q8_0_s4_n4
        .headerflags    @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
                                                                          /* 0x000fe40000000800 */
        /*0010*/                   IMMA.16832.U8.S8 R40, R36.ROW, R28.COL, RZ ;
        /*0020*/              @!P2 LDGSTS.E.BYPASS.128 [R7], desc[UR14][R4.64] ;
        /*0030*/               @P1 IMMA.16832.S8.S8 R32, R96.ROW, R28.COL, RZ ;
                Function : mtv_q8_0_r1
        /*0000*/                   IDP.4A.S8.S8 R5, R4, R6, R5 ;
"""
    got = opcode_counts(sass)
    assert got["mtb_q8_0_s4_n4"] == {"LDC": 1, "IMMA": 2, "LDGSTS": 1}
    assert got["mtv_q8_0_r1"] == {"IDP": 1}
