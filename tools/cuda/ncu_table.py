"""Read ``ncu --metrics`` reports (tools/cuda/ncu_stalls.sh) into one table per file.

One column per kernel launch (the last profile of each kernel name: the first is a warm-up),
one row per metric, stall reasons shortened to their name; reasons under 0.1 cycles per
issued instruction are left out.

    python3 -m tools.cuda.ncu_table ncu_stalls_1.txt ncu_stalls_16.txt
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_KERNEL = re.compile(r"^  (\S+) \((\d+), (\d+), (\d+)\)x\((\d+), 1, 1\)")
_METRIC = re.compile(r"^    (\S+)\s+(\S+)?\s+([\d,.]+)$")
_STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
_SHORT = {
    "gpu__time_duration.sum": "time us",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy %",
    "smsp__average_warp_latency_per_inst_issued.ratio": "cycles/issue",
    "l1tex__t_sector_hit_rate.pct": "L1 hit %",
    "lts__t_sector_hit_rate.pct": "L2 hit %",
    "dram__bytes_read.sum": "DRAM read MB",
    "lts__t_bytes.sum": "L2 bytes MB",
    "smsp__inst_executed.sum": "warp instr",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe %",
}


def read(path: Path) -> dict[str, dict[str, float]]:
    """{kernel (grid): {metric: value}}, the last profile of each kernel."""
    out: dict[str, dict[str, float]] = {}
    current: dict[str, float] | None = None
    for line in path.read_text(errors="replace").splitlines():
        m = _KERNEL.match(line)
        if m:
            current = {}
            out[f"{m.group(1)} ({m.group(2)}x{m.group(3)}x{m.group(4)})"] = current
            continue
        m = _METRIC.match(line)
        if m and current is not None:
            name, unit, value = m.group(1), m.group(2) or "", float(m.group(3).replace(",", ""))
            if unit == "Kbyte":
                value /= 1000
            elif unit == "Gbyte":
                value *= 1000
            elif unit == "ms":
                value *= 1000
            stall = _STALL.match(name)
            current[f"stall {stall.group(1)}" if stall else _SHORT.get(name, name)] = value
    return out


def table(path: Path) -> str:
    kernels = read(path)
    names = list(kernels)
    rows = list(dict.fromkeys(k for v in kernels.values() for k in v if not k.startswith("stall")))
    stalls = sorted(
        {k for v in kernels.values() for k, x in v.items() if k.startswith("stall") and x >= 0.1},
        key=lambda k: -max(v.get(k, 0.0) for v in kernels.values()),
    )
    lines = [f"== {path.name}", "| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for r in rows + stalls:
        cells = []
        for n in names:
            x = kernels[n].get(r)
            cells.append("" if x is None else f"{x:,.0f}" if x >= 1000 else f"{x:.2f}")
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(table(Path(p)) for p in sys.argv[1:]))
