"""The decoder-only transformer shared by every architecture, written against Backend ops.

One code path for any number of new rows: one row is decode, many are
prefill or verify. Architectures subclass ``Transformer`` and override the
few hooks where they differ (biases, RoPE pairing, extra norms, activation).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from echoline.engine.backends.base import Backend
from echoline.engine.config import ModelConfig
from echoline.engine.gguf_file import GGUFFile
from echoline.engine.kvcache import KVCache


@dataclass
class LayerWeights:
    """Prepared (backend-native) weights of one block; optional parts are None."""

    attn_norm: Any
    wqkv: Any
    wo: Any
    ffn_norm: Any
    w_gate_up: Any
    w_down: Any
    qkv_bias: Any = None
    q_norm: Any = None
    k_norm: Any = None
    post_attn_norm: Any = None
    post_ffn_norm: Any = None


class Transformer:
    """Llama-family block stack; subclasses set the architectural switches."""

    #: RoPE pairs (i, i + d/2) when True, adjacent (2i, 2i+1) when False.
    neox_rope = False
    has_qkv_bias = False
    gelu = False
    embed_scale = False
    qk_norm = False
    sandwich_norms = False

    @classmethod
    def local_attention(cls, get: Any, n_layers: int, rope_base: float) -> tuple[int, frozenset[int], float]:
        """(sliding window, local layer indices, their RoPE base) from the file's metadata
        (``get(key, default)``, keys without the architecture prefix). No local layers here;
        an architecture that has them says so in its own module."""
        return 0, frozenset(), rope_base

    def __init__(self, gf: GGUFFile, config: ModelConfig, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        c = config
        self.q_size = c.n_heads * c.head_dim
        self.kv_size = c.n_kv_heads * c.head_dim
        embd = gf.tensor("token_embd.weight")
        self.embedding = backend.prepare_embedding(embd)
        self.output = backend.prepare_matrix([gf.tensor("output.weight") if not c.tied_output else embd])
        self.output_norm = backend.prepare_vector(gf.tensor("output_norm.weight").dequantize())
        self.layers = [self._load_layer(gf, i) for i in range(c.n_layers)]
        self.attn_scale = 1.0 / math.sqrt(c.head_dim)

    def _vec(self, gf: GGUFFile, name: str) -> Any:
        return self.backend.prepare_vector(gf.tensor(name).dequantize())

    def _load_layer(self, gf: GGUFFile, i: int) -> LayerWeights:
        p = f"blk.{i}."
        b = self.backend
        lw = LayerWeights(
            attn_norm=self._vec(gf, p + "attn_norm.weight"),
            wqkv=b.prepare_matrix([gf.tensor(p + f"attn_{x}.weight") for x in "qkv"]),
            wo=b.prepare_matrix([gf.tensor(p + "attn_output.weight")]),
            ffn_norm=self._vec(gf, p + "ffn_norm.weight"),
            w_gate_up=b.prepare_matrix([gf.tensor(p + "ffn_gate.weight"), gf.tensor(p + "ffn_up.weight")]),
            w_down=b.prepare_matrix([gf.tensor(p + "ffn_down.weight")]),
        )
        if self.has_qkv_bias:
            bias = np.concatenate([gf.tensor(p + f"attn_{x}.bias").dequantize() for x in "qkv"])
            lw.qkv_bias = b.prepare_vector(bias)
        if self.qk_norm:
            lw.q_norm = self._vec(gf, p + "attn_q_norm.weight")
            lw.k_norm = self._vec(gf, p + "attn_k_norm.weight")
        if self.sandwich_norms:
            lw.post_attn_norm = self._vec(gf, p + "post_attention_norm.weight")
            lw.post_ffn_norm = self._vec(gf, p + "post_ffw_norm.weight")
        return lw

    def new_cache(self, capacity: int = 256, max_rows: int | None = None) -> KVCache:
        """A cache; ``max_rows`` (the most rows one forward will carry) enables window rings."""
        return KVCache(self.backend, self.config, capacity, max_rows)

    def forward(self, ids: list[int] | np.ndarray, cache: KVCache, all_logits: bool = True) -> Any:
        """Run ``ids`` at positions cache.length… and append their K/V.

        Returns logits (n, vocab) for every row, or (1, vocab) for the last row
        only when ``all_logits`` is False (prefill: the output head is the
        costliest matrix, and earlier rows' logits are never looked at).
        """
        b, c = self.backend, self.config
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        if 0 < n <= b.graph_max_rows and not cache.ring:
            return self._forward_graph(ids, cache, all_logits)
        start = cache.length
        cache.ensure(start + n)
        positions = np.arange(start, start + n, dtype=np.int64)
        x = b.embed(self.embedding, ids)
        if self.embed_scale:
            x = b.scale(x, math.sqrt(c.d_model))
        for li, lw in enumerate(self.layers):
            x = self._block(x, li, lw, cache, start, positions)
        cache.advance(start, n)
        if not all_logits:
            x = x[n - 1 :]
        return b.norm_matmul(x, self.output_norm, c.rms_eps, self.output)

    def _forward_graph(self, ids: np.ndarray, cache: KVCache, all_logits: bool) -> Any:
        """``forward`` replayed as a captured graph (backends with ``run_graph``: CUDA).

        One graph per row count and cache buffers (kept under ``cache.buffers``, so it
        follows the buffers when caches trade them); ids and positions are its only
        inputs, so every step (decode, verify) replays it. The logits it returns are
        a static buffer: read them before the next forward with the same row count.
        """
        b = self.backend
        n, start = len(ids), cache.length
        cache.ensure(start + n)
        step = self.graph_step(cache, n, all_logits)
        positions = np.arange(start, start + n, dtype=np.int32)
        logits = b.run_graph(("forward", n, all_logits), step, [ids, positions], owner=cache.buffers,
                             generation=self.graph_generation(cache))
        cache.advance(start, n)
        return logits

    @staticmethod
    def graph_generation(cache: KVCache) -> tuple[int, int]:
        """What identifies a cache's buffers to its captured graphs (growth replaces them)."""
        return (cache.capacity, id(cache.k[0]))

    def graph_step(self, cache: KVCache, n: int, all_logits: bool) -> Any:
        """The forward of ``n`` rows as a function of device ids and positions: what a
        graph captures (``_forward_graph``; the chained decode steps of engine/step_chain.py).

        The step is pinned to the cache's current buffers (a shallow copy of the cache, so
        ``pinned.buffers`` stays these buffers): a captured graph writes and reads the
        buffers it was captured on, even after the cache traded them away
        (``KVCache.exchange_buffers``); the function says so in Python too, for backends
        whose "graphs" re-run it."""
        b, c = self.backend, self.config
        pinned = copy.copy(cache)

        def step(ids_dev: Any, pos_dev: Any) -> Any:
            x = b.embed(self.embedding, ids_dev)
            if self.embed_scale:
                x = b.scale(x, math.sqrt(c.d_model))
            for li, lw in enumerate(self.layers):
                x = self._block(x, li, lw, pinned, pos_dev, pos_dev)
            if not all_logits:
                x = x[n - 1 :]
            return b.norm_matmul(x, self.output_norm, c.rms_eps, self.output)

        return step

    def _block(self, x: Any, li: int, lw: LayerWeights, cache: KVCache, start: int, positions: np.ndarray) -> Any:
        b, c = self.backend, self.config
        n = positions.shape[0]
        qkv = b.norm_matmul(x, lw.attn_norm, c.rms_eps, lw.wqkv, lw.qkv_bias)
        q, k, v = b.split(qkv, [self.q_size, self.kv_size, self.kv_size])
        q = b.reshape(q, (n, c.n_heads, c.head_dim))
        k = b.reshape(k, (n, c.n_kv_heads, c.head_dim))
        v = b.reshape(v, (n, c.n_kv_heads, c.head_dim))
        if lw.q_norm is not None:
            q = b.rms_norm(q, lw.q_norm, c.rms_eps)
            k = b.rms_norm(k, lw.k_norm, c.rms_eps)
        base = c.layer_rope_base(li)
        if cache.ring:  # window rings store each row twice (KVCache.write)
            q = b.rope(q, positions, base, self.neox_rope)
            k = b.rope(k, positions, base, self.neox_rope)
            cache.write(li, start, k, v)
        else:
            q = b.rope_store(q, k, v, positions, start, base, self.neox_rope, cache.k[li], cache.v[li])
        k_all, v_all, offset = cache.view(li, start, n)
        rel = positions - offset if offset else positions
        attn = b.attention(q, k_all, v_all, rel, c.layer_window(li), self.attn_scale)
        if lw.post_attn_norm is not None:
            x = b.add(x, b.rms_norm(b.matmul(attn, lw.wo), lw.post_attn_norm, c.rms_eps))
        else:
            x = b.matmul_add(attn, lw.wo, x)
        f = b.norm_matmul_glu(x, lw.ffn_norm, c.rms_eps, lw.w_gate_up, c.n_ff, self.gelu)
        if lw.post_ffn_norm is not None:
            return b.add(x, b.rms_norm(b.matmul(f, lw.w_down), lw.post_ffn_norm, c.rms_eps))
        return b.matmul_add(f, lw.w_down, x)
