"""The CPU package's own numba kernels are cached by content, not by path
(``kernels/cpu/numba_setup.py`` ``install_source_locator``): a second copy of the same code, as a
fresh install is, loads the first copy's compiled kernels; changed code compiles afresh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, numpy as np
from echoline.kernels.cpu import q8act
q8act.quantize_rows(np.ones((2, 64), np.float32))
s = q8act.quantize_rows.stats
print(json.dumps({"file": q8act.__file__, "hits": sum(s.cache_hits.values()),
                  "misses": sum(s.cache_misses.values()), "path": s.cache_path}))
"""


def _probe(tree: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "ECHOLINE_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=cache.parent, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _copy_tree(dest: Path) -> Path:
    """The three packages' files the probe imports, laid out as in a source tree."""
    for part in ("echoline", "engine", "kernels"):
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    return dest


def test_a_copy_of_the_same_code_loads_the_compiled_kernels(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _probe(ROOT, cache)
    assert first["misses"] == 1 and first["hits"] == 0, first
    assert first["path"].startswith(str(cache)), first  # not beside the source file

    other = _copy_tree(tmp_path / "elsewhere")
    second = _probe(other, cache)
    assert second["file"].startswith(str(other)), second  # the copy answered
    assert (second["hits"], second["misses"], second["path"]) == (1, 0, first["path"]), second

    # changed code (here: any file of the package) is compiled again, in a folder of its own
    ops = other / "kernels" / "cpu" / "attention.py"
    ops.write_text(ops.read_text() + "\n# changed\n")
    third = _probe(other, cache)
    assert third["misses"] == 1 and third["hits"] == 0, third
    assert third["path"] != first["path"]


def test_static_folders_of_old_code_are_pruned(tmp_path: Path) -> None:
    """All but the current code's folder and the most recently written others go."""
    from echoline.kernels.cpu import numba_setup

    static = tmp_path / "static"
    for i, name in enumerate(["cur", "a", "b", "c", "d"]):
        (static / name).mkdir(parents=True)
        (static / name / "k.nbi").write_bytes(b"x")
        os.utime(static / name, (1_000_000 + i, 1_000_000 + i))  # "d" the newest
    (static / "cur").touch()
    os.utime(static / "cur", (1, 1))  # the current one stays however old
    removed = numba_setup.prune_static.__wrapped__(static, "cur", keep=3)
    assert sorted(removed) == ["a", "b"]
    assert sorted(d.name for d in static.iterdir()) == ["c", "cur", "d"]
