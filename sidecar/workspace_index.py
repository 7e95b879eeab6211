"""The live workspace index: which files feed the engine's n-gram drafts.

Workspace folders are scanned once and then followed with ``watchfiles``.
What is indexed is decided here, conservatively: ``.gitignore`` is honoured,
binary, huge and secret-looking files are skipped, nothing outside the
workspace folders is read (symlinks are resolved and checked), and an open
editor buffer always wins over the file on disk. Every indexed text goes to a
*sink* (the engine worker) as a draft source ``"file:" + uri``; total bytes are
bounded by a budget.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pathspec
from pygls import uris

log = logging.getLogger(__name__)

# Never descended into, whatever .gitignore says.
SKIP_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", "node_modules", ".venv", "venv", "__pycache__",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox", ".hypothesis",
        ".ssh", ".gnupg", ".aws",
    }
)

# File names that may hold secrets: never read, never sent to a model.
SECRET_PATTERNS = (
    ".env", ".env.*", "*.env", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks",
    "*.keystore", "*.crt", "*.der", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    "credentials*", "*credentials.json", "secrets.*", "*.secret", "*.secrets",
    ".netrc", ".npmrc", ".pypirc", ".pgpass", "*.kdbx", "*.gpg", "*.asc", "htpasswd", ".htpasswd",
)

BINARY_SNIFF_BYTES = 8192


class SourceSink(Protocol):
    """Where indexed texts go (the engine worker; a dict in tests)."""

    def set_source(self, source_id: str, text: str) -> None: ...

    def remove_source(self, source_id: str) -> None: ...


def source_id_for(uri: str) -> str:
    return "file:" + uri


def is_secret_name(name: str) -> bool:
    low = name.lower()
    return any(fnmatch.fnmatchcase(low, pat) for pat in SECRET_PATTERNS)


def looks_binary(data: bytes) -> bool:
    return b"\x00" in data[:BINARY_SNIFF_BYTES]


def uri_for(path: Path) -> str:
    return uris.from_fs_path(str(path)) or path.as_uri()


def normalize_uri(uri: str) -> str:
    """One spelling per file, so an editor's URI and a scanned URI meet."""
    path = uris.to_fs_path(uri)
    if not path:
        return uri
    return uri_for(Path(os.path.abspath(path)))


@dataclass
class IndexStats:
    files: int = 0
    buffers: int = 0
    bytes: int = 0
    budget_bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    events: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "files": self.files,
            "buffers": self.buffers,
            "bytes": self.bytes,
            "budgetBytes": self.budget_bytes,
            "skipped": dict(self.skipped),
            "events": self.events,
        }


