"""From a GGUF file to a ready-to-run model of an architecture echoline knows.

``gguf_file`` checks the file format; this module checks the file against its
architecture (hyper-parameter ranges, every tensor the forward pass reads present,
supported and exactly shaped) and builds the config and the model. Why here: these
checks need the model classes (which tensors a qwen2 has that a llama has not), and
the format reader must not depend on them.
"""

from __future__ import annotations

import math
from pathlib import Path

from echoline.engine.backends import get_backend
from echoline.engine.backends.base import Backend
from echoline.engine.config import ModelConfig
from echoline.engine.errors import ModelFileError, UnsupportedArchitectureError
from echoline.engine.gguf_file import (
    SUPPORTED_QTYPES,
    GGUFFile,
    describe_value,
    is_int,
    unsupported_qtype_message,
)
from echoline.engine.models import MODEL_CLASSES, SUPPORTED_ARCHITECTURES, Transformer

#: ``{arch}.<suffix>`` integer hyper-parameters that ``config_from_gguf`` reads: (min, max).
HPARAM_INT_RANGES: dict[str, tuple[int, int]] = {
    "block_count": (1, 1024),
    "embedding_length": (1, 65536),
    "feed_forward_length": (1, 1 << 18),
    "attention.head_count": (1, 1024),
    "attention.head_count_kv": (1, 1024),
    "attention.key_length": (1, 4096),
    "attention.value_length": (1, 4096),
    "context_length": (1, 1 << 24),
    "vocab_size": (1, 1 << 22),
    "attention.sliding_window": (0, 1 << 24),
}
#: ``{arch}.<suffix>`` float hyper-parameters: (exclusive min, inclusive max); must be finite.
HPARAM_FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "rope.freq_base": (0.0, 1e12),
    "attention.layer_norm_rms_epsilon": (0.0, 1.0),
}


def load_model(path: str | Path, backend: Backend | str = "auto") -> tuple[GGUFFile, Transformer]:
    """Open and check ``path``, then build its architecture's model with weights on ``backend``."""
    gf = open_model_file(path)
    config = config_from_gguf(gf)
    be = get_backend(backend) if isinstance(backend, str) else backend
    model = MODEL_CLASSES[config.arch](gf, config, be)
    gf.release_pages()  # the weights are laid out: the file's pages need not stay resident
    return gf, model


def open_model_file(path: str | Path) -> GGUFFile:
    """``GGUFFile(path)``, then ``check_model_file``: what every model load goes through."""
    gf = GGUFFile(path)
    check_model_file(gf)
    return gf


def check_model_file(gf: GGUFFile) -> None:
    """For an architecture echoline runs: sane hyper-parameters, then every tensor the
    forward pass reads present, supported and shaped exactly as they imply.

    A file without the keys a config needs (a vocabulary-only GGUF) is left alone here:
    ``config_from_gguf`` reports the missing key when something tries to run it.
    """
    arch = gf.metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        return  # no or another architecture: config_from_gguf names it when loading
    _check_hparams(gf, arch)
    try:
        config = config_from_gguf(gf)
    except ModelFileError:
        return
    _check_tensor_shapes(gf, config)
    tokens = gf.metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) > config.vocab_size:
        raise ModelFileError(
            f"{gf.path}: the tokenizer has {len(tokens)} tokens but the model only "
            f"{config.vocab_size} embedding rows"
        )


def _required(gf: GGUFFile, key: str) -> int | float:
    value = gf.get(key)
    if value is None:
        raise ModelFileError(f"{gf.path}: missing metadata key {key!r}")
    return value


