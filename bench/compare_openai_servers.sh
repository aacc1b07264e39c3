#!/usr/bin/env bash
# tireless-serve and llama.cpp's llama-server side by side, on the same GGUF file, through the
# same OpenAI-compatible client (tireless-load's openai target) and the same offered load:
# cpu-smollm2's traffic at 1x and 3x of tireless's measured capacity. Not part of CI.
#
#   scripts/peer-llama-server-setup            # once: builds llama-server (minutes on 2 cores)
#   bench/compare_openai_servers.sh [DURATION_S]   # default 30; results in bench/results/
#
# Both servers get the quotas-lifted demo configuration's traffic (tireless: its tiers and
# admission; llama-server has no tiers: its 12 slots, continuous batching, first come first
# served). llama-server runs twice: at tireless's offered load, and at its own capacity (measured
# the same way). The tables are the load driver's; README.md quotes them. The client keeps each
# request's deadline (timeout_ms, 60 s) and closes the connection when it passes.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
duration=${1:-30}
server=$HOME/.cache/tireless/llama-server/build/bin/llama-server
model=$HOME/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf
load=$here/build/examples/load_driver/tireless-load
serve=$here/build/tools/tireless-serve
scenario=$here/examples/load_driver/scenarios/openai/cpu-smollm2.toml
out=$here/bench/results
[ -x "$server" ] || { echo "run scripts/peer-llama-server-setup first" >&2; exit 1; }
[ -x "$load" ] && [ -x "$serve" ] || { echo "build tireless first (scripts/build)" >&2; exit 1; }
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# The demo configuration with the tenants' quotas lifted (as cpu-smollm2's runs have them).
grep -vE '^(requests_per_minute|tokens_per_minute|max_concurrent) *=' "$here/config/tireless.toml" > "$work/tireless.toml"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 1 120); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.5; done; echo "no $1/health" >&2; return 1; }
run_load() {  # base_url, label, capacity (empty: measure)
  sed "s|^base_url = .*|base_url = \"$1\"|" "$scenario" > "$work/scenario.toml"
  sed -i "s|^config = .*|config = \"$work/tireless.toml\"|" "$work/scenario.toml"
  local cap=()
  [ -n "$3" ] && cap=(--capacity "$3")
  "$load" "$work/scenario.toml" --multiples 1,3 --duration "$duration" --warmup 8 --out "$work/out-$2" "${cap[@]}" \
    | tee "$work/$2.txt"
}

port=$(free_port)
"$serve" --config "$work/tireless.toml" --port 0 --http-port "$port" >"$work/tireless.out" 2>"$work/tireless.err" &
wait_http "http://127.0.0.1:$port"
echo "== tireless-serve (capacity measured)"
run_load "http://127.0.0.1:$port" tireless ""
capacity=$(grep -oE '^capacity: [0-9.]+' "$work/tireless.txt" | head -1 | awk '{print $2}')
kill %1; wait %1 2>/dev/null || true

lport=$(free_port)
# 12 slots of 2048 tokens: the concurrency tireless-load's calibration uses, each with room for
# the longest prompt of the mix and its answer.
"$server" -m "$model" --host 127.0.0.1 --port "$lport" -np 12 -c $((12 * 2048)) -t 2 --cont-batching \
  >"$work/llama.out" 2>"$work/llama.err" &
wait_http "http://127.0.0.1:$lport"
echo "== llama-server at the same offered load ($capacity requests/s = 1x)"
run_load "http://127.0.0.1:$lport" llama-server "$capacity"
# And at its own capacity, measured the same way (closed loop, 12 in flight): what it keeps
# when it is not offered more than it can do.
echo "== llama-server at its own capacity (measured)"
run_load "http://127.0.0.1:$lport" llama-server-own ""

{
  echo "# bench/compare_openai_servers.sh $duration, $(date -u +%Y-%m-%d), same GGUF, same client, same offered load"
  echo "## tireless-serve"; sed -n '/^comparison/,/^$/p' "$work/tireless.txt"
  for run in tireless llama-server llama-server-own; do
    case $run in
      tireless) echo "## tireless-serve at its measured capacity (1x) and 3x" ;;
      llama-server) echo "## llama-server (llama.cpp vendored in llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION:-0.3.36}) at the same offered load" ;;
      llama-server-own) echo "## llama-server at its own measured capacity (1x) and 3x" ;;
    esac
    grep -E '^capacity: .*tokens/s' "$work/$run.txt" || true
    grep -E '^tireless at [0-9]+x capacity|^  (tier|premium|standard|free|total) |^  longest pause' "$work/$run.txt" \
      | sed 's/^tireless at/at/' || true
  done
} | tee "$out/compare_openai_servers.txt"
