#!/bin/bash
# Device-side A/B of the CUDA backend's speed knobs (same bits) on the random 7B-shaped
# Q4_K_M file (issue 49, part 5): python3 -m echoline bench decode under each ECHOLINE_CUDA_*
# setting of ARMS, default first and last; prints plain tok/s and the 8 / 16-row costs.
export PYTHONUNBUFFERED=1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/models; cp .mdl/qwen-tok.gguf /tmp/models/ 2>/dev/null
F=/tmp/models/r7b-q4_k_m.gguf
[ -f $F ] || timeout 120 python3 -m tools.cuda.synth_gguf random --mix q4_k_m --meta /tmp/models/qwen-tok.gguf $F &
for q in "" q4_k q4_k@b5 q6_k q6_k@b5 q4_k+q6_k q4_k+q6_k@b5 q4_k@u2@b5 q6_k@u2@b5 q4_k+q6_k@u2@b5 \
         q4_k@b3 q6_k@b3 q4_k+q6_k@b3 q4_k@b8 q6_k@b8 q4_k+q6_k@b8; do
  timeout 240 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1] or None)" "$q" 2>&1 | tail -2 &
done
wait; echo "ready at ${SECONDS}s"
ARMS=${ARMS:-"default ECHOLINE_CUDA_TENSOR_UNITS=2 ECHOLINE_CUDA_TENSOR_MIN_BLOCKS=3 ECHOLINE_CUDA_TENSOR_MIN_BLOCKS=8 ECHOLINE_CUDA_TENSOR_SPLIT_UNITS=2 ECHOLINE_CUDA_TENSOR_SPLIT_WARPS=2 ECHOLINE_CUDA_TENSOR_MIN_UNITS_PER_WARP=2 ECHOLINE_CUDA_TENSOR_SPLIT_CLUSTER=0 ECHOLINE_CUDA_TENSOR_WIDE_WARPS=4 ECHOLINE_CUDA_TENSOR_WIDE_ROW_GROUPS=2 default"}
i=0
for arm in $ARMS; do
  i=$((i + 1)); envs=(); [ "$arm" = default ] || envs=("$arm")
  env "${envs[@]}" timeout 90 python3 -m echoline bench decode --backend cuda --model $F --json > /tmp/ab_$i.json 2> /tmp/ab_$i.err
  python3 - "$arm" /tmp/ab_$i.json <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[2]))
    print(f"{sys.argv[1]:<46} plain {r['plain_tok_s']:7.1f} tok/s  1 row {r['row_ms']['1']:6.3f} ms  8 x{r['row_cost']['8']:.3f}  16 x{r['row_cost']['16']:.3f}")
except Exception as e:
    print(sys.argv[1], "failed", e)
PY
done
echo "done at ${SECONDS}s"
