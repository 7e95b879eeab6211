"""CudaTuning: the CUDA backend's speed choices (no CuPy needed to test them)."""

from __future__ import annotations

from dataclasses import fields

from echoline.engine.backends.cuda_tuning import CudaTuning, install_tuned_attributes


def test_environment_overrides_take_only_well_formed_values() -> None:
    assert CudaTuning.from_env({}) == CudaTuning()
    t = CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_ATTENTION": "1", "ECHOLINE_CUDA_TENSOR_UNITS": "2"})
    assert t.tensor_attention is True and t.tensor_units == 2
    assert CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_ATTENTION": "0"}).tensor_attention is False
    odd = CudaTuning.from_env({"ECHOLINE_CUDA_TENSOR_ATTENTION": "yes", "ECHOLINE_CUDA_TENSOR_UNITS": "3"})
    assert odd == CudaTuning()


def test_backend_attributes_read_and_write_the_tuning() -> None:
    @install_tuned_attributes
    class Holder:
        def __init__(self) -> None:
            self.tuning = CudaTuning()

    a, b = Holder(), Holder()
    for f in fields(CudaTuning):
        assert getattr(a, f.name) == getattr(a.tuning, f.name)
        assert getattr(Holder, f.name) == f.default  # the class reads the defaults
    a.tensor_products = False
    a.attn_split = 64
    assert a.tuning.tensor_products is False and a.tuning.attn_split == 64
    assert b.tensor_products is True and b.attn_split == 32  # per instance, not shared
