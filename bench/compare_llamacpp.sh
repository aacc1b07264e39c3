#!/usr/bin/env bash
# tireless vs llama.cpp on the same GGUF file, run alternately (A B A B) so both see the same
# machine load; prints both tables and the ratios. Needs scripts/peer-llamacpp-setup first.
#   bench/compare_llamacpp.sh [ROUNDS]   (default 2; results in bench/results/)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-2}
peer=$HOME/.cache/tireless/peer-venv/bin/python
[ -x "$peer" ] || { echo "run scripts/peer-llamacpp-setup first" >&2; exit 1; }
out=$here/bench/results
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  echo "== round $r: tireless"
  "$here/build/bench/bench_forward" --threads 1,2 --reps 3 --json "$out/tireless_forward_$r.json"
  echo "== round $r: llama.cpp"
  "$peer" "$here/bench/peer_llamacpp.py" --wait-idle 0 --json "$out/peer_llamacpp_$r.json"
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
ours = [json.load(open(f"{out}/tireless_forward_{r}.json")) for r in range(1, rounds + 1)]
peer = [json.load(open(f"{out}/peer_llamacpp_{r}.json")) for r in range(1, rounds + 1)]
def peer_value(p, name, t):
    r = p["results"]["threads"][str(t)]
    return {"decode_b1": r["decode_tps"], "prefill_512": r["prefill_tps"], "decode_b8": r["batched_decode_tps"]["8"],
            "decode_b32": r["batched_decode_tps"]["32"]}[name]["median"]
rows = [("decode, batch 1", "decode_b1"), ("prefill, 512 tokens", "prefill_512"),
        ("decode, 8 sequences", "decode_b8"), ("decode, 32 sequences", "decode_b32")]
print(f"{'tokens/s (median of rounds)':30} {'thr':>3} {'tireless':>9} {'llama.cpp':>9} {'ratio':>6}")
for label, key in rows:
    for t in (1, 2):
        a = statistics.median(o["tokens_per_second"][key][str(t)] for o in ours)
        b = statistics.median(peer_value(p, key, t) for p in peer)
        print(f"{label:30} {t:>3} {a:9.1f} {b:9.1f} {a / b:6.2f}")
print(f"peak RSS: tireless {ours[-1]['peak_rss_mb']:.0f} MB (bar: file {ours[-1]['model_file_mb']:.0f} + KV pool "
      f"{ours[-1]['kv_pool_mb']:.0f} + 64 MB), llama.cpp {peer[-1]['peak_rss_kib'] / 1024:.0f} MB")
PY
