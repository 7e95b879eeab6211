"""llama.cpp's ``llama-server`` as a peer: build it from the sources vendored in the
``llama-cpp-python`` sdist, start it on a GGUF file, and talk to it.

A dev-only tool, never a dependency. The build names the machine's ISA explicitly instead
of ``-DGGML_NATIVE=ON``, which enables AMX code that faults in these VMs.

    python -m tools.llamacpp_peer build        # prints the path of llama-server
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

SDIST = "llama-cpp-python==0.3.36"
COMMIT = "0c1e570"
ROOT = Path(os.environ.get("ECHOLINE_PEER_DIR", Path.home() / ".cache" / "echoline-peer"))

_X86_FLAGS = [
    "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_AVX512=ON",
    "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX_VNNI=ON",
]


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


#: ``ECHOLINE_PEER_ISA=avx2``: build for an AVX2 machine (AVX2, FMA, F16C only) in its own
#: build folder, to stand in for the x86 CPUs without AVX-512 VNNI (most laptops) next to an
#: echoline run with ``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=`` (empty: Haswell's own features)
_ISA_CAP = {"avx2": {"avx2", "fma", "f16c"}}


def isa_flags() -> list[str]:
    """CMake ISA switches for this CPU (each only where the CPU has it; never AMX), capped by
    ``ECHOLINE_PEER_ISA`` when it names a smaller ISA."""
    have = _cpu_flags()
    cap = _ISA_CAP.get(os.environ.get("ECHOLINE_PEER_ISA", ""))
    if cap is not None:
        have &= cap
    wanted = {
        "-DGGML_AVX2=ON": "avx2", "-DGGML_FMA=ON": "fma", "-DGGML_F16C=ON": "f16c",
        "-DGGML_AVX512=ON": "avx512f", "-DGGML_AVX512_VNNI=ON": "avx512_vnni",
        "-DGGML_AVX512_VBMI=ON": "avx512vbmi", "-DGGML_AVX512_BF16=ON": "avx512_bf16",
        "-DGGML_AVX_VNNI=ON": "avx_vnni",
    }
    flags = [flag for flag in _X86_FLAGS if wanted[flag] in have]
    if cap is not None:  # what a Haswell-class build also names (the native list predates it)
        flags += [f for f, feat in (("-DGGML_AVX=ON", "avx"), ("-DGGML_BMI2=ON", "bmi2")) if feat in _cpu_flags()]
    return flags


def source_dir() -> Path:
    """The vendored llama.cpp tree, downloading and unpacking the sdist once."""
    src = ROOT / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    ROOT.mkdir(parents=True, exist_ok=True)
    dl = ROOT / "sdist"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "-q", "-d", str(dl), SDIST], check=True)
    archive = next(dl.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(archive) as tf:
        top = tf.getnames()[0].split("/")[0]
        members = [m for m in tf.getmembers() if m.name.startswith(f"{top}/vendor/llama.cpp/")]
        tf.extractall(ROOT / "unpacked", members=members, filter="data")
    shutil.move(str(ROOT / "unpacked" / top / "vendor" / "llama.cpp"), src)
    shutil.rmtree(ROOT / "unpacked", ignore_errors=True)
    return src


def build_flags() -> list[str]:
    """The CMake switches: this CPU's ISA, and nothing but what ``llama-server`` needs."""
    return ["-DGGML_NATIVE=OFF", *isa_flags(), "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_BUILD_NUMBER=1", f"-DLLAMA_BUILD_COMMIT={COMMIT}",
            "-DCMAKE_BUILD_TYPE=Release"]


def _stamp(flags: list[str]) -> dict:
    return {"sdist": SDIST, "flags": flags}


def _configured_with(build_dir: Path, flags: list[str]) -> bool:
    """Whether CMakeCache.txt holds every ``-DKEY=VALUE`` (a build made before stamps)."""
    try:
        cache = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return False
    have = {}
    for line in cache.splitlines():
        key, sep, value = line.partition("=")
        if sep and ":" in key and not line.startswith(("#", "//")):
            have[key.split(":", 1)[0]] = value
    for flag in flags:
        key, _, value = flag[2:].partition("=")
        if have.get(key) != value:
            return False
    return True


