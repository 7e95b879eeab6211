#!/bin/bash
# Device-side driver for the integer form of the tensor-core products (kernels.cu MT_INT8,
# backend settings tensor_int8 / tensor_int8_min_dim), steps on one warm machine:
#   quick : what one call holds: the 7B's types' tests in both forms, then decode in each form
#   test  : every tensor-core test of tests/test_cuda_backend.py, each in the f16 and int8 form
#   bench : echoline bench decode on the 7B-shaped file, interleaved: f16, int8 (x quantized by
#           every column tile), int8 with xprep8 (x quantized once per product), ROUNDS times;
#           llama-bench tg128 on the same file; tools.cuda.exact_7b (the default: int8 here)
#   mtv   : the integer form's few-row CUDA-core products (kernels.cu mtv): their tests, then
#           tools.cuda.exact_7b (one row at a time now runs them), then bench decode with them
#           off (ECHOLINE_CUDA_INT8_MV_ROWS=0), at the default (one row) and up to 4 rows,
#           ROUNDS (default 1) interleaved rounds (MTV_FORMS: other forms)
#   spec  : draft length on the same file: tools.cuda.exact_7b with the default (63 drafts a
#           round on CUDA) and with ECHOLINE_MAX_DRAFT=15 (the old cap), then versus_llamacpp
#           (VS_TRAFFIC, default edit; llama-server plain and ngram-mod) on it, within the call
#   nt8   : launches past 16 rows: the register bound of their kernels (tensor_min_blocks_rows,
#           modules "@rN") and eight 8-row tiles per pass past 32 rows (tensor_max_row_tiles,
#           modules "@t8"): the tests that compare them (Q4_K, Q6_K, Q8_0, both forms), then
#           tools.cuda.prod7b_probe at 16-64 rows under each; also the Q8_0 mtv tests (its
#           one-unit load of 17 aligned words)
#   nt8bench: bench decode (its verify rows 1-64) under each, ROUNDS (default 2) interleaved
#           rounds, then tools.cuda.exact_7b by default and with the bound EXACT_MINB (3)
#   batch : the staged many-row products (kernels.cu mtb, tensor_int8_batch_min_rows): their
#           tests on every type, then tools.cuda.prod7b_probe (Q8_0 and Q4_K_M mixes) with them
#           off and from 17 rows, at 1-64 rows
#   batchbench: bench decode (verify rows 1-64) with them off and from 17 rows, ROUNDS
#           (default 1) interleaved rounds, then tools.cuda.exact_7b with them on
#   batchw: the staged kernels of 64 weight rows a block (kernels.cu mtbw, modules "@w1",
#           tensor_int8_batch_weight_rows 64) and the signed-byte codes as s8 (MT_SIGNED,
#           "@s1", tensor_int8_signed_codes): their tests (Q8_0, Q4_K, Q6_K, IQ4_NL, IQ4_XS),
#           tools.cuda.prod7b_probe on the Q8_0 mix (batch17, batch17w, batch17s, batch17ws;
#           1, 32, 64 rows); it also writes a random Q8_0 7B file in the background
#   batchwbench: bench decode in each of those four on that file, then tools.cuda.exact_7b on
#           it with both
#   rows  : where a verify round's rows go: tools.cuda.prod7b_probe (each product of the 7B's
#           shapes, eager) and tools.cuda.attn_probe --time (qwen7b, in graphs) at 1-64 rows
# The first step on a machine also starts, detached, llama.cpp's CUDA build (llama-bench,
# llama-server) and the 7B-shaped Q4_K_M random file (tools/cuda/synth_gguf.py).
# Carry: .whl, .lcpp, .mdl/qwen-tok.gguf (the tokenizer keys for the synthetic file).
export PYTHONUNBUFFERED=1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
source tools/cuda/device_common.sh
F=/tmp/models/r7b-q4_k_m.gguf
LB=/tmp/lcpp/llama.cpp/build/bin

start_background() {
  [ -f /tmp/synth.log ] && return
  mkdir -p /tmp/models /tmp/lcpp && cp .mdl/qwen-tok.gguf /tmp/models/
  # not when run_7b.sh's parts started one already; the prebuilt one has no llama-bench
  [ -f /tmp/lcpp.log ] || start_llamacpp_build 12 "llama-bench llama-server"
  setsid nohup bash -c "PYTHONPATH=$PYTHONPATH python3 -m tools.cuda.synth_gguf random --mix q4_k_m \
    --meta /tmp/models/qwen-tok.gguf $F > /tmp/synth.log 2>&1; echo rc=\$? >> /tmp/synth.log" \
    > /dev/null 2>&1 < /dev/null &
  stamp "llama.cpp build and the synthetic file started"
}

