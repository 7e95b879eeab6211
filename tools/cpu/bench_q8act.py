"""int8-activation (VNNI) products against the float32-FMA kernels, per real model shape.

Run: ``flock /tmp/echoline-cpu.lock python -m tools.cpu.bench_q8act [--reps 15]``, or
``… --curve head [MODEL.gguf]`` for one matrix at 1-17 rows.
For each model's layer-0 matrices (fused as the backend fuses them) and the output
head: ms at 1/8/16 rows for ``matmul`` (fp32) and ``matmul_q8`` (int8 activations),
timed interleaved in one process (order alternating per rep), medians; the 8- and
16-row cost ratios; the relayout cost; the error of both against float64 x·Ŵ on
random normal rows. Ends with an estimate of a token's matrix products (layer
shapes × layers + head). Not a test: nothing is asserted except that the compiled
kernels contain ``vpdpbusd``.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import numpy as np
from echoline.engine.gguf_file import GGUFFile
from echoline.kernels.cpu.matmul import matmul, prepare_cached
from echoline.kernels.cpu.q8act import KINDS_Q8, kernel_asm, kernel_for, matmul_q8, prepare_q8

from tools.cpu.bench_matmul import model_matrices

MODELS = [
    Path.home() / ".cache/echoline/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    Path.home() / ".cache/echoline/models/gemma-3-270m-q4_k_m.gguf",
]
ROWS = (1, 8, 16)


def vnni_instructions() -> dict[str, int]:
    """Count of VNNI instructions in every compiled q8 kernel's assembly."""
    counts: dict[str, int] = {}
    for key in sorted(KINDS_Q8):
        if not kernel_for(*key).signatures:
            continue  # a kind no matrix of these models used
        for ins in re.findall(r"\b(vpdpbusds?|vpdpwssds?)\b", kernel_asm(*key)):
            counts[f"{key}:{ins}"] = counts.get(f"{key}:{ins}", 0) + 1
    return counts


def rel_rms(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sqrt(np.mean((y - ref) ** 2)) / np.sqrt(np.mean(ref**2)))


def bench_shape(label: str, tensors: list, reps: int, rng: np.random.Generator) -> dict[str, float]:
    pm = prepare_cached(tensors)
    t0 = time.perf_counter()
    qm = prepare_q8(pm)
    relayout_ms = (time.perf_counter() - t0) * 1e3
    x = rng.standard_normal((max(ROWS), pm.in_features)).astype(np.float32)
    w64 = np.concatenate([t.dequantize().reshape(t.rows, t.cols) for t in tensors]).astype(np.float64)
    ref = x[:4].astype(np.float64) @ w64.T
    err_fp = rel_rms(matmul(x[:4], pm), ref)
    err_q8 = rel_rms(matmul_q8(x[:4], qm), ref)
    res: dict[str, float] = {}
    for n in ROWS:
        xn = x[:n]
        matmul(xn, pm), matmul_q8(xn, qm)  # warm
        a, b = [], []
        for i in range(reps):
            order = ((matmul, pm, a), (matmul_q8, qm, b))
            for fn, w, sink in order if i % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                fn(xn, w)
                sink.append(time.perf_counter() - t0)
        res[f"fp{n}"] = float(np.median(a)) * 1e3
        res[f"q8{n}"] = float(np.median(b)) * 1e3
    types = "+".join(dict.fromkeys(t.qtype.name for t in tensors))
    print(
        f"{label:8} {types:11} {pm.out_features:>6}x{pm.in_features:<5}"
        + "".join(f" {res[f'fp{n}']:7.3f}" for n in ROWS)
        + f"  {res['fp8'] / res['fp1']:5.2f}x {res['fp16'] / res['fp1']:5.2f}x |"
        + "".join(f" {res[f'q8{n}']:7.3f}" for n in ROWS)
        + f"  {res['q88'] / res['q81']:5.2f}x {res['q816'] / res['q81']:5.2f}x |"
        + f" {relayout_ms:6.1f} ms  err {err_fp:.1e} / {err_q8:.1e}"
    )
    return res