def config_from_gguf(gf: GGUFFile) -> ModelConfig:
    """Build the config, naming the architecture when it is not one echoline runs."""
    arch = gf.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{gf.path}: architecture {arch!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    n_layers = int(_required(gf, f"{arch}.block_count"))
    d_model = int(_required(gf, f"{arch}.embedding_length"))
    n_heads = int(_required(gf, f"{arch}.attention.head_count"))
    n_kv = int(gf.get(f"{arch}.attention.head_count_kv", n_heads))
    head_dim = int(gf.get(f"{arch}.attention.key_length", d_model // n_heads))
    embd = gf.tensors.get("token_embd.weight")
    if embd is None:
        raise ModelFileError(f"{gf.path}: missing tensor 'token_embd.weight'")
    vocab = int(gf.get(f"{arch}.vocab_size", embd.shape[0]))
    rope_base = float(gf.get(f"{arch}.rope.freq_base", 10000.0))
    window, local, rope_local = MODEL_CLASSES[arch].local_attention(
        lambda key, default=None: gf.get(f"{arch}.{key}", default), n_layers, rope_base
    )
    return ModelConfig(
        arch=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_ff=int(_required(gf, f"{arch}.feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        rope_base=rope_base,
        rope_base_local=rope_local,
        rms_eps=float(gf.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        context_length=int(gf.get(f"{arch}.context_length", 2048)),
        vocab_size=vocab,
        sliding_window=window,
        local_layers=local,
        tied_output="output.weight" not in gf.tensors,
    )


def _check_hparams(gf: GGUFFile, arch: str) -> None:
    """Kinds and ranges of the ``{arch}.*`` keys the config reads, and how they relate."""
    ints: dict[str, int] = {}
    for suffix, (lo, hi) in HPARAM_INT_RANGES.items():
        key = f"{arch}.{suffix}"
        value = gf.metadata.get(key)
        if value is None:
            continue
        if not is_int(value):
            raise ModelFileError(
                f"{gf.path}: metadata {key} must be an integer, got {describe_value(value)}"
            )
        if not lo <= value <= hi:
            raise ModelFileError(
                f"{gf.path}: metadata {key} = {value} is out of range [{lo}, {hi}]"
            )
        ints[suffix] = value
    for suffix, (lo_x, hi_f) in HPARAM_FLOAT_RANGES.items():
        key = f"{arch}.{suffix}"
        value = gf.metadata.get(key)
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ModelFileError(
                f"{gf.path}: metadata {key} must be a number, got {describe_value(value)}"
            )
        if not (math.isfinite(value) and lo_x < value <= hi_f):
            raise ModelFileError(
                f"{gf.path}: metadata {key} = {value} is out of range ({lo_x}, {hi_f}]"
            )
    d_model = ints.get("embedding_length")
    heads = ints.get("attention.head_count")
    kv_heads = ints.get("attention.head_count_kv")
    key_len = ints.get("attention.key_length")
    value_len = ints.get("attention.value_length")
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise ModelFileError(
            f"{gf.path}: {arch}.attention.head_count_kv = {kv_heads} does not divide "
            f"{arch}.attention.head_count = {heads} (each KV head serves a group of Q heads)"
        )
    if key_len is None and heads is not None and d_model is not None and d_model % heads:
        raise ModelFileError(
            f"{gf.path}: {arch}.embedding_length = {d_model} is not divisible by "
            f"{arch}.attention.head_count = {heads} (and no attention.key_length is given)"
        )
    head_dim = key_len
    if head_dim is None and heads is not None and d_model is not None:
        head_dim = d_model // heads
    if value_len is not None and head_dim is not None and value_len != head_dim:
        raise ModelFileError(
            f"{gf.path}: {arch}.attention.value_length = {value_len} differs from the key "
            f"head size {head_dim}; echoline needs equal K and V head sizes"
        )


def _check_tensor_shapes(gf: GGUFFile, config: ModelConfig) -> None:
    """Each tensor the model reads: present, a supported quant type, exactly its shape.

    Why: the kernels trust these shapes to index weights without bounds checks, so a
    file whose ``attn_q`` is smaller than ``head_count × head_dim`` rows would read
    past its data; here it is a message naming the tensor and both shapes instead.
    """
    for name, want in expected_tensor_shapes(config).items():
        t = gf.tensors.get(name)
        if t is None:
            raise ModelFileError(
                f"{gf.path}: missing tensor {name!r} (the metadata gives {config.n_layers} layers)"
            )
        if t.qtype not in SUPPORTED_QTYPES:
            raise ModelFileError(unsupported_qtype_message(gf.path, name, t.qtype))
        if t.shape != want:
            raise ModelFileError(
                f"{gf.path}: tensor {name} has shape {t.shape}, but the metadata implies "
                f"{want} (vocab {config.vocab_size}, embedding {config.d_model}, "
                f"{config.n_heads} heads / {config.n_kv_heads} KV heads of {config.head_dim}, "
                f"feed-forward {config.n_ff})"
            )


def expected_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name → numpy-order shape of every tensor the forward pass of ``config.arch`` reads.

    The optional parts follow the architecture's model class (its ``has_qkv_bias``,
    ``qk_norm`` and ``sandwich_norms`` switches), so this list and what the model
    loads cannot drift apart.
    """
    model = MODEL_CLASSES[config.arch]
    d, hd, ff = config.d_model, config.head_dim, config.n_ff
    q_rows, kv_rows = config.n_heads * hd, config.n_kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (config.vocab_size, d),
        "output_norm.weight": (d,),
    }
    if not config.tied_output:
        shapes["output.weight"] = (config.vocab_size, d)
    for i in range(config.n_layers):
        p = f"blk.{i}."
        shapes[p + "attn_norm.weight"] = (d,)
        shapes[p + "attn_q.weight"] = (q_rows, d)
        shapes[p + "attn_k.weight"] = (kv_rows, d)
        shapes[p + "attn_v.weight"] = (kv_rows, d)
        shapes[p + "attn_output.weight"] = (d, q_rows)
        shapes[p + "ffn_norm.weight"] = (d,)
        shapes[p + "ffn_gate.weight"] = (ff, d)
        shapes[p + "ffn_up.weight"] = (ff, d)
        shapes[p + "ffn_down.weight"] = (d, ff)
        if model.has_qkv_bias:
            shapes[p + "attn_q.bias"] = (q_rows,)
            shapes[p + "attn_k.bias"] = (kv_rows,)
            shapes[p + "attn_v.bias"] = (kv_rows,)
        if model.qk_norm:
            shapes[p + "attn_q_norm.weight"] = (hd,)
            shapes[p + "attn_k_norm.weight"] = (hd,)
        if model.sandwich_norms:
            shapes[p + "post_attention_norm.weight"] = (d,)
            shapes[p + "post_ffw_norm.weight"] = (d,)
    return shapes
