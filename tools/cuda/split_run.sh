#!/bin/bash
# Device-side driver (issue 21, the split-K tensor products and the real-file figures), one
# step per call on a warm machine:
#   first  : wheels; NVRTC builds in parallel; every CUDA test; then the llama.cpp CUDA build in
#            the background (.lcpp/lcpp.tgz, setsid); PROBE_S=N: python3 -m tools.cuda.split_probe
#   part   : copy the carried model part (.mdl/qwenpartNN) to /tmp/models; then BENCH=qwen|smol|
#            q15|iq4 (the IQ4 shapes beside their usual types) runs python3 -m tools.cuda.bench_device --reps 30 --quick --chain --gap on that shape
#            (BENCH_FLAGS replaces --chain --gap, e.g. --tc)
#   final  : join the parts (.mdl/qwenpartNN, .mdl/smolpartNN); for each of MODELS (default qwen;
#            smol too) bench decode (chained vs stepwise plain) and bench spec for each of
#            TRAFFIC (default copy edit); the real-file GPU tests; then, where the llama.cpp build
#            finished, python3 -m tools.versus_llamacpp against it (VS_TRAFFIC, default copy,edit,rewrite)
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
source "$(dirname "$0")/device_common.sh"  # stamp, start_llamacpp_build
mkdir -p /tmp/models
for p in .mdl/*part*; do [ -f "$p" ] && cp "$p" /tmp/models/ && stamp "have $(basename "$p")"; done
BENCH_CMD="python3 -m tools.cuda.bench_device --reps 30 --quick ${BENCH_FLAGS:---chain --gap} --ks 1,8,16 --context 1024"
case "$1" in
first)
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
  # the modules the tests load (device_run.sh suite's list), built before anything else runs:
  # with the llama.cpp build beside them the NVRTC builds and the tests ran past their limits
  # EXTRA_MODULES: more to build beside them (e.g. "q5_0@b5@x1": a setting under A/B)
  for q in $(bash tools/cuda/device_run.sh modules) $EXTRA_MODULES; do
    timeout 300 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1] or None)" "$q" 2>&1 | tail -3 &
  done
  timeout 300 python3 -c "from echoline.kernels.cuda import load_module; load_module(None)" &
  wait; stamp compiled
  # TESTS / TEST_K: another selection (default: the whole GPU suite)
  timeout ${TEST_S:-330} python3 -m pytest -q -p no:cacheprovider --durations=6 \
    ${TESTS:-tests/test_cuda_backend.py tests/test_cuda_tuning.py} ${TEST_K:+-k "$TEST_K"} > "$OUT/tests.log" 2>&1
  stamp "tests rc=$?"; grep -E "passed|failed|^E |Error|s call|^FAILED" "$OUT/tests.log" | head -40
  if [ -f .lcpp/lcpp.tgz ]; then  # after the tests: it builds while the parts travel
    start_llamacpp_build 12
  fi
  if [ "${PROBE_S:-0}" != 0 ]; then
    timeout $PROBE_S python3 -m tools.cuda.split_probe > "$OUT/probe.log" 2>&1
    rc=$?; stamp "probe rc=$rc"; sed -n '/== split probe ==/,$p' "$OUT/probe.log"; [ $rc = 0 ] || tail -25 "$OUT/probe.log"
  fi
  ;;
part)
  case "$BENCH" in
    qwen) M=qwen2.5-0.5b ;; smol) M=smollm2-135m ;; q15) M=qwen2.5-1.5b ;;
    iq4) M=qwen2.5-0.5b-iq4nl,qwen2.5-0.5b,qwen2.5-1.5b-iq4xs ;; *) M= ;;
  esac
  if [ -n "$M" ]; then
    timeout ${BENCH_S:-150} $BENCH_CMD --models $M > "$OUT/bench_$BENCH.log" 2>&1
    stamp "bench $M rc=$?"; sed -n '/== summary ==/,$p' "$OUT/bench_$BENCH.log" | grep -v "ops n=[248] "
  fi
  tail -2 /tmp/lcpp.log 2>/dev/null
  ;;
final)
  if [ ! -f /tmp/models/qwen.gguf ] && [ -f /tmp/models/qwenpart09 ]; then
    cat /tmp/models/qwenpart* > /tmp/models/qwen.gguf && rm /tmp/models/qwenpart* && sha256sum /tmp/models/qwen.gguf
  fi
  if [ ! -f /tmp/models/smol.gguf ] && [ -f /tmp/models/smolpart01 ]; then
    cat /tmp/models/smolpart* > /tmp/models/smol.gguf && rm /tmp/models/smolpart* && sha256sum /tmp/models/smol.gguf
  fi
  M=/tmp/models/qwen.gguf
  # WAIT_S=N: first wait up to N s for the llama.cpp build (its 12 jobs would share the host)
  for _ in $(seq 1 $((${WAIT_S:-0} / 5))); do grep -q "rc=" /tmp/lcpp.log 2>/dev/null && break; sleep 5; done
  [ "${WAIT_S:-0}" = 0 ] || stamp "build: $(tail -1 /tmp/lcpp.log)"
  # MODELS: the joined files to measure (qwen, smol), each with bench decode and TRAFFIC
  for name in ${MODELS:-qwen}; do
    F=/tmp/models/$name.gguf
    [ -f $F ] || { echo "no model $name"; ls -l /tmp/models; continue; }
    timeout ${DECODE_S:-90} python3 -m echoline bench decode --backend cuda --model $F --json > "$OUT/decode_$name.json" 2> "$OUT/decode_$name.err"
    stamp "decode $name rc=$?"; tail -8 "$OUT/decode_$name.err"; tail -c 600 "$OUT/decode_$name.json"; echo
    for t in ${TRAFFIC:-copy edit}; do  # t: a traffic, or traffic:ENV=VALUE for an A/B arm
      tr=${t%%:*}; f=spec_${name}_${t//[:=]/_}; [ "$t" = "$tr" ] || export "${t#*:}"
      timeout ${SPEC_S:-100} python3 -m echoline bench spec --backend cuda --model $F --traffic $tr --rounds 3 --json > "$OUT/$f.json" 2> "$OUT/$f.err"
      stamp "spec $name $t rc=$?"; [ "$t" = "$tr" ] || unset "$(echo "${t#*:}" | cut -d= -f1)"
      python3 - "$OUT/$f.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
keep = ("plain_tok_s", "spec_tok_s", "ratio", "identical", "acceptance", "tokens_per_round",
        "round_split_ms", "verify_cost", "oracle_ratio", "limit_ratio", "lookups_ahead_share")
print(json.dumps({k: r.get(k) for k in keep}))
PY
    done
  done
  if [ "${E2E_S:-90}" != 0 ]; then  # E2E_S=0 / VS_S=0: skip that step
    ECHOLINE_CUDA_MODEL=$M timeout ${E2E_S:-90} python3 -m pytest -q -p no:cacheprovider tests/test_cuda_e2e.py > "$OUT/e2e.log" 2>&1
    stamp "e2e rc=$?"; grep -E "passed|failed|^E " "$OUT/e2e.log" | head
  fi
  tail -3 /tmp/lcpp.log
  EXE=/tmp/lcpp/llama.cpp/build/bin/llama-server
  if [ -x $EXE ] && [ "${VS_S:-200}" != 0 ]; then
    timeout ${VS_S:-200} python3 -m tools.versus_llamacpp --model $M --backend cuda --rounds 3 --traffic ${VS_TRAFFIC:-copy,edit,rewrite} \
      --llama-server $EXE --llama-args "-ngl 99" --json > "$OUT/versus.log" 2>&1
    stamp "versus rc=$?"; tail -8 "$OUT/versus.log"
  fi
  ;;
esac
stamp done
