"""``qwen2`` (Qwen2.5 / Qwen2.5-Coder): Q/K/V biases, NEOX RoPE, output optionally tied."""

from echoline.engine.models.base import Transformer


class Qwen2Model(Transformer):
    neox_rope = True
    has_qkv_bias = True
