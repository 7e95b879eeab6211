#!/bin/bash
# Device-side: ncu of the Qwen 0.5B-shaped head and gate|up products (tools.cuda.prod_probe) at 1
# and 16 rows, and of the attention at 16 rows and one (tools.cuda.attn_probe, context 1024):
# duration, registers, occupancy, waves and issue stalls per kernel, into $OUT/ncu_*.txt.
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu=$NCU"
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats"
for r in 1 16; do
  timeout 150 $NCU --clock-control none -k "regex:^(mt|mtw|xprep)" $S python3 -m tools.cuda.prod_probe --shape 0.5b --ops head,gate_up --rows $r > $OUT/ncu_prod_$r.txt 2>&1
  echo "prod rows=$r rc=$?"
done
timeout 150 $NCU --clock-control none -k "regex:attn_" $S python3 -m tools.cuda.attn_probe --shapes qwen0.5b --context 1024 > $OUT/ncu_attn.txt 2>&1
echo "attn rc=$?"
for f in $OUT/ncu_*.txt; do echo "== $f"; grep -E "^  [a-z_0-9]+.*\(|Duration|Registers Per|Achieved Occupancy|Waves Per SM|Warp Cycles Per Issued|Memory Throughput|Compute \(SM\) Throughput|Block Limit Registers|Block Limit Shared" $f | sed 's/  */ /g' | head -60; done
