"""Instruction mix of a CUDA module's kernels, from their SASS (no GPU needed).

Run: ``python -m tools.cuda.sass_mix MODULE [MODULE ...] [--filter REGEX] [--ops IMMA,IDP,...]``,
e.g. ``python -m tools.cuda.sass_mix q8_0@i1@b5 q8_0@i1@b5@s1 --filter '^mtb_q8_0_s4_n4$|^mtv_q8_0_r1$'``.
Each MODULE is what ``kernels.cuda.load_module`` takes; it is built as
``tools.cuda.ptxas_regs`` builds it (nvcc, same options) and disassembled with ``cuobjdump
-sass`` (the CUDA toolkit's; ``$CUOBJDUMP`` names it where it is not on the PATH). Per kernel:
its SASS instructions in all, and how many of each opcode asked for (``--ops``, by the
opcode's stem: ``IMMA`` counts ``IMMA.16832.U8.S8``).

Why it exists: where a kernel spends issue slots (the tensor-core mma, the float steps of the
integer form, integer address work) shows in the code before any device time is spent; the
signed-codes build (kernels.cu MT_SIGNED) was sized this way (``docs/backend-cuda.md``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from tools.cuda.ptxas_regs import compile_cubin

_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$")
_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def opcode_counts(sass: str) -> dict[str, Counter]:
    """kernel name -> Counter of opcode stems, from ``cuobjdump -sass`` text."""
    out: dict[str, Counter] = {}
    current: Counter | None = None
    for line in sass.splitlines():
        if m := _FUNCTION.match(line):
            current = out.setdefault(m.group(1), Counter())
        elif current is not None and (m := _INSTRUCTION.match(line)):
            current[m.group(1)] += 1
    return out


def module_mix(module: str, arch: str = "sm_90") -> dict[str, Counter]:
    """Build ``module`` and count its kernels' opcodes."""
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        raise SystemExit("cuobjdump not found: install the CUDA toolkit's, or set CUOBJDUMP")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "m.cubin"
        compile_cubin(module, cubin, arch)
        sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return opcode_counts(sass)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="+", help='load_module names, e.g. "q8_0@i1@b5"')
    ap.add_argument("--filter", default="", help="only kernels whose name matches this regex")
    ap.add_argument("--ops", default="IMMA,IDP,I2FP,FFMA,FMUL,IMAD,LOP3,LDS,BAR", help="opcode stems")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    ops = args.ops.split(",")
    print(f"{'module':22s} {'kernel':28s} {'all':>6s} " + " ".join(f"{o:>6s}" for o in ops))
    for module in args.modules:
        for name, mix in sorted(module_mix(module, args.arch).items()):
            if re.search(args.filter, name):
                print(f"{module:22s} {name:28s} {sum(mix.values()):6d} " + " ".join(f"{mix[o]:6d}" for o in ops))


if __name__ == "__main__":
    main()
