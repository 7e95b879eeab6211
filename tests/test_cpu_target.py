"""Which CPU numba generates the kernels for: the host, or the one NUMBA_CPU_NAME names.

Why it matters: with ``NUMBA_CPU_NAME=haswell`` (AVX2 code, a stand-in for the x86 machines
without AVX-512) the q8 mode, whose kernels emit AVX-512 VNNI instructions, must not be
picked, and the kernel cache must not be shared with the host's code.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import pytest
from echoline.kernels.cpu import numba_setup, q8act


@pytest.fixture
def target(monkeypatch):
    def set_target(name: str | None, feats: str | None = None) -> None:
        monkeypatch.setattr(numba_setup._config, "CPU_NAME", name)
        monkeypatch.setattr(numba_setup._config, "CPU_FEATURES", feats)

    return set_target


def test_host_by_default(target):
    target(None)
    assert numba_setup.target_cpu() == (llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())
    host = llvm.get_host_cpu_features()
    assert q8act.vnni_available() == bool(host.get("avx512vnni") and host.get("avx512bw"))


def test_a_named_cpu_changes_the_cache_key_and_drops_vnni(target):
    target(None)
    host_key = numba_setup._cpu_name()
    target("haswell", "")  # NUMBA_CPU_FEATURES empty: the named CPU's own features
    assert numba_setup.target_cpu() == ("haswell", "")
    assert numba_setup._cpu_name() != host_key  # its own cache folder: never the host's code
    assert not q8act.vnni_available() and numba_setup.target_has("avx2") and q8act.q8_available()
    target("pentium4", "")  # unknown to the table: every feature absent
    assert not numba_setup.target_has("avx2") and not q8act.q8_available()


def test_a_name_alone_keeps_the_host_features(target):
    """As numba does: NUMBA_CPU_NAME without NUMBA_CPU_FEATURES still passes the host's
    feature flags to LLVM, so the VNNI choice follows the host's."""
    target(None)
    host_vnni = q8act.vnni_available()
    target("haswell")
    assert numba_setup.target_cpu() == ("haswell", llvm.get_host_cpu_features().flatten())
    assert q8act.vnni_available() == host_vnni


def test_explicit_features_decide(target):
    target("icelake-server", "+avx512vnni,+avx512bw,+avx2")
    assert q8act.vnni_available() and numba_setup.target_has("avx2")
    target("icelake-server", "+avx2,-avx512vnni")
    assert not q8act.vnni_available()


# --- the kernels a host gets, by feature masks (not by what this test machine happens to be)

#: Feature sets of real CPU kinds, as LLVM names them
ZEN4 = frozenset({"avx", "avx2", "fma", "f16c", "bmi", "bmi2", "popcnt", "lzcnt", "movbe", "avx512f", "avx512bw",
                  "avx512dq", "avx512vl", "avx512vnni", "avx512bf16", "avx512vbmi"})  # fmt: skip
ALDERLAKE = frozenset({"avx", "avx2", "fma", "f16c", "bmi", "bmi2", "popcnt", "lzcnt", "movbe", "avxvnni"})
HASWELL = frozenset({"avx", "avx2", "fma", "f16c", "bmi", "bmi2", "popcnt", "lzcnt", "movbe"})
SSE_ONLY = frozenset({"popcnt"})


def _as_host(monkeypatch, feats: frozenset[str]) -> None:
    """Make this process see a host (LLVM's own CPU name) with exactly ``feats``: every code
    feature named on or off, as a real host's flattened LLVM feature string names them, so the
    result does not hang on whether this machine's CPU name is one the named-CPU table knows
    (on a Zen 3, "znver3", a bare "+popcnt" would have kept that table's AVX2)."""
    flags = [f"+{f}" for f in sorted(feats)] + [f"-{f}" for f in sorted(numba_setup.CODE_FEATURES - feats)]
    monkeypatch.setattr(numba_setup._config, "CPU_NAME", None)
    monkeypatch.setattr(numba_setup._config, "CPU_FEATURES", ",".join(flags))
    monkeypatch.setattr(numba_setup, "host_features", lambda: feats)


@pytest.mark.parametrize(
    ("feats", "form", "wide"),
    [(ZEN4, "avx512vnni", True), (ALDERLAKE, "avxvnni", False), (HASWELL, "avx2", False), (SSE_ONLY, None, False)],
    ids=["zen4", "alderlake", "haswell", "sse"],
)
def test_kernel_choice_follows_the_host_features(monkeypatch, feats, form, wide):
    """The int8 dot form and the float tiles follow the features alone: never AVX-VNNI on a
    host without it (Zen 4), never AVX-512 on one without it (Alder Lake, Haswell)."""
    from echoline.kernels.cpu import matmul

    _as_host(monkeypatch, feats)
    assert q8act.dot_form() == form
    assert q8act.vnni_available() == (form == "avx512vnni")
    assert q8act.q8_available() == (form is not None)
    assert (matmul.tiles_for_target() == matmul.WIDE_TILES) == wide
    assert numba_setup.missing_on_host() == []  # the host's own code always runs on it


