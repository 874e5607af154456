#!/usr/bin/env bash
# Issue 18 measurement: needle-in-a-haystack recall by length x depth (the long_context eval family) for the
# native window or a RoPE-extended one, served by `tandem serve` on a private Ray head, one run per setting.
# Usage: bench/needle-heatmap.sh FACTOR [LIMIT] [OUT_DIR]
#   FACTOR 1: tandem-standard at the model's own window (8,192 for the bundled model);
#   FACTOR 2, 4, ...: a `long` tier (tandem-long) with YaRN x FACTOR (METHOD=linear|dynamic to change it).
#   e.g. bench/needle-heatmap.sh 2 20 bench/results/long-context-yarn2
# The eval reads the served window from the gateway's /v1/models, so haystacks run from 1k tokens up to it;
# OUT_DIR gets the Inspect log, long_context-heatmap.png and timing.txt. MAX_SAMPLES (default 2): requests in
# flight; 1 for the longest windows, where one prefill takes minutes on a CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
factor="${1:?usage: needle-heatmap.sh FACTOR [LIMIT] [OUT_DIR]}"
limit="${2:-20}"
out="${3:-$(mktemp -d /tmp/tandem-needle-XXXX)}"
method="${METHOD:-yarn}"
port="${PORT:-8030}"
ray_port=$((port + 1000))
mkdir -p "$out"
. bench/serve-lib.sh
start_ray_head "$ray_port" "$out"

# The standard tier is required; when it is not the one measured it gets a small window and KV cache.
# The measured engine's KV cache holds two full-length prompts (45 KiB a token in float32).
kv_bytes=$(python3 -c "print(int(2 * 8192 * $factor * 46080 * 1.1))")
base="dtype: float32, enforce_eager: true, max_num_seqs: 4"  # a tier's engine replaces the default whole
if [[ "$factor" == "1" ]]; then
  model_id=tandem-standard
  tiers="  - {name: standard, model_id: tandem-standard, engine: {$base, extra: {kv_cache_memory_bytes: $kv_bytes}}}"
else
  model_id=tandem-long
  tiers="  - {name: standard, model_id: tandem-standard, engine: {$base, max_model_len: 2048, extra: {kv_cache_memory_bytes: 268435456}}}
  - name: long
    model_id: tandem-long
    context_extension: {method: $method, factor: $factor}
    engine: {$base, extra: {kv_cache_memory_bytes: $kv_bytes}}"
fi
cat >"$out/tandem.yaml" <<YAML
model: smollm2-135m-instruct@base
tiers:
$tiers
server: {host: 127.0.0.1, port: $port}
ray: {address: "127.0.0.1:$ray_port"}
YAML
serve_until_healthy "$out/tandem.yaml" "$out/serve.log" "$port"
curl -fs "http://127.0.0.1:$port/v1/models" >"$out/models.json"
started=$SECONDS
.venv/bin/tandem eval --model "$model_id" --base-url "http://127.0.0.1:$port/v1" --families long_context \
  --split test --seed 0 --limit "$limit" --max-tokens 32 --max-samples "${MAX_SAMPLES:-2}" --log-dir "$out" 2>&1 | tee "$out/eval.log"
echo "needle $model_id factor=$factor method=$method limit=$limit: $((SECONDS - started)) s" | tee "$out/timing.txt"
