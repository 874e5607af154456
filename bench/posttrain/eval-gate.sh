#!/usr/bin/env bash
# Issue 5 measurement: `tandem eval` of the base and of a post-trained candidate at the same seeds, each
# served by its own `tandem serve` (standard tier, bench/posttrain/gateway-eval.yaml) one after the other
# on a private Ray head, then `tandem gate` with bench/posttrain/gate-standard-tier.yaml.
# Usage: bench/posttrain/eval-gate.sh CANDIDATE_REF [LIMIT] [OUT_DIR]
#   e.g. bench/posttrain/eval-gate.sh tandem-candidate@sft-documents-r5 30 /tmp/pt
# ONLY=base or ONLY=candidate runs one side (the base can be measured while the candidate trains); the gate
# runs once both sides' logs are in OUT_DIR. EVAL_CONFIG=FILE serves from another gateway config (e.g.
# bench/posttrain/gateway-eval-8k.yaml, the model's whole window).
set -euo pipefail
cd "$(dirname "$0")/../.."
candidate="${1:?usage: eval-gate.sh CANDIDATE_REF [LIMIT] [OUT_DIR]}"
limit="${2:-30}"
out="${3:-$(mktemp -d /tmp/tandem-eval-gate-XXXX)}"
base="${BASE_REF:-smollm2-135m-instruct@base}"
families="${FAMILIES:-documents,terminal,agent}"
max_tokens="${MAX_TOKENS:-256}"
port="${PORT:-8020}"
eval_config="${EVAL_CONFIG:-bench/posttrain/gateway-eval.yaml}"
ray_port=$((port + 1000))
mkdir -p "$out"
. bench/serve-lib.sh
start_ray_head "$ray_port" "$out"

evaluate() {  # label model-ref
  local label="$1" ref="$2"
  sed -e "s|^model: .*|model: $ref|" -e "s|port: 8000|port: $port|" "$eval_config" \
    > "$out/$label.yaml"
  printf 'ray: {address: "127.0.0.1:%s"}\n' "$ray_port" >> "$out/$label.yaml"
  serve_until_healthy "$out/$label.yaml" "$out/serve-$label.log" "$port"
  local started=$SECONDS
  .venv/bin/tandem eval --model tandem-standard --base-url "http://127.0.0.1:$port/v1" \
    --families "$families" --split test --seed 0 --limit "$limit" --max-tokens "$max_tokens" \
    --max-samples 8 --log-dir "$out/logs-$label" 2>&1 | tee "$out/eval-$label.log"
  echo "eval $label ($ref): $((SECONDS - started)) s" | tee -a "$out/timing.txt"
  stop_serve
}

case "${ONLY:-both}" in
  base) evaluate base "$base" ;;
  candidate) evaluate candidate "$candidate" ;;
  *) evaluate base "$base"; evaluate candidate "$candidate" ;;
esac
[[ -d "$out/logs-base" && -d "$out/logs-candidate" ]] || exit 0
.venv/bin/tandem gate --candidate "$out/logs-candidate" --baseline "$out/logs-base" \
  --policy bench/posttrain/gate-standard-tier.yaml --report-dir "$out/gate" 2>&1 | tee "$out/gate.log"
