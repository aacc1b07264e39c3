#!/usr/bin/env bash
# Experts in tireless-shard processes on this machine's loopback: decode tokens/s, dispatch
# overhead per MoE layer call, bytes on the wire per token row, for 1, 2 and 4 shard processes
# (f32, f16 and int8 activations); shard imbalance on the skewed router before and after rebalancing;
# recovery time when a shard is killed (replicas; a supervised restart); with and without
# overlap (two micro-batches in ping-pong), tokens/s and each shard's idle share at a batch of 8.
#
#   bench/expert_shards.sh [TOKENS]     (default 256; writes bench/results/expert_shards.txt)
#
# Needs build/ (scripts/build) and the SmolLM2 GGUF (scripts/fetch-model); makes the upcycled
# MoE (8 experts, 2 per token, perturbed 0.05, Zipf skew 1) under ~/.cache/tireless/models.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-256}
B=build/tools
dense=~/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf
M=~/.cache/tireless/models/SmolLM2-135M-moe8x2-p0.05-s1.gguf
[ -f "$M" ] || python3 -c "import sys; sys.path.insert(0, 'tools'); import upcycle_moe, os; upcycle_moe.upcycle('$dense', '$M.tmp', 8, 2, 0.05, 1.0, 1); os.replace('$M.tmp', '$M')"
prompt="Once upon a time, in a small village by the sea,"
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT

addrs=()
start_shards() {  # count: shard i of count holds experts e % count == i; sets addrs
  local count=$1
  addrs=()
  for ((i = 0; i < count; i++)); do
    $B/tireless-shard -m "$M" --listen 127.0.0.1:0 --port-file "$tmp/p$i" -t 1 --shard $i --of "$count" >/dev/null 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < count; i++)); do
    while [ ! -s "$tmp/p$i" ]; do sleep 0.05; done
    addrs+=(--expert-shard "$(cat "$tmp/p$i")")
  done
}
stop_shards() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); rm -f "$tmp"/p*; }

run() {  # label, args...: prints one table row
  local label=$1; shift
  local err
  err=$($B/tireless-generate -m "$M" -t 1 -n "$n" --prompt "$prompt" "$@" 2>&1 >/dev/null)
  local tps disp req rep imb
  tps=$(sed -n 's/.*generated [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1/p' <<<"$err")
  disp=$(sed -n 's/.*dispatch overhead \([0-9.]*\) us.*/\1/p' <<<"$err")
  req=$(sed -n 's/.*; \([0-9]*\) request + \([0-9]*\) reply.*/\1/p' <<<"$err")
  rep=$(sed -n 's/.*; \([0-9]*\) request + \([0-9]*\) reply.*/\2/p' <<<"$err")
  imb=$(sed -n 's/.*shard imbalance \([0-9.]*\).*/\1/p' <<<"$err")
  printf "| %-34s | %7s | %9s | %7s | %7s | %9s |\n" "$label" "$tps" "${disp:--}" "${req:--}" "${rep:--}" "${imb:--}"
}

run_overlap() {  # label, args...: one row of the overlap table
  local label=$1; shift
  local err
  err=$($B/tireless-generate -m "$M" -t 1 -n "$n" --batch 8 --prompt "$prompt" "$@" 2>&1 >/dev/null)
  local tps wait idle calls
  tps=$(sed -n 's/.*generated [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1/p' <<<"$err")
  calls=$(sed -n 's/.*expert overlap: [a-z]*, \([0-9]* of [0-9]*\) layer calls.*/\1/p' <<<"$err")
  wait=$(sed -n 's/.*waiting for shards \([0-9.]*%\).*/\1/p' <<<"$err")
  idle=$(sed -n 's/.*each shard idle \(.*\)$/\1/p' <<<"$err")
  printf "| %-30s | %7s | %-13s | %8s | %-27s |\n" "$label" "$tps" "$calls" "$wait" "$idle"
}

{
echo "# bench/expert_shards.sh $n on $(nproc) cores, $(date -u +%Y-%m-%d)"
echo "# model: SmolLM2-135M upcycled to 8 experts, 2 per token (perturb 0.05, Zipf skew 1); one sequence, greedy, $n tokens"
echo "# every process (attention shard and each tireless-shard) uses 1 thread; on 2 cores, 4 shards share them"
echo
echo "| setup                              | tok/s   | dispatch  | req B/  | reply B/| shard     |"
echo "|                                    | decode  | us/layer  | token   | token   | imbalance |"
echo "|------------------------------------|---------|-----------|---------|---------|-----------|"
run "in process (no shards)"
for count in 1 2 4; do
  start_shards $count
  run "$count shard process(es), f32" "${addrs[@]}"
  run "$count shard process(es), f16" "${addrs[@]}" --expert-f16
  run "$count shard process(es), int8" "${addrs[@]}" --expert-int8
  if [ "$count" = 4 ]; then
    run "4 shards, rebalanced once at $((n / 2)), 2 replicas" "${addrs[@]}" --rebalance-every $((n / 2)) --replicas 2
    run "4 shards, rebalanced once at $((n / 2)), 1 replica" "${addrs[@]}" --rebalance-every $((n / 2)) --replicas 1
  fi
  stop_shards
done
echo
echo "Overlap: 8 sequences of the prompt at once, each step split into two micro-batches of 4 (--overlap):"
echo "one's attention runs here while the other's experts run on the shards."
echo
echo "| setup                          | tok/s   | overlapped    | waiting  | each shard idle             |"
echo "|                                | decode  | layer calls   | for shards | (share of the run)        |"
echo "|--------------------------------|---------|---------------|----------|-----------------------------|"
for count in 1 2 4; do
  start_shards $count
  for rep in 1 2; do
    run_overlap "$count shards, batch 8, no overlap" "${addrs[@]}"
    run_overlap "$count shards, batch 8, overlap" "${addrs[@]}" --overlap
  done
  stop_shards
done
echo
echo "dispatch: the time a MoE layer call takes beyond its slowest shard's compute (RPC, copies, combine)."
echo "B/token: serialized Cap'n Proto request and reply bytes per token row sent to a shard."
echo "imbalance: max over mean of the (token, expert) pairs each shard computed, per layer, averaged over"
echo "layers, since the last rebalance (rebalanced rows: the second half of the run)."
echo "waiting for shards: the attention side blocked on replies; shard idle: 1 - its compute time / the run's wall time."
} | tee bench/results/expert_shards.txt