build_7b_modules() {  # the 7B-shaped Q4_K_M file's types, in each form
  build_modules "" q4_k q4_k@b5 q4_k@i1@b5 q6_k q6_k@b5 q6_k@i1@b5 q4_k+q6_k q4_k+q6_k@b5 q4_k+q6_k@i1@b5
}

tensor_tests() {  # types ($1) built in the forms $5 ("-": the bare build; default: all three),
  # then the tests picked by $2 in $3 s, log $4
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  start_background
  local mods=""
  for q in $1 q4_k+q6_k; do for f in ${5:-- @b5 @i1@b5}; do mods="$mods $q${f#-}"; done; done
  build_modules "" $mods
  timeout "$3" python3 -m pytest -q -p no:cacheprovider --maxfail=5 -k "$2" tests/test_cuda_backend.py 2>&1 \
    | tee "$OUT/$4" | tail -30
  stamp "tests rc=$?"
}

decode() {  # one bench decode of the file in the form $1, round $2
  local env
  case $1 in
    f16) env="ECHOLINE_CUDA_INT8=0 ECHOLINE_CUDA_INT8_MIN_DIM=0" ;;
    int8) env="ECHOLINE_CUDA_INT8=1 ECHOLINE_CUDA_INT8_XPREP_MIN_ROWS=0" ;;
    int8x) env="ECHOLINE_CUDA_INT8=1 ECHOLINE_CUDA_INT8_XPREP_MIN_ROWS=1" ;;
    int8x_mv0) env="ECHOLINE_CUDA_INT8=1 ECHOLINE_CUDA_INT8_XPREP_MIN_ROWS=1 ECHOLINE_CUDA_INT8_MV_ROWS=0" ;;
    int8x_mv4) env="ECHOLINE_CUDA_INT8=1 ECHOLINE_CUDA_INT8_XPREP_MIN_ROWS=1 ECHOLINE_CUDA_INT8_MV_ROWS=4" ;;
    int8x_w48) env="ECHOLINE_CUDA_INT8=1 ECHOLINE_CUDA_INT8_XPREP_MIN_ROWS=1 ECHOLINE_CUDA_TENSOR_WIDE_MAX_SMEM_KIB=48" ;;
    r3) env="ECHOLINE_CUDA_TENSOR_MIN_BLOCKS_ROWS=3" ;;
    nt8r2) env="ECHOLINE_CUDA_TENSOR_MAX_ROW_TILES=8 ECHOLINE_CUDA_TENSOR_MIN_BLOCKS_ROWS=2" ;;
    nt8) env="ECHOLINE_CUDA_TENSOR_MAX_ROW_TILES=8" ;;
    b0) env="ECHOLINE_CUDA_INT8_BATCH_MIN_ROWS=0" ;;
    b17) env="ECHOLINE_CUDA_INT8_BATCH_MIN_ROWS=17 ECHOLINE_CUDA_INT8_SIGNED=0" ;;  # offset codes
    b17w) env="ECHOLINE_CUDA_INT8_BATCH_MIN_ROWS=17 ECHOLINE_CUDA_INT8_BATCH_WEIGHT_ROWS=64 ECHOLINE_CUDA_INT8_SIGNED=0" ;;
    b17s) env="ECHOLINE_CUDA_INT8_BATCH_MIN_ROWS=17 ECHOLINE_CUDA_INT8_SIGNED=1" ;;
    b17ws) env="ECHOLINE_CUDA_INT8_BATCH_MIN_ROWS=17 ECHOLINE_CUDA_INT8_BATCH_WEIGHT_ROWS=64 ECHOLINE_CUDA_INT8_SIGNED=1" ;;
  esac
  env $env timeout ${DECODE_S:-100} python3 -m echoline bench decode --backend cuda --model ${DECODE_F:-$F} --json \
    > "$OUT/decode_$1_$2.json" 2> "/tmp/decode_$1_$2.err"
  stamp "decode $1 round $2 rc=$?"; tail -6 "/tmp/decode_$1_$2.err"
}

wait_file() {
  for _ in $(seq 1 60); do grep -q "rc=" /tmp/synth.log 2>/dev/null && break; sleep 2; done
  stamp "synthetic file: $(tail -1 /tmp/synth.log)"
}

set -o pipefail
case "$1" in
quick)
  tensor_tests "q4_k q6_k" "(tensor or xprep) and (Q4_K or Q6_K or model or nan or two_type)" \
    ${TEST_S:-150} tests_quick.log
  wait_file
  for form in f16 int8 int8x; do decode $form 1; done
  ;;
