"""The wheel: one ``echoline`` name in site-packages, every file the backends read, and the
README's main command working from a fresh, non-editable install in another folder."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("engine", "kernels", "sidecar")


def test_pyproject_lists_every_package_folder() -> None:
    """Packages are listed by hand (the folders map to ``echoline.*``): a new folder with an
    ``__init__.py`` that is not listed would be missing from the wheel."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {"echoline"} | {
        "echoline." + str(init.parent.relative_to(ROOT)).replace("/", ".")
        for top in FOLDERS for init in (ROOT / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert set(tool["packages"]) == on_disk
    assert tool["package-dir"] == {"echoline": "echoline", **{f"echoline.{f}": f for f in FOLDERS}}


def test_python_dash_m_echoline_is_the_cli(tmp_path: Path) -> None:
    from importlib.metadata import version

    out = subprocess.run([sys.executable, "-m", "echoline", "--version"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == f"echoline {version('echoline')}"
    import echoline

    assert echoline.__version__ == version("echoline")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    [built] = out.glob("echoline-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_carries_every_file_the_backends_read(wheel: Path) -> None:
    """A non-editable install reads kernels/cuda/*.cu AND quant.cuh (it is inlined into
    every module): the wheel must hold them all, and every package folder, under one name."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in sorted((ROOT / "kernels" / "cuda").glob("*.cu*")):
        assert f"echoline/kernels/cuda/{f.name}" in names, f.name
    for pkg in ("engine", "kernels", "sidecar", "engine/drafting", "engine/models", "kernels/cpu"):
        assert f"echoline/{pkg}/__init__.py" in names, pkg
    assert "echoline/__main__.py" in names
    # nothing generic like a top-level ``kernels`` package, and no tests or tools
    assert {n.split("/")[0] for n in names if not n.startswith("echoline-")} == {"echoline"}
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta and "Classifier: " in meta and "Project-URL: " in meta


def _main_command() -> list[str]:
    """The README's main command, after its install steps (``.venv/bin/echoline …``)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    at = lines.index("<!-- main-command -->")
    cmd = lines[at + 2].split("&&")[-1].strip()
    assert cmd.startswith(".venv/bin/echoline "), cmd
    return shlex.split(cmd)[1:]


@pytest.mark.slow
def test_a_fresh_non_editable_install_runs_the_main_command(wheel: Path, tmp_path: Path) -> None:
    """pip installs the wheel (and its dependencies) into a new venv; the README's main
    command then runs from a folder that holds only the sample file, not the repository."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=900)
    work = tmp_path / "elsewhere"
    (work / "examples").mkdir(parents=True)
    (work / "examples" / "scale.py").write_text((ROOT / "examples" / "scale.py").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(venv / "bin" / "echoline"), *_main_command()], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "+" in proc.stdout and "weight" in proc.stdout, proc.stdout
    # the installed package, not the checkout, answered
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import echoline.engine as e; print(e.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert str(venv) in where and str(ROOT) not in where
    # its numba kernels went to the cache folder, keyed by content (kernels/cpu/numba_setup.py), not
    # beside the installed files, where the next install of the same code would miss them
    installed = Path(where.strip()).parent.parent / "kernels" / "cpu"
    assert installed.is_dir() and not list(installed.rglob("*.nbi")), installed
