#!/bin/bash
# Device driver for the streamed tensor-core products (kernels.cu mtq_body), steps in $STEPS
# (carry .whl and .mdl: the wheels, .mdl/qwen-tok.gguf, and .mdl/base/ the four files the
# comparison tree takes from before the change: kernels_cuda_kernels.cu, …_init__.py,
# engine_backends_cupy_backend.py, engine_backends_cuda_tuning.py):
#   probe : NVRTC builds; python3 -m tools.cuda.prod7b_probe (PROBE_ARGS); stops the call when
#           any 16-row result differs from its rows called alone
#   decode: a random Q4_K_M 7B file (synth_gguf); bench decode with the streamed kernels off
#           and on (ECHOLINE_CUDA_TENSOR_STREAM), ROUNDS times interleaved; exact_7b (EXACT_S)
#   small : bench_device on the Qwen 0.5B and 1.5B shapes, the tree before the change (/tmp/base)
#           and this one, interleaved
#   tests : the CUDA test files (TESTS)
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
source tools/cuda/device_common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
R=/tmp/r7b-q4_k_m.gguf
for step in ${STEPS:-probe decode}; do
case $step in
probe)
  for q in "" q4_k@b5 q6_k@b5 q4_k+q6_k@b5 $EXTRA_MODULES; do
    timeout 300 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1] or None)" "$q" 2>&1 | tail -3 &
  done
  wait; stamp "compiled"
  timeout ${PROBE_S:-300} python3 -m tools.cuda.prod7b_probe ${PROBE_ARGS} > "$OUT/probe.log" 2>&1
  stamp "probe rc=$?"; sed -n '/== prod7b table ==/,$p' "$OUT/probe.log" || tail -30 "$OUT/probe.log"
  grep -q "== prod7b table ==" "$OUT/probe.log" || { tail -30 "$OUT/probe.log"; exit 1; }
  grep -q "rows==1row False" "$OUT/probe.log" && { stamp "a row differs: stop"; exit 1; }
  ;;
decode)
  [ -f $R ] || timeout 300 python3 -m tools.cuda.synth_gguf random --mix q4_k_m --meta .mdl/qwen-tok.gguf $R
  stamp "file rc=$?"
  for r in $(seq 1 ${ROUNDS:-1}); do
    for s in 0 1; do
      ECHOLINE_CUDA_TENSOR_STREAM=$s timeout ${DECODE_S:-120} python3 -m echoline bench decode --backend cuda \
        --model $R --json > "$OUT/decode_s${s}_$r.json" 2> "$OUT/decode_s${s}_$r.err"
      stamp "decode stream=$s round $r rc=$?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: v for k, v in d.items() if not isinstance(v, (list, dict))})" "$OUT/decode_s${s}_$r.json" || tail -5 "$OUT/decode_s${s}_$r.err"
    done
  done
  if [ "${EXACT_S:-200}" != 0 ]; then
    timeout ${EXACT_S:-200} python3 -m tools.cuda.exact_7b $R --json > "$OUT/exact.json" 2> "$OUT/exact.err"
    stamp "exact rc=$?"; tail -c 1500 "$OUT/exact.json"; tail -4 "$OUT/exact.err"
  fi
  ;;
small)
  rm -rf /tmp/base && mkdir /tmp/base && cp -r echoline engine kernels tools pyproject.toml /tmp/base/
  for f in .mdl/base/*; do cp "$f" "/tmp/base/$(basename "$f" | sed 's#^kernels_cuda_#kernels/cuda/#; s#^engine_backends_#engine/backends/#')"; done
  for r in 1 2; do
    for tree in /tmp/base $PWD; do
      (cd $tree && PYTHONPATH=/tmp/site:$tree timeout ${SMALL_S:-150} python3 -m tools.cuda.bench_device --reps 30 --quick \
        --ks 1,16 --context 1024 --models ${SMALL_MODELS:-qwen2.5-0.5b,qwen2.5-1.5b} > "$OUT/small_$(basename $tree)_$r.log" 2>&1)
      stamp "small $tree round $r rc=$?"; sed -n '/== summary ==/,$p' "$OUT/small_$(basename $tree)_$r.log" | grep -i "tok/s\|x1\|ms" | head -8
    done
  done
  ;;
tests)
  timeout ${TEST_S:-400} python3 -m pytest -q -x ${TESTS:-tests/test_cuda_backend.py tests/test_cuda_tuning.py} > "$OUT/tests.log" 2>&1
  stamp "tests rc=$?"; tail -15 "$OUT/tests.log"
  ;;
esac
done
stamp done
