#!/usr/bin/env python3
"""The autoscaling ramp's variants side by side, minute by minute (bench/autoscale_ramp.sh).

    python3 bench/autoscale_table.py WORKDIR OUT.png

WORKDIR holds one load-driver output folder per variant (results.json). Prints, per minute of
arrivals: the offered load (times the starting fleet's capacity), then for each variant the
replicas serving at the minute's end and each tier's share of requests served within its SLO
(among feasible ones); draws replicas and premium/free SLO against time with gnuplot.
"""
import json
import os
import subprocess
import sys

VARIANTS = ["tireless-autoscaled", "tireless-fixed", "least-slack-autoscaled", "tireless-hpa-metrics-only"]
SHORT = {"tireless-autoscaled": "tireless+HPA+refusals", "tireless-fixed": "tireless, fixed 2",
         "least-slack-autoscaled": "least-slack+HPA", "tireless-hpa-metrics-only": "tireless+HPA (queue only)"}
TIERS = ["premium", "standard", "free"]


def load(workdir, v):
    with open(os.path.join(workdir, v, "results.json")) as f:
        j = json.load(f)
    return j["capacity"]["requests_per_s"], j["runs"][0]


def serving_at(run, t):
    n = run["fleet"]["initial"] if run.get("fleet") else 0
    for p in (run.get("fleet") or {}).get("points", []):
        if p["t_s"] <= t + 1e-9:
            n = p["serving"]
    return n


def pct(a, b):
    return 100.0 * a / b if b else float("nan")


def main():
    workdir, png = sys.argv[1], sys.argv[2]
    runs = {}
    capacity = None
    for v in VARIANTS:
        capacity, runs[v] = load(workdir, v)
    head = f"{'arrivals':>11} {'load':>6}"
    for v in VARIANTS:
        head += f" | {SHORT[v]:^26}"
    print("# per minute: replicas serving at its end; SLO among feasible requests, premium / standard / free")
    print(head)
    rows = []
    base = runs[VARIANTS[0]]
    for i, w in enumerate(base["windows"]):
        span = w["to_s"] - w["from_s"]
        offered = sum(w["tiers"][t]["offered"] for t in TIERS)
        line = f"{w['from_s']:>5.0f}-{w['to_s']:<5.0f} {offered / span / capacity:>5.2f}x"
        row = [w["from_s"], offered / span / capacity]
        for v in VARIANTS:
            wv = runs[v]["windows"][i]
            slo = [pct(wv["tiers"][t]["feasible_met"], wv["tiers"][t]["feasible"]) for t in TIERS]
            n = serving_at(runs[v], w["to_s"])
            line += f" | {n:>3} {slo[0]:>6.1f} {slo[1]:>6.1f} {slo[2]:>6.1f}  "
            row += [n, slo[0], slo[2]]
        print(line)
        rows.append(row)
    data = os.path.join(workdir, "ramp.dat")
    with open(data, "w") as f:
        for r in rows:
            f.write(" ".join(f"{x:.4g}" for x in r) + "\n")
    # Columns: 1 t, 2 load, then per variant k (0-based): replicas 3+3k, premium 4+3k, free 5+3k.
    plots_top = ", ".join(f"'{data}' using ($1/60):{3 + 3 * k} with steps lw 2 title '{SHORT[v]}'" for k, v in enumerate(VARIANTS))
    plots_bottom = ", ".join(
        f"'{data}' using ($1/60):{4 + 3 * k} with lines lw 2 dt 1 lc {k + 1} title '{SHORT[v]} premium', "
        f"'{data}' using ($1/60):{5 + 3 * k} with lines lw 1 dt 2 lc {k + 1} title '{SHORT[v]} free'"
        for k, v in enumerate(VARIANTS))
    script = f"""
set terminal pngcairo size 1100,800
set output '{png}'
set multiplot layout 2,1
set title 'h200-k2-autoscale: load (x the starting fleet of 2) and replicas serving'
set xlabel 'minute of the run (arrivals)'
set ylabel 'replicas / load x'
set key top left
plot '{data}' using ($1/60):2 with lines lw 3 lc rgb 'black' title 'offered load (x)', {plots_top}
set title 'SLO among feasible requests, per minute (premium solid, free dashed)'
set ylabel '%'
set yrange [0:105]
set key bottom left font ',8'
plot {plots_bottom}
unset multiplot
"""
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"(no plot: {e})", file=sys.stderr)


if __name__ == "__main__":
    main()
