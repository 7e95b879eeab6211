#!/bin/bash
# Device-side driver for the 7B-shaped files (issue 49, part 5), one step per call on a warm
# machine (tools/cuda/synth_gguf.py says what the files are):
#   first : wheels (.whl); NVRTC builds of the K-mix modules beside the three random files
#           (.mdl/qwen-tok.gguf: the tokenizer keys); then llama.cpp's CUDA build in the background
#           (.lcpp/lcpp.tgz, setsid); echoline bench decode on each random file
#   llama : llama-bench tg128 on each random file (waits up to WAIT_S for the build); then
#           python3 -m tools.cuda.exact_7b on the Q4_K_M one (EXACT_S, 0: skip)
#   part  : copy the carried parts (.mdl/e05partNN: the 0.5B less its untied head); the first
#           call that carries .lcpp also starts llama-server's CUDA build (detached), so it
#           builds while the parts travel
#   check : the GPU tests picked by TEST_K (default: the mtv/mtb/mtbw row kernels, the row-pass
#           builds and the signed codes; Q8_0, Q4_K, IQ4_XS) within TEST_S seconds, while the
#           build finishes
#   final : join the parts; write the embedded 7B file (Q8_0); versus_llamacpp on it (VS_S s a
#           run, 0: none; WAIT_S: wait that long for the build first), once per entry of
#           VS_ENVS (space-separated; each "default" or VAR=V[,VAR=V...], e.g.
#           "default ECHOLINE_CUDA_INT8_BATCH_MIN_ROWS=0"), ROUNDS rounds of VS_TRAFFIC; then
#           python3 -m tools.cuda.exact_7b on it (EXACT_S s, 0: skip), a still-running build
#           reniced to 19 first, so VS_S=0 EXACT_S=150 measures echoline alone while it builds
# Every step first copies whatever .mdl/* files came with the call to /tmp/models.
export PYTHONUNBUFFERED=1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
source tools/cuda/device_common.sh  # stamp, start_llamacpp_build, build_modules
mkdir -p /tmp/models
for p in .mdl/*; do [ -f "$p" ] && cp "$p" /tmp/models/ && stamp "have $(basename "$p")"; done
R=/tmp/models/r7b
MIXES="${MIXES:-q4_k_m q5_k_m q8_0}"
LB=/tmp/lcpp/llama.cpp/build/bin
case "$1" in
first)
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  for q in "" q4_k q4_k@b5 q5_k q5_k@b5 q6_k q6_k@b5 q8_0 q8_0@b5 q4_k+q6_k q4_k+q6_k@b5 q5_k+q6_k q5_k+q6_k@b5; do
    timeout 240 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1] or None)" "$q" 2>&1 | tail -3 &
  done
  for m in $MIXES; do
    timeout 240 python3 -m tools.cuda.synth_gguf random --mix $m --meta /tmp/models/qwen-tok.gguf $R-$m.gguf &
  done
  wait; stamp "compiled and written"; ls -l /tmp/models; df -h /tmp | tail -1
  mkdir -p /tmp/lcpp && tar xzf .lcpp/lcpp.tgz -C /tmp/lcpp
  setsid nohup bash -c 'cd /tmp/lcpp/llama.cpp && cmake -S . -B build -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_NUMBER=1 -DLLAMA_BUILD_COMMIT=0c1e570 > /tmp/lcpp.log 2>&1 \
    && cmake --build build -j 14 --target llama-server llama-bench llama-quantize >> /tmp/lcpp.log 2>&1; echo "rc=$?" >> /tmp/lcpp.log' \
    > /dev/null 2>&1 < /dev/null &
  stamp "llama.cpp build started"
  for m in $MIXES; do
    timeout ${DECODE_S:-110} python3 -m echoline bench decode --backend cuda --model $R-$m.gguf --json > "$OUT/decode_r7b_$m.json" 2> "$OUT/decode_r7b_$m.err"
    stamp "decode $m rc=$?"; tail -14 "$OUT/decode_r7b_$m.err"
  done
  tail -3 /tmp/lcpp.log
  ;;
llama)
  for _ in $(seq 1 $((${WAIT_S:-200} / 5))); do grep -q "rc=" /tmp/lcpp.log 2>/dev/null && break; sleep 5; done
  stamp "build: $(tail -1 /tmp/lcpp.log)"
  for m in $MIXES; do
    timeout 120 $LB/llama-bench -m $R-$m.gguf -ngl 99 -p 0 -n 128 -r 5 -o json > "$OUT/llama_bench_r7b_$m.json" 2> "$OUT/llama_bench_r7b_$m.err"
    stamp "llama-bench $m rc=$?"; python3 -c "import json,sys; [print(r['model_type'], r['n_prompt'], r['n_gen'], round(r['avg_ts'],1), round(r['stddev_ts'],1)) for r in json.load(open(sys.argv[1]))]" "$OUT/llama_bench_r7b_$m.json" || tail -5 "$OUT/llama_bench_r7b_$m.err"
  done
  if [ "${EXACT_S:-150}" != 0 ]; then
    timeout ${EXACT_S:-150} python3 -m tools.cuda.exact_7b $R-q4_k_m.gguf --json > "$OUT/exact_r7b_q4_k_m.json" 2> "$OUT/exact_r7b_q4_k_m.err"
    stamp "exact rc=$?"; tail -8 "$OUT/exact_r7b_q4_k_m.err"
  fi
  ;;
part)
  if [ ! -f /tmp/lcpp.log ] && { [ -f .lcpp/lcpp.tgz ] || [ -f .lcpp/llama-server-sm90.tar.xz ]; }; then
    start_llamacpp_build 14
  fi
  ls -l /tmp/models | tail -8; tail -2 /tmp/lcpp.log
  ;;
check)
  build_modules "" q8_0 q8_0@b5 q8_0@i1@b5 q8_0@i1@b5@w1@s1 q8_0@i1@b5@s1 q4_k q4_k@b5 q4_k@i1@b5 \
    q4_k@i1@b5@w1@s1 q4_k@i1@b5@s1 iq4_xs iq4_xs@b5 iq4_xs@i1@b5 iq4_xs@i1@b5@s1  # @s1: the default
  timeout ${TEST_S:-240} python3 -m pytest -q -p no:cacheprovider --maxfail=5 \
    -k "${TEST_K:-(row_kernels or row_pass or signed) and (Q8_0 or Q4_K or IQ4_XS)}" tests/test_cuda_backend.py 2>&1 \
    | tee "$OUT/tests_check.log" | tail -15
  stamp "tests rc=${PIPESTATUS[0]}"; tail -2 /tmp/lcpp.log
  ;;
final)
  if [ ! -f /tmp/models/e05.gguf ]; then
    cat /tmp/models/e05part0* > /tmp/models/e05.gguf && sha256sum /tmp/models/e05.gguf
  fi
  E=/tmp/models/e7b-q8_0.gguf
  [ -f $E ] || timeout 300 python3 -m tools.cuda.synth_gguf embed --src /tmp/models/e05.gguf $E
  stamp "embedded rc=$?"; ls -l $E
  if [ "${VS_S:-330}" != 0 ]; then
    for _ in $(seq 1 $((${WAIT_S:-0} / 5))); do grep -q "rc=" /tmp/lcpp.log 2>/dev/null && break; sleep 5; done
    stamp "build: $(tail -1 /tmp/lcpp.log)"
    i=0
    for envs in ${VS_ENVS:-default}; do  # each: "default" or VAR=V[,VAR=V...], one run each
      i=$((i + 1)); env_args=(); [ "$envs" = default ] || IFS=, read -ra env_args <<< "$envs"
      echo "== run $i: $envs" | tee -a "$OUT/versus_e7b.log"
      env "${env_args[@]}" timeout ${VS_S:-330} python3 -m tools.versus_llamacpp --model $E --backend cuda \
        --rounds ${ROUNDS:-3} --traffic ${VS_TRAFFIC:-copy,edit} --llama-server $LB/llama-server \
        --llama-args "-ngl 99" --json > "$OUT/versus_e7b_$i.log" 2>&1
      stamp "versus $i rc=$?"; tail -8 "$OUT/versus_e7b_$i.log" | tee -a "$OUT/versus_e7b.log"
    done
  fi
  if [ "${EXACT_S:-0}" != 0 ]; then
    quiet_build  # exact_7b may run while llama.cpp still builds (VS_S=0)
    timeout $EXACT_S python3 -m tools.cuda.exact_7b $E --json > "$OUT/exact_e7b.json" 2> "$OUT/exact_e7b.err"
    stamp "exact rc=$?"; tail -8 "$OUT/exact_e7b.err"
  fi
  ;;
esac
stamp done
