"""The measured cost curve: clamped to what is physically possible, cached, sane."""

from __future__ import annotations

import pytest
from echoline.engine.backends.numpy_backend import NumpyBackend
from echoline.engine.calibration import _sane, measure_verify_cost
from echoline.engine.models.loader import load_model

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
    monkeypatch.delenv("ECHOLINE_CACHE_DIR", raising=False)  # the caches follow XDG here
    path = write_model(tmp_path / "m.gguf", "llama", context=1024)
    _, model = load_model(path, NumpyBackend())
    cost = measure_verify_cost(model, path)
    ratios = cost.ratios(17, 100)
    assert ratios[1] == 1.0
    assert all(1.0 <= ratios[k] <= k + 1e-9 for k in range(1, 18))
    assert list((tmp_path / "cache" / "echoline" / "calibration").glob("*.json"))
    again = measure_verify_cost(model, path, recheck=False)  # read back from the cache file
    assert again.ratios(17, 100) == ratios


def test_extrapolated_grid_stays_monotone_in_rows(tmp_path, monkeypatch):
    """A one-row slope steeper than the two-row one must not make T(2) < T(1) far out."""
    import json

    from echoline.engine import calibration

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ECHOLINE_CACHE_DIR", raising=False)  # the caches follow XDG here
    path = write_model(tmp_path / "m.gguf", "llama", context=16384)
    _, model = load_model(path, NumpyBackend())
    lo, hi = calibration.CAL_CONTEXTS
    table = {
        lo: {r: 0.006 + 0.0008 * (r - 1) for r in calibration.CAL_ROWS},
        hi: {r: 0.009 + 0.0008 * (r - 1) for r in calibration.CAL_ROWS},
    }
    table[hi][2] = table[lo][2] + 0.0010  # two rows grow far slower with context than one
    cache_file = calibration._cache_file(path, model.backend.name)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text(json.dumps(table))
    cost = measure_verify_cost(model, path, recheck=False)  # this very table, not a fresh one
    for ctx in (0, 1024, 2048, 8192):
        ratios = cost.ratios(17, ctx)
        assert all(ratios[k] >= ratios[k - 1] for k in range(2, 18)), (ctx, ratios)


def test_cached_curve_is_keyed_by_the_kernel_sources(tmp_path, monkeypatch):
    """A kernel change (another code stamp) must not reuse a curve measured before it."""
    from echoline.engine import calibration

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ECHOLINE_CACHE_DIR", raising=False)  # the caches follow XDG here
    path = write_model(tmp_path / "m.gguf", "llama", context=1024)
    before = calibration._cache_file(path, "cpu")
    assert calibration._cache_file(path, "cpu") == before
    monkeypatch.setattr(calibration, "_code_stamp", lambda: "another-kernel-build")
    assert calibration._cache_file(path, "cpu") != before


def _measured(tmp_path, monkeypatch):
    """A tiny model with its curve measured and cached: (model, path, cache file, table)."""
    import json

    from echoline.engine import calibration

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ECHOLINE_CACHE_DIR", raising=False)  # the caches follow XDG here
    path = write_model(tmp_path / "m.gguf", "llama", context=1024)
    _, model = load_model(path, NumpyBackend())
    measure_verify_cost(model, path, recheck=False)
    cache_file = calibration._cache_file(path, model.backend.name)
    table = {int(c): {int(r): t for r, t in v.items()} for c, v in json.loads(cache_file.read_text()).items()}
    return model, path, cache_file, table


def test_contended_cached_curve_is_measured_again(tmp_path, monkeypatch):
    """A cached curve whose wide verify is far dearer than a quick check now finds (a first
    calibration under contention) is replaced by a fresh measurement, also on disk."""
    import json

    from echoline.engine import calibration

    model, path, cache_file, table = _measured(tmp_path, monkeypatch)
    wide = max(calibration.CAL_ROWS)
    lo = min(table)
    contended = {c: {r: t * (1 + r) for r, t in v.items()} for c, v in table.items()}  # k rows cost ~k steps
    cache_file.write_text(json.dumps(contended))
    assert calibration.cached_curve_is_pessimistic(model, contended, lo)
    again = measure_verify_cost(model, path)
    assert again.ratio(wide, 64) < 0.6 * (contended[lo][wide] / contended[lo][1])
    rewritten = json.loads(cache_file.read_text())
    assert rewritten[str(lo)][str(wide)] / rewritten[str(lo)]["1"] < 0.6 * (contended[lo][wide] / contended[lo][1])


def test_a_cached_curve_slower_everywhere_is_measured_again(tmp_path, monkeypatch):
    """Measured under load, every time of a curve is inflated (ratios included, by noise):
    a one-row forward now far faster than the cached one condemns the cached curve, even
    when its wide/one-row ratio looks plausible; an honest cached curve is kept."""

    from echoline.engine import calibration

    model, path, cache_file, table = _measured(tmp_path, monkeypatch)
    lo = min(table)
    wide = max(calibration.CAL_ROWS)
    # The quick check's own timing is pinned to the cached one: a real re-measurement
    # would make this test hang on whatever else the machine runs at that moment.
    now = {1: table[lo][1], wide: table[lo][wide]}
    monkeypatch.setattr(calibration, "row_times", lambda *a, **k: dict(now))
    honest = table
    assert not calibration.cached_curve_is_pessimistic(model, honest, lo)
    loaded = {c: {r: t * 3.0 for r, t in v.items()} for c, v in table.items()}  # same ratios, 3x slower
    assert calibration.cached_curve_is_pessimistic(model, loaded, lo)
    now[wide] = table[lo][wide] * 0.5  # the wide verify now clearly cheaper than cached
    assert calibration.cached_curve_is_pessimistic(model, honest, lo)


