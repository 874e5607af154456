#!/usr/bin/env bash
# Issue 6 load test with one tier replica killed mid-run, on the bundled model (bounded, loopback only).
# Starts its own Ray head and `tandem serve` (keys on, standard + fast tiers), creates a roomy key and a
# 5 rpm key, runs `tandem bench load --kill-fast` and stops everything. Results: bench/results/load-kill-*.json
# Usage: bench/gateway/load-kill.sh [REQUESTS] [PORT]
set -euo pipefail
cd "$(dirname "$0")/../.."
requests="${1:-2000}"
port="${2:-8010}"
work="$(mktemp -d /tmp/tandem-load-kill-XXXX)"
ray_port=$((port + 1000))
. bench/serve-lib.sh
cat > "$work/tandem.yaml" <<YAML
tiers:
  - {name: standard, model_id: tandem-standard, aliases: [standard]}
  - {name: fast, model_id: tandem-fast, aliases: [fast], speculative: {method: ngram}}
server: {host: 127.0.0.1, port: $port}
ray: {address: "127.0.0.1:$ray_port"}
gateway:
  auth: {mode: keys, key_store: $work/keys.db}
YAML
start_ray_head "$ray_port" "$work"
longest() { grep -o 'tk-[A-Za-z0-9_-]*' | awk 'length($0) > length(k) { k = $0 } END { print k }'; }  # not the id
big="$(COLUMNS=200 .venv/bin/tandem keys create load --rpm 100000 --tpm 100000000 --store "$work/keys.db" | longest)"
small="$(COLUMNS=200 .venv/bin/tandem keys create limited --rpm 5 --store "$work/keys.db" | longest)"
serve_until_healthy "$work/tandem.yaml" "$work/serve.log" "$port"
.venv/bin/tandem bench load --url "http://127.0.0.1:$port" --api-key "$big" --limited-key "$small" \
  --requests "$requests" --kill-fast --ray-address "127.0.0.1:$ray_port"
