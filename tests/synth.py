"""Tiny synthetic GGUF models written with gguf's own writer, for every architecture.

Random weights, real layouts: what the engine must load and compute exactly,
at sizes a test runs in milliseconds. K-quant blocks (which gguf cannot
quantize) are random bytes with sane half-float scales, which is all a
layout test needs.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
GGUF_QUANTIZABLE = (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)
K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
#: non-linear 4-bit types gguf can read but not write: random indices and scales, a sane d
IQ_QUANTS = (Q.IQ4_NL, Q.IQ4_XS)


def random_kquant_rows(rng: np.random.Generator, rows: int, cols: int, qtype: Q) -> np.ndarray:
    """Valid K-quant (or IQ4) blocks: random bytes with the half-float scale fields set small."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = cols // block_elems
    raw = rng.integers(0, 256, size=(rows, n_blocks, block_bytes), dtype=np.uint8)
    d = rng.uniform(0.002, 0.01, size=(rows, n_blocks)).astype(np.float16).view(np.uint8)
    dmin = rng.uniform(0.001, 0.005, size=(rows, n_blocks)).astype(np.float16).view(np.uint8)
    d = d.reshape(rows, n_blocks, 2)
    dmin = dmin.reshape(rows, n_blocks, 2)
    if qtype in IQ_QUANTS:
        raw[..., 0:2] = d  # the rest (indices; IQ4_XS: 6-bit sub-block scales) is any bytes
    elif qtype == Q.Q6_K:
        raw[..., block_bytes - 2 :] = d  # d is the last field of a Q6_K block
        scales = raw[..., 192:208].view(np.int8)
        scales[...] = rng.integers(-32, 32, size=scales.shape, dtype=np.int8)
    else:
        raw[..., 0:2] = d
        raw[..., 2:4] = dmin
    return raw.reshape(rows, n_blocks * block_bytes)


def encode_matrix(rng: np.random.Generator, rows: int, cols: int, qtype: Q, scale: float = 0.05):
    """(data, raw_dtype) for GGUFWriter.add_tensor: float weights quantized, or K-quant bytes."""
    if qtype in K_QUANTS or qtype in IQ_QUANTS:
        return random_kquant_rows(rng, rows, cols, qtype), qtype
    w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    if qtype == Q.F32:
        return w, None
    if qtype == Q.F16:
        return w.astype(np.float16), None
    return gguf.quants.quantize(w, qtype), qtype


def write_model(
    path: Path,
    arch: str = "llama",
    *,
    qtype: Q = Q.Q8_0,
    n_layers: int = 2,
    d_model: int = 64,
    n_ff: int = 128,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    head_dim: int | None = None,
    vocab: int = 96,
    context: int = 512,
    sliding_window: int = 8,
    tied: bool = True,
    seed: int = 0,
) -> Path:
    """Write a random ``arch`` model; K-quant types need d_model and n_ff multiples of 256."""
    rng = np.random.default_rng(seed)
    hd = head_dim or d_model // n_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layers)
    w.add_context_length(context)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    if head_dim is not None:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if arch == "gemma3":
        w.add_sliding_window(sliding_window)

    def mat(name: str, rows: int, cols: int, q: Q = qtype) -> None:
        data, raw = encode_matrix(rng, rows, cols, q)
        if raw is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=raw)

    def vec(name: str, n: int, around: float = 1.0) -> None:
        w.add_tensor(name, (around + 0.1 * rng.standard_normal(n)).astype(np.float32))

    # Embedding rows are quantized in blocks of 32 even for K-quant models (as real files do).
    emb_q = Q.Q8_0 if qtype in K_QUANTS else qtype
    mat("token_embd.weight", vocab, d_model, emb_q)
    if not tied:
        mat("output.weight", vocab, d_model, emb_q)
    vec("output_norm.weight", d_model)
    for i in range(n_layers):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", d_model)
        vec(p + "ffn_norm.weight", d_model)
        mat(p + "attn_q.weight", n_heads * hd, d_model)
        mat(p + "attn_k.weight", n_kv_heads * hd, d_model)
        mat(p + "attn_v.weight", n_kv_heads * hd, d_model)
        attn_out_q = qtype if (n_heads * hd) % gguf.GGML_QUANT_SIZES[qtype][0] == 0 else Q.Q8_0
        mat(p + "attn_output.weight", d_model, n_heads * hd, attn_out_q)
        mat(p + "ffn_gate.weight", n_ff, d_model)
        mat(p + "ffn_up.weight", n_ff, d_model)
        mat(p + "ffn_down.weight", d_model, n_ff)
        if arch == "qwen2":
            for x, n in (("q", n_heads * hd), ("k", n_kv_heads * hd), ("v", n_kv_heads * hd)):
                vec(p + f"attn_{x}.bias", n, around=0.0)
        if arch == "gemma3":
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
            vec(p + "post_attention_norm.weight", d_model)
            vec(p + "post_ffw_norm.weight", d_model)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- a FIM-shaped qwen2 model with a real byte-level BPE vocabulary --------------------------

FIM_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
FIM_MERGES = (("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"), ("d", "e"), ("de", "f"), ("r", "e"), ("re", "t"))


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (byte-level BPE token texts)."""
    from echoline.engine.tokenizer import _gpt2_byte_decoder

    table = {b: ch for ch, b in _gpt2_byte_decoder().items()}
    return [table[b] for b in range(256)]


def fim_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a Qwen2.5-Coder-shaped vocabulary in miniature:
    256 byte tokens, a few merges, then the control tokens (FIM ones included)."""
    tokens = _byte_chars() + [a + b for a, b in FIM_MERGES]
    types = [1] * len(tokens)  # normal
    tokens += list(FIM_SPECIALS)
    types += [3] * len(FIM_SPECIALS)  # control
    return tokens, types, [f"{a} {b}" for a, b in FIM_MERGES]


def write_fim_qwen2_model(path: Path, *, seed: int = 0, context: int = 2048) -> Path:
    """A random ``qwen2`` model whose GGUF carries a byte-level BPE tokenizer with
    ``<|fim_prefix|>``, ``<|fim_suffix|>``, ``<|fim_middle|>`` (ids also in the
    ``tokenizer.ggml.fim_*_token_id`` keys, as recent conversions of Qwen2.5-Coder do).

    Written in two steps: the weights with ``write_model``, then copied into a new
    file together with the tokenizer metadata (gguf's writer wants all keys first).
    """
    tokens, types, merges = fim_vocab()
    tmp = path.with_suffix(".weights.gguf")
    write_model(tmp, "qwen2", vocab=len(tokens), context=context, seed=seed, tied=False)
    reader = gguf.GGUFReader(str(tmp))
    w = gguf.GGUFWriter(str(path), "qwen2")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            continue
        w.add_key_value(field.name, field.contents(), vtype)
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ids["<|endoftext|>"])
    w.add_eos_token_id(ids["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_uint32("tokenizer.ggml.fim_pre_token_id", ids["<|fim_prefix|>"])
    w.add_uint32("tokenizer.ggml.fim_suf_token_id", ids["<|fim_suffix|>"])
    w.add_uint32("tokenizer.ggml.fim_mid_token_id", ids["<|fim_middle|>"])
    w.add_uint32("tokenizer.ggml.fim_pad_token_id", ids["<|fim_pad|>"])
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.tensor_type in (Q.F32, Q.F16):
            w.add_tensor(t.name, data.reshape([int(x) for x in reversed(t.shape)]))
        else:
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)  # bytes, shaped (rows, row bytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    del reader
    tmp.unlink()
    return path
