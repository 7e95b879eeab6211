"""Workspace index: what gets indexed, and that it follows the disk and the editor."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sidecar.workspace_index import WorkspaceIndex, is_secret_name, source_id_for, uri_for


class DictSink:
    def __init__(self) -> None:
        self.sources: dict[str, str] = {}

    def set_source(self, source_id: str, text: str) -> None:
        self.sources[source_id] = text

    def remove_source(self, source_id: str) -> None:
        self.sources.pop(source_id, None)


def sid(path: Path) -> str:
    return source_id_for(uri_for(path))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("def a():\n    return 1\n")
    (root / "notes.md").write_text("# notes\n")
    return root


def make(root: Path, **kw) -> tuple[WorkspaceIndex, DictSink]:
    sink = DictSink()
    return WorkspaceIndex([root], sink, **kw), sink


def test_scan_indexes_text_files(ws: Path) -> None:
    idx, sink = make(ws)
    idx.scan()
    assert sink.sources[sid(ws / "src" / "a.py")] == "def a():\n    return 1\n"
    assert sid(ws / "notes.md") in sink.sources
    assert idx.stats().files == 2
    assert idx.stats().bytes == len("def a():\n    return 1\n") + len("# notes\n")


def test_gitignore_honoured(ws: Path) -> None:
    (ws / ".gitignore").write_text("*.log\nbuild/\n!keep.log\n")
    (ws / "x.log").write_text("noise\n")
    (ws / "keep.log").write_text("kept\n")
    (ws / "build").mkdir()
    (ws / "build" / "out.py").write_text("x = 1\n")
    (ws / "src" / ".gitignore").write_text("gen_*.py\n")
    (ws / "src" / "gen_x.py").write_text("y = 2\n")
    idx, sink = make(ws)
    idx.scan()
    assert sid(ws / "x.log") not in sink.sources
    assert sid(ws / "keep.log") in sink.sources
    assert sid(ws / "build" / "out.py") not in sink.sources
    assert sid(ws / "src" / "gen_x.py") not in sink.sources
    assert sid(ws / "src" / "a.py") in sink.sources
    assert idx.stats().skipped.get("gitignore", 0) >= 2


@pytest.mark.parametrize(
    "name", [".env", ".env.local", "id_rsa", "id_ed25519.pub", "server.pem", "tls.key", "cert.p12",
             "credentials.json", "credentials"]
)
def test_secret_files_skipped(ws: Path, name: str) -> None:
    assert is_secret_name(name)
    (ws / name).write_text("SECRET=hunter2\n")
    idx, sink = make(ws)
    idx.scan()
    assert sid(ws / name) not in sink.sources
    assert not any("hunter2" in t for t in sink.sources.values())
    assert idx.stats().skipped["secret"] == 1


def test_ordinary_names_are_not_secret() -> None:
    for name in ("main.py", "keys.py", "environment.md", "README.md", "pem_parser.rs"):
        assert not is_secret_name(name), name


def test_binary_and_huge_skipped(ws: Path) -> None:
    (ws / "blob.bin").write_bytes(b"\x7fELF\x00\x01\x02" * 10)
    (ws / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (ws / "big.py").write_text("x = 1\n" * 1000)  # 6000 bytes
    (ws / "small.py").write_text("y = 2\n")
    idx, sink = make(ws, max_file_bytes=4096)
    idx.scan()
    assert sid(ws / "blob.bin") not in sink.sources
    assert sid(ws / "latin1.txt") not in sink.sources
    assert sid(ws / "big.py") not in sink.sources
    assert sid(ws / "small.py") in sink.sources
    skipped = idx.stats().skipped
    assert skipped["binary"] == 2 and skipped["huge"] == 1


def test_total_budget_bounds_memory(ws: Path) -> None:
    for i in range(10):
        (ws / f"f{i}.py").write_text(f"v{i} = {'0' * 90}\n")  # ~96 bytes each
    idx, sink = make(ws, max_total_bytes=500)
    idx.scan()
    st = idx.stats()
    assert st.bytes <= 500
    assert sum(len(t.encode()) for t in sink.sources.values()) == st.bytes
    assert st.skipped["budget"] >= 5


def test_symlink_pointing_outside_is_never_read(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "private.py").write_text("TOKEN = 'outside-secret'\n")
    os.symlink(outside / "private.py", ws / "link.py")
    os.symlink(outside, ws / "linkdir")
    os.symlink(ws / "src" / "a.py", ws / "inner_link.py")  # points inside: fine
    idx, sink = make(ws)
    idx.scan()
    assert not any("outside-secret" in t for t in sink.sources.values())
    assert sid(ws / "link.py") not in sink.sources
    assert sid(ws / "inner_link.py") in sink.sources
    assert idx.skip_reason(ws / "link.py") == "outside"
    assert idx.skip_reason(outside / "private.py") == "outside"


def test_open_buffer_overrides_disk_and_close_reverts(ws: Path) -> None:
    idx, sink = make(ws)
    idx.scan()
    a = ws / "src" / "a.py"
    assert idx.open_buffer(uri_for(a), "def a():\n    return 2  # edited\n")
    assert sink.sources[sid(a)].endswith("# edited\n")
    # a disk event while the buffer is open must not clobber the buffer
    a.write_text("def a():\n    return 3\n")
    idx.index_file(a)
    assert sink.sources[sid(a)].endswith("# edited\n")
    idx.close_buffer(uri_for(a))
    assert sink.sources[sid(a)] == "def a():\n    return 3\n"


def test_open_buffer_secret_refused(ws: Path) -> None:
    idx, sink = make(ws)
    assert not idx.open_buffer(uri_for(ws / ".env"), "KEY=1\n")
    assert sid(ws / ".env") not in sink.sources


def wait_for(pred, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_watch_create_modify_rename_delete(ws: Path) -> None:
    idx, sink = make(ws, debounce_ms=50)
    idx.start()
    try:
        assert wait_for(lambda: sid(ws / "src" / "a.py") in sink.sources)
        time.sleep(0.3)  # let the watcher arm
        new = ws / "src" / "new.py"
        new.write_text("def fresh():\n    pass\n")
        assert wait_for(lambda: sink.sources.get(sid(new)) == "def fresh():\n    pass\n")
        new.write_text("def fresh():\n    return 42\n")
        assert wait_for(lambda: "42" in sink.sources.get(sid(new), ""))
        renamed = ws / "src" / "renamed.py"
        new.rename(renamed)
        assert wait_for(lambda: sid(renamed) in sink.sources and sid(new) not in sink.sources)
        renamed.unlink()
        assert wait_for(lambda: sid(renamed) not in sink.sources)
        (ws / ".env").write_text("SECRET=1\n")  # created later, still refused
        time.sleep(0.5)
        assert sid(ws / ".env") not in sink.sources
    finally:
        idx.stop()


def test_handle_changes_directory_delete(ws: Path) -> None:
    import shutil

    import watchfiles

    idx, sink = make(ws)
    idx.scan()
    shutil.rmtree(ws / "src")
    idx.handle_changes({(watchfiles.Change.deleted, str(ws / "src"))})
    assert sid(ws / "src" / "a.py") not in sink.sources
    assert idx.stats().files == 1