def build(jobs: int | None = None) -> Path:
    """``llama-server`` built for this CPU, cached under ``ROOT`` and keyed by the sdist
    version and the CMake flags (``build/echoline-build.json``): a cached binary built
    otherwise is rebuilt (incrementally, in place). A failed step raises.

    Processes that call this at once take turns (an exclusive lock on ``ROOT/build.lock``):
    the test suite starts one build in the background (``tests/conftest.py``) and its
    tests then wait for that build instead of starting a second one in the same folder."""
    import fcntl

    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(jobs)


def is_built() -> bool:
    """Whether a cached ``llama-server`` matches this sdist and these flags (no build)."""
    build_dir = _build_dir()
    try:
        stamp = json.loads((build_dir / "echoline-build.json").read_text())
    except (OSError, ValueError):
        return False
    return (build_dir / "bin" / "llama-server").is_file() and stamp == _stamp(build_flags())


def _build_dir() -> Path:
    """The build folder: one per ISA cap (``ECHOLINE_PEER_ISA``), so builds never mix."""
    isa = os.environ.get("ECHOLINE_PEER_ISA", "")
    return ROOT / "llama.cpp" / (f"build-{isa}" if isa in _ISA_CAP else "build")


def _build_locked(jobs: int | None) -> Path:
    src = source_dir()
    build_dir = _build_dir()
    exe = build_dir / "bin" / "llama-server"
    flags = build_flags()
    stamp = build_dir / "echoline-build.json"
    if exe.is_file():
        try:
            if json.loads(stamp.read_text()) == _stamp(flags):
                return exe
        except (OSError, ValueError):
            if _configured_with(build_dir, flags):
                stamp.write_text(json.dumps(_stamp(flags)))
                return exe
    stamp.unlink(missing_ok=True)
    subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir), *flags], check=True)
    subprocess.run(["cmake", "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 2),
                    "--target", "llama-server"], check=True)
    stamp.write_text(json.dumps(_stamp(flags)))
    return exe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A running ``llama-server`` on one model (a context manager)."""

    def __init__(self, model: Path, *, exe: Path | None = None, threads: int | None = None,
                 ctx: int = 4096, parallel: int = 1, extra: list[str] | None = None) -> None:
        self.exe = exe or build()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [str(self.exe), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                    "-t", str(threads or os.cpu_count() or 2), "-c", str(ctx), "-np", str(parallel),
                    "--no-webui", *(extra or [])]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError("llama-server did not become healthy")

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.load(r)

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's ids for ``text``: no BOS, special-token text not parsed (as echoline)."""
        out = self.post("/tokenize", {"content": text, "add_special": False, "parse_special": False})
        return [int(t) for t in out["tokens"]]

    def greedy(self, prompt_ids: list[int], n: int, **extra: object) -> dict:
        """Greedy continuation of token ids: ``{"ids": [...], "timings": {...}, "text": ...}``."""
        body = {"prompt": prompt_ids, "n_predict": n, "temperature": 0.0, "top_k": 1,
                "return_tokens": True, "cache_prompt": False, "samplers": ["top_k"], **extra}
        out = self.post("/completion", body)
        return {"ids": [int(t) for t in out.get("tokens", [])], "timings": out.get("timings", {}),
                "text": out.get("content", ""), "stop_type": out.get("stop_type")}


def add_peer_arguments(ap: argparse.ArgumentParser) -> None:
    """``--llama-server`` and ``--llama-args``: what every side-by-side tool takes to run
    llama-server built elsewhere (the GPU build) or with more flags (``-ngl 99``)."""
    ap.add_argument("--llama-server", default="",
                    help="a llama-server built elsewhere (the GPU build), instead of building one here")
    ap.add_argument("--llama-args", default="",
                    help="more llama-server arguments for its servers, e.g. '-ngl 99' on a GPU")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["build"])
    ap.parse_args()
    print(build())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
