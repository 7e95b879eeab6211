#!/bin/bash
# Device-side driver for the integer form of the tensor-core products (kernels.cu MT_INT8,
# backend setting tensor_int8), two calls on one warm machine:
#   test  : wheels; llama.cpp's CUDA build (llama-bench, llama-server) and the 7B-shaped
#           Q4_K_M random file (tools/cuda/synth_gguf.py) in the background, detached; NVRTC
#           builds of every tensor type's modules in both forms, in parallel; then the
#           tensor-core tests of tests/test_cuda_backend.py, each in the f16 and the int8 form
#   bench : echoline bench decode on that file, interleaved: f16, int8 (x quantized by every
#           column tile), int8 with xprep8 (x quantized once per product), ROUNDS times;
#           llama-bench tg128 on the same file; tools.cuda.exact_7b in the int8 form
# Carry: .whl, .lcpp, .mdl/qwen-tok.gguf (the tokenizer keys for the synthetic file).
export PYTHONUNBUFFERED=1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
source tools/cuda/device_common.sh
F=/tmp/models/r7b-q4_k_m.gguf
LB=/tmp/lcpp/llama.cpp/build/bin
start_background() {
  mkdir -p /tmp/models /tmp/lcpp && cp .mdl/qwen-tok.gguf /tmp/models/
  tar xzf .lcpp/lcpp.tgz -C /tmp/lcpp
  setsid nohup bash -c 'cd /tmp/lcpp/llama.cpp && cmake -S . -B build -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_NUMBER=1 -DLLAMA_BUILD_COMMIT=0c1e570 > /tmp/lcpp.log 2>&1 \
    && cmake --build build -j 6 --target llama-bench llama-server >> /tmp/lcpp.log 2>&1; echo "rc=$?" >> /tmp/lcpp.log' \
    > /dev/null 2>&1 < /dev/null &
  setsid nohup bash -c "PYTHONPATH=$PYTHONPATH python3 -m tools.cuda.synth_gguf random --mix q4_k_m \
    --meta /tmp/models/qwen-tok.gguf $F > /tmp/synth.log 2>&1; echo rc=\$? >> /tmp/synth.log" \
    > /dev/null 2>&1 < /dev/null &
  stamp "llama.cpp build and the synthetic file started"
}

build_modules() {  # NVRTC builds in parallel (CuPy's disk cache keeps them for the tests)
  for q in "$@"; do
    timeout 300 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1] or None)" "$q" > "/tmp/build_$q.log" 2>&1 &
    while [ "$(jobs -rp | wc -l)" -ge 10 ]; do sleep 1; done
  done
  wait; stamp "modules built"; grep -h -i -A5 error /tmp/build_*.log | head -40
}

decode() {  # one bench decode of the file in the form $1
  case $1 in
    f16) env="ECHOLINE_CUDA_INT8=0" ;;
    int8) env="ECHOLINE_CUDA_INT8=1 ECHOLINE_CUDA_XPREP_MIN_ROWS=0" ;;
    int8x) env="ECHOLINE_CUDA_INT8=1 ECHOLINE_CUDA_XPREP_MIN_ROWS=1" ;;
  esac
  env $env timeout ${DECODE_S:-100} python3 -m echoline bench decode --backend cuda --model $F --json \
    > "$OUT/decode_$1_$2.json" 2> "/tmp/decode_$1_$2.err"
  stamp "decode $1 round $2 rc=$?"; tail -6 "/tmp/decode_$1_$2.err"
}

case "$1" in
quick)  # one call: the 7B's types tested in both forms, then decode f16 / int8 / int8 + xprep8
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  start_background
  build_modules "" q4_k q4_k@b5 q4_k@i1@b5 q6_k q6_k@b5 q6_k@i1@b5 q4_k+q6_k q4_k+q6_k@b5 q4_k+q6_k@i1@b5
  set -o pipefail
  timeout ${TEST_S:-150} python3 -m pytest -q -p no:cacheprovider --maxfail=5 \
    -k "(tensor or xprep) and (Q4_K or Q6_K or model or nan or two_type)" tests/test_cuda_backend.py 2>&1 \
    | tee $OUT/tests_quick.log | tail -25
  stamp "tests rc=$?"
  for _ in $(seq 1 60); do grep -q "rc=" /tmp/synth.log 2>/dev/null && break; sleep 2; done
  stamp "synthetic file: $(tail -1 /tmp/synth.log)"
  for form in f16 int8 int8x; do decode $form 1; done
  tail -1 /tmp/lcpp.log
  ;;
