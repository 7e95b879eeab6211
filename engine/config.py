"""ModelConfig: the frozen numbers a forward pass needs.

Read from a file's metadata by ``engine.models.loader.config_from_gguf``, which knows
the architectures; this module knows none of them, so the models can import it.
"""

from __future__ import annotations

from dataclasses import dataclass


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
