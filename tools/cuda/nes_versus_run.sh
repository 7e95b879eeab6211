#!/bin/bash
# Device-side driver for the edit-prediction side-by-side on a GPU: echoline (plain and exact
# speculation) against llama-server (plain and --spec-type ngram-mod) on the prompts that
# `echoline bench next-edit` builds for the tune split (tools/versus_llamacpp.py --traffic
# next-edit), one step per call on a warm machine.
# Why this order: the llama.cpp CUDA build (~4 min) is the long pole, so the first call starts
# it at once in the background (setsid) together with the NVRTC builds, and the model parts
# travel while both build. Why a snapshot: the checkout that travels can be mid-edit by others
# between calls, so the first call carries one commit's code as a tarball and the run uses it.
# Carried (made here):
#   .whl/          the pure-Python wheels (pygls, lsprotocol, gguf, ...)
#   .lcpp/lcpp.tgz llama.cpp 0c1e570, trimmed (../shared/recipes/llamacpp-peer.md)
#   .mdl/el/src.tgz `git archive COMMIT echoline engine sidecar kernels tools pyproject.toml | gzip`
#   .mdl/el/aNN    Qwen2.5-Coder-0.5B-Instruct (qwen2.5-coder-0.5b-instruct.gguf) in order,
#                  each call's part under the 64 MiB a call carries
# Steps (each first moves the parts that came with it to /tmp/parts):
#   first : nvidia-smi; the llama.cpp build and the NVRTC builds started in the background
#   part  : nothing more (lists the parts and the builds' progress)
#   final : join the parts into the echoline cache (sha256 checked, stamped); wait for both
#           builds (WAIT_S, default 300); a short run (SMALL_CASES cases, one round: a figure
#           even if the long one runs out of time), then the whole tune split (CASES, 0: all;
#           ROUNDS, default 3; VS_S seconds)
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:/tmp/src
export ECHOLINE_CACHE_DIR=/tmp/ec
source "$(dirname "$0")/device_common.sh"  # stamp, start_llamacpp_build
mkdir -p /tmp/parts "$ECHOLINE_CACHE_DIR/models"
for p in .mdl/el/a[0-9][0-9]; do [ -f "$p" ] && mv "$p" /tmp/parts/ && stamp "have $(basename "$p")"; done
SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
NAME=qwen2.5-coder-0.5b-instruct.gguf
EXE=/tmp/lcpp/llama.cpp/build/bin/llama-server

case "$1" in
first)
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  start_llamacpp_build 14 || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  mkdir -p /tmp/src && tar xzf .mdl/el/src.tgz -C /tmp/src || exit 1
  # the modules the 0.5B file loads, built in the background while the parts travel
  setsid nohup bash -c 'cd /tmp/src; for q in "" @a7 q5_0 q5_0@b5 q8_0 q8_0@b5 q5_0+q8_0 q5_0+q8_0@b5; do
      timeout 240 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1] or None)" "$q" &
    done; wait; echo nvrtc-done' > /tmp/nvrtc.log 2>&1 < /dev/null &
  stamp "NVRTC builds started"
  ;;
part)
  ls /tmp/parts | tr '\n' ' '; echo; tail -c 300 /tmp/lcpp.log; echo; tail -2 /tmp/nvrtc.log
  ;;
final)
  dest="$ECHOLINE_CACHE_DIR/models/$NAME"
  [ -f "$dest" ] || { cat /tmp/parts/a[0-9][0-9] > "$dest" && rm -f /tmp/parts/a[0-9][0-9]; }
  got=$(sha256sum "$dest" | cut -d' ' -f1)
  [ "$got" = "$SHA" ] || { stamp "sha256 mismatch: $got ($(stat -c %s "$dest") bytes)"; exit 1; }
  python3 - "$dest" "$SHA" <<'PY'
import json, os, sys
path, sha = sys.argv[1], sys.argv[2]
st = os.stat(path)  # the stamp echoline's model catalog writes after its own check
open(path + ".verified", "w").write(json.dumps({"sha256": sha, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))
PY
  stamp "joined $NAME, sha256 ok"
  for _ in $(seq 1 $((${WAIT_S:-300} / 5))); do
    grep -q "rc=" /tmp/lcpp.log && grep -q nvrtc-done /tmp/nvrtc.log && break; sleep 5
  done
  stamp "llama.cpp: $(tail -1 /tmp/lcpp.log); nvrtc: $(tail -1 /tmp/nvrtc.log)"
  [ -x $EXE ] || { tail -30 /tmp/lcpp.log; exit 1; }
  cd /tmp/src || exit 1
  vs() {  # vs NAME SECONDS ARGS...: tools.versus_llamacpp --traffic next-edit into $OUT/NAME.log
    local name=$1 secs=$2; shift 2
    timeout "$secs" python3 -m tools.versus_llamacpp --model qwen2.5-coder-0.5b --backend cuda \
      --traffic next-edit --llama-server $EXE --llama-args "-ngl 99" --json "$@" > "$OUT/$name.log" 2>&1
    stamp "versus $name rc=$?"; grep -v '^{' "$OUT/$name.log" | tail -12
  }
  vs small "${SMALL_S:-120}" --next-edit-cases "${SMALL_CASES:-5}" --rounds 1
  vs tune "${VS_S:-420}" --next-edit-cases "${CASES:-0}" --rounds "${ROUNDS:-3}"
  ;;
esac
stamp done
