"""The live workspace index: which files feed the engine's n-gram drafts.

Workspace folders are scanned once and then followed with ``watchfiles``.
What is indexed is decided here, conservatively: ``.gitignore`` is honoured,
binary, huge and secret-looking files are skipped, nothing outside the
workspace folders is read (symlinks are resolved and checked), and an open
editor buffer always wins over the file on disk. Every indexed text goes to a
*sink* (the engine worker) as a draft source ``"file:" + uri``; total bytes are
bounded by a budget and the number of files by a cap.

Hostile or huge workspaces are expected: a workspace folder that is the home
directory, a filesystem root or a system folder is refused outright (scanning it
would read the user's whole life into a model's context and take forever), file
sizes are checked with ``stat`` before anything is read, and a symlink is judged
by its own name *and* by what it points at.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pathspec
from pygls import uris

log = logging.getLogger(__name__)

# Folders that hold credentials as a whole: every file under one of them is a secret,
# whatever its own name (``.kube/config``, ``.docker/config.json``, ``.aws/config``).
SECRET_DIRS = frozenset(
    {".ssh", ".gnupg", ".aws", ".kube", ".docker", ".azure", ".password-store"}
)

# Never descended into, whatever .gitignore says.
SKIP_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", "node_modules", ".venv", "venv", "__pycache__",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox", ".hypothesis",
    }
) | SECRET_DIRS

# File names that may hold secrets: never read, never sent to a model.
SECRET_PATTERNS = (
    # environment files and keys
    ".env", ".env.*", "*.env", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks",
    "*.keystore", "*.crt", "*.der", "*.ppk", "*.ovpn",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    # credential stores and token holders
    "credentials*", "*credentials.json", "secrets.*", "*.secret", "*.secrets",
    ".git-credentials", ".netrc", "_netrc", ".npmrc", ".pypirc", ".pgpass", ".dockercfg",
    ".s3cfg", "kubeconfig", "*.kubeconfig", "*.kdbx", "*.gpg", "*.asc", "htpasswd", ".htpasswd",
    # infrastructure state and variables (hold passwords and keys in clear text)
    "*.tfvars", "*.tfvars.json", "*.tfstate", "*.tfstate.*",
    # shell and REPL histories (pasted tokens, typed passwords)
    "*_history", ".histfile",
)

BINARY_SNIFF_BYTES = 8192
READ_CHUNK_BYTES = 64 * 1024

# Workspace folders that are never indexed: they are not projects, and scanning them
# means reading (and watching) far too much, much of it private. Subfolders are fine.
POSIX_TOO_BROAD = frozenset(
    {
        "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
        "/media", "/mnt", "/nix", "/nix/store", "/opt", "/proc", "/root", "/run", "/sbin",
        "/snap", "/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/include", "/usr/lib",
        "/usr/local", "/usr/sbin", "/usr/share", "/usr/src", "/var", "/var/lib", "/var/log",
        "/var/tmp", "/Applications", "/Library", "/System", "/Users", "/Volumes", "/private",
        "/private/etc", "/private/tmp", "/private/var",
    }
)
# Compared without the drive and lower-cased: ``C:\\Windows`` -> ``/windows``.
WINDOWS_TOO_BROAD = frozenset(
    {"/windows", "/program files", "/program files (x86)", "/programdata", "/users"}
)


class SourceSink(Protocol):
    """Where indexed texts go (the engine worker; a dict in tests)."""

    def set_source(self, source_id: str, text: str) -> None: ...

    def remove_source(self, source_id: str) -> None: ...


def source_id_for(uri: str) -> str:
    return "file:" + uri


def is_secret_name(name: str) -> bool:
    low = name.lower()
    return any(fnmatch.fnmatchcase(low, pat) for pat in SECRET_PATTERNS)


def is_secret_dir(name: str) -> bool:
    """A folder whose whole content is treated as secret (``.ssh``, ``credentials/``...)."""
    return name.lower() in SECRET_DIRS or is_secret_name(name)


def is_secret_parts(parts: Sequence[str]) -> bool:
    """Workspace-relative path parts: a secret file name, or any secret folder above it."""
    if not parts:
        return False
    return is_secret_name(parts[-1]) or any(is_secret_dir(p) for p in parts[:-1])


def in_secret_dir(path: Path) -> bool:
    """True when any folder of an absolute path is a credentials folder (``~/.ssh/...``).

    Only the fixed folder list is used here, not the name patterns: folders above a
    workspace root are the user's own layout and a name like ``secrets.d`` there says
    nothing about the files below it.
    """
    return any(p.lower() in SECRET_DIRS for p in path.parts[:-1])


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


def _home_dirs() -> set[Path]:
    try:
        home = Path.home()
    except (RuntimeError, KeyError, OSError):  # no HOME and no passwd entry
        return set()
    return {Path(os.path.abspath(home)), home.resolve()}


def _temp_dirs() -> set[Path]:
    tmp = Path(tempfile.gettempdir())
    return {Path(os.path.abspath(tmp)), tmp.resolve()}


def too_broad_root(root: str | Path) -> str | None:
    """Why a workspace folder is too broad to index, or None when it may be scanned.

    Editors happily open ``~`` or ``/`` as a workspace; indexing those would walk the
    whole disk and feed private files to the model. The folder itself and its resolved
    location are both checked, so a symlink to ``~`` is refused too.
    """
    path = Path(os.path.abspath(root))
    try:
        candidates = {path, path.resolve()}
    except (OSError, RuntimeError):
        candidates = {path}
    homes = _home_dirs()
    temps = _temp_dirs()
    for cand in candidates:
        if cand.parent == cand:
            return "filesystem root"
        if cand in homes:
            return "home directory"
        if any(cand in home.parents for home in homes):
            return "contains the home directory"
        if cand in temps:
            return "temp directory"
        if os.name == "nt":
            key = cand.as_posix()[len(cand.drive):].lower().rstrip("/")
            if key in WINDOWS_TOO_BROAD:
                return "system directory"
        elif cand.as_posix() in POSIX_TOO_BROAD:
            return "system directory"
    return None


def _read_capped(path: Path, expect: os.stat_result, limit: int) -> tuple[bytes, str | None]:
    """Read at most ``limit`` bytes of the regular file ``expect`` describes.

    Opened without following a final symlink and without blocking (a FIFO swapped in
    after the check must not hang the indexer), and the opened file must be the very
    inode that was checked, so a file replaced between check and read is not read.
    Reading stops early when the first chunk is binary. Returns (data, reason).
    """
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_BINARY", 0)
    )
    try:
        fd = os.open(path, flags)
    except OSError:
        return b"", "unreadable"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (
            expect.st_dev,
            expect.st_ino,
        ):
            return b"", "changed"
        chunks: list[bytes] = []
        got = 0
        while got < limit:
            want = BINARY_SNIFF_BYTES if not chunks else READ_CHUNK_BYTES
            chunk = os.read(fd, min(want, limit - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            if len(chunks) == 1 and looks_binary(chunk):
                break  # the caller rejects it anyway; do not read the rest
        return b"".join(chunks), None
    except OSError:
        return b"", "unreadable"
    finally:
        os.close(fd)


@dataclass
class IndexStats:
    files: int = 0
    buffers: int = 0
    bytes: int = 0
    budget_bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    events: int = 0
    max_files: int = 0
    file_cap_reached: bool = False
    refused_roots: dict[str, str] = field(default_factory=dict)  # path -> reason

    def as_dict(self) -> dict[str, object]:
        return {
            "files": self.files,
            "buffers": self.buffers,
            "bytes": self.bytes,
            "budgetBytes": self.budget_bytes,
            "skipped": dict(self.skipped),
            "events": self.events,
            "maxFiles": self.max_files,
            "fileCapReached": self.file_cap_reached,
            "refusedRoots": dict(self.refused_roots),
        }


class _Ignores:
    """All .gitignore files of one root, applied deepest-last like git."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.specs: list[tuple[Path, pathspec.GitIgnoreSpec]] = []
        self.reload()

    def reload(self) -> None:
        """Collect the .gitignore files, without walking into ignored folders.

        Git does not read .gitignore files inside ignored folders either, and a huge
        ignored ``build/`` or ``target/`` must not be walked just to look for them.
        The walk is top-down, so a folder's ancestors' specs are known when it is seen.
        """
        self.specs = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            here = Path(dirpath)
            if ".gitignore" in filenames:
                try:
                    lines = (here / ".gitignore").read_text(
                        encoding="utf-8", errors="replace"
                    ).splitlines()
                except OSError:
                    lines = None
                if lines is not None:
                    self.specs.append((here, pathspec.GitIgnoreSpec.from_lines(lines)))
            dirnames[:] = [
                d
                for d in dirnames
                if d not in SKIP_DIRS and not self.ignored(here / d, is_dir=True)
            ]
        self.specs.sort(key=lambda item: len(item[0].parts))

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

    def excludes(self, path: Path) -> bool:
        """The file, or any folder between the root and it, is ignored."""
        rel_parts = path.relative_to(self.root).parts
        return self.ignored(path) or any(
            self.ignored(self.root.joinpath(*rel_parts[:i]), is_dir=True)
            for i in range(1, len(rel_parts))
        )


