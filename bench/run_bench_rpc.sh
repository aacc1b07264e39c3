#!/usr/bin/env bash
# Measures the Cap'n Proto RPC front of tireless-serve over loopback with bench_rpc: tiny
# requests completed per second, and refusals per second (unknown key; a full tier queue),
# with request-to-outcome latency. Starts a server per configuration (sim backend, written
# below), runs the scenarios, prints one table and saves it with the command to
# bench/results/bench_rpc.txt.
#
#   bench/run_bench_rpc.sh     BUILD=build, SECONDS_PER_ROW=5; PROFILE=1 also records the server
#                              with perf during one run of each refusal kind and writes a summary
#                              to bench/results/bench_rpc_profile.txt (DWARF call graphs: Debian's
#                              kj/capnp/libc have no frame pointers, so -g alone loses the callers)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$here/build}
seconds=${SECONDS_PER_ROW:-5}
out=$here/bench/results/bench_rpc.txt
profile_out=$here/bench/results/bench_rpc_profile.txt
tmp=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# The sim profile "zero": steps take no time, so what is measured is the server's own cost.
cat > "$tmp/fast.toml" <<'EOF'
[server]
listen = "127.0.0.1:0"
log_level = "warn"
max_connections = 4096
shutdown_grace_ms = 1000
[model]
path = "~/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf"
name = "bench-sim"
[backend]
kind = "sim"
sim_profile = "zero"
max_context = 4096
[kv]
block_size = 64
blocks = 20000
prefix_caching = false
[engine]
max_step_tokens = 8192
max_step_seqs = 256
[admission]
policy = "tireless"
default_max_tokens = 16
[[tiers]]
name = "premium"
priority = 3
ttft_ms = 60000
tpot_ms = 1000
queue_bound = 100000
sheddable = false
[[tenants]]
name = "bench"
keys = ["sk-bench"]
tier = "premium"
# A tenant over its request-rate quota: the policy refuses every request it sends
# (quota_exceeded, with the exact wait), at zero step cost.
[[tenants]]
name = "capped"
keys = ["sk-capped"]
tier = "premium"
requests_per_minute = 1
EOF

# Every request refused by the admission policy: long generations of a higher tier (bench_rpc
# --hold, tenant "holder") keep the engine busy on the slow cpu-smollm2 profile, and the bench
# tenant's tier sheds (sheddable) every request whose predicted time to first token misses its
# 1 ms target, i.e. all of them: Mooncake-style early rejection, decided with the engine's
# measured step times, each with a retry hint. (A full tier queue held by long generations of
# the same tier, as before, let a bench request in whenever the engine took a queued holder.)
cat > "$tmp/overload.toml" <<'EOF'
[server]
listen = "127.0.0.1:0"
log_level = "warn"
max_connections = 4096
shutdown_grace_ms = 1000
[model]
path = "~/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf"
name = "bench-sim"
[backend]
kind = "sim"
sim_profile = "cpu-smollm2"
[engine]
max_step_seqs = 1
[admission]
policy = "tireless"
default_max_tokens = 16
[[tiers]]
name = "hold"
priority = 2
ttft_ms = 60000
tpot_ms = 1000
sheddable = false
[[tiers]]
name = "bulk"
priority = 1
ttft_ms = 1
tpot_ms = 1000
sheddable = true
[[tenants]]
name = "bench"
keys = ["sk-bench"]
tier = "bulk"
[[tenants]]
name = "holder"
keys = ["sk-holder"]
tier = "hold"
EOF