def test_a_second_process_waits_for_the_calibration_under_way_and_reuses_it(tmp_path, monkeypatch):
    """Two sidecars starting together must not time their forwards against each other:
    while one holds the calibration lock, the other waits, then reads the curve it wrote."""
    import fcntl
    import json
    import subprocess
    import sys
    import threading

    from echoline.engine import calibration

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ECHOLINE_CACHE_DIR", raising=False)  # the caches follow XDG here
    path = write_model(tmp_path / "m.gguf", "llama", context=1024)
    _, model = load_model(path, NumpyBackend())
    cache_file = calibration._cache_file(path, model.backend.name)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    lo, hi = calibration.CAL_CONTEXTS
    theirs = {c: {r: 0.01 * (1 + 0.05 * r) * (1 + c / 1000) for r in calibration.CAL_ROWS} for c in (lo, hi)}
    # Another process holds the lock, as a calibrating sidecar would, until told to write.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys\n"
            f"h = open({str(cache_file.with_suffix('.lock'))!r}, 'a')\n"
            "fcntl.flock(h, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.readline()\n"
            f"open({str(cache_file)!r}, 'w').write(sys.argv[1])\n",
            json.dumps(theirs),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    result: dict = {}
    waiter = threading.Thread(target=lambda: result.update(cost=measure_verify_cost(model, path, recheck=False)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive(), "calibration ran while another process held the lock"
    holder.communicate("go\n", timeout=30)
    waiter.join(60)
    assert not waiter.is_alive()
    expected = measure_verify_cost(model, path, recheck=False).ratios(17, lo)
    assert result["cost"].ratios(17, lo) == expected
    on_disk = {int(c): {int(r): t for r, t in v.items()} for c, v in json.loads(cache_file.read_text()).items()}
    assert on_disk == theirs  # the waiter reused the other process's curve rather than measuring its own
    with open(cache_file.with_suffix(".lock"), "a") as h:  # and let go of the lock when done
        fcntl.flock(h, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.parametrize("verify_rows", [17, 64])
def test_the_curve_is_measured_as_wide_as_the_engine_drafts(tmp_path, monkeypatch, verify_rows):
    """The longest verify (the default max_draft drafts + the pending token) is a measured row
    count, so the controller never prices the verifies it picks most on copy traffic by
    extrapolation: 17 rows where the backend says nothing, 64 where it offers 64 (CUDA)."""
    from echoline.engine import calibration
    from echoline.engine.api import default_max_draft

    monkeypatch.delenv("ECHOLINE_MAX_DRAFT", raising=False)
    backend = NumpyBackend()
    backend.verify_max_rows = verify_rows
    _, model = load_model(write_model(tmp_path / "m.gguf", "llama", context=1024), backend)
    rows = calibration.cal_rows(model)
    assert default_max_draft(backend) + 1 == verify_rows == max(rows)
    assert rows[: len(calibration.CAL_ROWS)] == calibration.CAL_ROWS
    cost = measure_verify_cost(model, None)
    assert cost.rows == list(rows)
    monkeypatch.setenv("ECHOLINE_MAX_DRAFT", "5")
    assert default_max_draft(backend) == 5


def test_a_cached_curve_of_other_rows_is_measured_again(tmp_path, monkeypatch):
    """A curve cached for 17 rows is not used once the backend verifies 64 (and not the other
    way round): its widest drafts would be priced by extrapolation."""
    import json

    from echoline.engine import calibration

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ECHOLINE_CACHE_DIR", raising=False)
    path = write_model(tmp_path / "m.gguf", "llama", context=1024)
    backend = NumpyBackend()
    backend.verify_max_rows = 64
    _, model = load_model(path, backend)
    lo, hi = calibration.CAL_CONTEXTS
    table = {c: {r: 0.01 * r for r in calibration.CAL_ROWS} for c in (lo, hi)}
    cache_file = calibration._cache_file(path, model.backend.variant)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text(json.dumps(table))
    cost = measure_verify_cost(model, path, recheck=False)
    assert cost.rows[-1] == 64
    assert sorted(json.loads(cache_file.read_text())[str(lo)], key=int)[-1] == "64"


def test_an_unwritable_cache_costs_a_measurement_not_the_request(tmp_path, monkeypatch):
    """Disk full or a read-only cache: the curve is measured and used, nothing raises."""
    from pathlib import Path

    from echoline.engine import calibration

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ECHOLINE_CACHE_DIR", raising=False)  # the caches follow XDG here
    path = write_model(tmp_path / "m.gguf", "llama", context=1024)
    _, model = load_model(path, NumpyBackend())

    def full(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    monkeypatch.setattr(Path, "mkdir", full)
    cost = measure_verify_cost(model, path)
    assert cost.ratio(max(calibration.CAL_ROWS), 64) >= 1.0
    assert not calibration._cache_file(path, model.backend.name).exists()
