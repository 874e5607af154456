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
export RAY_AUTH_MODE=disabled  # a private loopback cluster; ~/.ray/auth_token is shared machine-wide
# SIGTERM: a background job of a non-interactive shell ignores SIGINT.
cleanup() {  # only this script's processes: other Ray clusters on the machine are left alone
  [[ -n "${serve_pid:-}" ]] && kill -TERM "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true
  [[ -n "${head_pid:-}" ]] && kill -TERM -- "-$head_pid" 2>/dev/null || true
}
trap cleanup EXIT
cat > "$work/tandem.yaml" <<YAML
tiers:
  - {name: standard, model_id: tandem-standard, aliases: [standard]}
  - {name: fast, model_id: tandem-fast, aliases: [fast], speculative: {method: ngram}}
server: {host: 127.0.0.1, port: $port}
ray: {address: "127.0.0.1:$ray_port"}
gateway:
  auth: {mode: keys, key_store: $work/keys.db}
YAML
setsid .venv/bin/ray start --head --block --port="$ray_port" --num-cpus=8 --include-dashboard=false \
  --temp-dir="$work/ray" >"$work/ray.log" 2>&1 &
head_pid=$!
sleep 15
longest() { grep -o 'tk-[A-Za-z0-9_-]*' | awk 'length($0) > length(k) { k = $0 } END { print k }'; }  # not the id
big="$(COLUMNS=200 .venv/bin/tandem keys create load --rpm 100000 --tpm 100000000 --store "$work/keys.db" | longest)"
small="$(COLUMNS=200 .venv/bin/tandem keys create limited --rpm 5 --store "$work/keys.db" | longest)"
.venv/bin/tandem serve --config "$work/tandem.yaml" >"$work/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 600); do
  curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 "$serve_pid" 2>/dev/null || { tail -40 "$work/serve.log"; exit 1; }
  sleep 2
done
.venv/bin/tandem bench load --url "http://127.0.0.1:$port" --api-key "$big" --limited-key "$small" \
  --requests "$requests" --kill-fast --ray-address "127.0.0.1:$ray_port"
