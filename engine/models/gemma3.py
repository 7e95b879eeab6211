"""``gemma3``: embeddings × √d, per-head q/k RMS norms, sandwich norms, GELU-tanh.

Norm weights in the GGUF already include Gemma's +1, so they are used as
stored. Five of every six layers are local (sliding-window attention with their own RoPE
base): ``local_attention`` says which, and ModelConfig carries the answer.
"""

from typing import Any

from echoline.engine.models.base import Transformer


class Gemma3Model(Transformer):
    neox_rope = True
    gelu = True
    embed_scale = True
    qk_norm = True
    sandwich_norms = True
    #: Gemma 3 alternates five local (sliding-window) layers with one global layer.
    LOCAL_PERIOD = 6
    LOCAL_ROPE_BASE = 10000.0

    @classmethod
    def local_attention(cls, get: Any, n_layers: int, rope_base: float) -> tuple[int, frozenset[int], float]:
        window = int(get("attention.sliding_window", 512))
        local = frozenset(i for i in range(n_layers) if i % cls.LOCAL_PERIOD < cls.LOCAL_PERIOD - 1)
        return window, local, cls.LOCAL_ROPE_BASE
