"""GGUF files of Qwen2.5-Coder-7B's shapes, written on the GPU machine (issue 49, part 5).

Files of gigabytes cannot travel to the device (64 MiB a call), so they are made there:

- ``random``: every tensor random, in the tensor types of llama.cpp's Q4_K_M, Q5_K_M or Q8_0
  file of a 28-layer qwen2 (``llama_tensor_get_type``: Q6_K for ``output`` and, in the K
  mixes, for ``attn_v`` and ``ffn_down`` of the layers ``use_more_bits`` picks). The blocks
  are well formed and zero-mean (weights of std ~0.02), so activations stay finite in both
  engines. For timing: such a model writes noise, so speculation means nothing on it.
- ``embed``: Qwen2.5-Coder-0.5B's own function inside the 7B's shapes. Its 896 model dims,
  14 heads (2 kv heads) of 64 dims, 4,864 FFN units and 24 layers are placed in the 7B's
  3,584 dims, 28 heads (4 kv) of 128 dims, 18,944 units and 28 layers; every other weight is
  random where it cannot reach the output (it multiplies a zero, or feeds a head whose output
  projection is zero) and zero where it could (the residual stream's extra dims, the keys'
  extra head dims, the four extra layers' output projections). The RoPE pairs line up (the
  0.5B's head dim j goes to 2j: the same frequency), q is scaled by sqrt(2) for the larger
  head's 1/sqrt(128), and the norms by 1/2 for the four times wider RMS (epsilon by 1/4). So the file costs
  what a 7B costs per token and writes the 0.5B's text: speculation's acceptance is that of
  a real code model on real traffic, for both engines. Written as Q8_0 (``--type f32`` for
  the local test).

Commands (``tokenizer`` and ``shrink`` run here, the others on the device)::

    python -m tools.cuda.synth_gguf tokenizer SRC.gguf OUT.gguf     # the tokenizer keys alone
    python -m tools.cuda.synth_gguf shrink SRC.gguf OUT.gguf        # the 0.5B less its untied head
    python -m tools.cuda.synth_gguf random --mix q4_k_m --meta TOK.gguf OUT.gguf
    python -m tools.cuda.synth_gguf embed --src SMALL.gguf OUT.gguf
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType

#: Qwen2.5-Coder-7B-Instruct's hyper-parameters (its config.json), tied embeddings: no
QWEN7B = dict(layers=28, d=3584, ff=18944, heads=28, kv=4, vocab=152064, rope=1e6, eps=1e-6, ctx=32768)
#: a tiny stand-in for the local test of ``embed``
TINY = dict(layers=3, d=128, ff=384, heads=8, kv=4, vocab=104, rope=1e6, eps=1e-6, ctx=512)

SIGMA = 0.02  # std of the random weights


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule (llama-quant.cpp) for the layers whose attn_v / ffn_down get Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def mix_types(mix: str, layers: int) -> dict[str, Q]:
    """The type of every weight matrix of a qwen2 file quantized with ``mix`` by llama-quantize."""
    base = {"q4_k_m": Q.Q4_K, "q5_k_m": Q.Q5_K, "q8_0": Q.Q8_0}[mix]
    out = {"token_embd.weight": base, "output.weight": Q.Q6_K if mix != "q8_0" else Q.Q8_0}
    for i in range(layers):
        more = mix != "q8_0" and use_more_bits(i, layers)
        for name in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            out[f"blk.{i}.{name}.weight"] = base
        for name in ("attn_v", "ffn_down"):
            out[f"blk.{i}.{name}.weight"] = Q.Q6_K if more else base
    return out


# ---- random well-formed blocks ----------------------------------------------------------------


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape, 2)


def random_blocks(rng: np.random.Generator, rows: int, cols: int, q: Q) -> np.ndarray:
    """(rows, row bytes) of random ``q`` blocks whose weights are zero-mean with std ~SIGMA.

    K-quants: one 4-bit scale s per block used for every sub-block's scale and min, with
    dmin = d * (mid code), so a weight is d*s*(code - mid)."""
    elems, nbytes = gguf.GGML_QUANT_SIZES[q]
    nb = cols // elems
    raw = np.frombuffer(rng.bytes(rows * nb * nbytes), np.uint8).reshape(rows, nb, nbytes).copy()
    jitter = rng.uniform(0.5, 1.5, size=(rows, nb))
    if q == Q.Q8_0:
        raw[..., 0:2] = _f16(jitter * SIGMA / 73.9)  # uniform int8: std 73.9
    elif q in (Q.Q4_K, Q.Q5_K):
        mid = 7.5 if q == Q.Q4_K else 15.5
        s = rng.integers(1, 16, size=(rows, nb), dtype=np.uint8)
        d = jitter * SIGMA / (s * mid / math.sqrt(3))  # uniform codes: std ~ mid/sqrt(3)
        raw[..., 0:2] = _f16(d)
        raw[..., 2:4] = _f16(d * mid)
        raw[..., 4:8] = s[..., None]  # scales of sub-blocks 0-3
        raw[..., 8:12] = s[..., None]  # mins of sub-blocks 0-3
        raw[..., 12:16] = (s | (s << 4))[..., None]  # sub-blocks 4-7: low 4 bits of both
    elif q == Q.Q6_K:
        sc = rng.integers(1, 32, size=(rows, nb, 16)) * rng.choice([-1, 1], size=(rows, nb, 16))
        raw[..., 192:208] = sc.astype(np.int8).view(np.uint8)
        raw[..., 208:210] = _f16(jitter * SIGMA / (16 * 18.5))  # |sc| ~16, codes-32: std 18.5
    else:
        raise ValueError(f"no random blocks for {q.name}")
    return raw.reshape(rows, nb * nbytes)


# ---- metadata -----------------------------------------------------------------------------------


def copy_keys(w: gguf.GGUFWriter, reader: gguf.GGUFReader, vocab: int) -> None:
    """Every key of ``reader`` but the format's and the architecture's own, the token list
    padded to ``vocab`` with llama.cpp's unused ``[PADn]`` tokens (as 7B files have)."""
    for f in reader.fields.values():
        if f.name.startswith(("GGUF.", "qwen2.")) or f.name in ("general.architecture", "general.file_type"):
            continue  # the shape's own keys are written by hparams; the source's file type is not ours
        vtype = f.types[0]
        val = f.contents()
        sub = f.types[-1] if vtype == VT.ARRAY else None
        if f.name == "tokenizer.ggml.tokens":
            val = list(val) + [f"[PAD{i}]" for i in range(len(val), vocab)]
        elif f.name == "tokenizer.ggml.token_type":
            val = list(val) + [int(gguf.TokenType.UNUSED)] * (vocab - len(val))
        if f.name == "general.name":
            val = "synthetic 7B shape"
        w.add_key_value(f.name, val, vtype, sub)


