"""Benchmarks: speeds as ratios measured in one run (interleaved rounds, medians)."""
