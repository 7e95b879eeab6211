"""``gemma3``: embeddings × √d, per-head q/k RMS norms, sandwich norms, GELU-tanh.

Norm weights in the GGUF already include Gemma's +1, so they are used as
stored. Local (sliding-window) layers and their RoPE base come from
ModelConfig (layer il is local when il % 6 < 5).
"""

from engine.models.base import Transformer


class Gemma3Model(Transformer):
    neox_rope = True
    gelu = True
    embed_scale = True
    qk_norm = True
    sandwich_norms = True
