"""Plots for docs/benchmarks.md, drawn from the benchmark JSON kept in ``docs/data/``.

Why a script: a figure in the docs must be reproducible from the numbers next to it, so
the plots are never edited by hand. Each input is the JSON line a benchmark printed:

* ``versus-llamacpp-*.json`` (``python -m tools.versus_llamacpp --model M --json``):
  tok/s of llama.cpp plain, llama.cpp ngram-mod, echoline plain and echoline exact
  speculation, per traffic → ``docs/images/versus-llamacpp.png``;
* ``spec-*.json`` (``echoline bench spec --model M --traffic T --json``): the verify-cost
  curve (k rows / one row) → ``docs/images/verify-cost.png``, and the acceptance and
  tokens per round by traffic → ``docs/images/acceptance.png``.

Usage: ``python -m tools.plots [--data docs/data] [--out docs/images]`` (needs matplotlib:
``pip install -e ".[plots]"``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = (("llama_plain_tok_s", "llama.cpp plain"), ("llama_ngram_tok_s", "llama.cpp ngram-mod"),
        ("echo_plain_tok_s", "echoline plain"), ("echo_spec_tok_s", "echoline exact spec"))  # fmt: skip


def _load(paths: list[Path]) -> list[dict]:
    out = []
    for p in sorted(paths):
        lines = [ln for ln in p.read_text().splitlines() if ln.strip().startswith("{")]
        if lines:
            out.append(json.loads(lines[-1]))
    return out


def _save(fig, ax, path: Path) -> Path:
    """Legend, layout, write, close: the end of every plot."""
    import matplotlib.pyplot as plt

    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_versus(runs: list[dict], out: Path) -> Path | None:
    """Grouped bars: one group per (model, traffic), one bar per engine and mode."""
    import matplotlib.pyplot as plt

    groups = [(r, t) for r in runs for t in sorted(r.get("traffic", {}))]
    if not groups:
        return None
    fig, ax = plt.subplots(figsize=(2.2 * len(groups) + 2, 4))
    width = 0.8 / len(ARMS)
    for i, (key, label) in enumerate(ARMS):
        xs = [g + (i - (len(ARMS) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [r["traffic"][t][key] for r, t in groups], width, label=label)
    cpus = {r.get("cpu", "?") for r in runs}
    short = {"Intel(R) Xeon(R) Processor": "Intel Xeon"}  # the name /proc/cpuinfo gives, shortened
    ax.set_xticks(range(len(groups)), [
        f"{r['model']}\n{t}" + (f"\n{short.get(r.get('cpu', '?'), r.get('cpu', '?'))}" if len(cpus) > 1 else "")
        for r, t in groups
    ])  # fmt: skip
    ax.set_ylabel("decode tok/s")
    first = runs[0]
    where = ", ".join(sorted(short.get(c, c) for c in cpus))
    ax.set_title(f"echoline vs llama-server, {where} ({first.get('cores', '?')} cores)")
    return _save(fig, ax, out / "versus-llamacpp.png")


def plot_verify_cost(runs: list[dict], out: Path) -> Path | None:
    """k rows' forward time over one row's, per model and backend."""
    import matplotlib.pyplot as plt

    seen, lines = set(), []
    for r in runs:
        key = (r.get("model"), r.get("variant") or r.get("backend"))
        if r.get("verify_cost") and key not in seen:
            seen.add(key)
            lines.append((key, r["verify_cost"]))
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for (model, backend), curve in lines:
        ks = sorted(int(k) for k in curve)
        ax.plot(ks, [curve[str(k)] for k in ks], marker="o", label=f"{model} ({backend})")
    ax.plot([1, 16], [1, 16], linestyle=":", color="grey", label="k separate steps")
    ax.set_xlabel("rows in one forward (k)")
    ax.set_ylabel("time / one-row time")
    ax.set_title("verify cost")
    return _save(fig, ax, out / "verify-cost.png")


def plot_acceptance(runs: list[dict], out: Path) -> Path | None:
    """Speed-up over plain and tokens per round, by traffic."""
    import matplotlib.pyplot as plt

    rows = [r for r in runs if "ratio" in r and "traffic" in r and isinstance(r["traffic"], str)]
    if not rows:
        return None
    labels = [f"{r['model'].split('.gguf')[0][:24]}\n{r['traffic']}" for r in rows]
    fig, ax = plt.subplots(figsize=(1.8 * len(rows) + 2, 4))
    ax.bar(range(len(rows)), [r["ratio"] for r in rows], label="exact spec / plain")
    ax.bar(range(len(rows)), [r.get("tokens_per_round", 0) for r in rows], alpha=0.35,
           label="tokens per round")  # fmt: skip
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_title("speculation by traffic (bench spec)")
    return _save(fig, ax, out / "acceptance.png")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "docs" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    args.out.mkdir(parents=True, exist_ok=True)
    spec = _load(list(args.data.glob("spec-*.json")))
    made = [plot_versus(_load(sorted(args.data.glob("versus-llamacpp-*.json"))), args.out),
            plot_verify_cost(spec, args.out), plot_acceptance(spec, args.out)]  # fmt: skip
    for p in made:
        if p is not None:
            print(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
