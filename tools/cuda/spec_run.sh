#!/bin/bash
# Device-side driver for `bench spec` A/B runs (issue 21, the plain arm).
# Real model files travel in <= 50 MB parts, one per call (`carry: [".mdl"]`, parts named
# smolpartNN / qwenpartNN as `split -b 50000000 -d FILE smolpart` makes them); each call copies
# its part to /tmp/models and the files are joined once all parts are there. Then every
# argument JOB = model:traffic:arm:carry[:timeout] runs one
#   ECHOLINE_PLAIN_ARM=arm ECHOLINE_DRAFT_CARRY=carry python3 -m echoline bench spec \
#     --backend cuda --model M --traffic T --rounds 3 --json
# (model: smol | qwen), appending one summary line to $OUT/spec.jsonl. JOB "e2e:smol" runs the
# real-model GPU tests.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/models
for p in .mdl/*part*; do [ -f "$p" ] && cp "$p" /tmp/models/; done
join() {  # prefix last-part file
  if [ ! -f "/tmp/models/$2" ] && [ -f "/tmp/models/$3" ]; then
    cat /tmp/models/"$1"* > "/tmp/models/$2" && rm /tmp/models/"$1"* && sha256sum "/tmp/models/$2"
  fi
}
join smolpart smol.gguf smolpart01
join qwenpart qwen.gguf qwenpart09
ls /tmp/models
for job in "$@"; do
  IFS=: read -r model traffic arm carry limit <<< "$job"
  M=/tmp/models/$([ "$model" = qwen ] && echo qwen || echo smol).gguf
  [ -f "$M" ] || { echo "$job: no model yet"; continue; }
  if [ "$model" = e2e ]; then
    ECHOLINE_CUDA_MODEL=/tmp/models/$traffic.gguf timeout 300 python3 -m pytest -q -p no:cacheprovider \
      tests/test_cuda_e2e.py 2>&1 | tee -a "$OUT/tests.log" | grep -E "passed|failed|^E |Error" | head -20
    continue
  fi
  t0=$(date +%s)
  ECHOLINE_PLAIN_ARM=$arm ECHOLINE_DRAFT_CARRY=$carry timeout "${limit:-240}" python3 -m echoline bench spec \
    --backend cuda --model "$M" --traffic "$traffic" --rounds 3 --json > /tmp/spec.json 2> /tmp/spec.err
  rc=$?
  cat /tmp/spec.err >> "$OUT/spec.log"
  python3 - "$job" "$rc" "$(( $(date +%s) - t0 ))" <<'EOF' | tee -a "$OUT/spec.jsonl"
import json, sys
job, rc, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    r = json.load(open("/tmp/spec.json"))
except Exception as e:  # noqa: BLE001
    print(json.dumps({"job": job, "rc": rc, "secs": secs, "error": str(e)[:200]})); sys.exit()
keep = ("plain_tok_s", "spec_tok_s", "ratio", "identical", "acceptance", "tokens_per_round", "lookup_share",
        "round_ms", "round_split_ms", "token_split_ms", "verify_cost", "oracle_ratio", "limit_ratio")
print(json.dumps({"job": job, "rc": rc, "secs": secs, **{k: r.get(k) for k in keep}}))
EOF
done
