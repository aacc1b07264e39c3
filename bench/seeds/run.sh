#!/usr/bin/env bash
# The short form of seven scenarios under three seeds of their own (not the shipped ones), at
# 1-3x, tireless only, requests recorded: to compare two builds of the scheduler on traffic
# neither was tuned on. Sum the outcomes with bench/seeds/sum.py TAG...
#   bench/seeds/run.sh BINARY TAG      (BINARY: a tireless-load; results in /tmp/seeds/TAG)
set -euo pipefail
bin=$(realpath "$1"); tag=$2
cd "$(dirname "$0")/../.."
for scen in h200-herd stress/h200-oscillate h200-spike h200-trace-day h200-k2-expert-faults h200-ramp h200-k2-fleet; do
  src=examples/load_driver/scenarios/$scen.toml
  dir=$(dirname $src)
  for seed in 11 22 33; do
    tmp=$dir/zz-seed-$tag-$seed-$(basename $src)
    sed -E "s/^seed = [0-9]+/seed = $seed/" "$src" > "$tmp"  # beside it: the config path is relative
    "$bin" "$tmp" --short --multiples 1,2,3 --policies tireless --requests --out "/tmp/seeds/$tag/$(basename $scen)-$seed" > /dev/null 2>&1 || { rm -f "$tmp"; exit 1; }
    rm -f "$tmp"
  done
done
