"""Registers and spills of a CUDA module's kernels, from ptxas (no GPU needed, nvcc is).

Run: ``python -m tools.cuda.ptxas_regs MODULE [--filter REGEX] [--arch sm_90]``, e.g.
``python -m tools.cuda.ptxas_regs q4_k@i1@b5 --filter '^mt_.*_n4_'``. MODULE is what
``kernels.cuda.load_module`` takes (a quant type with its "@" build options; "" for the common
module). The source is the one NVRTC compiles (``kernel_source``) with the same options, built
with nvcc for ``--arch``; ptxas reports each kernel's registers and spill bytes.

Why it exists: a kernel whose accumulators spill to local memory is slow however its math is
arranged, and that shows here without device time (``docs/backend-cuda.md``, "Launches past
16 rows", quotes its figures).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

from echoline.kernels.cuda import OPTIONS, kernel_source

_ENTRY = re.compile(
    r"Compiling entry function '([^']+)'.*?(\d+) bytes spill stores, (\d+) bytes spill loads\s*\n"
    r"ptxas info\s*: Used (\d+) registers",
    re.S,
)


def compile_cubin(module: str, cubin: Path, arch: str = "sm_90") -> str:
    """Build ``module``'s source (as NVRTC would, same options) into ``cubin`` with nvcc;
    returns ptxas's verbose report."""
    src = cubin.with_suffix(".cu")
    src.write_text(kernel_source(module or None))
    done = subprocess.run(
        ["nvcc", f"-arch={arch}", "-cubin", *OPTIONS, "-Xptxas", "-v", str(src), "-o", str(cubin)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"nvcc failed:\n{done.stderr[-2000:]}")
    return done.stderr


def kernel_registers(module: str, arch: str = "sm_90") -> dict[str, tuple[int, int, int]]:
    """kernel name -> (registers, spill store bytes, spill load bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = compile_cubin(module, Path(tmp) / "m.cubin", arch)
    return {m[0]: (int(m[3]), int(m[1]), int(m[2])) for m in _ENTRY.findall(report)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module", help='a load_module name, e.g. "q4_k@i1@b5" ("" for the common kernels)')
    ap.add_argument("--filter", default="", help="only kernels whose name matches this regex")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    rows = kernel_registers(args.module, args.arch)
    for name in sorted(n for n in rows if re.search(args.filter, n)):
        regs, stores, loads = rows[name]
        print(f"{name:36s} {regs:4d} registers  spill stores {stores:5d} B  loads {loads:5d} B")


if __name__ == "__main__":
    main()