start_server() {
  config=$1
  "$build/tools/tireless-serve" --config "$config" --port 0 > "$tmp/serve.out" 2> "$tmp/serve.err" &
  server_pid=$!
  for _ in $(seq 1 100); do
    grep -q "listening on" "$tmp/serve.out" 2>/dev/null && break
    sleep 0.1
  done
  port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$tmp/serve.out")
  if [ -z "$port" ]; then echo "tireless-serve did not start:" >&2; cat "$tmp/serve.err" >&2; exit 1; fi
}
stop_server() {
  kill -TERM "$server_pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$server_pid" 2>/dev/null; then
    echo "(tireless-serve had not exited 10 s after SIGTERM; killed)"
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}
row() {  # label, then bench_rpc options
  local label=$1; shift
  "$build/bench/bench_rpc" --port "$port" --server-pid "$server_pid" --seconds "$seconds" --label "$label" "$@" \
    || echo "($label: errors, unexpected outcomes, or none of the expected kind)"
  if ! kill -0 "$server_pid" 2>/dev/null; then
    wait "$server_pid" 2>/dev/null && status=0 || status=$?
    echo "(tireless-serve died during \"$label\", exit status $status; its last words:"
    tail -n 3 "$tmp/serve.err" | sed 's/^/   /'
    echo " restarted for the next row)"
    start_server "$config"
  fi
}

profile() {  # label, then bench_rpc options: one row with perf recording the server meanwhile
  local label=$1; shift
  perf record -e cpu-clock --call-graph dwarf,16384 -F 1000 -p "$server_pid" -o "$tmp/perf.data" \
    -- sleep "$((seconds + 1))" > /dev/null 2>&1 &
  local perf_pid=$!
  row "$label (perf)" "$@"
  wait "$perf_pid" || true
  {
    set +o pipefail
    echo "== $label: bench_rpc $*"
    echo "-- server CPU by thread"
    perf report -i "$tmp/perf.data" --no-children --sort comm --stdio -g none 2>/dev/null | grep '%'
    echo "-- by library"
    perf report -i "$tmp/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null | grep '%' | head -12
    echo "-- by function, inclusive (children), user space, top 45"
    perf report -i "$tmp/perf.data" --children --sort symbol --stdio -g none 2>/dev/null | grep '%' \
      | grep -v '\[k\]\|\] 0x0000' | head -45 | cut -c1-200
    echo "-- by function, self, top 25"
    perf report -i "$tmp/perf.data" --no-children --sort symbol --stdio -g none 2>/dev/null | grep '%' \
      | head -25 | cut -c1-160
    echo
    set -o pipefail
  } >> "$profile_out"
  sed -i 's/[[:space:]]*$//' "$profile_out"
}

exec > >(tee "$out")  # the table goes to the terminal and to the results file
if [ "${PROFILE:-0}" = 1 ]; then
  echo "# perf record -e cpu-clock --call-graph dwarf -p SERVER during bench/run_bench_rpc.sh ($(date -u +%Y-%m-%dT%H:%MZ), git $(git -C "$here" rev-parse --short HEAD))" > "$profile_out"
fi
echo "\$ PROFILE=${PROFILE:-0} SECONDS_PER_ROW=$seconds bench/run_bench_rpc.sh   ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg), git $(git -C "$here" rev-parse --short HEAD))"
echo "Closed loop over loopback: T client threads (one kj loop each) × C connections × P requests in flight each."
echo "Latency: generate() sent → TokenSink.done() received. rpc p50/p99: that latency minus the runtime's own"
echo "Outcome.timings.totalMs. server/client: CPU cores used in the window (2.00 = both cores); srv µs/cli µs:"
echo "CPU time per outcome. Unexpected outcomes (not the scenario's kind) are listed and not counted in outcome/s."
echo "Request: 4 prompt token ids, maxTokens 1."
echo
start_server "$tmp/fast.toml"
row "completed, 1 in flight" --key sk-bench --threads 1 --connections 1 --inflight 1 --header
row "completed, moderate" --key sk-bench --threads 1 --connections 2 --inflight 4
row "completed, saturated" --key sk-bench --threads 2 --connections 4 --inflight 16
row "unauthenticated, 1 in flight" --key sk-unknown --expect rejected:unauthenticated --threads 1 --connections 1 --inflight 1
row "unauthenticated, moderate" --key sk-unknown --expect rejected:unauthenticated --threads 2 --connections 2 --inflight 2
row "unauthenticated, 32 in flight" --key sk-unknown --expect rejected:unauthenticated --threads 2 --connections 4 --inflight 4
row "unauthenticated, saturated" --key sk-unknown --expect rejected:unauthenticated --threads 2 --connections 4 --inflight 16
# One client thread: the client keeps to one core and the server has the other (with two
# client threads, three busy threads share two cores and the tail is the OS's time slices).
row "unauthenticated, 1 client core" --key sk-unknown --expect rejected:unauthenticated --threads 1 --connections 4 --inflight 4
row "unauthenticated, 1 client core" --key sk-unknown --expect rejected:unauthenticated --threads 1 --connections 4 --inflight 8
row "over quota, 1 client core" --key sk-capped --expect rejected:quota_exceeded --threads 1 --connections 4 --inflight 4
row "over quota, 1 client core" --key sk-capped --expect rejected:quota_exceeded --threads 1 --connections 4 --inflight 8
if [ "${PROFILE:-0}" = 1 ]; then
  profile "unauthenticated" --key sk-unknown --expect rejected:unauthenticated --threads 2 --connections 4 --inflight 4
