"""One cache root (``echoline.paths``): ``ECHOLINE_CACHE_DIR``, its deprecated aliases, and
every module that keeps files reading its folder from there."""

from __future__ import annotations

from pathlib import Path

import pytest

from echoline import paths


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (paths.ENV, *paths.DEPRECATED_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(paths, "_warned", set())
    return monkeypatch


def test_the_variable_moves_every_cache(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from echoline.engine import calibration, model_catalog, setup_check, tokenizer
    from echoline.kernels.cpu import numba_setup, weight_cache

    clean_env.setenv("ECHOLINE_CACHE_DIR", str(tmp_path))
    assert paths.cache_root() == tmp_path
    assert model_catalog.cache_dir() == tmp_path / "models"
    assert model_catalog.model_path("smollm2").parent == tmp_path / "models"
    assert tokenizer.default_cache_dir() == tmp_path / "tokenizers"
    assert weight_cache.cache_dir() == tmp_path / "relayout"
    assert numba_setup.cache_root().parent == tmp_path / "numba"
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    assert calibration._cache_file(model, "cpu").parent == tmp_path / "calibration"
    assert setup_check._cache_dirs() == {k: tmp_path / v for k, v in paths.KINDS.items()}


def test_without_the_variable_the_platform_cache_folder(clean_env: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    clean_env.setattr(paths.sys, "platform", "linux")
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir("models") == tmp_path / "xdg" / "echoline" / "models"


@pytest.mark.parametrize("old", paths.DEPRECATED_ENV)
def test_the_old_variables_still_work_with_a_warning(clean_env: pytest.MonkeyPatch, tmp_path: Path,
                                                     old: str) -> None:
    clean_env.setenv(old, str(tmp_path / "old"))
    with pytest.warns(DeprecationWarning, match="ECHOLINE_CACHE_DIR"):
        assert paths.cache_dir("models") == tmp_path / "old" / "models"
    clean_env.setenv("ECHOLINE_CACHE_DIR", str(tmp_path / "new"))  # the new name wins
    assert paths.cache_dir("models") == tmp_path / "new" / "models"


def test_an_unknown_kind_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown cache kind 'modles'; known: models"):
        paths.cache_dir("modles")


def test_no_module_builds_a_cache_folder_of_its_own() -> None:
    """The old variables and ``~/.cache`` appear nowhere but in ``echoline.paths``."""
    root = Path(__file__).resolve().parents[1]
    offenders = []
    for folder in ("engine", "kernels", "sidecar", "echoline"):
        for f in (root / folder).rglob("*.py"):
            text = f.read_text()
            if f.name != "paths.py" and any(
                s in text for s in ('"ECHOLINE_HOME"', '"ECHOLINE_CACHE"', '"ECHOLINE_CACHE_DIR"',
                                    '"XDG_CACHE_HOME"', '".cache"')
            ):
                offenders.append(str(f.relative_to(root)))
    assert offenders == []
