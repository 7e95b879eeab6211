#!/bin/bash
# Device-side driver (GPU machine): kernel tests + bench, then the real-model end-to-end
# checks once both parts of the model file have arrived (they travel in separate calls,
# each under the 64 MiB tree limit, as .mdl/part00 and .mdl/part01).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
M=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p /tmp/models
for p in .mdl/part0*; do [ -f "$p" ] && cp "$p" /tmp/models/; done
ls -l /tmp/models >&2  # stderr: stdout of "modules" is the module list
if [ "$1" = kernels ]; then
  timeout 330 python3 -m pytest -q -x -p no:cacheprovider --durations=8 tests/test_cuda_backend.py 2>&1 | tee "$OUT/tests.log" | grep -E "passed|failed|^E |Error|s call" | head -30
  timeout 240 python3 -m tools.cuda.bench_device --reps 30 > "$OUT/bench.log" 2>&1
  sed -n '/== summary ==/,$p' "$OUT/bench.log"
fi
if [ "$1" = tc ]; then  # round 6: tensor-core products (kernel tests, then the A/B bench)
  timeout 300 python3 -m pytest -q -x -p no:cacheprovider --durations=6 tests/test_cuda_backend.py -k "${TC_TESTS:-tensor}" 2>&1 | tee "$OUT/tc_tests.log" | grep -E "passed|failed|^E |Error|s call" | head -40
  [ -n "$TC_BENCH" ] && timeout ${TC_BENCH} python3 -m tools.cuda.bench_device --reps 30 --tc --quick > "$OUT/bench.log" 2>&1
  [ -n "$TC_BENCH" ] && sed -n '/== summary ==/,$p' "$OUT/bench.log"
fi
if [ "$1" = attn ]; then  # session 5: tensor-core attention (its tests, the A/B bench, then every GPU test)
  timeout 200 python3 -m pytest -q -p no:cacheprovider --durations=5 tests/test_cuda_backend.py -k "attention" 2>&1 | tee "$OUT/attn_tests.log" | grep -E "passed|failed|^E |Error|s call" | head -40
  timeout ${ATTN_BENCH:-240} python3 -m tools.cuda.bench_device --reps 30 --attn --quick --ks 1,2,4,8,12,16,17 > "$OUT/bench.log" 2>&1
  sed -n '/== summary ==/,$p' "$OUT/bench.log"
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py -k "not attention" 2>&1 | tee "$OUT/tests.log" | grep -E "passed|failed|^E |Error" | head -30
fi
if [ "$1" = rows ]; then  # session 5: 9-17-row tensor-core launches split over blocks
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda_backend.py -k "tensor or model or graph" 2>&1 | tee "$OUT/tc_tests.log" | grep -E "passed|failed|^E |Error" | head -30
  timeout 200 python3 -m tools.cuda.bench_device --reps 30 --rowsplit --quick --ks 1,8,9,12,16,17 > "$OUT/bench.log" 2>&1
  sed -n '/== summary ==/,$p' "$OUT/bench.log"
fi
if [ "$1" = gap ]; then  # session 6: GPU idle time per decode step, then the row-split tests
  timeout 200 python3 -m tools.cuda.bench_device --reps 30 --gap --quick --ks 1 ${GAP_ARGS} > "$OUT/bench.log" 2>&1
  sed -n '/== summary ==/,$p' "$OUT/bench.log"; tail -3 "$OUT/bench.log"
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py -k "row_split or pair" 2>&1 | tee "$OUT/tests.log" | grep -E "passed|failed|^E |Error" | head -30
fi
if [ "$1" = units ]; then  # session 6: tensor-product units in flight (bits, then the A/B)
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py -k "units or row_split" 2>&1 | tee "$OUT/tests.log" | grep -E "passed|failed|^E |Error" | head -30
  timeout ${UNITS_BENCH:-300} python3 -m tools.cuda.bench_device --reps 30 --units --quick --ks ${UNITS_KS:-1,8,16} ${GAP_ARGS} > "$OUT/bench.log" 2>&1
  sed -n '/== summary ==/,$p' "$OUT/bench.log"; tail -3 "$OUT/bench.log"
fi
if [ "$1" = ab ]; then  # session 15: an interleaved policy A/B of bench_device (AB_FLAGS, e.g.
  # --minblocks, --attnblocks, --xprep, --narrow): the modules it loads built in parallel first
  # (AB_MODULES), then the tests named by AB_TESTS (pytest -k), then the bench on AB_MODELS
  python3 -c "from echoline.kernels.cuda import load_module; load_module(None)" &
  for q in ${AB_MODULES:-@a7 q8_0@b5 q5_0@b5 q4_k@b5 q6_k@b5 q4_1@b5 q5_0+q8_0@b5 q4_k+q6_k@b5 q4_1+q8_0@b5}; do
    timeout 250 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1])" "$q" 2>&1 | tail -5 &
  done
  wait; echo "compiled at $SECONDS s"
  if [ -n "$AB_TESTS" ]; then
    timeout ${AB_TESTS_S:-200} python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda_backend.py tests/test_cuda_tuning.py -k "$AB_TESTS" 2>&1 | tee "$OUT/tests.log" | grep -E "passed|failed|^E |Error" | head -20
  fi
  timeout ${AB_BENCH_S:-300} python3 -m tools.cuda.bench_device --reps 30 ${AB_FLAGS:---minblocks} --quick --ks 1,8,16 --context 1024 --models ${AB_MODELS:-qwen2.5-0.5b} > "$OUT/bench.log" 2>&1
  echo "bench rc=$? at $SECONDS s"; sed -n '/== summary ==/,$p' "$OUT/bench.log" | grep -v "ops n=[248] "; tail -3 "$OUT/bench.log"
