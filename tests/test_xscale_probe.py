"""The x-scale probe's own arithmetic (tools/cuda/xscale_probe.py): its int8 rounding per
group and how it compares replies. The figures it prints are in docs/history/cuda-rounds.md."""

from __future__ import annotations

import numpy as np

from tools.cuda.xscale_probe import first_difference, quantize_groups


def test_quantize_groups_moves_each_element_at_most_half_a_step() -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 896)) * rng.choice([1e-3, 1.0, 50.0], size=(5, 1))).astype(np.float32)
    for group in (32, 256):  # 896 = 3.5 x 256: the last group is shorter
        q = quantize_groups(x, group)
        padded = np.pad(np.abs(x.astype(np.float64)), ((0, 0), (0, -896 % group)))
        step = np.repeat(padded.reshape(5, -1, group).max(axis=2) / 127.0, group, axis=1)[:, :896]
        assert q.shape == x.shape
        assert np.all(np.abs(q - x) <= step / 2 * (1 + 1e-12))
        codes = q / np.where(step > 0, step, 1.0)
        assert np.allclose(codes, np.rint(codes)) and np.abs(codes).max() <= 127 + 1e-9
    assert np.array_equal(quantize_groups(np.zeros((1, 64), np.float32), 32), np.zeros((1, 64)))


def test_first_difference_counts_positions_and_lengths() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2
