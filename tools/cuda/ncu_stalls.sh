#!/bin/bash
# Device-side: where the Qwen 0.5B-shaped (SHAPE: 1.5b, 7b) products wait at 1 and 16 rows
# (ROWS; issue 21's verify cost). ncu of tools.cuda.prod_probe (random weights of the real file's types) with every
# issue-stall reason, occupancy, cache hit rates and bytes; raw reports into $OUT/ncu_stalls_R.txt
# (read them with python3 -m tools.cuda.ncu_table $OUT/ncu_stalls_*.txt).
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu=$NCU"
M="gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_per_inst_issued.ratio"
M="$M,l1tex__t_sector_hit_rate.pct,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_bytes.sum"
M="$M,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
for r in ${ROWS:-1 16}; do
  timeout ${NCU_S:-150} $NCU --clock-control none -k "regex:^(mt|mtw|mtc|xprep)" --metrics "$M" \
    python3 -m tools.cuda.prod_probe --shape ${SHAPE:-0.5b} --ops ${OPS:-head,gate_up,qkv,o,down} --rows $r \
    > $OUT/ncu_stalls_$r.txt 2>&1
  echo "rows=$r rc=$?"; grep -c "gpu__time_duration" $OUT/ncu_stalls_$r.txt; grep -m3 -E "ERR|rror" $OUT/ncu_stalls_$r.txt
done