def row_curve(path: Path, label: str, reps: int) -> None:
    """One fused matrix (``qkv``, ``o``, ``gate|up``, ``down``, ``head``) at 1-17 rows: ms of
    both kernels (interleaved, order alternating), and the q8 kernel's GB/s and G MAC/s."""
    mats = model_matrices(GGUFFile(path))
    tensors = next(t for name, t in mats if name == label)
    pm = prepare_cached(tensors)
    qm = prepare_q8(pm)
    x = np.random.default_rng(0).standard_normal((17, pm.in_features)).astype(np.float32)
    rows = (1, 2, 3, 4, 5, 8, 9, 16, 17)
    times: dict[int, tuple[list[float], list[float]]] = {n: ([], []) for n in rows}
    for rep in range(reps):
        for n in rows if rep % 2 else rows[::-1]:
            for sink, (fn, w) in zip(times[n], ((matmul, pm), (matmul_q8, qm)), strict=True):
                t0 = time.perf_counter()
                fn(x[:n], w)
                sink.append(time.perf_counter() - t0)
    print(f"{path.name} {label} {pm.out_features}x{pm.in_features}, q8 weights {qm.nbytes / 1e6:.1f} MB, "
          f"median of {reps}")
    one = float(np.median(times[1][1]))
    for n in rows:
        f32, q8 = (float(np.median(t)) for t in times[n])
        macs = n * pm.out_features * pm.in_features
        print(f"{n:3d} rows  f32 {f32 * 1e3:7.3f} ms  q8 {q8 * 1e3:7.3f} ms  q8 x{q8 / one:5.2f}  "
              f"{qm.nbytes / q8 / 1e9:6.1f} GB/s  {macs / q8 / 1e9:6.1f} G MAC/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("models", nargs="*", type=Path, default=MODELS)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--curve", metavar="MATRIX", help="qkv|o|gate|up|down|head: that matrix at 1-17 rows")
    args = ap.parse_args()
    if args.curve:
        for path in args.models:
            row_curve(path, args.curve, max(args.reps, 25))
        return
    rng = np.random.default_rng(0)
    head = (
        f"{'matrix':8} {'types':11} {'out x in':>12}"
        + "".join(f" {'fp32 ' + str(n):>7}" for n in ROWS)
        + "   8/1   16/1  |"
        + "".join(f" {'q8 ' + str(n):>7}" for n in ROWS)
        + "   8/1   16/1  | relayout   rel. RMS error fp32 / q8"
    )
    for path in args.models:
        f = GGUFFile(path)
        mats = model_matrices(f)
        n_layers = sum(1 for label, _ in mats if label == "qkv")
        print(f"\n{path.name} ({n_layers} layers), ms per call, median of {args.reps}, interleaved")
        print(head)
        total = dict.fromkeys([f"{k}{n}" for k in ("fp", "q8") for n in ROWS], 0.0)
        for label, tensors in mats[:4] + [mats[-1]]:
            res = bench_shape(label, tensors, args.reps, rng)
            mult = 1 if label == "head" else n_layers
            for k in total:
                total[k] += mult * res[k]
        print(
            "token estimate (layer-0 shapes x layers + head): "
            + " ".join(f"fp32 {n}: {total[f'fp{n}']:.2f} ms" for n in ROWS)
            + f" ({total['fp8'] / total['fp1']:.2f}x, {total['fp16'] / total['fp1']:.2f}x); "
            + " ".join(f"q8 {n}: {total[f'q8{n}']:.2f} ms" for n in ROWS)
            + f" ({total['q88'] / total['q81']:.2f}x, {total['q816'] / total['q81']:.2f}x)"
        )
    counts = vnni_instructions()
    print("\nVNNI instructions in the compiled kernels:", counts)
    if not any("vpdpbusd" in k for k in counts):
        raise SystemExit("no vpdpbusd in the q8 kernels")


if __name__ == "__main__":
    main()
