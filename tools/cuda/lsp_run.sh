#!/bin/bash
# Device-side driver for the figures measured through the language server on a GPU (inline
# completion while typing, a warm rewrite, edit prediction), one step per call on a warm
# machine. Why a snapshot: the checkout that travels can be mid-edit by others between calls,
# so the first call carries the code as one tarball and every bench runs from that copy.
# Parts (made here with any splitter, each under the 64 MiB a call carries):
#   .mdl/el/aNN : Qwen2.5-Coder-0.5B-Instruct (qwen2.5-coder-0.5b-instruct.gguf) in order
#   .mdl/el/bNN : Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2.5-coder-1.5b-instruct-q4_k_m.gguf)
# Steps (every step first moves whatever parts came with the call to /tmp/parts):
#   first : wheels (.whl); the code snapshot (.mdl/el/src.tgz: the package folders as a tar,
#           e.g. `tar czf .mdl/el/src.tgz $(git ls-files echoline engine sidecar kernels tools
#           pyproject.toml)`) to /tmp/src; NVRTC builds of both files' modules in parallel
#   part  : nothing more
#   q05   : join the aNN parts into the echoline cache (sha256 checked, stamped); bench inline
#           --typing, bench next-edit --split tune, bench lsp (0.5B); INLINE_S, NEXT_S, LSP05_S
#           (seconds, 0: skip) bound each
#   q15   : join the bNN parts; bench lsp on the 1.5B (LSP15_S)
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:/tmp/src
export ECHOLINE_CACHE_DIR=/tmp/ec
source "$(dirname "$0")/device_common.sh"  # stamp
mkdir -p /tmp/parts "$ECHOLINE_CACHE_DIR/models"
for p in .mdl/el/[ab][0-9][0-9]; do [ -f "$p" ] && mv "$p" /tmp/parts/ && stamp "have $(basename "$p")"; done

join() {  # join PREFIX FILE SHA256: the parts in order into the cache, checked and stamped
  local dest="$ECHOLINE_CACHE_DIR/models/$2"
  if [ ! -f "$dest" ]; then
    cat /tmp/parts/"$1"[0-9][0-9] > "$dest" && rm -f /tmp/parts/"$1"[0-9][0-9]
  fi
  local got; got=$(sha256sum "$dest" | cut -d' ' -f1)
  [ "$got" = "$3" ] || { stamp "sha256 mismatch for $2: $got"; return 1; }
  python3 - "$dest" "$3" <<'PY'
import json, os, sys
path, sha = sys.argv[1], sys.argv[2]
st = os.stat(path)  # the stamp echoline's model catalog writes after its own check
open(path + ".verified", "w").write(json.dumps({"sha256": sha, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))
PY
  stamp "joined $2 ($(stat -c %s "$dest") bytes, sha256 ok)"
}

bench() {  # bench NAME SECONDS ARGS...: python3 -m echoline bench ARGS --json into $OUT/NAME.json
  local name=$1 secs=$2; shift 2
  [ "$secs" = 0 ] && return
  (cd /tmp/src && timeout "$secs" python3 -m echoline bench "$@" --json > "$OUT/$name.json" 2> "$OUT/$name.err")
  stamp "bench $name rc=$?"; tail -${TAIL:-22} "$OUT/$name.err"
}

case "$1" in
first)
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  mkdir -p /tmp/src && tar xzf .mdl/el/src.tgz -C /tmp/src || exit 1
  cd /tmp/src || exit 1
  # the modules the two Qwen files load (their quant types, the tensor-core @b5 builds, the
  # q|k|v pairs), built in parallel so that no bench waits on NVRTC
  for q in "" @a7 q5_0 q5_0@b5 q8_0 q8_0@b5 q4_k q4_k@b5 q6_k q6_k@b5 q5_0+q8_0 q5_0+q8_0@b5 \
           q4_k+q6_k q4_k+q6_k@b5; do
    timeout 240 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1] or None)" "$q" 2>&1 | tail -3 &
  done
  wait; stamp compiled
  ;;
part)
  ls /tmp/parts | tr '\n' ' '; echo
  ;;
q05)
  join a qwen2.5-coder-0.5b-instruct.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 || exit 1
  bench inline-typing "${INLINE_S:-240}" inline --typing --places 4 --positions 12 --backend cuda --model qwen2.5-coder-0.5b
  bench next-edit "${NEXT_S:-180}" next-edit --split tune --backend cuda --model qwen2.5-coder-0.5b
  bench lsp-q05 "${LSP05_S:-150}" lsp --model qwen2.5-coder-0.5b --source engine/gguf_file.py --file-lines 300 \
    --selection-lines 10 --rounds 3 --backend cuda
  ;;
q15)
  join b qwen2.5-coder-1.5b-instruct-q4_k_m.gguf cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 || exit 1
  bench lsp-q15 "${LSP15_S:-300}" lsp --model qwen2.5-coder-1.5b --source engine/gguf_file.py --file-lines 300 \
    --selection-lines 10 --rounds 3 --backend cuda
  ;;
esac
stamp done