def test_named_cpu_beyond_the_host_is_refused(monkeypatch):
    """Code for a named CPU runs only where the host has what it uses: Alder Lake's AVX-VNNI
    on a Zen 4 is named as missing, and the backend refuses with a clear error instead of
    dying with SIGILL."""
    from echoline.engine.backends.cpu_backend import CpuBackend
    from echoline.engine.errors import EcholineError

    monkeypatch.setattr(numba_setup, "host_features", lambda: ZEN4)
    monkeypatch.setattr(numba_setup._config, "CPU_NAME", "alderlake")
    monkeypatch.setattr(numba_setup._config, "CPU_FEATURES", "")
    assert numba_setup.missing_on_host() == ["avxvnni"]
    assert numba_setup.missing_on_host(ALDERLAKE) == []
    assert numba_setup.missing_on_host(HASWELL) == ["avxvnni"]
    with pytest.raises(EcholineError, match="avxvnni"):
        CpuBackend(activations="f32")
    monkeypatch.setattr(numba_setup._config, "CPU_NAME", "haswell")
    assert numba_setup.missing_on_host() == [] and numba_setup.missing_on_host(SSE_ONLY) == [
        "avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe"]  # fmt: skip
    monkeypatch.setattr(numba_setup._config, "CPU_FEATURES", "+avx512f")  # a name plus a feature on top
    assert numba_setup.missing_on_host(HASWELL) == ["avx512f"]


CHILD = r"""
import re, sys
import numpy as np
from echoline.engine.backends.cpu_backend import CpuBackend
from echoline.kernels.cpu import q8act
from echoline.kernels.cpu.matmul import prepare
from tests.test_cpu_kernels import make_tensor
import gguf
assert q8act.dot_form() == "avx2", q8act.dot_form()
t = make_tensor(gguf.GGMLQuantizationType.Q4_1, 64, 64, 0)
q8act.matmul_q8(np.ones((3, 64), np.float32), q8act.prepare_q8(prepare([t]), packed=False))
asm = q8act.kernel_asm(32, True)
assert asm.count("vpmaddubsw") > 0, "not the AVX2 form"
bad = sorted(set(re.findall(r"\b(vpdpbusds?|zmm\d+|k[1-7]\b|\{vex\})", asm)))
print("BAD", bad)
"""


@pytest.mark.slow
def test_generated_code_has_no_avx512_or_vnni_under_an_avx2_mask(tmp_path):
    """Built with the host's name but a feature list with AVX-512 and AVX-VNNI masked off
    (what an AVX2 laptop's host features look like), the int8 kernels' machine code holds no
    ``vpdpbusd``, no zmm register, no mask register: only the AVX2 form. Masking features off
    the host's own list is safe to run on any host that has AVX2."""
    import os
    import subprocess
    import sys

    if "avx2" not in numba_setup.host_features():
        pytest.skip("this CPU lacks avx2, which the AVX2 form uses")
    mask = ",".join(f"+{f}" for f in sorted(HASWELL))
    mask += "".join(f",-{f}" for f in sorted(numba_setup.CODE_FEATURES - HASWELL))
    (tmp_path / "child.py").write_text(CHILD)
    env = {**os.environ, "NUMBA_CPU_NAME": llvm.get_host_cpu_name(), "NUMBA_CPU_FEATURES": mask,
           "ECHOLINE_CPU_ACTIVATIONS": "q8", "PYTHONPATH": os.getcwd()}  # fmt: skip
    out = subprocess.run([sys.executable, str(tmp_path / "child.py")], env=env, capture_output=True, text=True,
                         timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "BAD []" in out.stdout, out.stdout[-2000:]


def test_llamacpp_peer_builds_only_what_the_host_runs(monkeypatch):
    """The peer's CMake switches name only features in /proc/cpuinfo: on a Zen 4 (AVX-512 VNNI,
    no AVX-VNNI) no ``GGML_AVX_VNNI``; capped to AVX2 (``ECHOLINE_PEER_ISA=avx2``), nothing of
    AVX-512 either."""
    from tools import llamacpp_peer

    zen4 = {"avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512_vnni", "avx512vbmi", "avx512_bf16"}
    monkeypatch.setattr(llamacpp_peer, "_cpu_flags", lambda: zen4)
    monkeypatch.delenv("ECHOLINE_PEER_ISA", raising=False)
    flags = llamacpp_peer.isa_flags()
    assert "-DGGML_AVX512_VNNI=ON" in flags and "-DGGML_AVX_VNNI=ON" not in flags
    monkeypatch.setenv("ECHOLINE_PEER_ISA", "avx2")
    assert not [f for f in llamacpp_peer.isa_flags() if "512" in f or "VNNI" in f]
    monkeypatch.setattr(llamacpp_peer, "_cpu_flags", lambda: {"avx", "avx2", "fma", "f16c", "avx_vnni"})
    monkeypatch.delenv("ECHOLINE_PEER_ISA")
    assert "-DGGML_AVX_VNNI=ON" in llamacpp_peer.isa_flags() and not [f for f in llamacpp_peer.isa_flags() if "512" in f]
