"""A loaded model's GGUF pages leave the process's resident memory (``GGUFFile.release_pages``).

Why: the backends read every tensor once while laying the weights out; those file pages
would otherwise stay counted as the server's own (a 1.5B first start held 2.9 GB resident
where a cached start holds 1.8 GB). Dropping them must not change a single value read
from the file afterwards.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest
from echoline.engine.gguf_file import GGUFFile

pytestmark = pytest.mark.skipif(not hasattr(mmap, "MADV_DONTNEED"), reason="no MADV_DONTNEED on this platform")


def _resident_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * mmap.PAGESIZE


def test_release_drops_the_files_pages_and_keeps_its_values(smollm2_path: Path) -> None:
    gf = GGUFFile(smollm2_path)
    size = sum(t.data.nbytes for t in gf.tensors.values())
    sums = {name: int(np.asarray(t.data).view(np.uint8).sum(dtype=np.uint64)) for name, t in gf.tensors.items()}
    touched = _resident_bytes()  # every tensor's pages read once, as a layout pass does
    assert gf.release_pages()
    released = _resident_bytes()
    assert touched - released > size // 2, (touched, released, size)
    again = {name: int(np.asarray(t.data).view(np.uint8).sum(dtype=np.uint64)) for name, t in gf.tensors.items()}
    assert again == sums  # read back from the page cache, unchanged


def test_loading_a_model_releases_its_file_and_replies_the_same(smollm2_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader releases the file once the model is built; a model loaded so replies
    token for token as one whose file pages were never released."""
    from echoline.engine.api import Engine

    prompt = [1, 504, 3287, 30, 288]
    kept = Engine.load(str(smollm2_path), backend="numpy")  # released too: the reference is below
    released: list[Path] = []
    real = GGUFFile.release_pages

    def spy(self: GGUFFile) -> bool:
        released.append(self.path)
        return real(self)

    monkeypatch.setattr(GGUFFile, "release_pages", spy)
    engine = Engine.load(str(smollm2_path), backend="numpy")
    assert released == [Path(smollm2_path)]
    monkeypatch.setattr(GGUFFile, "release_pages", lambda self: False)
    never = Engine.load(str(smollm2_path), backend="numpy")
    want = never.generate(prompt, max_tokens=12, spec=False).token_ids
    assert engine.generate(prompt, max_tokens=12, spec=False).token_ids == want
    assert kept.generate(prompt, max_tokens=12).token_ids == want