test)
  tensor_tests "q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k iq4_nl iq4_xs" "tensor or xprep or mtv" \
    $((${CALL_S:-540} - $(date +%s) + t0)) tests.log
  ;;
bench)
  start_background
  build_7b_modules
  wait_file
  for r in $(seq 1 ${ROUNDS:-3}); do for form in f16 int8 int8x; do decode $form $r; done; done
  for _ in $(seq 1 $((${WAIT_S:-120} / 5))); do grep -q "rc=" /tmp/lcpp.log 2>/dev/null && break; sleep 5; done
  stamp "build: $(tail -1 /tmp/lcpp.log)"
  timeout 120 $LB/llama-bench -m $F -ngl 99 -p 0 -n 128 -r 5 -o json > "$OUT/llama_bench.json" 2> /tmp/llama_bench.err
  stamp "llama-bench rc=$?"
  python3 -c "import json,sys; [print(r['n_gen'], round(r['avg_ts'],1), round(r['stddev_ts'],1)) for r in json.load(open(sys.argv[1]))]" "$OUT/llama_bench.json" || tail -5 /tmp/llama_bench.err
  timeout ${EXACT_S:-150} python3 -m tools.cuda.exact_7b $F --json > "$OUT/exact.json" 2> /tmp/exact.err
  stamp "exact rc=$?"; tail -8 /tmp/exact.err
  ;;
spec)
  start_background
  build_7b_modules  # a cold NVRTC build inside exact_7b ran past its time on a fresh machine
  wait_file
  for md in 63 15; do
    ECHOLINE_MAX_DRAFT=$md timeout ${EXACT_S:-150} python3 -m tools.cuda.exact_7b $F --json > "$OUT/exact_md$md.json" 2> /tmp/exact_md$md.err
    stamp "exact max_draft $md rc=$?"; tail -8 /tmp/exact_md$md.err
  done
  for _ in $(seq 1 $((${WAIT_S:-200} / 5))); do grep -q "rc=" /tmp/lcpp.log 2>/dev/null && break; sleep 5; done
  stamp "build: $(tail -1 /tmp/lcpp.log)"
  timeout $((${CALL_S:-590} - $(date +%s) + t0)) python3 -m tools.versus_llamacpp --model $F --backend cuda --rounds ${ROUNDS:-3} \
    --traffic ${VS_TRAFFIC:-edit} --llama-server $LB/llama-server --llama-args "-ngl 99" --json > "$OUT/versus_r7b.log" 2>&1
  stamp "versus rc=$?"; tail -12 "$OUT/versus_r7b.log"
  ;;
mtv)
  # the integer form of every type, and the bare builds the 7B file's embedding reads
  tensor_tests "q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k iq4_nl iq4_xs" "mtv" ${TEST_S:-200} \
    tests_mtv.log @i1@b5
  build_modules "" q4_k q6_k q4_k+q6_k
  wait_file
  timeout ${EXACT_S:-150} python3 -m tools.cuda.exact_7b $F --json > "$OUT/exact_mtv.json" 2> /tmp/exact.err
  stamp "exact rc=$?"; tail -8 /tmp/exact.err
  for r in $(seq 1 ${ROUNDS:-1}); do for form in ${MTV_FORMS:-int8x_mv0 int8x int8x_mv4}; do decode $form $r; done; done
  ;;
nt8)
  tensor_tests "q8_0 q4_k q6_k" "((row_pass or batch_invariant or row_split) and (Q4_K or Q6_K or Q8_0)) or (mtv and Q8_0)" \
    ${TEST_S:-240} tests_nt8.log "- @b5 @i1@b5 @b5@r3 @i1@b5@r3 @b5@r2@t8 @i1@b5@r2@t8 @b5@t8 @i1@b5@t8"
  build_7b_modules
  timeout ${PROBE_S:-150} python3 -m tools.cuda.prod7b_probe --policies default,rows_minb3,nt8,nt8_minb2 \
    --rows 16,32,64 --iters 20 2>&1 | tee "$OUT/prod7b_nt8.txt" | tail -12
  stamp "products rc=$?"
  ;;
nt8bench)
  build_7b_modules
  build_modules q4_k@i1@b5@r3 q6_k@i1@b5@r3 q4_k+q6_k@i1@b5@r3 q4_k@i1@b5@r2@t8 q6_k@i1@b5@r2@t8 \
    q4_k+q6_k@i1@b5@r2@t8
  wait_file
  for r in $(seq 1 ${ROUNDS:-2}); do for form in int8x r3 nt8r2; do decode $form $r; done; done
  for form in "" "ECHOLINE_CUDA_TENSOR_MIN_BLOCKS_ROWS=${EXACT_MINB:-3}"; do
    env $form timeout ${EXACT_S:-150} python3 -m tools.cuda.exact_7b $F --json > "$OUT/exact_rows${form##*=}.json" 2> /tmp/exact.err
    stamp "exact ${form:-default} rc=$?"; tail -8 /tmp/exact.err
  done
  ;;
