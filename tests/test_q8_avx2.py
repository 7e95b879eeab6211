"""The int8 (q8) products built for an AVX2 or AVX-VNNI CPU give the bits the host's own
kernels give.

The AVX2 form (kernels/cpu/q8act.py ``_dot256``) takes the same integer dot with
``vpmaddubsw`` / ``vpmaddwd`` (and ``vpsignb`` for 8-bit weights), so a machine without VNNI
runs the same q8 mode with the same replies. Checked here by building the kernels in a child
process for ``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=`` (that CPU's own features: AVX2, no
AVX-512; numba generates its code and caches it apart), and for ``alderlake`` (AVX-VNNI:
``vpdpbusd`` on 256-bit halves), and comparing every output bit with this process's kernels
(the host's own form), over the weight layouts of 4, 5, 6 and 8 bits and 1 to 17 rows,
including weights whose every code is at its largest against activations all at +127 or -127
(where the AVX2 form's ``vpmaddubsw`` pair sums reach their bound).

A target runs only where this CPU has every feature its code may use (``numba_setup.missing_on_host``):
AMD Zen 4 has AVX-512 VNNI but not the VEX-encoded AVX-VNNI, so Alder Lake's kernels would die
there with SIGILL; that target is skipped, naming the missing feature.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from tests.synth import encode_matrix

pytestmark = pytest.mark.slow
Q = gguf.GGMLQuantizationType
TYPES = (Q.Q4_K, Q.Q5_0, Q.Q6_K, Q.Q8_0, Q.Q4_0)
ROWS = (1, 3, 17)
#: type -> (block bytes, byte spans of its codes): Q4_K's nibbles; Q5_0's high bits and
#: nibbles; Q6_K's low nibbles and high bits (scales and d stay as drawn)
SATURATE = {Q.Q4_K: (144, [(16, 144)]), Q.Q5_0: (22, [(2, 22)]), Q.Q6_K: (210, [(0, 192)])}

CHILD = r"""
import json, sys
import numpy as np
from echoline.engine.backends.cpu_backend import CpuBackend
from echoline.engine.gguf_file import QuantTensor
from echoline.kernels.cpu import q8act
spec = json.load(open(sys.argv[1]))
data = np.load(sys.argv[2])
assert q8act.dot_form() == spec["form"], f"the child runs the wrong kernels: {q8act.dot_form()}"
b = CpuBackend(activations="q8")
out = {}
for name, shape, qtype in spec["weights"]:
    t = QuantTensor(name, qtype, tuple(shape), data[name])
    w = b.prepare_matrix([t])
    for n in spec["rows"]:
        out[f"{name}-{n}"] = np.asarray(b.matmul(data["x"][:n], w))
np.savez(sys.argv[3], **out)
"""
#: named CPUs the kernels are cross-built for, and the dot form each must get
TARGETS = {"haswell": "avx2", "alderlake": "avxvnni"}


def _run(tmp: Path, tag: str, env: dict, form: str, spec: dict) -> dict:
    (tmp / f"{tag}.json").write_text(json.dumps({**spec, "form": form}))
    out = tmp / f"{tag}.npz"
    subprocess.run([sys.executable, str(tmp / "child.py"), str(tmp / f"{tag}.json"), str(tmp / "data.npz"), str(out)],
                   check=True, env=env, timeout=900)  # fmt: skip
    return dict(np.load(out))


def _missing_for(cpu: str, monkeypatch) -> list[str]:
    """What code built for ``cpu`` may use that this host lacks (as the child would see it)."""
    from echoline.kernels.cpu import numba_setup

    monkeypatch.setattr(numba_setup._config, "CPU_NAME", cpu)
    monkeypatch.setattr(numba_setup._config, "CPU_FEATURES", "")
    try:
        return numba_setup.missing_on_host()
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("cpu", sorted(TARGETS))
def test_cross_built_products_equal_host_products(tmp_path, cpu, monkeypatch):
    from echoline.kernels.cpu import q8act

    host_form = q8act.dot_form()
    if host_form is None:
        pytest.skip("this CPU has no int8 kernels (needs avx2) to compare against")
    missing = _missing_for(cpu, monkeypatch)
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(missing)}, which code built for {cpu} uses")
    rng = np.random.default_rng(7)
    cols = 512
    arrays, weights = {}, []
    for q in TYPES:
        data, _ = encode_matrix(rng, 40, cols, q)
        arrays[q.name] = np.ascontiguousarray(data).reshape(40, -1).view(np.uint8)
        weights.append([q.name, [40, cols], int(q)])
        if q in SATURATE:  # every code at its largest: the AVX2 form's pair sums at their bound
            size, spans = SATURATE[q]
            sat = arrays[q.name].copy().reshape(40, -1, size)
            for a, b in spans:
                sat[:, :, a:b] = 0xFF
            arrays[f"{q.name}-sat"] = sat.reshape(40, -1)
            weights.append([f"{q.name}-sat", [40, cols], int(q)])
    arrays["x"] = (rng.standard_normal((max(ROWS), cols)) * rng.choice([1e-3, 1.0, 40.0], (max(ROWS), 1))).astype(
        np.float32
    )
    arrays["x"][0], arrays["x"][1] = 1.0, -1.0  # every activation at +127, then at -127
    np.savez(tmp_path / "data.npz", **arrays)
    (tmp_path / "child.py").write_text(CHILD)
    base = {**os.environ, "ECHOLINE_CPU_ACTIVATIONS": "q8"}
    for var in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"):
        base.pop(var, None)
    spec = {"weights": weights, "rows": list(ROWS)}
    host = _run(tmp_path, "host", base, host_form, spec)
    other = _run(tmp_path, cpu, {**base, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": ""}, TARGETS[cpu], spec)
    assert set(host) == set(other) and len(host) == len(weights) * len(ROWS)
    for key, want in host.items():
        assert np.isfinite(want).all()
        assert np.array_equal(other[key], want), f"{key}: {cpu} ({TARGETS[cpu]}) and host ({host_form}) products differ"
