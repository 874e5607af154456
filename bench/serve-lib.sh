# Sourced by the bench scripts that run `tandem serve` on a private Ray head (eval-gate.sh, load-kill.sh,
# needle-heatmap.sh): start the head, serve a config and wait for /health, and stop only what they started.
# Needs `set -euo pipefail` and the repository root as the working directory.
export RAY_AUTH_MODE=disabled  # a private loopback cluster; ~/.ray/auth_token is shared machine-wide

# SIGTERM: a background job of a non-interactive shell ignores SIGINT. Other Ray clusters are left alone.
stop_serve() {
  [[ -n "${serve_pid:-}" ]] && kill -TERM "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true
  serve_pid=""
}
cleanup() {
  stop_serve
  [[ -n "${head_pid:-}" ]] && kill -TERM -- "-$head_pid" 2>/dev/null || true
}
trap cleanup EXIT

start_ray_head() {  # PORT DIR: a Ray head on PORT with its temp dir and log under DIR; sets head_pid
  setsid .venv/bin/ray start --head --block --port="$1" --num-cpus=8 --include-dashboard=false \
    --temp-dir="$2/ray" >"$2/ray.log" 2>&1 &
  head_pid=$!
  for _ in $(seq 90); do
    .venv/bin/ray status --address="127.0.0.1:$1" >/dev/null 2>&1 && return 0
    kill -0 "$head_pid" 2>/dev/null || { tail -20 "$2/ray.log"; exit 1; }
    sleep 2
  done
  echo "Ray head on port $1 not up after 180 s (log: $2/ray.log)" >&2
  exit 1
}

serve_until_healthy() {  # CONFIG LOG PORT: `tandem serve` in the background until /health answers; sets serve_pid
  .venv/bin/tandem serve --config "$1" >"$2" 2>&1 &
  serve_pid=$!
  for _ in $(seq 600); do
    curl -fs "http://127.0.0.1:$3/health" >/dev/null 2>&1 && return 0
    kill -0 "$serve_pid" 2>/dev/null || { tail -40 "$2"; exit 1; }
    sleep 2
  done
  echo "tandem serve on port $3 not healthy after 1200 s (log: $2)" >&2
  exit 1
}
