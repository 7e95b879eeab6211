#!/bin/bash
# Device-side driver (issue 21, the staged wide-weight tensor kernel, mtw_body): one call,
# steps in order of importance, each under its own timeout; full logs under $OUT.
#   1. NVRTC builds of every module the steps use, in parallel (CuPy caches them on disk)
#   2. python3 -m tools.cuda.wide_probe: the heads alone on every kernel family
#   3. python3 -m tools.cuda.bench_device --reps 30 --quick $BENCH_FLAGS (default --tc) on
#      $BENCH_MODELS (default qwen2.5-0.5b)
#   4. the wide-kernel tests (tests/test_cuda_backend.py -k wide, tests/test_cuda_tuning.py)
#   5. the same bench for $SMOL_MODELS (default smollm2-135m; SMOL_S=0 skips it)
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# the modules the default settings load (tensor_min_blocks 5: "@b5", attn_min_blocks 7: "@a7")
for q in ${MODULES:-@a7 q8_0@b5 q6_k@b5 q5_0@b5 q4_1@b5 q4_k@b5 q5_0+q8_0@b5 q4_k+q6_k@b5 q4_0@b5 q5_1@b5 q5_k@b5 q4_1+q8_0@b5}; do
  timeout 200 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1] or None)" "$q" 2>&1 | tail -3 &
done
timeout 200 python3 -c "from echoline.kernels.cuda import load_module; load_module(None)" &
wait
stamp compiled
BENCH="python3 -m tools.cuda.bench_device --reps 30 --quick ${BENCH_FLAGS:---tc} --ks 1,8,16 --context 1024"
timeout ${PROBE_S:-90} python3 -m tools.cuda.wide_probe > "$OUT/probe.log" 2>&1
rc=$?; stamp "probe rc=$rc"
sed -n '/== wide probe ==/,$p' "$OUT/probe.log"; [ $rc = 0 ] || tail -25 "$OUT/probe.log"
timeout ${QWEN_S:-110} $BENCH --models ${BENCH_MODELS:-qwen2.5-0.5b} > "$OUT/bench_qwen.log" 2>&1
stamp "bench qwen rc=$?"; sed -n '/== summary ==/,$p' "$OUT/bench_qwen.log" | grep -v "ops n=[248] "
timeout ${TEST_S:-120} python3 -m pytest -q -p no:cacheprovider --durations=5 tests/test_cuda_backend.py tests/test_cuda_tuning.py \
  -k "wide or environment or attributes" > "$OUT/tests.log" 2>&1
stamp "tests rc=$?"; grep -E "passed|failed|^E |Error|s call" "$OUT/tests.log" | head -30
if [ "${SMOL_S:-70}" != 0 ]; then
  timeout ${SMOL_S:-70} $BENCH --models ${SMOL_MODELS:-smollm2-135m} > "$OUT/bench_smol.log" 2>&1
  stamp "bench smol rc=$?"; sed -n '/== summary ==/,$p' "$OUT/bench_smol.log" | grep -v "ops n=[248] "
fi
