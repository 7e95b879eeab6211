"""GGUF metadata → a frozen ModelConfig (the numbers a forward pass needs)."""

from __future__ import annotations

from dataclasses import dataclass

from echoline.engine.errors import ModelFileError, UnsupportedArchitectureError
from echoline.engine.gguf_file import GGUFFile


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters read from ``{arch}.*`` keys.

    ``sliding_window`` is 0 for models without local layers; ``local_layers``
    lists the layer indices that attend within the window (Gemma 3: il % 6 < 5)
    and use ``rope_base_local``.
    """

    arch: str
    n_layers: int
    d_model: int
    n_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_base: float
    rope_base_local: float
    rms_eps: float
    context_length: int
    vocab_size: int
    sliding_window: int
    local_layers: frozenset[int]
    tied_output: bool

    @property
    def kv_bytes_per_token(self) -> int:
        """float32 K and V over all layers: what one cached position costs."""
        return self.n_layers * 2 * self.n_kv_heads * self.head_dim * 4

    def layer_window(self, layer: int) -> int:
        return self.sliding_window if layer in self.local_layers else 0

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_local if layer in self.local_layers else self.rope_base


def _required(gf: GGUFFile, key: str) -> int | float:
    value = gf.get(key)
    if value is None:
        raise ModelFileError(f"{gf.path}: missing metadata key {key!r}")
    return value


def config_from_gguf(gf: GGUFFile) -> ModelConfig:
    """Build the config, naming the architecture when it is not one echoline runs."""
    from echoline.engine.models import (  # models import this module
        MODEL_CLASSES,
        SUPPORTED_ARCHITECTURES,
    )

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
