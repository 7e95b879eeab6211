"""Workspace index: what gets indexed, and that it follows the disk and the editor."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
from echoline.sidecar import workspace_index as wi
from echoline.sidecar.workspace_index import (
    WorkspaceIndex,
    is_secret_name,
    source_id_for,
    too_broad_root,
    uri_for,
)
from pygls import uris


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


# ---- hostile or huge workspaces ---------------------------------------------------------


@pytest.fixture
def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / "proj").mkdir(parents=True)
    (home / "diary.txt").write_text("dear diary\n")
    (home / "proj" / "main.py").write_text("print('hi')\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: cls(str(home))))
    assert Path.home() == home
    return home


def test_home_root_refused_other_roots_still_indexed(fake_home: Path, ws: Path) -> None:
    proj = fake_home / "proj"
    events: list[tuple[str, str]] = []
    sink = DictSink()
    idx = WorkspaceIndex([fake_home, proj, ws], sink, on_change=lambda k, u: events.append((k, u)))
    assert idx.roots == [proj, ws]
    idx.scan()
    assert sid(proj / "main.py") in sink.sources  # a subfolder of home is fine
    assert sid(ws / "notes.md") in sink.sources
    assert sid(fake_home / "diary.txt") not in sink.sources
    assert not any("dear diary" in t for t in sink.sources.values())
    assert idx.skip_reason(fake_home / "diary.txt") == "outside"
    st = idx.stats()
    assert st.refused_roots == {str(fake_home): "home directory"}
    assert st.as_dict()["refusedRoots"] == {str(fake_home): "home directory"}
    only_home = WorkspaceIndex([fake_home], DictSink(), on_change=lambda k, u: events.append((k, u)))
    only_home.start()  # nothing to watch: reports the refusal and returns, no thread
    assert only_home._thread is None
    assert ("refused", uri_for(fake_home)) in events


def test_too_broad_roots(fake_home: Path, tmp_path: Path) -> None:
    for broad in ("/", "/usr", "/etc", "/var", "/tmp", tempfile.gettempdir(), fake_home, tmp_path):
        assert too_broad_root(broad) is not None, broad
    assert too_broad_root("/") == "filesystem root"
    assert too_broad_root(tmp_path) == "contains the home directory"
    os.symlink(fake_home, tmp_path / "home_link")
    assert too_broad_root(tmp_path / "home_link") == "home directory"
    assert too_broad_root(fake_home / "proj") is None
    assert too_broad_root(tmp_path / "ws") is None
    assert too_broad_root("/usr/src/project") is None
    sink = DictSink()
    idx = WorkspaceIndex(["/", "/etc"], sink)  # must not walk the disk, here or in scan()
    idx.scan()
    assert idx.roots == [] and sink.sources == {}
    assert idx.stats().refused_roots == {"/": "filesystem root", "/etc": "system directory"}


def test_file_cap_stops_scan_and_is_reported(ws: Path) -> None:
    for i in range(10):
        (ws / f"f{i}.py").write_text(f"v{i} = {i}\n")
    idx, sink = make(ws, max_index_files=4)
    idx.scan()
    st = idx.stats()
    assert st.files == 4 and len(sink.sources) == 4
    assert st.file_cap_reached and st.max_files == 4
    assert st.skipped["file-cap"] == 1  # the walk stopped at the first refusal
    assert st.as_dict()["fileCapReached"] is True and st.as_dict()["maxFiles"] == 4
    indexed = sorted(sink.sources)
    first = Path(uris.to_fs_path(indexed[0].removeprefix("file:")))
    assert idx.index_file(first)  # re-indexing an indexed file is not a new file
    idx.remove_path(first)
    assert idx.index_file(ws / "f9.py")  # room again after a removal
    assert not idx.index_file(ws / "f8.py")


def test_sizes_checked_before_reading(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[tuple[str, int]] = []
    real_read = wi._read_capped

    def spy(path: Path, expect: os.stat_result, limit: int) -> tuple[bytes, str | None]:
        reads.append((path.name, limit))
        return real_read(path, expect, limit)

    monkeypatch.setattr(wi, "_read_capped", spy)
    with open(ws / "huge.txt", "wb") as fh:  # sparse: costs no disk space
        fh.truncate(8 * 1024 * 1024)
    for i in range(6):
        (ws / f"g{i}.py").write_text("x" * 99 + "\n")  # 100 bytes each
    idx, sink = make(ws, max_file_bytes=4096, max_total_bytes=400)
    idx.scan()
    names = [n for n, _ in reads]
    assert "huge.txt" not in names
    assert idx.stats().skipped["huge"] == 1
    assert idx.stats().skipped["budget"] >= 1
    assert len(reads) == len(sink.sources)  # nothing over the budget was opened
    assert all(limit == 4096 + 1 for _, limit in reads)
    assert idx.stats().bytes <= 400


def test_file_growing_after_stat_is_read_capped(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grown: list[int] = []
    real_read = wi._read_capped

    def grow_then_read(path: Path, expect: os.stat_result, limit: int) -> tuple[bytes, str | None]:
        with open(path, "a") as fh:
            fh.write("y = 2\n" * 2000)
        data, reason = real_read(path, expect, limit)
        grown.append(len(data))
        return data, reason

    monkeypatch.setattr(wi, "_read_capped", grow_then_read)
    idx, sink = make(ws, max_file_bytes=1000)
    assert not idx.index_file(ws / "notes.md")
    assert grown == [1001]
    assert idx.stats().skipped["huge"] == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_not_read(ws: Path) -> None:
    os.mkfifo(ws / "pipe.txt")
    idx, sink = make(ws)
    idx.scan()  # would hang if the FIFO were opened for reading
    assert idx.skip_reason(ws / "pipe.txt") == "not-a-file"
    assert sid(ws / "pipe.txt") not in sink.sources


class NoSumDict(dict):
    """A dict that fails when summed: the running total must not need it."""

    def values(self):  # type: ignore[override]
        raise AssertionError("bytes must be a running total, not a sum over all files")


def test_running_total_kept_without_resumming(ws: Path) -> None:
    idx, sink = make(ws)
    idx.scan()
    idx._disk = NoSumDict(idx._disk)
    idx._buffers = NoSumDict(idx._buffers)

    def consistent() -> bool:
        return idx.stats().bytes == sum(len(t.encode()) for t in sink.sources.values())

    for i in range(50):
        (ws / f"n{i}.py").write_text(f"n{i} = {'1' * i}\n")
        assert idx.index_file(ws / f"n{i}.py")
    assert consistent()
    (ws / "n3.py").write_text("replaced = True\n")
    idx.index_file(ws / "n3.py")
    assert consistent()
    idx.remove_path(ws / "n4.py")
    assert consistent()
    a = ws / "src" / "a.py"
    assert idx.open_buffer(uri_for(a), "def a():\n    return 'buffer, much longer'\n")
    assert consistent()  # the buffer replaces the disk copy, counted once
    assert not idx.open_buffer(uri_for(a), "x\x00")
    assert consistent()
    idx.close_buffer(uri_for(a))
    assert consistent()
    idx.remove_path(ws)
    assert idx.stats().bytes == 0 and sink.sources == {}


@pytest.fixture
def secret_home(fake_home: Path) -> Path:
    (fake_home / ".ssh").mkdir()
    (fake_home / ".ssh" / "id_rsa").write_text("-----BEGIN KEY----- ssh-secret\n")
    (fake_home / ".ssh" / "config").write_text("Host x ssh-secret\n")
    return fake_home


def test_symlink_names_harmless_targets_secret(ws: Path, secret_home: Path) -> None:
    (ws / ".env").write_text("TOKEN=env-secret\n")
    (ws / ".kube").mkdir()
    (ws / ".kube" / "config").write_text("token: kube-secret\n")
    os.symlink(ws / ".env", ws / "notes.txt")
    os.symlink(ws / ".kube" / "config", ws / "readme.md")
    os.symlink(ws / ".kube", ws / "plain_dir")
    os.symlink(secret_home / ".ssh" / "config", ws / "hosts.txt")
    os.symlink(secret_home / ".ssh" / "id_rsa", ws / "key.txt")
    idx, sink = make(ws)
    idx.scan()
    assert not any("secret" in t for t in sink.sources.values())
    for name in ("notes.txt", "readme.md", "hosts.txt", "key.txt"):
        assert sid(ws / name) not in sink.sources
        assert idx.skip_reason(ws / name) == "secret", name
    assert idx.skip_reason(ws / "plain_dir" / "config") == "secret"
    assert not idx.open_buffer(uri_for(ws / "notes.txt"), "TOKEN=env-secret\n")
    assert not idx.open_buffer(uri_for(ws / "plain_dir" / "config"), "token: kube-secret\n")
    assert sink.sources.keys() == {sid(ws / "src" / "a.py"), sid(ws / "notes.md")}


def test_symlinks_out_of_root_and_loops(ws: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere.py").write_text("outside = 1\n")
    os.symlink(tmp_path / "elsewhere.py", ws / "harmless.py")
    os.symlink(ws, ws / "loop")  # directory symlink loops
    os.symlink(ws / "src", ws / "src" / "again")
    os.symlink(ws / "b.txt", ws / "a.txt")  # file symlink cycle
    os.symlink(ws / "a.txt", ws / "b.txt")
    (ws / ".gitignore").write_text("build/\n")
    (ws / "build").mkdir()
    (ws / "build" / "out.txt").write_text("generated\n")
    os.symlink(ws / "build" / "out.txt", ws / "pub.txt")
    idx, sink = make(ws)
    idx.scan()  # terminates
    assert sink.sources.keys() == {
        sid(ws / "src" / "a.py"), sid(ws / "notes.md"), sid(ws / ".gitignore")
    }
    assert idx.skip_reason(ws / "harmless.py") == "outside"
    assert idx.skip_reason(ws / "a.txt") == "outside"
    assert idx.skip_reason(ws / "pub.txt") == "gitignore"


NEW_SECRET_FILES = [
    ".git-credentials", "prod.tfvars", "prod.tfvars.json", "terraform.tfstate",
    "terraform.tfstate.backup", ".bash_history", ".zsh_history", ".python_history",
    ".node_repl_history", "psql_history", ".netrc", ".pgpass", ".npmrc", ".pypirc", "id_ecdsa",
    "id_ed25519", "client.pfx", "server.KEY", ".env.production", "kubeconfig",
]
SECRET_DIR_FILES = [
    ".kube/config", ".docker/config.json", ".aws/credentials", ".aws/config", ".ssh/config",
    ".gnupg/pubring.kbx", "deploy/.kube/config", ".azure/env/settings.json",
]


@pytest.mark.parametrize("rel", NEW_SECRET_FILES + SECRET_DIR_FILES)
def test_extended_secret_rules(ws: Path, rel: str) -> None:
    path = ws / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("SECRET=hunter2\n")
    idx, sink = make(ws)
    idx.scan()
    assert idx.skip_reason(path) == "secret"
    assert not any("hunter2" in t for t in sink.sources.values())
    assert not idx.open_buffer(uri_for(path), "SECRET=hunter2\n")  # buffers: same rule
    assert sid(path) not in sink.sources
    assert idx.stats().skipped["buffer-refused"] == 1


def test_new_rules_keep_ordinary_names() -> None:
    for name in ("history.md", "docker-compose.yml", "kube.py", "config.json", "main.tf",
                 "Dockerfile", "history.py", "tfvars.md"):
        assert not is_secret_name(name), name


def test_watch_event_for_skipped_dir_is_not_walked(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import watchfiles

    idx, sink = make(ws)
    idx.scan()
    nm = ws / "node_modules" / "pkg"
    nm.mkdir(parents=True)
    (nm / "index.js").write_text("module.exports = 1\n")
    walked: list[Path] = []
    monkeypatch.setattr(idx, "_scan_dir", lambda root, top: walked.append(top) or True)
    idx.handle_changes({(watchfiles.Change.added, str(nm))})
    assert walked == []
