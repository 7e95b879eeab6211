"""``llama`` (SmolLM2): GQA, SiLU-gated FFN, adjacent-pair RoPE.

The GGUF converter permuted Q/K rows so that llama.cpp's adjacent-pair
rotation reproduces HF's half-split one; rotating (2i, 2i+1) here matches it.
"""

from echoline.engine.models.base import Transformer


class LlamaModel(Transformer):
    neox_rope = False