def hparams(w: gguf.GGUFWriter, s: dict) -> None:
    w.add_block_count(s["layers"])
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["d"])
    w.add_feed_forward_length(s["ff"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_rope_freq_base(s["rope"])
    w.add_vocab_size(s["vocab"])


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_random(out: Path, mix: str, meta: Path, s: dict = QWEN7B, seed: int = 0) -> Path:
    """A random file of shape ``s`` in ``mix``'s tensor types, with ``meta``'s tokenizer."""
    rng = np.random.default_rng(seed)
    types = mix_types(mix, s["layers"])
    hd = s["d"] // s["heads"]
    w = gguf.GGUFWriter(str(out), "qwen2")
    hparams(w, s)
    copy_keys(w, gguf.GGUFReader(str(meta)), s["vocab"])

    def mat(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, random_blocks(rng, rows, cols, types[name]), raw_dtype=types[name])

    def vec(name: str, n: int, around: float = 1.0) -> None:
        w.add_tensor(name, (around + 0.1 * rng.standard_normal(n)).astype(np.float32))

    mat("token_embd.weight", s["vocab"], s["d"])
    vec("output_norm.weight", s["d"])
    mat("output.weight", s["vocab"], s["d"])
    for i in range(s["layers"]):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", s["d"])
        vec(p + "ffn_norm.weight", s["d"])
        mat(p + "attn_q.weight", s["heads"] * hd, s["d"])
        mat(p + "attn_k.weight", s["kv"] * hd, s["d"])
        mat(p + "attn_v.weight", s["kv"] * hd, s["d"])
        mat(p + "attn_output.weight", s["d"], s["heads"] * hd)
        mat(p + "ffn_gate.weight", s["ff"], s["d"])
        mat(p + "ffn_up.weight", s["ff"], s["d"])
        mat(p + "ffn_down.weight", s["d"], s["ff"])
        for x, n in (("q", s["heads"] * hd), ("k", s["kv"] * hd), ("v", s["kv"] * hd)):
            vec(p + f"attn_{x}.bias", n, around=0.0)
    _finish(w)
    return out


# ---- a small model inside the large shapes ----------------------------------------------------


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """(rows, cols) float32 -> (rows, row bytes) Q8_0 blocks (llama.cpp's rounding: d = amax/127)."""
    rows, cols = x.shape
    b = x.reshape(rows, cols // 32, 32)
    d = np.abs(b).max(axis=2) / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    qs = np.rint(b * inv[..., None]).astype(np.int8)
    out = np.empty((rows, cols // 32, 34), np.uint8)
    out[..., 0:2] = _f16(d)
    out[..., 2:] = qs.view(np.uint8)
    return out.reshape(rows, -1)


def _dequant(t) -> np.ndarray:
    """A reader tensor as float32 (rows, cols)."""
    shape = [int(x) for x in reversed(t.shape)]
    if t.tensor_type in (Q.F32, Q.F16):
        return np.asarray(t.data, np.float32).reshape(shape)
    return gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)


def _src_shape(reader: gguf.GGUFReader) -> dict:
    f = {k: reader.fields[k].contents() for k in reader.fields if k.startswith("qwen2.")}
    return dict(
        layers=int(f["qwen2.block_count"]), d=int(f["qwen2.embedding_length"]),
        ff=int(f["qwen2.feed_forward_length"]), heads=int(f["qwen2.attention.head_count"]),
        kv=int(f["qwen2.attention.head_count_kv"]), rope=float(f["qwen2.rope.freq_base"]),
        eps=float(f["qwen2.attention.layer_norm_rms_epsilon"]),
    )


def head_rows(src_heads: int, src_hd: int, dst_hd: int) -> np.ndarray:
    """Destination row of each source row of a q/k/v projection: head h's dim j (NEOX pairs
    j, j + hd/2) goes to head h's dim j*r (r = dst_hd/src_hd), the pair with the same
    RoPE frequency; the head's other dims stay unused."""
    r = dst_hd // src_hd
    half = src_hd // 2
    j = np.arange(src_hd)
    within = np.where(j < half, j * r, (j - half) * r + dst_hd // 2)
    return (np.arange(src_heads)[:, None] * dst_hd + within[None, :]).reshape(-1)


def write_embedded(out: Path, src: Path, s: dict = QWEN7B, qtype: str = "q8_0", seed: int = 0,
                   threads: int = 16) -> Path:
    """``src`` (a qwen2 model) computed inside the shapes ``s``; see the module docstring."""
    reader = gguf.GGUFReader(str(src))
    c = _src_shape(reader)
    shd, dhd = c["d"] // c["heads"], s["d"] // s["heads"]
    r = dhd // shd
    assert dhd == r * shd and c["heads"] <= s["heads"] and c["kv"] <= s["kv"], (c, s)
    assert c["heads"] // c["kv"] == s["heads"] // s["kv"], "GQA groups must be the same size"
    assert c["layers"] <= s["layers"] and c["d"] <= s["d"] and c["ff"] <= s["ff"]
    assert c["rope"] == s["rope"]
    t = {x.name: x for x in reader.tensors}
    src_vocab = int(t["token_embd.weight"].shape[1])
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(1 << 22) * SIGMA).astype(np.float32)

    def noise(rows: int, cols: int) -> np.ndarray:
        start = int(rng.integers(0, pool.size))
        return np.resize(np.roll(pool, -start), rows * cols).reshape(rows, cols)

    qrows = head_rows(c["heads"], shd, dhd)
    kvrows = head_rows(c["kv"], shd, dhd)
    d0, ff0 = c["d"], c["ff"]
    norm_scale = math.sqrt(d0 / s["d"])  # RMS over d dims of a vector with d0 nonzero ones
    s = dict(s, eps=c["eps"] * d0 / s["d"])  # and the same epsilon inside that mean

    def tensors() -> list[tuple[str, object]]:
        """(name, builder) in file order; a builder returns the float32 array."""
        out: list[tuple[str, object]] = []

        def embd() -> np.ndarray:
            e = np.zeros((s["vocab"], s["d"]), np.float32)  # residual dims past d0 stay 0
            e[:src_vocab, :d0] = _dequant(t["token_embd.weight"])
            return e

        def head() -> np.ndarray:
            h = noise(s["vocab"], s["d"])  # its extra columns multiply zeros
            h[:, :d0] = 0.0
            name = "output.weight" if "output.weight" in t else "token_embd.weight"
            h[:src_vocab, :d0] = _dequant(t[name])
            return h

        out.append(("token_embd.weight", embd))
        out.append(("output_norm.weight", lambda: _norm("output_norm.weight")))
        out.append(("output.weight", head))
        for i in range(s["layers"]):
            out.extend((f"blk.{i}.{n}", (lambda i=i, n=n: layer(i, n))) for n in (
                "attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight",
                "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                "ffn_down.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias"))
        return out

    def _norm(name: str) -> np.ndarray:
        v = np.ones(s["d"], np.float32)  # dims past d0 hold zeros: any weight
        v[:d0] = _dequant(t[name]).reshape(-1) * norm_scale
        return v

    def layer(i: int, n: int) -> np.ndarray:
        real = i < c["layers"]
        p = f"blk.{i}."
        hd_q, hd_kv = s["heads"] * dhd, s["kv"] * dhd
        if n.endswith("norm.weight"):
            return _norm(p + n) if real else np.ones(s["d"], np.float32)
        if n in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_q.bias", "attn_k.bias",
                 "attn_v.bias"):
            x = n.split(".")[0][-1]
            rows = qrows if x == "q" else kvrows
            nrows = hd_q if x == "q" else hd_kv
            bias = n.endswith("bias")
            m = noise(nrows, 1 if bias else s["d"])
            if x == "k":  # keys of the unused head dims must be 0: q's there are noise
                used = np.zeros(nrows, bool)
                used[rows] = True
                used[c["kv"] * dhd:] = True  # whole extra kv heads: only extra q heads read them
                m[~used] = 0.0
            if real:
                w = _dequant(t[p + n]).reshape(len(rows), -1)
                if x == "q":
                    w = w * math.sqrt(r)  # the larger head's 1/sqrt(dhd)
                if bias:
                    m[rows, 0] = w[:, 0]
                else:  # its columns past d0 multiply zeros: they keep their noise
                    m[rows, :d0] = w
            return m[:, 0] if bias else m
        if n == "attn_output.weight":
            m = np.zeros((s["d"], hd_q), np.float32)  # output of every unused head: 0
            if real:
                m[:d0, qrows] = _dequant(t[p + n])
            return m
        if n in ("ffn_gate.weight", "ffn_up.weight"):
            m = noise(s["ff"], s["d"])  # extra units: their down columns are 0
            if real:
                m[:ff0, :d0] = _dequant(t[p + n])
            return m
        if n == "ffn_down.weight":
            m = np.zeros((s["d"], s["ff"]), np.float32)
            if real:
                m[:d0, :ff0] = _dequant(t[p + n])
            return m
        raise KeyError(n)

    w = gguf.GGUFWriter(str(out), "qwen2")
    hparams(w, s)
    copy_keys(w, reader, s["vocab"])

    def build(item: tuple[str, object]) -> tuple[str, np.ndarray]:
        name, fn = item
        a = fn()  # type: ignore[operator]
        if a.ndim == 2 and qtype == "q8_0":
            return name, quantize_q8_0(a)
        return name, a

    items = tensors()
    with ThreadPoolExecutor(threads) as ex:
        for name, a in ex.map(build, items):
            if a.ndim == 2 and qtype == "q8_0":
                w.add_tensor(name, a, raw_dtype=Q.Q8_0)
            else:
                w.add_tensor(name, a)
    _finish(w)
    return out


# ---- local steps ---------------------------------------------------------------------------------


def write_tokenizer(src: Path, out: Path) -> Path:
    """The keys of ``src`` but its hyper-parameters and tensors: a few MB that travel."""
    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(out), "qwen2")
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    copy_keys(w, reader, vocab)
    _finish(w)
    return out


def shrink(src: Path, out: Path) -> Path:
    """``src`` without ``output.weight`` when the embedding is tied (Qwen2.5-0.5B's file holds
    both, the same weights at Q8_0 and Q5_0): its own tensors, unchanged, in 347 MB, not 469."""
    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(out), "qwen2")
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        w.add_key_value(f.name, f.contents(), f.types[0], f.types[-1] if f.types[0] == VT.ARRAY else None)
    for t in reader.tensors:
        if t.name == "output.weight":
            continue
        data = np.asarray(t.data)
        if t.tensor_type in (Q.F32, Q.F16):
            w.add_tensor(t.name, data.reshape([int(x) for x in reversed(t.shape)]))
        else:
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    _finish(w)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("tokenizer", "shrink"):
        p = sub.add_parser(name)
        p.add_argument("src", type=Path)
        p.add_argument("out", type=Path)
    p = sub.add_parser("random")
    p.add_argument("--mix", default="q4_k_m", choices=("q4_k_m", "q5_k_m", "q8_0"))
    p.add_argument("--meta", type=Path, required=True)
    p.add_argument("out", type=Path)
    p = sub.add_parser("embed")
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--type", default="q8_0", choices=("q8_0", "f32"))
    p.add_argument("out", type=Path)
    a = ap.parse_args()
    t0 = time.perf_counter()
    if a.cmd == "tokenizer":
        write_tokenizer(a.src, a.out)
    elif a.cmd == "shrink":
        shrink(a.src, a.out)
    elif a.cmd == "random":
        write_random(a.out, a.mix, a.meta)
    else:
        write_embedded(a.out, a.src, qtype=a.type)
    print(f"{a.cmd}: {a.out} {a.out.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