class WorkspaceIndex:
    """Scanned + watched workspace files, and open buffers, mirrored into a sink."""

    def __init__(
        self,
        roots: Iterable[str | Path],
        sink: SourceSink,
        *,
        max_file_bytes: int = 512 * 1024,
        max_total_bytes: int = 64 * 1024 * 1024,
        max_index_files: int = 20_000,
        debounce_ms: int = 300,
        force_polling: bool | None = None,
        on_change: Callable[[str, str], None] | None = None,
    ) -> None:
        self.roots: list[Path] = []
        self.refused_roots: dict[Path, str] = {}
        for raw in roots:
            root = Path(os.path.abspath(raw))
            why = too_broad_root(root)
            if why is None:
                self.roots.append(root)
            else:
                self.refused_roots[root] = why
                log.warning(
                    "workspace index: not indexing %s (%s); open a project folder instead",
                    root,
                    why,
                )
        self._real_roots = [r.resolve() for r in self.roots]
        self.sink = sink
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.max_index_files = max_index_files
        self.debounce_ms = debounce_ms
        self.force_polling = force_polling
        self.on_change = on_change
        self._lock = threading.RLock()
        self._disk: dict[str, int] = {}  # uri -> bytes, files indexed from disk
        self._buffers: dict[str, int] = {}  # uri -> bytes, open editor buffers
        self._bytes = 0  # running sum of both dicts' values; see _put/_pop helpers
        self._file_cap_reached = False
        self._skipped: dict[str, int] = {}
        self._events = 0
        # Only accepted roots get .gitignore walks: a refused "/" must not be walked here.
        self._ignores = {root: _Ignores(root) for root in self.roots}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- policy -------------------------------------------------------
    def _root_of(self, path: Path) -> Path | None:
        for root in self.roots:
            if path == root or root in path.parents:
                return root
        return None

    def _real_root_of(self, real: Path) -> tuple[Path, Path] | None:
        """(lexical root, resolved root) whose resolved location holds ``real``."""
        for root, real_root in zip(self.roots, self._real_roots, strict=True):
            if real == real_root or real_root in real.parents:
                return root, real_root
        return None

    def inside_workspace(self, path: Path) -> bool:
        """True when the file's real location (symlinks resolved) is inside a root."""
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return False
        return self._real_root_of(real) is not None

    def _is_secret(self, path: Path, real: Path | None) -> bool:
        """Secret by the path's own name and folders, or by those of its symlink target.

        ``notes.txt -> .env`` has a harmless name; only the target shows what it is.
        """
        root = self._root_of(path)
        if in_secret_dir(path) or is_secret_name(path.name):
            return True
        if root is not None and is_secret_parts(path.relative_to(root).parts):
            return True
        if real is None or real == path:
            return False
        if in_secret_dir(real) or is_secret_name(real.name):
            return True
        hit = self._real_root_of(real)
        return hit is not None and is_secret_parts(real.relative_to(hit[1]).parts)

    def skip_reason(self, path: Path) -> str | None:
        """Why a file is not indexed, or None when it may be read."""
        return self._check(path)[0]

    def _check(self, path: Path) -> tuple[str | None, Path | None, os.stat_result | None]:
        """(reason, None, None), or (None, resolved path, its stat) when it may be read."""
        root = self._root_of(path)
        if root is None:
            return "outside", None, None
        if self._is_secret(path, None):
            return "secret", None, None
        rel_parts = path.relative_to(root).parts
        if any(p in SKIP_DIRS for p in rel_parts[:-1]):
            return "ignored", None, None
        try:
            real = path.resolve(strict=True)  # dangling or looping links raise
        except (OSError, RuntimeError):
            return "outside", None, None
        if self._is_secret(path, real):
            return "secret", None, None
        hit = self._real_root_of(real)
        if hit is None:
            return "outside", None, None
        target_root, real_root = hit
        real_rel = real.relative_to(real_root).parts
        if any(p in SKIP_DIRS for p in real_rel[:-1]):
            return "ignored", None, None
        if self._ignores[root].excludes(path) or (
            real != path and self._ignores[target_root].excludes(target_root.joinpath(*real_rel))
        ):
            return "gitignore", None, None
        try:
            st = os.stat(real)
        except OSError:
            return "unreadable", None, None
        if not stat.S_ISREG(st.st_mode):
            return "not-a-file", None, None
        if st.st_size > self.max_file_bytes:
            return "huge", None, None
        return None, real, st

    def _read(self, path: Path, room: int) -> tuple[str | None, str | None]:
        """(text, None) or (None, reason). ``room``: bytes the budget has left for it.

        Sizes are checked on ``stat`` first, so a huge file or one over the budget is
        never opened, and at most ``max_file_bytes + 1`` bytes are read (the extra byte
        catches a file that grew since the stat).
        """
        reason, real, st = self._check(path)
        if reason is not None:
            return None, reason
        assert real is not None and st is not None
        if st.st_size > room:
            return None, "budget"
        data, reason = _read_capped(real, st, self.max_file_bytes + 1)
        if reason is not None:
            return None, reason
        if len(data) > self.max_file_bytes:
            return None, "huge"
        if looks_binary(data):
            return None, "binary"
        if len(data) > room:
            return None, "budget"
        try:
            return data.decode("utf-8"), None
        except UnicodeDecodeError:
            return None, "binary"

    # ---- bookkeeping --------------------------------------------------
    # Every change to _disk/_buffers goes through these, so _bytes stays the sum of both
    # without re-summing all files for each one (which made a scan quadratic).
    def _put_disk(self, uri: str, size: int) -> None:
        self._bytes += size - self._disk.get(uri, 0)
        self._disk[uri] = size

    def _pop_disk(self, uri: str) -> int | None:
        size = self._disk.pop(uri, None)
        if size is not None:
            self._bytes -= size
        return size

    def _put_buffer(self, uri: str, size: int) -> None:
        self._bytes += size - self._buffers.get(uri, 0)
        self._buffers[uri] = size

    def _pop_buffer(self, uri: str) -> int | None:
        size = self._buffers.pop(uri, None)
        if size is not None:
            self._bytes -= size
        return size

    def _total(self) -> int:
        return self._bytes

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
        return self._index_file(path) is None

    def _index_file(self, path: Path) -> str | None:
        """index_file, returning why the file was not indexed (None: it is)."""
        path = Path(os.path.abspath(path))
        uri = uri_for(path)
        with self._lock:
            if uri in self._buffers:
                return None  # the open buffer wins over disk
            if uri not in self._disk and len(self._disk) >= self.max_index_files:
                self._count_skip("file-cap")
                if not self._file_cap_reached:
                    self._file_cap_reached = True
                    log.warning(
                        "workspace index: file cap reached (%d files); not indexing more",
                        self.max_index_files,
                    )
                return "file-cap"
            room = self.max_total_bytes - (self._bytes - self._disk.get(uri, 0))
            text, reason = self._read(path, room)
            if text is None:
                assert reason is not None
                self._count_skip(reason)
                self._drop_disk(uri)
                return reason
            self._put_disk(uri, len(text.encode("utf-8")))
            self.sink.set_source(source_id_for(uri), text)
        self._notify("indexed", uri)
        return None

    def _drop_disk(self, uri: str) -> bool:
        if self._pop_disk(uri) is not None and uri not in self._buffers:
            self.sink.remove_source(source_id_for(uri))
            return True
        return False

    def remove_path(self, path: Path) -> None:
        """A file or a whole folder disappeared."""
        path = Path(os.path.abspath(path))
        uri = uri_for(path)
        prefix = uri.rstrip("/") + "/"
        with self._lock:
            gone = [u for u in self._disk if u == uri or u.startswith(prefix)]
            for u in gone:
                self._drop_disk(u)
        for u in gone:
            self._notify("removed", u)

    def scan(self) -> None:
        """Index every eligible file under the roots (blocking), up to the file cap."""
        with self._lock:
            self._file_cap_reached = False
        for root in self.roots:
            self._ignores[root].reload()
            if not self._scan_dir(root, root):
                break

    def _scan_dir(self, root: Path, top: Path) -> bool:
        """Index the files under ``top``; False when the file cap stopped the walk.

        Directory symlinks are listed by os.walk but never followed, so a link loop
        (``ws/loop -> ws``) cannot make the walk endless.
        """
        ignores = self._ignores[root]
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            here = Path(dirpath)
            dirnames[:] = sorted(
                d
                for d in dirnames
                if d not in SKIP_DIRS
                and not is_secret_dir(d)
                and not ignores.ignored(here / d, is_dir=True)
            )
            for name in sorted(filenames):
                if self._index_file(here / name) == "file-cap":
                    return False
        return True

    # ---- editor buffers -----------------------------------------------
    def _buffer_is_secret(self, uri: str, path: str | None) -> bool:
        """The secret rule for buffers: name, folders and symlink target, as on disk."""
        if not path:
            return is_secret_name(uri.rsplit("/", 1)[-1])
        lexical = Path(path)
        try:
            real = Path(os.path.realpath(lexical))
        except (OSError, RuntimeError):
            real = None
        return self._is_secret(lexical, real)

    def open_buffer(self, uri: str, text: str) -> bool:
        """An editor buffer (didOpen/didChange): overrides disk while open."""
        uri = normalize_uri(uri)
        path = uris.to_fs_path(uri)
        size = len(text.encode("utf-8"))
        with self._lock:
            if self._buffer_is_secret(uri, path) or size > self.max_file_bytes or "\x00" in text:
                self._count_skip("buffer-refused")
                if self._pop_buffer(uri) is not None:
                    self.sink.remove_source(source_id_for(uri))
                return False
            others = self._bytes - self._buffers.get(uri, 0) - self._disk.get(uri, 0)
            if others + size > self.max_total_bytes:
                self._count_skip("budget")
                return False
            # The buffer replaces the disk copy under the same source id: count it once.
            self._pop_disk(uri)
            self._put_buffer(uri, size)
            self.sink.set_source(source_id_for(uri), text)
        return True

    def close_buffer(self, uri: str) -> None:
        """Buffer closed: fall back to the file on disk, if it is indexable."""
        uri = normalize_uri(uri)
        with self._lock:
            if self._pop_buffer(uri) is None:
                return
            self._pop_disk(uri)
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
                if root is not None and not self._dir_excluded(root, path):
                    self._scan_dir(root, path)
            else:
                self.index_file(path)
        if gitignore_touched:
            self._rescan_after_gitignore()

    def _dir_excluded(self, root: Path, path: Path) -> bool:
        """A new folder the scan would never enter (``node_modules``, ``.kube``, ignored).

        Checked before walking it on a watch event, so ``npm install`` does not make
        the index walk (and reject one by one) a whole dependency tree.
        """
        rel_parts = path.relative_to(root).parts
        return any(p in SKIP_DIRS or is_secret_dir(p) for p in rel_parts) or any(
            self._ignores[root].ignored(root.joinpath(*rel_parts[:i]), is_dir=True)
            for i in range(1, len(rel_parts) + 1)
        )

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
        """Scan (in the watcher thread) and then follow changes until stop().

        Refused roots (home, ``/``...) are reported through ``on_change("refused", uri)``
        first, so the editor can tell the user why that folder gives no drafts.
        """
        if self._thread is not None:
            return
        for root in self.refused_roots:  # already logged when refused, in __init__
            self._notify("refused", uri_for(root))
        if not self.roots:
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
                max_files=self.max_index_files,
                file_cap_reached=self._file_cap_reached,
                refused_roots={str(root): why for root, why in self.refused_roots.items()},
            )
