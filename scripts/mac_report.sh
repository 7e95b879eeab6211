#!/usr/bin/env bash
# One command for a Mac (Apple silicon) user: checks the MLX backend and prints a
# report to paste into an issue. Runs doctor (the set-up report, then batch invariance
# on the real model),
# the decode benchmark (tok/s, verify-cost curve) and the copy-traffic speculation
# benchmark, each as JSON, plus the machine and library versions.
#
#   bash scripts/mac_report.sh            # default model (smollm2)
#   MODEL=gemma3-270m bash scripts/mac_report.sh
set -u
MODEL="${MODEL:-smollm2}"
if command -v echoline >/dev/null 2>&1; then
  ECHOLINE=(echoline)
else
  PY="${PYTHON:-python3}"
  ECHOLINE=("$PY" -c 'import sys; from echoline.sidecar.cli import main; sys.exit(main())')
fi
PY="${PYTHON:-python3}"

section() { printf '\n===== %s =====\n' "$1"; }

section "machine"
uname -a
sysctl -n machdep.cpu.brand_string 2>/dev/null || true
sysctl -n hw.memsize 2>/dev/null | awk '{printf "memory: %.1f GiB\n", $1/1073741824}' || true
"$PY" - <<'PYEOF'
import platform
print("python", platform.python_version(), platform.machine())
try:
    import mlx.core as mx
    print("mlx", mx.__version__, "default device:", mx.default_device(), "metal:", mx.metal.is_available())
    from echoline.engine.backends.mlx_backend import MlxBackend
    b = MlxBackend()
    print("mlx backend: q6k metal kernel in use:", b.q6k_kernel, "| claims batch-invariant:", b.batch_invariant)
    print("op self-check (row counts 1..16):", b.check_batch_invariance())
except Exception as exc:  # report, never stop: the rest of the report still helps
    print("mlx backend unavailable:", repr(exc))
PYEOF

status=0
run() {
  section "$*"
  "${ECHOLINE[@]}" "$@" --model "$MODEL" 2>&1 || { echo "(exit $?)"; status=1; }
}
run doctor --backend mlx --json
run doctor --invariance --backend mlx --json
run bench decode --backend mlx --json
run bench spec --backend mlx --traffic copy --json
section "end (paste everything above)"
exit $status