fi
stop_server
start_server "$tmp/overload.toml"
hold=(--hold 2 --hold-key sk-holder --hold-max-tokens 8000)
row "overloaded, 1 in flight" --key sk-bench --expect rejected:overloaded --threads 1 --connections 1 --inflight 1 "${hold[@]}"
row "overloaded, moderate" --key sk-bench --expect rejected:overloaded --threads 2 --connections 2 --inflight 2 "${hold[@]}"
row "overloaded, 32 in flight" --key sk-bench --expect rejected:overloaded --threads 2 --connections 4 --inflight 4 "${hold[@]}"
row "overloaded, saturated" --key sk-bench --expect rejected:overloaded --threads 2 --connections 4 --inflight 16 "${hold[@]}"
row "overloaded, 1 client core" --key sk-bench --expect rejected:overloaded --threads 1 --connections 4 --inflight 4 "${hold[@]}"
row "overloaded, 1 client core" --key sk-bench --expect rejected:overloaded --threads 1 --connections 2 --inflight 16 "${hold[@]}"
# The same shapes refused at the door while the engine runs: what the engine's own activity
# (its steps, the holders' token streams) costs the refusals' tail on 2 shared cores.
row "unauthenticated, engine busy" --key sk-unknown --expect rejected:unauthenticated --threads 1 --connections 4 --inflight 4 "${hold[@]}"
row "unauthenticated, engine busy" --key sk-unknown --expect rejected:unauthenticated --threads 1 --connections 2 --inflight 16 "${hold[@]}"
if [ "${PROFILE:-0}" = 1 ]; then
  profile "overloaded" --key sk-bench --expect rejected:overloaded --threads 2 --connections 4 --inflight 4 "${hold[@]}"
fi
stop_server
# The real model (config/tireless.toml, SmolLM2 on the cpu backend) and a tenant over its quota
# sending a short chat message as text: the server tokenizes it (chat template) to decide.
if [ -f "$HOME/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  { cat "$here/config/tireless.toml"; printf '\n[[tenants]]\nname = "capped"\nkeys = ["sk-capped"]\ntier = "free"\nrequests_per_minute = 1\n'; } > "$tmp/real.toml"
  sed -i 's/^log_level = .*/log_level = "warn"/' "$tmp/real.toml"
  start_server "$tmp/real.toml"
  question=(--chat "What is the capital of Italy? Answer in one word.")
  row "real model: over quota, chat" --key sk-capped --expect rejected:quota_exceeded --threads 1 --connections 4 --inflight 4 "${question[@]}"
  row "real model: unauthenticated" --key sk-unknown --expect rejected:unauthenticated --threads 1 --connections 4 --inflight 4 "${question[@]}"
  stop_server
fi
echo
echo "Bar: at least 20,000 refusals/s with p99 under 5 ms on 2 cores (client and server share them here)."
echo "Refusals: unauthenticated at the door; over quota and overloaded by the admission policy, decided on"
echo "the RPC thread (scheduler/admission_gate.hpp). Zero step cost: the first server (sim profile \"zero\");"
echo "engine busy: the second (cpu-smollm2 profile, 2 long generations of a higher tier running and waiting)."