test)
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  mkdir -p /tmp/models /tmp/lcpp && cp .mdl/qwen-tok.gguf /tmp/models/
  tar xzf .lcpp/lcpp.tgz -C /tmp/lcpp
  setsid nohup bash -c 'cd /tmp/lcpp/llama.cpp && cmake -S . -B build -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_NUMBER=1 -DLLAMA_BUILD_COMMIT=0c1e570 > /tmp/lcpp.log 2>&1 \
    && cmake --build build -j 6 --target llama-bench llama-server >> /tmp/lcpp.log 2>&1; echo "rc=$?" >> /tmp/lcpp.log' \
    > /dev/null 2>&1 < /dev/null &
  setsid nohup bash -c "PYTHONPATH=$PYTHONPATH python3 -m tools.cuda.synth_gguf random --mix q4_k_m \
    --meta /tmp/models/qwen-tok.gguf $F > /tmp/synth.log 2>&1; echo rc=\$? >> /tmp/synth.log" \
    > /dev/null 2>&1 < /dev/null &
  stamp "llama.cpp build and the synthetic file started"
  mods=""
  for q in q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k iq4_nl iq4_xs; do mods="$mods $q $q@b5 $q@i1@b5"; done
  for q in "" $mods q4_k+q6_k q4_k+q6_k@b5 q4_k+q6_k@i1@b5; do
    timeout 300 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1] or None)" "$q" > /tmp/build_$q.log 2>&1 &
    while [ "$(jobs -rp | wc -l)" -ge 10 ]; do sleep 1; done
  done
  wait; stamp "modules built"; grep -l -i error /tmp/build_*.log | head; grep -h -i -A5 error /tmp/build_*.log | head -40
  set -o pipefail
  # the 7B's types first (Q4_K, Q6_K, whole models), then every other tensor test while time is left
  first="(tensor or xprep) and (Q4_K or Q6_K or model or nan or two_type)"
  timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider --maxfail=5 -k "$first" \
    tests/test_cuda_backend.py 2>&1 | tee $OUT/tests_first.log | tail -25
  stamp "first tests rc=$?"
  left=$((${CALL_S:-540} - $(date +%s) + t0))
  [ $left -gt 30 ] && timeout $left python3 -m pytest -q -p no:cacheprovider --maxfail=5 \
    -k "(tensor or xprep) and not ($first)" tests/test_cuda_backend.py 2>&1 | tee $OUT/tests_rest.log | tail -25
  stamp "other tests rc=$?"; tail -2 /tmp/synth.log; tail -2 /tmp/lcpp.log
  ;;
bench)
  for _ in $(seq 1 60); do grep -q "rc=" /tmp/synth.log 2>/dev/null && break; sleep 2; done
  stamp "synthetic file: $(tail -1 /tmp/synth.log)"; ls -l $F
  for r in $(seq 1 ${ROUNDS:-2}); do
    for form in f16 int8 int8x; do
      case $form in
        f16) env="ECHOLINE_CUDA_INT8=0" ;;
        int8) env="ECHOLINE_CUDA_INT8=1 ECHOLINE_CUDA_XPREP_MIN_ROWS=0" ;;
        int8x) env="ECHOLINE_CUDA_INT8=1 ECHOLINE_CUDA_XPREP_MIN_ROWS=1" ;;
      esac
      env $env timeout ${DECODE_S:-120} python3 -m echoline bench decode --backend cuda --model $F --json \
        > "$OUT/decode_${form}_$r.json" 2> "/tmp/decode_${form}_$r.err"
      stamp "decode $form round $r rc=$?"; tail -6 "/tmp/decode_${form}_$r.err"
    done
  done
  for _ in $(seq 1 $((${WAIT_S:-120} / 5))); do grep -q "rc=" /tmp/lcpp.log 2>/dev/null && break; sleep 5; done
  stamp "build: $(tail -1 /tmp/lcpp.log)"
  timeout 120 $LB/llama-bench -m $F -ngl 99 -p 0 -n 128 -r 5 -o json > "$OUT/llama_bench.json" 2> /tmp/llama_bench.err
  stamp "llama-bench rc=$?"; python3 -c "import json,sys; [print(r['n_gen'], round(r['avg_ts'],1), round(r['stddev_ts'],1)) for r in json.load(open(sys.argv[1]))]" "$OUT/llama_bench.json" || tail -5 /tmp/llama_bench.err
  if [ "${EXACT_S:-150}" != 0 ]; then
    ECHOLINE_CUDA_INT8=1 timeout ${EXACT_S:-150} python3 -m tools.cuda.exact_7b $F --json > "$OUT/exact_int8.json" 2> /tmp/exact.err
    stamp "exact int8 rc=$?"; tail -8 /tmp/exact.err
  fi
  ;;
esac
stamp done