class _Ignores:
    """All .gitignore files of one root, applied deepest-last like git."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.specs: list[tuple[Path, pathspec.GitIgnoreSpec]] = []
        self.reload()

    def reload(self) -> None:
        specs = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            if ".gitignore" in filenames:
                try:
                    lines = (Path(dirpath) / ".gitignore").read_text(
                        encoding="utf-8", errors="replace"
                    ).splitlines()
                except OSError:
                    continue
                specs.append((Path(dirpath), pathspec.GitIgnoreSpec.from_lines(lines)))
        specs.sort(key=lambda item: len(item[0].parts))
        self.specs = specs

    def ignored(self, path: Path, is_dir: bool = False) -> bool:
        verdict = False
        for base, spec in self.specs:
            try:
                rel = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if is_dir:
                rel += "/"
            res = spec.check_file(rel)
            if res.include is not None:
                verdict = bool(res.include)
        return verdict


class WorkspaceIndex:
    """Scanned + watched workspace files, and open buffers, mirrored into a sink."""

    def __init__(
        self,
        roots: Iterable[str | Path],
        sink: SourceSink,
        *,
        max_file_bytes: int = 512 * 1024,
        max_total_bytes: int = 64 * 1024 * 1024,
        debounce_ms: int = 300,
        force_polling: bool | None = None,
        on_change: Callable[[str, str], None] | None = None,
    ) -> None:
        self.roots = [Path(os.path.abspath(r)) for r in roots]
        self._real_roots = [r.resolve() for r in self.roots]
        self.sink = sink
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.debounce_ms = debounce_ms
        self.force_polling = force_polling
        self.on_change = on_change
        self._lock = threading.RLock()
        self._disk: dict[str, int] = {}  # uri -> bytes, files indexed from disk
        self._buffers: dict[str, int] = {}  # uri -> bytes, open editor buffers
        self._skipped: dict[str, int] = {}
        self._events = 0
        self._ignores = {root: _Ignores(root) for root in self.roots}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- policy -------------------------------------------------------
    def _root_of(self, path: Path) -> Path | None:
        for root in self.roots:
            if path == root or root in path.parents:
                return root
        return None

    def inside_workspace(self, path: Path) -> bool:
        """True when the file's real location (symlinks resolved) is inside a root."""
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return False
        return any(real == r or r in real.parents for r in self._real_roots)

    def skip_reason(self, path: Path) -> str | None:
        """Why a file is not indexed, or None when it may be read."""
        root = self._root_of(path)
        if root is None or not self.inside_workspace(path):
            return "outside"
        rel_parts = path.relative_to(root).parts
        if any(p in SKIP_DIRS for p in rel_parts[:-1]):
            return "ignored"
        if is_secret_name(path.name) or any(is_secret_name(p) for p in rel_parts[:-1]):
            return "secret"
        if self._ignores[root].ignored(path) or any(
            self._ignores[root].ignored(root.joinpath(*rel_parts[:i]), is_dir=True)
            for i in range(1, len(rel_parts))
        ):
            return "gitignore"
        try:
            st = path.stat()
        except OSError:
            return "unreadable"
        if not path.is_file():
            return "not-a-file"
        if st.st_size > self.max_file_bytes:
            return "huge"
        return None

    def _read(self, path: Path) -> tuple[str | None, str | None]:
        """(text, None) or (None, reason)."""
        reason = self.skip_reason(path)
        if reason:
            return None, reason
        try:
            data = path.read_bytes()
        except OSError:
            return None, "unreadable"
        if len(data) > self.max_file_bytes:
            return None, "huge"
        if looks_binary(data):
            return None, "binary"
        try:
            return data.decode("utf-8"), None
        except UnicodeDecodeError:
            return None, "binary"

    # ---- bookkeeping --------------------------------------------------
    def _total(self) -> int:
        return sum(self._disk.values()) + sum(self._buffers.values())

    def _count_skip(self, reason: str) -> None:
        self._skipped[reason] = self._skipped.get(reason, 0) + 1

    def _notify(self, kind: str, uri: str) -> None:
        if self.on_change is not None:
            try:
                self.on_change(kind, uri)
            except Exception:  # a status callback must never break indexing
                log.exception("on_change callback failed")

    def index_file(self, path: Path) -> bool:
        """(Re)index one file from disk. Returns True when it is now indexed."""
        path = Path(os.path.abspath(path))
        uri = uri_for(path)
        with self._lock:
            if uri in self._buffers:
                return True  # the open buffer wins over disk
            text, reason = self._read(path)
            if text is None:
                assert reason is not None
                self._count_skip(reason)
                self._drop_disk(uri)
                return False
            size = len(text.encode("utf-8"))
            if self._total() - self._disk.get(uri, 0) + size > self.max_total_bytes:
                self._count_skip("budget")
                self._drop_disk(uri)
                return False
            self._disk[uri] = size
            self.sink.set_source(source_id_for(uri), text)
        self._notify("indexed", uri)
        return True

    def _drop_disk(self, uri: str) -> bool:
        if self._disk.pop(uri, None) is not None and uri not in self._buffers:
            self.sink.remove_source(source_id_for(uri))
            return True
        return False

    def remove_path(self, path: Path) -> None:
        """A file or a whole folder disappeared."""
        path = Path(os.path.abspath(path))
        prefix = uri_for(path).rstrip("/") + "/"
        with self._lock:
            gone = [u for u in self._disk if u == uri_for(path) or u.startswith(prefix)]
            for uri in gone:
                self._drop_disk(uri)
        for uri in gone:
            self._notify("removed", uri)

    def scan(self) -> None:
        """Index every eligible file under the roots (blocking)."""
        for root in self.roots:
            self._ignores[root].reload()
            self._scan_dir(root, root)

    def _scan_dir(self, root: Path, top: Path) -> None:
        ignores = self._ignores[root]
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            here = Path(dirpath)
            dirnames[:] = sorted(
                d
                for d in dirnames
                if d not in SKIP_DIRS
                and not is_secret_name(d)
                and not ignores.ignored(here / d, is_dir=True)
            )
            for name in sorted(filenames):
                self.index_file(here / name)

    # ---- editor buffers -----------------------------------------------
    def open_buffer(self, uri: str, text: str) -> bool:
        """An editor buffer (didOpen/didChange): overrides disk while open."""
        uri = normalize_uri(uri)
        path = uris.to_fs_path(uri)
        name = Path(path).name if path else uri.rsplit("/", 1)[-1]
        size = len(text.encode("utf-8"))
        with self._lock:
            if is_secret_name(name) or size > self.max_file_bytes or "\x00" in text:
                self._count_skip("buffer-refused")
                if uri in self._buffers:
                    self._buffers.pop(uri)
                    self.sink.remove_source(source_id_for(uri))
                return False
            others = self._total() - self._buffers.get(uri, 0) - self._disk.get(uri, 0)
            if others + size > self.max_total_bytes:
                self._count_skip("budget")
                return False
            self._buffers[uri] = size
            self.sink.set_source(source_id_for(uri), text)
        return True

    def close_buffer(self, uri: str) -> None:
        """Buffer closed: fall back to the file on disk, if it is indexable."""
        uri = normalize_uri(uri)
        with self._lock:
            if self._buffers.pop(uri, None) is None:
                return
            self._disk.pop(uri, None)
            self.sink.remove_source(source_id_for(uri))
            path = uris.to_fs_path(uri)
            if path and self._root_of(Path(path)) is not None and os.path.isfile(path):
                self.index_file(Path(path))

    # ---- watching -----------------------------------------------------
    def handle_changes(self, changes: Iterable[tuple[object, str]]) -> None:
        """Apply one batch of watchfiles changes (also callable directly in tests)."""
        import watchfiles

        gitignore_touched = False
        for change, raw in sorted(changes, key=lambda c: (c[1], int(c[0]))):  # type: ignore[call-overload]
            self._events += 1
            path = Path(raw)
            if path.name == ".gitignore":
                gitignore_touched = True
                continue
            if change == watchfiles.Change.deleted or not os.path.lexists(path):
                self.remove_path(path)
            elif path.is_dir() and not path.is_symlink():
                root = self._root_of(path)
                if root is not None:
                    self._scan_dir(root, path)
            else:
                self.index_file(path)
        if gitignore_touched:
            self._rescan_after_gitignore()

    def _rescan_after_gitignore(self) -> None:
        for root in self.roots:
            self._ignores[root].reload()
        with self._lock:
            stale = list(self._disk)
        for uri in stale:
            path = uris.to_fs_path(uri)
            if path and self.skip_reason(Path(path)) is not None:
                self.remove_path(Path(path))
        self.scan()

    def start(self, scan: bool = True) -> None:
        """Scan (in the watcher thread) and then follow changes until stop()."""
        if self._thread is not None or not self.roots:
            return
        self._thread = threading.Thread(
            target=self._run, args=(scan,), name="echoline-index", daemon=True
        )
        self._thread.start()

    def _run(self, scan: bool) -> None:
        import watchfiles

        try:
            if scan:
                self.scan()
            self._notify("scanned", "")
            roots = [r for r in self.roots if r.is_dir()]
            if not roots:
                return
            for changes in watchfiles.watch(
                *roots,
                watch_filter=None,
                debounce=self.debounce_ms,
                step=50,
                stop_event=self._stop,
                force_polling=self.force_polling,
                raise_interrupt=False,
                ignore_permission_denied=True,
            ):
                try:
                    self.handle_changes(changes)
                except Exception:
                    log.exception("workspace index: failed to apply changes")
        except Exception:
            log.exception("workspace index watcher stopped")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    # ---- reporting ----------------------------------------------------
    def indexed_uris(self) -> set[str]:
        with self._lock:
            return set(self._disk) | set(self._buffers)

    def is_indexed(self, path_or_uri: str | Path) -> bool:
        uri = path_or_uri if isinstance(path_or_uri, str) and ":" in path_or_uri[:8] else None
        uri = normalize_uri(uri) if uri else uri_for(Path(os.path.abspath(path_or_uri)))
        return uri in self.indexed_uris()

    def stats(self) -> IndexStats:
        with self._lock:
            return IndexStats(
                files=len(self._disk),
                buffers=len(self._buffers),
                bytes=self._total(),
                budget_bytes=self.max_total_bytes,
                skipped=dict(self._skipped),
                events=self._events,
            )