fi
SUITE_MODS="@a7 @a8 f32 f16 bf16 iq4_nl@b5 iq4_xs@b5 q4_0@b5 q4_1@b5 q5_0@b5 q5_1@b5 q8_0@b5 q4_k@b5 q5_k@b5 q6_k@b5 \
  q5_0+q8_0@b5 q4_k+q6_k@b5 q4_1+q8_0@b5 q4_k+q8_0@b5 q4_k@u2@b5 q4_k+q6_k@u2@b5 q5_0@b6 q4_k@b6 \
  q4_k+q6_k@b6 q5_0 q4_k q4_k+q6_k q4_1 q4_1+q8_0 q8_0"
if [ "$1" = modules ]; then echo $SUITE_MODS; exit 0; fi  # the list, for split_run.sh first
if [ "$1" = suite ]; then  # every CUDA test, the modules they load compiled in parallel first
  mods="${SUITE_MODULES:-$SUITE_MODS}"
  for q in $mods; do
    timeout 300 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1] or None)" "$q" 2>&1 | tail -5 &
  done
  timeout 300 python3 -c "from echoline.kernels.cuda import load_module; load_module(None)" &
  wait; echo "compiled at $SECONDS s"
  timeout ${SUITE_S:-400} python3 -m pytest -q -p no:cacheprovider --durations=5 tests/test_cuda_backend.py tests/test_cuda_tuning.py ${SUITE_K:+-k "$SUITE_K"} > "$OUT/tests.log" 2>&1
  echo "tests rc=$? at $SECONDS s"; grep -E "passed|failed|^E |Error|s call|^FAILED" "$OUT/tests.log" | head -40
fi
if [ -f /tmp/models/part00 ] && [ -f /tmp/models/part01 ]; then
  cat /tmp/models/part00 /tmp/models/part01 > $M && sha256sum $M
  export ECHOLINE_CUDA_MODEL=$M
  cli="python3 -m echoline"
  if [ "$1" != spec ]; then
  timeout 120 $cli doctor --backend cuda --model $M --json > "$OUT/doctor.json" 2> "$OUT/doctor.err"; echo "doctor rc=$?"; tail -c 1500 "$OUT/doctor.json"
  fi
  timeout 150 $cli bench decode --backend cuda --model $M --json > "$OUT/decode.json" 2> "$OUT/decode.err"; echo "decode rc=$?"; cat "$OUT/decode.err" | tail -12; tail -c 800 "$OUT/decode.json"
  timeout 200 $cli bench spec --backend cuda --model $M --traffic copy --json > "$OUT/spec.json" 2> "$OUT/spec.err"; echo "spec rc=$?"; tail -15 "$OUT/spec.err"; tail -c 1500 "$OUT/spec.json"
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_e2e.py 2>&1 | tee "$OUT/e2e.log" | grep -E "passed|failed|^E |Error|s call" | head -30
  if [ "$1" = real ]; then  # the same commands with the other attention kernel, right after
    alt=$([ "${ECHOLINE_CUDA_TENSOR_ATTENTION:-0}" = 1 ] && echo 0 || echo 1)
    ECHOLINE_CUDA_TENSOR_ATTENTION=$alt timeout 100 $cli bench decode --backend cuda --model $M --json > "$OUT/decode_alt.json" 2>/dev/null; echo "decode (tensor_attention=$alt) rc=$?"; tail -c 400 "$OUT/decode_alt.json"
    ECHOLINE_CUDA_TENSOR_ATTENTION=$alt timeout 150 $cli bench spec --backend cuda --model $M --traffic copy --json > "$OUT/spec_alt.json" 2>/dev/null; echo "spec copy (tensor_attention=$alt) rc=$?"; tail -c 700 "$OUT/spec_alt.json"
  fi
  if [ "$1" = spec ] || [ "$1" = real ]; then
    timeout 150 $cli bench spec --backend cuda --model $M --traffic edit --json > "$OUT/spec_edit.json" 2> "$OUT/spec_edit.err"; echo "spec edit rc=$?"; tail -6 "$OUT/spec_edit.err"; tail -c 700 "$OUT/spec_edit.json"
  fi
fi
