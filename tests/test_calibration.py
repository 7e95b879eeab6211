"""The measured cost curve: clamped to what is physically possible, cached, sane."""

from __future__ import annotations

from engine.backends.numpy_backend import NumpyBackend
from engine.calibration import _sane, measure_verify_cost
from engine.model import load_model
from tests.synth import write_model


def test_outliers_are_clamped_to_k_single_rows_and_monotone():
    noisy = {1: 10.0, 2: 12.0, 3: 900.0, 4: 16.0, 8: 5.0, 17: 40.0}
    got = _sane(noisy)
    assert got[3] == 30.0  # never more than three one-row forwards
    assert got[4] == 30.0 and got[8] == 30.0  # never less than fewer rows
    assert got[17] == 40.0
    clean = {1: 8.0, 2: 9.0, 4: 12.0}
    assert _sane(clean) == clean


def test_measured_curve_is_cached_and_plausible(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = write_model(tmp_path / "m.gguf", "llama", context=1024)
    _, model = load_model(path, NumpyBackend())
    cost = measure_verify_cost(model, path)
    ratios = cost.ratios(17, 100)
    assert ratios[1] == 1.0
    assert all(1.0 <= ratios[k] <= k + 1e-9 for k in range(1, 18))
    assert list((tmp_path / "cache" / "echoline" / "calibration").glob("*.json"))
    again = measure_verify_cost(model, path)  # read back from the cache file
    assert again.ratios(17, 100) == ratios