batch)
  tensor_tests "q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k iq4_nl iq4_xs" "mtb" ${TEST_S:-240} \
    tests_mtb.log @i1@b5
  for mix in q8_0 q4_k_m; do
    timeout ${PROBE_S:-150} python3 -m tools.cuda.prod7b_probe --mix $mix --policies batch0,batch17 \
      --rows ${ROWS_LIST:-1,16,32,64} --iters 20 2>&1 | tee "$OUT/prod7b_batch_$mix.txt" | tail -10
    stamp "products $mix rc=$?"
  done
  ;;
batchbench)
  build_7b_modules
  wait_file
  for r in $(seq 1 ${ROUNDS:-1}); do for form in b0 b17; do decode $form $r; done; done
  ECHOLINE_CUDA_INT8_BATCH_MIN_ROWS=17 timeout ${EXACT_S:-150} python3 -m tools.cuda.exact_7b $F --json \
    > "$OUT/exact_b17.json" 2> /tmp/exact.err
  stamp "exact b17 rc=$?"; tail -8 /tmp/exact.err
  ;;
batchw)
  F8=/tmp/models/r7b-q8_0.gguf  # the signed codes touch Q8_0 (and IQ4) only: a Q8_0 file
  [ -f $F8 ] || { mkdir -p /tmp/models && cp .mdl/qwen-tok.gguf /tmp/models/ && setsid nohup bash -c \
    "PYTHONPATH=$PYTHONPATH python3 -m tools.cuda.synth_gguf random --mix q8_0 --meta /tmp/models/qwen-tok.gguf $F8 \
    > /tmp/synth8.log 2>&1; echo rc=\$? >> /tmp/synth8.log" > /dev/null 2>&1 < /dev/null & }
  tensor_tests "q8_0 q4_k q6_k iq4_nl iq4_xs" \
    "(mtb or signed) and (Q8_0 or Q4_K or Q6_K or IQ4_NL or IQ4_XS or rows_equal or nan)" ${TEST_S:-240} \
    tests_mtbw.log "@i1@b5 @i1@b5@w1 @i1@b5@s1 @i1@b5@w1@s1"  # signed codes are the default
  build_modules q8_0@i1@b5 q8_0@i1@b5@w1 q8_0@i1@b5@s1 q8_0@i1@b5@w1@s1
  timeout ${PROBE_S:-150} python3 -m tools.cuda.prod7b_probe --mix q8_0 --policies batch17,batch17w,batch17s,batch17ws \
    --rows ${ROWS_LIST:-1,32,64} --iters 20 2>&1 | tee "$OUT/prod7b_batchw_q8_0.txt" | tail -12
  stamp "products rc=$?"
  ;;
batchwbench)
  F8=/tmp/models/r7b-q8_0.gguf  # written by batchw (in the background)
  for _ in $(seq 1 60); do grep -q "rc=" /tmp/synth8.log 2>/dev/null && break; sleep 2; done
  ls -l $F8; tail -2 /tmp/synth8.log
  for r in $(seq 1 ${ROUNDS:-1}); do for form in b17 b17w b17s b17ws; do DECODE_F=$F8 decode $form $r; done; done
  ECHOLINE_CUDA_INT8_BATCH_WEIGHT_ROWS=64 ECHOLINE_CUDA_INT8_SIGNED=1 timeout ${EXACT_S:-150} \
    python3 -m tools.cuda.exact_7b $F8 --json > "$OUT/exact_b17ws.json" 2> /tmp/exact.err
  stamp "exact b17ws rc=$?"; tail -8 /tmp/exact.err
  ;;
rows)
  build_7b_modules
  timeout ${PROBE_S:-200} python3 -m tools.cuda.prod7b_probe --policies default --rows ${ROWS_LIST:-1,16,32,64} \
    --iters 20 2>&1 | tee "$OUT/prod7b_rows.txt" | tail -8
  stamp "products rc=$?"
  timeout ${PROBE_S:-200} python3 -m tools.cuda.attn_probe --time --shapes qwen7b --context ${CTX:-1024} \
    --rows ${ROWS_LIST:-1,16,32,64} 2>&1 | tee "$OUT/attn7b_rows.txt" | tail -8
  stamp "attention rc=$?"
  ;;
*) echo "usage: bash tools/cuda/int8_run.sh quick|test|bench|spec|mtv|nt8|nt8bench|batch|batchbench|batchw|batchwbench|rows"; exit 2 ;;
esac
stamp done
