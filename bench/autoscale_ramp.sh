#!/usr/bin/env bash
# The autoscaling ramp (examples/load_driver/scenarios/fleet/h200-k2-autoscale.toml): the same
# 1x -> 4x -> 1x ramp on the fleet of two H200 replicas, with and without the autoscaler, with
# and without early rejection (tireless against least-slack, a good scheduler that admits
# everything), and with the HPA's metrics alone (queue depth and waiting, without refusals per
# second). Virtual time: a minute or two here. Writes bench/results/autoscale/ramp.txt (each
# variant's summary, then all of them minute by minute) and ramp.png (bench/autoscale_table.py).
#
#   bench/autoscale_ramp.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
load=$here/build/examples/load_driver/tireless-load
scenario=$here/examples/load_driver/scenarios/fleet/h200-k2-autoscale.toml
out=$here/bench/results/autoscale
[ -x "$load" ] || { echo "build tireless first (scripts/build)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
# The HPA of deploy/kubernetes/hpa.yaml as it is: no refusals-per-second metric.
grep -v 'what = "refused_per_s"' "$scenario" > "$work/hpa-only.toml"
sed -i "s|^config = .*|config = \"$here/config/sim-h200-k2.toml\"|" "$work/hpa-only.toml"

run() {  # variant, scenario, extra args
  local variant=$1 file=$2
  shift 2
  "$load" "$file" --out "$work/$variant" "$@" > "$work/$variant.txt" 2>/dev/null
}
run tireless-autoscaled "$scenario" --policies tireless
run tireless-fixed "$scenario" --policies tireless --autoscale off
run least-slack-autoscaled "$scenario" --policies least-slack
run least-slack-fixed "$scenario" --policies least-slack --autoscale off
run tireless-hpa-metrics-only "$work/hpa-only.toml" --policies tireless
run least-slack-hpa-metrics-only "$work/hpa-only.toml" --policies least-slack

{
  echo "# bench/autoscale_ramp.sh, $(date -u +%Y-%m-%d): h200-k2-autoscale, virtual time"
  grep -m1 -E '^capacity' "$work/tireless-autoscaled.txt" || true
  for v in tireless-autoscaled tireless-fixed least-slack-autoscaled least-slack-fixed tireless-hpa-metrics-only \
           least-slack-hpa-metrics-only; do
    echo
    echo "## $v"
    sed -n '/^comparison/,/^$/p' "$work/$v.txt" | sed '1d;/^$/d'
    grep -E '^  fleet:|^  worst|^  late|^  SLO among feasible' "$work/$v.txt" || true
  done
  echo
  python3 "$here/bench/autoscale_table.py" "$work" "$out/ramp.png"
} > "$out/ramp.txt"
cat "$out/ramp.txt"
