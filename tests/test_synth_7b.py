"""tools.cuda.synth_gguf: the 7B-shaped files the GPU benchmark writes (issue 49, part 5).

The embedded model must compute the small model's function exactly (up to float rounding)
inside the larger shapes, else its speculation figures would not be a real model's; the
random mixes must hold llama.cpp's tensor types and load in echoline.
"""

from __future__ import annotations

import gguf
import numpy as np
from echoline.engine.backends.numpy_backend import NumpyBackend
from echoline.engine.models.loader import load_model

from tests.synth import write_fim_qwen2_model, write_model
from tools.cuda import synth_gguf as sg

#: larger shapes: 4x the model dims, heads of twice the dims, more heads, units, layers, tokens
BIG = dict(layers=3, d=256, ff=384, heads=8, kv=4, vocab=104, rope=10000.0, eps=1e-5, ctx=512)


def test_embedded_model_computes_the_small_one(tmp_path):
    small = write_model(tmp_path / "s.gguf", "qwen2", qtype=sg.Q.F32, n_layers=2, d_model=64,
                        n_ff=128, n_heads=4, n_kv_heads=2, vocab=96, tied=True, seed=3)
    big = sg.write_embedded(tmp_path / "b.gguf", small, s=BIG, qtype="f32", threads=2)
    _, ms = load_model(small, NumpyBackend(np.float64))
    _, mb = load_model(big, NumpyBackend(np.float64))
    ids = [1, 5, 9, 2, 7, 3, 11, 4, 6, 8, 10, 12, 40, 41, 42, 43]
    ls = ms.forward(ids, ms.new_cache(), all_logits=True)
    lb = mb.forward(ids, mb.new_cache(), all_logits=True)
    assert lb.shape[-1] == BIG["vocab"]
    np.testing.assert_allclose(lb[..., :96], ls, rtol=1e-6, atol=1e-6 * np.abs(ls).max())
    np.testing.assert_array_equal(lb[..., 96:], 0.0)  # the padding tokens' rows are zero


def test_random_mix_types_and_load(tmp_path):
    tok = sg.write_tokenizer(write_fim_qwen2_model(tmp_path / "fim.gguf"), tmp_path / "tok.gguf")
    shape = dict(layers=8, d=256, ff=512, heads=2, kv=1, vocab=300, rope=1e6, eps=1e-6, ctx=512)
    # llama.cpp's rule: of 8 layers, 0, 3, 6 and 7 get Q6_K attn_v / ffn_down in the K mixes
    assert [i for i in range(8) if sg.use_more_bits(i, 8)] == [0, 3, 6, 7]
    for mix in ("q4_k_m", "q5_k_m", "q8_0"):
        path = sg.write_random(tmp_path / f"{mix}.gguf", mix, tok, s=shape)
        want = sg.mix_types(mix, 8)
        got = {t.name: t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
        assert {k: got[k] for k in want} == want
        _, m = load_model(path, NumpyBackend())
        logits = m.forward([1, 2, 3], m.new_cache())
        assert np.isfinite(logits).all() and logits.shape[-1] == 300
