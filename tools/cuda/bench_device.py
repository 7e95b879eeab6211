"""Device benchmark: synthetic GGUF models with real shapes, timed on the CUDA backend.

Dev script for the GPU machine (not a test): writes random-weight GGUF files with
SmolLM2-135M (Q4_1 layers, Q8_0 embedding) and Qwen2.5-Coder-1.5B q4_k_m shapes
(Q4_K with Q6_K attn_v/ffn_down/embedding), fills the KV cache to ``--context``,
then times plain decode (eager and CUDA-graph) and verify of k rows.

    python -m tools.cuda.bench_device --context 2048
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType

SHAPES = {
    "smollm2-135m": dict(
        arch="llama",
        layers=30,
        d=576,
        ff=1536,
        heads=9,
        kv=3,
        vocab=49152,
        rope=100000.0,
        layer_q=Q.Q4_1,
        heavy_q=Q.Q4_1,
        embd_q=Q.Q8_0,
    ),
    "qwen2.5-0.5b": dict(  # Qwen2.5-Coder-0.5B-Instruct: mostly Q5_0, a Q8_0 head
        arch="qwen2",
        layers=24,
        d=896,
        ff=4864,
        heads=14,
        kv=2,
        vocab=151936,
        rope=1e6,
        layer_q=Q.Q5_0,
        heavy_q=Q.Q8_0,
        embd_q=Q.Q8_0,
    ),
    "qwen2.5-1.5b": dict(
        arch="qwen2",
        layers=28,
        d=1536,
        ff=8960,
        heads=12,
        kv=2,
        vocab=151936,
        rope=1e6,
        layer_q=Q.Q4_K,
        heavy_q=Q.Q6_K,
        embd_q=Q.Q6_K,
    ),
}
# The same shapes in the non-linear 4-bit types of IQ4 files (llama.cpp writes IQ4_NL where a
# row of 896 is no multiple of IQ4_XS's 256-weight superblock)
SHAPES["qwen2.5-0.5b-iq4nl"] = dict(SHAPES["qwen2.5-0.5b"], layer_q=Q.IQ4_NL, heavy_q=Q.IQ4_NL)
SHAPES["qwen2.5-1.5b-iq4xs"] = dict(SHAPES["qwen2.5-1.5b"], layer_q=Q.IQ4_XS, heavy_q=Q.IQ4_XS)


def random_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: Q) -> np.ndarray:
    """Random quantized rows with small, finite half-float scales in each block."""
    elems, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    nb = cols // elems
    raw = rng.integers(0, 256, size=(rows, nb, nbytes), dtype=np.uint8)
    d = (
        rng.uniform(0.001, 0.01, size=(rows, nb))
        .astype(np.float16)
        .view(np.uint8)
        .reshape(rows, nb, 2)
    )
    if qtype == Q.Q6_K:
        raw[..., 208:210] = d
        raw[..., 192:208] = rng.integers(-32, 32, size=(rows, nb, 16), dtype=np.int8).view(np.uint8)
    else:
        raw[..., 0:2] = d
        if qtype in (Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q5_K):
            m = (-rng.uniform(0.0, 0.01, size=(rows, nb))).astype(np.float16)
            if qtype in (Q.Q4_K, Q.Q5_K):
                m = -m
            raw[..., 2:4] = m.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * nbytes)


def write_model(path: Path, s: dict, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    hd = s["d"] // s["heads"]
    arch = s["arch"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(s["layers"])
    w.add_context_length(32768)
    w.add_embedding_length(s["d"])
    w.add_feed_forward_length(s["ff"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(s["rope"])
    w.add_vocab_size(s["vocab"])

    def mat(name: str, rows: int, cols: int, q: Q) -> None:
        w.add_tensor(name, random_blocks(rng, rows, cols, q), raw_dtype=q)

    def vec(name: str, n: int, around: float = 1.0) -> None:
        w.add_tensor(name, (around + 0.1 * rng.standard_normal(n)).astype(np.float32))

    mat("token_embd.weight", s["vocab"], s["d"], s["embd_q"])
    vec("output_norm.weight", s["d"])
    for i in range(s["layers"]):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", s["d"])
        vec(p + "ffn_norm.weight", s["d"])
        mat(p + "attn_q.weight", s["heads"] * hd, s["d"], s["layer_q"])
        mat(p + "attn_k.weight", s["kv"] * hd, s["d"], s["layer_q"])
        mat(p + "attn_v.weight", s["kv"] * hd, s["d"], s["heavy_q"])
        mat(p + "attn_output.weight", s["d"], s["heads"] * hd, s["layer_q"])
        mat(p + "ffn_gate.weight", s["ff"], s["d"], s["layer_q"])
        mat(p + "ffn_up.weight", s["ff"], s["d"], s["layer_q"])
        mat(p + "ffn_down.weight", s["d"], s["ff"], s["heavy_q"])
        if arch == "qwen2":
            for x, n in (("q", s["heads"] * hd), ("k", s["kv"] * hd), ("v", s["kv"] * hd)):
                vec(p + f"attn_{x}.bias", n, around=0.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(name: str, context: int, reps: int, ks: list[int], out: Path) -> list[str]:
    from echoline.engine.backends.cupy_backend import CupyBackend
    from echoline.engine.models.loader import load_model

    t0 = time.perf_counter()
    path = write_model(out / f"{name}.gguf", SHAPES[name])
    t_write = time.perf_counter() - t0
    b = CupyBackend()
    t0 = time.perf_counter()
    _, model = load_model(path, b)
    b.synchronize()
    t_load = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    vocab = model.config.vocab_size
    cache = model.new_cache(context + 64)
    prompt = rng.integers(0, vocab, size=context)
    t0 = time.perf_counter()
    for s in range(0, context, 512):
        model.forward(prompt[s : s + 512], cache, all_logits=False)
    b.synchronize()
    t_prefill = time.perf_counter() - t0
    lines = [
        f"{name}: write {t_write:.1f}s load {t_load:.1f}s prefill {context} tok {t_prefill:.2f}s"
    ]

    # eager decode: one forward + host argmax, cache cut back each time
    def eager_step() -> None:
        cache.truncate(context)
        b.argmax(model.forward(prompt[-1:], cache))

    b.graph_max_rows = 0  # eager: one Python launch per op
    eager_step()
    t_eager = median_time(eager_step, reps)
    b.graph_max_rows = type(b).graph_max_rows
    lines.append(f"  eager decode      {t_eager * 1e3:8.3f} ms  {1 / t_eager:8.1f} tok/s")

    # the engine's own path: Transformer.forward (graph for <= graph_max_rows rows) + argmax
    timings = {}
    for k in ks:
        ids = prompt[-k:]

        def run(ids=ids) -> np.ndarray:
            cache.truncate(context)
            return b.argmax(model.forward(ids, cache, all_logits=True))

        first = run()
        second = run()
        assert np.array_equal(first, second), "graph replay differs from its eager run"
        timings[k] = median_time(run, reps)
    t1 = timings[ks[0]]
    lines.append(f"  graph decode      {t1 * 1e3:8.3f} ms  {1 / t1:8.1f} tok/s")
    for k in ks[1:]:
        lines.append(
            f"  graph verify k={k:<3d}{timings[k] * 1e3:8.3f} ms  ratio {timings[k] / t1:5.2f}"
        )
    b.drop_graphs()
    if CHAIN:
        lines += chain_ab(b, model, cache, context, prompt)
    if "pdl" in POLICY_AB:
        lines += loop_ab(b, model, cache, context, prompt, PDL_CONFIGS)
    if AB:
        lines += ab_decode(b, model, cache, context, prompt, reps)
    if TC:
        lines += ab_tensor(b, model, cache, context, prompt, reps, ks)
    if ATTN:
        lines += ab_attention(b, model, cache, context, prompt, reps, ks)
    if ROWSPLIT:
        lines += ab_policies(b, model, cache, context, prompt, reps, ks, ROWSPLIT_CONFIGS, "rows")
    chosen = [name for name in POLICY_SWITCHES if name in POLICY_AB]
    for name in chosen:
        lines += ab_policies(b, model, cache, context, prompt, reps, ks, POLICY_SWITCHES[name], name)
    if chosen and QUICK:
        return lines
    if GAP:
        lines += host_gap(b, model, cache, context, prompt, reps)
        if QUICK:
            return lines
    if (ATTN or ROWSPLIT) and QUICK:
        return lines
    lines += op_breakdown(b, model, cache, context)
    return lines


def loop_ab(b, model, cache, context: int, prompt, configs: dict, rounds: int = 7, n: int = 64) -> list[str]:
    """Plain generation (engine/generate.py's loop, ``n`` tokens after ``context``) under each
    config (a dict of backend attributes), interleaved (the order reverses every other round);
    median tok/s of each against the first, and whether every config's ids agree."""
    from echoline.engine.generate import StopRules, generate_tokens
    from echoline.engine.types import GenerationStats

    ids = [int(t) for t in prompt] + [int(prompt[-1])]
    names = list(configs)
    rates: dict[str, list[float]] = {c: [] for c in names}
    replies: dict[str, list[int]] = {}
    keep = {a: getattr(b, a) for cfg in configs.values() for a in cfg}
    try:
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                for a, v in configs[name].items():
                    setattr(b, a, v)
                b.drop_graphs()
                for budget in (4, n):  # the first run captures this config's graphs
                    cache.truncate(context)
                    res = generate_tokens(model, cache, ids, decode=lambda _ids: "",
                                          rules=StopRules(max_tokens=budget), stats=GenerationStats())
                rates[name].append((len(res.token_ids) - 1) / res.stats.decode_s)
                replies.setdefault(name, res.token_ids)
    finally:
        for a, v in keep.items():
            setattr(b, a, v)
        b.drop_graphs()
    base = statistics.median(rates[names[0]])
    same = all(replies[c] == replies[names[0]] for c in names)
    parts = [f"{c} {statistics.median(rates[c]):8.1f} tok/s x{statistics.median(rates[c]) / base:.3f}"
             for c in names]
    return ["  plain loop " + "  ".join(parts) + f"  same ids: {same}"]


def chain_ab(b, model, cache, context: int, prompt) -> list[str]:
    """The plain loop with its steps chained on the device vs each step waiting for its id."""
    configs = {"stepwise": {"graph_chain": False}, "chained": {"graph_chain": True}}
    return loop_ab(b, model, cache, context, prompt, configs)


#: round-5 A/B (--ab): graph decode with each product policy, interleaved
AB = False
CHAIN = False
QUICK = False
AB_CONFIGS = {  # name: (factored_max_cols, fuse_segment_pairs); 0 = never factored
    "plain,2-launch": (0, False),  # = round 4's kernels
    "plain,pair": (0, True),
    "factored<=4096,pair": (4096, True),  # the default
    "factored-all,pair": (10**9, True),
}


def ab_decode(b, model, cache, context: int, prompt, reps: int, rounds: int = 3) -> list[str]:
    """Graph decode (forward + argmax, one row) per config, configs interleaved ``rounds``
    times with fresh graphs each switch; reports each config's median of round medians."""
    keep = b.factored_max_cols, b.fuse_segment_pairs
    ids = prompt[-1:]
    times: dict[str, list[float]] = {k: [] for k in AB_CONFIGS}
    picks: dict[str, set[int]] = {k: set() for k in AB_CONFIGS}

    def run() -> np.ndarray:
        cache.truncate(context)
        return b.argmax(model.forward(ids, cache, all_logits=True))

    for _ in range(rounds):
        for name, (fact, pair) in AB_CONFIGS.items():
            b.factored_max_cols, b.fuse_segment_pairs = fact, pair
            b.drop_graphs()
            run()
            picks[name].add(int(run()[-1]))
            times[name].append(median_time(run, reps))
    b.factored_max_cols, b.fuse_segment_pairs = keep
    b.drop_graphs()
    base = statistics.median(times["plain,2-launch"])
    lines = []
    for name, ts in times.items():
        t = statistics.median(ts)
        rounds_ms = " ".join(f"{v * 1e3:.3f}" for v in ts)
        lines.append(
            f"  ab {name:<18s} {t * 1e3:7.3f} ms {1 / t:7.1f} tok/s  x{t / base:5.3f}  "
            f"rounds [{rounds_ms}] ids {sorted(picks[name])}"
        )
    return lines


#: round-6 A/B (--tc): CUDA-core products (round 5 default) vs tensor-core products
TC = False


def ab_tensor(
    b, model, cache, context: int, prompt, reps: int, ks: list[int], rounds: int = 3
) -> list[str]:
    """Engine path at each k for the product policies (CUDA cores, tensor cores for every
    supported weight, the round-8 default (wide heads on the CUDA cores), the backend's
    default), then (without --quick) the attention-items A/B."""
    keys = ("tensor_products", "tensor_max_in", "tensor_max_cols", "tensor_wide", "tensor_split")
    limits = (b.tensor_max_in, b.tensor_max_cols)
    configs = {
        name: dict(zip(keys, policy, strict=True))
        for name, policy in (
            ("cuda-core", (False, 0, 0, False, False)),
            ("tensor", (True, 10**9, 10**9, b.tensor_wide, False)),  # mt_body for every weight
            ("split-off", (True, *limits, b.tensor_wide, False)),  # long rows on the CUDA cores
            ("default", (True, *limits, b.tensor_wide, b.tensor_split)),  # long rows split-K
        )
    }
    split = {"tensor_split_cluster": b.tensor_split_cluster, "tensor_split_units": b.tensor_split_units}
    for a in configs.values():
        a.update(split)
    # the split-K variants (same bits): the tile's blocks as a cluster; two units in flight
    configs["split-cluster"] = {**configs["default"], "tensor_split_cluster": True}
    configs["split-u2"] = {**configs["default"], "tensor_split_units": 2, "tensor_split_cluster": False}
    lines = [] if QUICK else attn_items_ab(b, model, cache, context, prompt, reps, rounds)
    return lines + ab_policies(b, model, cache, context, prompt, reps, ks, configs, "tc", rounds)


#: session-5 A/Bs: CUDA-core vs tensor-core attention (--attn); 9-17-row tensor-core
#: launches as parallel 8-row blocks vs passes in one block (--rowsplit)
ATTN = False
ROWSPLIT = False
ATTN_CONFIGS = {  # name: backend attributes
    "cuda-core": {"tensor_attention": False, "attn_split": 32, "tensor_attention_min_group": 0},
    "tensor": {"tensor_attention": True, "attn_split": 32, "tensor_attention_min_group": 0},
}
UNITS_CONFIGS = {  # session 6: 64-weight units in flight per tensor-core product warp
    "u1": {"tensor_units": 1, "tensor_max_in": 4096},
    "u2": {"tensor_units": 2, "tensor_max_in": 4096},
    "u2,long-tc": {"tensor_units": 2, "tensor_max_in": 10**6},  # Qwen down on tensor cores
}
#: session 15 (--xprep): x converted once per product (kernels.cu xprep) from this many rows
#: (0: never) on the mt kernels and on the wide heads; the same bits in every config
XPREP_CONFIGS = {
    "off": {"tensor_xprep_min_rows": 0, "tensor_xprep_wide_min_rows": 0},
    "heads": {"tensor_xprep_min_rows": 0, "tensor_xprep_wide_min_rows": 1},
    "9+,heads": {"tensor_xprep_min_rows": 9, "tensor_xprep_wide_min_rows": 1},
    "2+,heads": {"tensor_xprep_min_rows": 2, "tensor_xprep_wide_min_rows": 1},
    "all": {"tensor_xprep_min_rows": 1, "tensor_xprep_wide_min_rows": 1},
}
#: session 15 (--minblocks): resident 4-warp blocks per SM asked of the register allocator
MINBLOCKS_CONFIGS = {f"b{n}": {"tensor_min_blocks": n} for n in (1, 5, 6, 8)}
#: session 15 (--narrow): narrow weights' K split 16 ways even below 2 units per warp
NARROW_CONFIGS = {f"units>={n}": {"tensor_min_units_per_warp": n} for n in (2, 1)}
#: ... and for the CUDA-core attention (--attnblocks)
ATTNBLOCKS_CONFIGS = {
    f"a{n},i{i}": {"attn_min_blocks": n, "attn_items": i} for n, i in ((1, 8), (7, 8), (8, 8), (1, 16), (8, 4))
}
#: session 18 (--attngroup): (row, head) items a warp of the CUDA-core attention takes at
#: once from 2 rows, and the resident blocks asked for those grouped kernels
ATTNGROUP_CONFIGS = {"g1": {"attn_items_per_warp": 1}} | {
    f"g{g},b{n}": {"attn_items_per_warp": g, "attn_group_min_blocks": n}
    for g, n in ((2, 2), (2, 4), (4, 2), (4, 3))
}
#: ... and around the default (--attngroup2): blocks per SM and items per block
ATTNGROUP2_CONFIGS = {
    f"g2,b{n},i{i}": {"attn_items_per_warp": 2, "attn_group_min_blocks": n, "attn_items": i}
    for n, i in ((4, 8), (3, 8), (5, 8), (4, 16), (4, 4))
}
#: session 19 (--pdl): every kernel launched with programmatic stream serialization
#: (kernels/cuda/launch.py), its dependents released at its start or at its blocks' exit,
#: or with CuPy's plain launch; the same bits in all
PDL_CONFIGS = {
    "plain": {"programmatic_launch": False},
    "pdl-exit": {"programmatic_launch": True, "programmatic_early": False},
    "pdl-start": {"programmatic_launch": True, "programmatic_early": True},
}
#: session 20 (--wide): the head's staged kernel with 1, 2 or 4 warps per tile (a choice per
#: weight: the sums' order, so the ids may differ between warp counts) and 16-row launches
#: split into two row groups (the same bits)
WIDE_CONFIGS = {
    f"w{w}" + (f",rows{g}" if g > 1 else ""): {"tensor_wide_warps": w, "tensor_wide_row_groups": g}
    for w, g in ((1, 1), (2, 1), (4, 1), (1, 2), (2, 2))
}
ROWSPLIT_CONFIGS = {  # session 22: "split-20,1wave" (the default) splits only within one wave
    "passes": {"tensor_row_split_warps_per_sm": 0},
    "split-20": {"tensor_row_split_warps_per_sm": 20, "tensor_row_split_one_wave": False},
    "split-20,1wave": {"tensor_row_split_warps_per_sm": 20, "tensor_row_split_one_wave": True},
    "split-all": {"tensor_row_split_warps_per_sm": 10**6, "tensor_row_split_one_wave": False},
}
#: interleaved policy A/Bs by switch name (``--units`` …): each a dict of configs, run in
#: this order; with --quick the run ends after them
POLICY_SWITCHES = {
    "units": UNITS_CONFIGS,
    "xprep": XPREP_CONFIGS,
    "minblocks": MINBLOCKS_CONFIGS,
    "narrow": NARROW_CONFIGS,
    "attnblocks": ATTNBLOCKS_CONFIGS,
    "attngroup": ATTNGROUP_CONFIGS,
    "attngroup2": ATTNGROUP2_CONFIGS,
    "pdl": PDL_CONFIGS,
    "wide": WIDE_CONFIGS,
}
POLICY_AB: set[str] = set()


def ab_policies(
    b,
    model,
    cache,
    context: int,
    prompt,
    reps: int,
    ks: list[int],
    configs: dict,
    label: str,
    rounds: int = 3,
) -> list[str]:
    """Engine path (forward + argmax) at each k for each policy (a dict of backend
    attributes), interleaved ``rounds`` times with fresh graphs each switch; median of the
    round medians, and the ids each policy picked (they must agree)."""
    keep = {a: getattr(b, a) for cfg in configs.values() for a in cfg}
    times = {(c, k): [] for c in configs for k in ks}
    picks: dict[str, set[int]] = {c: set() for c in configs}
    for _ in range(rounds):
        for name, cfg in configs.items():
            for a, v in cfg.items():
                setattr(b, a, v)
            b.drop_graphs()
            for k in ks:
                ids = prompt[-k:]

                def run(ids=ids) -> np.ndarray:
                    cache.truncate(context)
                    return b.argmax(model.forward(ids, cache, all_logits=True))

                run()
                picks[name].add(int(run()[-1]))
                times[(name, k)].append(median_time(run, reps))
    for a, v in keep.items():
        setattr(b, a, v)
    b.drop_graphs()
    lines = []
    base = statistics.median(times[(next(iter(configs)), ks[0])])
    for name in configs:
        med = {k: statistics.median(times[(name, k)]) for k in ks}
        t1 = med[ks[0]]
        parts = " ".join(f"k={k}:{med[k] * 1e3:.3f}ms(x{med[k] / t1:.2f})" for k in ks)
        lines.append(
            f"  {label} {name:<10s} decode {t1 * 1e3:7.3f} ms {1 / t1:7.1f} tok/s x{t1 / base:5.3f} | "
            f"{parts} | ids {sorted(picks[name])}"
        )
    return lines


def ab_attention(b, model, cache, context: int, prompt, reps: int, ks: list[int]) -> list[str]:
    """The attention A/B, then one layer's attention alone inside graphs at 1-17 rows."""
    import cupy

    lines = ab_policies(b, model, cache, context, prompt, reps, ks, ATTN_CONFIGS, "attn")
    keep = b.tensor_attention, b.attn_split, b.tensor_attention_min_group
    c = model.config
    for n in (1, 8, 16, 17):
        pos = b.device_ints(np.arange(context - n, context))
        q = cupy.asarray(
            np.random.default_rng(4).standard_normal((n, c.n_heads, c.head_dim)).astype(np.float32)
        )
        parts = []
        for name, cfg in ATTN_CONFIGS.items():
            for key, value in cfg.items():
                setattr(b, key, value)
            fn = lambda q=q, pos=pos: b.attention(q, cache.k[0], cache.v[0], pos, 0, 0.1)  # noqa: E731
            parts.append(f"{name} {graph_op_time(b, fn) * 1e6:.1f}")
        lines.append(
            f"  attention n={n:<2d} (us, one layer, context {context}): " + ", ".join(parts)
        )
    b.tensor_attention, b.attn_split, b.tensor_attention_min_group = keep
    b.drop_graphs()
    return lines


def attn_items_ab(b, model, cache, context: int, prompt, reps: int, rounds: int) -> list[str]:
    """Engine path at k = 1, 8, 16 with 8 vs 48 attention items per block, interleaved."""
    keep = b.attn_items
    ks = (1, 8, 16)
    times: dict[tuple[int, int], list[float]] = {(a, k): [] for a in (8, 48) for k in ks}
    for _ in range(rounds):
        for items in (8, 48):
            b.attn_items = items
            b.drop_graphs()
            for k in ks:
                ids = prompt[-k:]

                def run(ids=ids) -> np.ndarray:
                    cache.truncate(context)
                    return b.argmax(model.forward(ids, cache, all_logits=True))

                run()
                times[(items, k)].append(median_time(run, reps))
    b.attn_items = keep
    b.drop_graphs()
    med = {key: statistics.median(v) for key, v in times.items()}
    return [
        f"  attn items {a:<2d}: " + " ".join(f"k={k}:{med[(a, k)] * 1e3:.3f}ms" for k in ks)
        for a in (8, 48)
    ]


#: session 6 (--gap): how much of a step is the host (Python, copies, sync) and not the GPU
GAP = False


def host_gap(b, model, cache, context: int, prompt, reps: int, rounds: int = 3) -> list[str]:
    """Step time of the engine path (forward + argmax + id copy, the host waiting for
    each id) against the same steps queued back to back (the host never waits, so the
    GPU never idles): the difference is the GPU's idle time per step, which no kernel
    change can remove. Interleaved ``rounds`` times; medians."""
    ids = prompt[-1:]

    def step() -> np.ndarray:
        cache.truncate(context)
        return b.argmax(model.forward(ids, cache, all_logits=True))

    def queued(count: int = 50, with_argmax: bool = True) -> float:
        b.synchronize()
        t0 = time.perf_counter()
        for _ in range(count):
            cache.truncate(context)
            logits = model.forward(ids, cache, all_logits=True)
            if with_argmax:
                b.argmax_device(logits)
        b.synchronize()
        return (time.perf_counter() - t0) / count

    step()
    step()
    waited, back, bare = [], [], []
    for _ in range(rounds):
        waited.append(median_time(step, reps))
        back.append(statistics.median(queued() for _ in range(5)))
        bare.append(statistics.median(queued(with_argmax=False) for _ in range(5)))
    tw, tb, tn = (statistics.median(v) for v in (waited, back, bare))
    return host_parts(b, model, cache, context, ids) + [
        f"  gap step (host waits)   {tw * 1e3:7.3f} ms {1 / tw:7.1f} tok/s",
        f"  gap queued (+argmax)    {tb * 1e3:7.3f} ms {1 / tb:7.1f} tok/s  idle/step {(tw - tb) * 1e6:6.1f} us",
        f"  gap queued (no argmax)  {tn * 1e3:7.3f} ms {1 / tn:7.1f} tok/s  argmax {(tb - tn) * 1e6:6.1f} us",
    ]


def host_parts(b, model, cache, context: int, ids, reps: int = 200) -> list[str]:
    """Host time of each piece of a decode step, the GPU idle before each (so a piece's
    time is its own, not a wait): where the idle time of ``host_gap`` goes."""
    import cupy

    logits = model.forward(ids, cache, all_logits=True)
    dev_ids = b.argmax_device(logits)
    small = np.arange(8, dtype=np.int32)
    dsmall = cupy.asarray(small)
    pinned = cupy.cuda.alloc_pinned_memory(64)
    host = np.frombuffer(pinned, dtype=np.int32, count=8)
    stream = cupy.cuda.get_current_stream()

    def each(fn, sync_before: bool = True) -> float:
        ts = []
        for _ in range(reps):
            if sync_before:
                b.synchronize()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        b.synchronize()
        return statistics.median(ts) * 1e6

    def forward_call() -> None:
        cache.truncate(context)
        model.forward(ids, cache, all_logits=True)

    def raw_get() -> None:
        cupy.cuda.runtime.memcpyAsync(host.ctypes.data, dev_ids.data.ptr, 4, 2, stream.ptr)
        stream.synchronize()

    def raw_set() -> None:
        cupy.cuda.runtime.memcpyAsync(dsmall.data.ptr, host.ctypes.data, 32, 1, stream.ptr)

    parts = {
        "forward() host call": forward_call,
        "argmax_device launch": lambda: b.argmax_device(logits),
        "ids .get()": lambda: dev_ids.get(),
        "ids pinned memcpy+sync": raw_get,
        "inputs .set()": lambda: dsmall.set(small),
        "inputs pinned memcpyAsync": raw_set,
        "np pack": lambda: b._pack([ids, np.arange(context, context + 1, dtype=np.int32)]),
        "stream.synchronize idle": stream.synchronize,
    }
    return [f"  host {name:<26s} {each(fn):7.1f} us" for name, fn in parts.items()]


def graph_op_time(b, fn, reps: int = 20, iters: int = 20) -> float:
    """Seconds per call of ``fn`` inside a CUDA graph of ``reps`` back-to-back calls."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=False)
    with stream:
        fn()
        stream.synchronize()
        graph, _ = b._capture(stream, lambda: [fn() for _ in range(reps)], [])
        graph.launch(stream)
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            graph.launch(stream)
        stream.synchronize()
    return (time.perf_counter() - t0) / (reps * iters)


def op_breakdown(b, model, cache, context: int) -> list[str]:
    """Per-op time inside graphs for one layer, at 1 and 16 rows."""
    import cupy

    c = model.config
    lw = model.layers[0]
    lines = []
    logits = cupy.asarray(
        np.random.default_rng(3).standard_normal((16, c.vocab_size)).astype(np.float32)
    )
    for n in (1, 2, 4, 8, 16) if TC else (1, 16):
        x = cupy.asarray(
            np.random.default_rng(2).standard_normal((n, c.d_model)).astype(np.float32)
        )
        pos = b.device_ints(np.arange(context - n, context))
        q = cupy.ones((n, c.n_heads, c.head_dim), dtype=cupy.float32)
        kv = cupy.ones((n, c.n_kv_heads, c.head_dim), dtype=cupy.float32)
        ff = cupy.ones((n, c.n_ff), dtype=cupy.float32)
        ops = {
            "norm+qkv": lambda x=x: b.norm_matmul(x, lw.attn_norm, 1e-6, lw.wqkv, lw.qkv_bias),
            "rope_store": lambda q=q, kv=kv, pos=pos: b.rope_store(
                q, kv, kv, pos, pos, 1e4, True, cache.k[0], cache.v[0]
            ),
            "attention": lambda q=q, pos=pos: b.attention(q, cache.k[0], cache.v[0], pos, 0, 0.1),
            "o+add": lambda q=q, x=x: b.matmul_add(q.reshape(q.shape[0], -1), lw.wo, x),
            "norm+gate_up+glu": lambda x=x: b.norm_matmul_glu(
                x, lw.ffn_norm, 1e-6, lw.w_gate_up, c.n_ff, False
            ),
            "down+add": lambda ff=ff, x=x: b.matmul_add(ff, lw.w_down, x),
            "norm+output": lambda x=x: b.norm_matmul(x, model.output_norm, 1e-6, model.output),
            "rms,output": lambda x=x: b.matmul(
                b.rms_norm(x, model.output_norm, 1e-6), model.output
            ),
            "argmax": lambda n=n: b.argmax_device(logits[:n]),
        }
        parts = [f"{name} {graph_op_time(b, fn) * 1e6:.1f}" for name, fn in ops.items()]
        lines.append(f"  ops n={n:<2d} (us): " + ", ".join(parts))
        if TC:  # the products on the tensor cores (every supported weight) / CUDA cores
            keep_tc = b.tensor_products, b.tensor_max_in, b.tensor_max_cols
            mm = {k: v for k, v in ops.items() if "," in k or "+" in k}
            for label, policy in (("tensor", (True, 10**9, 10**9)), ("cuda-core", (False, 0, 0))):
                b.tensor_products, b.tensor_max_in, b.tensor_max_cols = policy
                parts = [f"{name} {graph_op_time(b, fn) * 1e6:.1f}" for name, fn in mm.items()]
                lines.append(f"  ops n={n:<2d} {label} (us): " + ", ".join(parts))
            b.tensor_products, b.tensor_max_in, b.tensor_max_cols = keep_tc
        if AB:  # the products with round-4 kernels (plain, two launches) for comparison
            keep = b.factored_products, b.fuse_segment_pairs
            b.factored_products = b.fuse_segment_pairs = False
            mm = {k: v for k, v in ops.items() if "," in k or "+" in k}
            parts = [f"{name} {graph_op_time(b, fn) * 1e6:.1f}" for name, fn in mm.items()]
            lines.append(f"  ops n={n:<2d} plain,2-launch (us): " + ", ".join(parts))
            b.factored_products, b.fuse_segment_pairs = keep
        if TC:  # attention (row, head) items per block: a speed choice only
            keep_items = b.attn_items
            parts = []
            for items in (8, 16, 24, 48):
                b.attn_items = items
                parts.append(f"{items} {graph_op_time(b, ops['attention']) * 1e6:.1f}")
            b.attn_items = keep_items
            lines.append(f"  attention n={n:<2d} items per block (us): " + ", ".join(parts))
        if QUICK:
            continue
        keep_split = b.attn_split
        for split in (32, 64, 128):  # keys per attention split (fixed per backend)
            b.attn_split = split
            t = graph_op_time(b, ops["attention"])
            lines.append(f"  attention n={n:<2d} split {split}: {t * 1e6:.1f} us")
        b.attn_split = keep_split
        # columns per warp: 1 everywhere vs 4 everywhere (default: by grid size)
        keep = b.wide_min_blocks_per_sm, b.wide_min_blocks_one_row
        for label, policy in (("c1", 10**9), ("c4", 0)):
            b.wide_min_blocks_per_sm = b.wide_min_blocks_one_row = policy
            mm = {k: v for k, v in ops.items() if "," in k or "+" in k}
            parts = [f"{name} {graph_op_time(b, fn) * 1e6:.1f}" for name, fn in mm.items()]
            lines.append(f"  ops n={n:<2d} {label} (us): " + ", ".join(parts))
        b.wide_min_blocks_per_sm, b.wide_min_blocks_one_row = keep
        keep = b.ksplit_min_k, b.ksplit_gated
        for label, policy in (("ks-gated", (keep[0], True)), ("ks-all", (0, True))):
            b.ksplit_min_k, b.ksplit_gated = policy
            mm = {k: v for k, v in ops.items() if "," in k or "+" in k}
            parts = [f"{name} {graph_op_time(b, fn) * 1e6:.1f}" for name, fn in mm.items()]
            lines.append(f"  ops n={n:<2d} {label} (us): " + ", ".join(parts))
        b.ksplit_min_k, b.ksplit_gated = keep
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-1.5b")
    ap.add_argument("--ks", default="1,2,4,8,16")
    ap.add_argument("--out", default="/tmp/echoline-bench")
    switches = {  # each an interleaved A/B or a probe; see the module's round notes
        "ab": "interleaved A/B of the round-5 product policies",
        "tc": "interleaved A/B: CUDA-core vs tensor-core products",
        "attn": "interleaved A/B: CUDA-core vs tensor-core attention",
        "rowsplit": "interleaved A/B: 9-17-row launches split over blocks or not",
        "units": "interleaved A/B: tensor-product units in flight",
        "xprep": "interleaved A/B: x converted once per product from N rows",
        "minblocks": "interleaved A/B: resident tensor-product blocks per SM",
        "attnblocks": "interleaved A/B: resident attention blocks per SM",
        "narrow": "interleaved A/B: narrow weights' K split 16 ways below 2 units per warp",
        "attngroup": "interleaved A/B: attention items per warp (and their resident blocks)",
        "attngroup2": "interleaved A/B: two items per warp, resident blocks and items per block",
        "pdl": "interleaved A/B: programmatic dependent launch of every kernel or not",
        "wide": "interleaved A/B: the head's warps per tile and row groups",
        "gap": "GPU idle time per decode step (host work)",
        "chain": "interleaved A/B: the plain loop with steps chained on the device or not",
        "quick": "skip the split / columns / split-K sweeps",
    }
    for flag, text in switches.items():
        ap.add_argument(f"--{flag}", action="store_true", help=text)
    args = ap.parse_args()
    global AB, QUICK, TC, ATTN, ROWSPLIT, GAP
    AB, QUICK, TC, ATTN, ROWSPLIT = args.ab, args.quick, args.tc, args.attn, args.rowsplit
    GAP = args.gap
    global CHAIN
    CHAIN = args.chain
    POLICY_AB.update(name for name in POLICY_SWITCHES if getattr(args, name))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ks = [int(k) for k in args.ks.split(",")]
    report = []
    for name in args.models.split(","):
        report += bench(name, args.context, args.reps, ks, out)
        print("\n".join(report[-(len(ks) + 6) :]), flush=True)
    print("\n== summary ==\n" + "\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
