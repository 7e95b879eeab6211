"""Which CPU numba generates the kernels for: the host, or the one NUMBA_CPU_NAME names.

Why it matters: with ``NUMBA_CPU_NAME=haswell`` (AVX2 code, a stand-in for the x86 machines
without AVX-512) the q8 mode, whose kernels emit AVX-512 VNNI instructions, must not be
picked, and the kernel cache must not be shared with the host's code.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import pytest
from echoline.kernels.cpu import _env, q8act


@pytest.fixture
def target(monkeypatch):
    def set_target(name: str | None, feats: str | None = None) -> None:
        monkeypatch.setattr(_env._config, "CPU_NAME", name)
        monkeypatch.setattr(_env._config, "CPU_FEATURES", feats)

    return set_target


def test_host_by_default(target):
    target(None)
    assert _env.target_cpu() == (llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())
    host = llvm.get_host_cpu_features()
    assert q8act.vnni_available() == bool(host.get("avx512vnni") and host.get("avx512bw"))


def test_a_named_cpu_changes_the_cache_key_and_drops_vnni(target):
    target(None)
    host_key = _env._cpu_name()
    target("haswell", "")  # NUMBA_CPU_FEATURES empty: the named CPU's own features
    assert _env.target_cpu() == ("haswell", "")
    assert _env._cpu_name() != host_key  # its own cache folder: never the host's code
    assert not q8act.vnni_available() and _env.target_has("avx2") and q8act.q8_available()
    target("pentium4", "")  # unknown to the table: every feature absent
    assert not _env.target_has("avx2") and not q8act.q8_available()


def test_a_name_alone_keeps_the_host_features(target):
    """As numba does: NUMBA_CPU_NAME without NUMBA_CPU_FEATURES still passes the host's
    feature flags to LLVM, so the VNNI choice follows the host's."""
    target(None)
    host_vnni = q8act.vnni_available()
    target("haswell")
    assert _env.target_cpu() == ("haswell", llvm.get_host_cpu_features().flatten())
    assert q8act.vnni_available() == host_vnni


def test_explicit_features_decide(target):
    target("icelake-server", "+avx512vnni,+avx512bw,+avx2")
    assert q8act.vnni_available() and _env.target_has("avx2")
    target("icelake-server", "+avx2,-avx512vnni")
    assert not q8act.vnni_available()
