#!/usr/bin/env python3
"""Writes a synthetic trace of chat traffic with the arrival pattern of a real service, for
tireless-load's trace replay (arrivals.process = "trace"): not a recorded trace, but one with
its shapes. The rate follows a compressed day (a quiet night, a morning rise, a lunch dip, an
afternoon peak at ~1.7x the mean); users arrive in sessions of several turns separated by
think times, each turn's prompt carrying the conversation so far; an API tenant submits batch
jobs (hundreds of requests within seconds) a few times a day. Columns:
arrival_s,tenant_key,prompt_tokens,output_tokens. Deterministic for a seed.

  python3 examples/load_driver/traces/make_trace.py --out examples/load_driver/traces/day-chat.csv
"""
import argparse
import math
import random


def day_rate(t, span):
    """Relative session rate at t of a day compressed into span seconds (mean ~1)."""
    h = 24.0 * t / span
    night = 0.25
    morning = 1.1 * math.exp(-((h - 10.5) / 2.2) ** 2)
    afternoon = 1.5 * math.exp(-((h - 15.5) / 2.5) ** 2)
    evening = 0.8 * math.exp(-((h - 20.5) / 1.8) ** 2)
    lunch_dip = -0.35 * math.exp(-((h - 12.8) / 0.6) ** 2)
    return max(0.1, night + morning + afternoon + evening + lunch_dip)


def lognormal(rng, median, sigma, lo, hi):
    while True:
        v = int(round(median * math.exp(rng.gauss(0.0, sigma))))
        if lo <= v <= hi:
            return v


# (tenant key, share of sessions, system prompt tokens, first prompt median, output median)
TENANTS = [
    ("sk-sim-enterprise-a-1", 0.10, 600, 250, 280),
    ("sk-sim-enterprise-b", 0.05, 0, 900, 350),
    ("sk-sim-startup-c", 0.15, 300, 400, 250),
    ("sk-sim-startup-d", 0.10, 0, 700, 220),
    ("sk-sim-free-web", 0.60, 150, 200, 230),
]
BATCH_TENANT = "sk-sim-free-api"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--span", type=float, default=3600.0, help="seconds of the compressed day")
    ap.add_argument("--sessions", type=int, default=4000)
    ap.add_argument("--batches", type=int, default=3, help="batch jobs of the API tenant")
    ap.add_argument("--seed", type=int, default=20261202)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    rows = []
    # Session starts: a Poisson process thinned by the day's rate.
    peak = max(day_rate(t, a.span) for t in range(0, int(a.span), 10))
    mean = sum(day_rate(t, a.span) for t in range(0, int(a.span), 10)) / (a.span / 10)
    rate = a.sessions / a.span / mean
    t = 0.0
    while t < a.span:
        t += rng.expovariate(rate * peak)
        if t >= a.span or rng.random() > day_rate(t, a.span) / peak:
            continue
        key, _, system, first, out = rng.choices(TENANTS, weights=[x[1] for x in TENANTS])[0]
        turns = min(12, 1 + int(rng.expovariate(1 / 2.0)))
        context, at = system, t
        for _ in range(turns):
            ask = lognormal(rng, first, 0.8, 8, 6000)
            answer = lognormal(rng, out, 0.7, 8, 1500)
            context = min(context + ask, 12000)
            rows.append((at, key, context, answer))
            context = min(context + answer, 12000)
            at += lognormal(rng, 25, 0.9, 3, 600) + answer / 30.0  # reading, thinking, typing
    for _ in range(a.batches):
        start = rng.uniform(0.2 * a.span, 0.9 * a.span)
        for i in range(rng.randint(150, 400)):
            rows.append((start + rng.expovariate(40.0) * i / 10, BATCH_TENANT,
                         lognormal(rng, 1200, 0.5, 100, 4000), lognormal(rng, 150, 0.5, 16, 600)))
    rows.sort()
    with open(a.out, "w") as f:
        f.write("arrival_s,tenant_key,prompt_tokens,output_tokens\n")
        for at, key, p, o in rows:
            f.write(f"{at:.3f},{key},{p},{o}\n")
    print(f"{a.out}: {len(rows)} requests over {rows[-1][0]:.0f} s")


if __name__ == "__main__":
    main()
