#!/usr/bin/env python3
"""Traffic nobody tuned for: seeded random scenarios on the simulated H200 (config/sim-h200-k2.toml),
each run under priority and tireless at several multiples of its capacity by the load driver's
suite (short form, virtual clock), then checked for what tireless promises whatever the traffic:

  hard (exit 1 when broken):
    - every request ends with exactly one outcome (zero lost);
    - every degraded response says so (nothing silently shortened);
    - no stream of a tireless run paused longer than its tier allows;
    - the top tier's SLO among its feasible requests under tireless is at least priority's
      (within --tolerance points): admission control never costs the top tier;
    - tireless's goodput is at least priority's (within --tolerance percent) where no tenant's
      quota refused anything (priority enforces none).
  reported: the late share and the refusals after admission of every tier.

    python3 tests/load_driver/random_mixes.py --load build/examples/load_driver/tireless-load
                                              [--count 3] [--seed 1] [--multiples 1,2,3] [--keep]

A mix draws 2-6 request classes over the config's six tenant keys (three tiers), with shares,
prompt and answer lengths (lognormal, tens to tens of thousands of tokens), shared system
prompts, bursts and a load profile (steps between 0.3x and 4x) all random. With --vary-config
it also runs on a machine and tiers nobody tuned for: the KV memory (2,500-21,000 blocks), the
step's token and sequence budgets and every tier's TTFT and TPOT targets drawn at random from
the shipped config's. A failing seed is printed with its scenario file: rerun it with --seeds
(and the same --vary-config), --keep to look at it.
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CONFIG = os.path.join(ROOT, "config", "sim-h200-k2.toml")
KEYS = {  # tenant key -> tier, as config/sim-h200-k2.toml has them
    "sk-sim-enterprise-a-1": "premium",
    "sk-sim-enterprise-b": "premium",
    "sk-sim-startup-c": "standard",
    "sk-sim-startup-d": "standard",
    "sk-sim-free-web": "free",
    "sk-sim-free-api": "free",
}
HARD_BARS = ("zero lost requests", "every degraded response says so", "no stream paused longer")


def log_uniform(rng, lo, hi):
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def length(rng, lo, hi, cap):
    median = round(log_uniform(rng, lo, hi))
    sigma = round(rng.uniform(0.2, 1.2), 2)
    top = min(cap, max(median * 2, round(median * rng.uniform(2, 12))))
    return f'{{ dist = "lognormal", median = {median}, sigma = {sigma}, min = 8, max = {top} }}'


def mix_class(rng, i, key):
    lines = ["[[mix]]", f'name = "class-{i}"', f"share = {rng.uniform(0.05, 1.0):.3f}", f'tenant_key = "{key}"']
    if rng.random() < 0.3:
        lines.append(f"system_prompt_tokens = {round(log_uniform(rng, 64, 4000))}")
    lines.append(f"prompt = {length(rng, 20, 6000, 60000)}")
    lines.append(f"output = {length(rng, 8, 1500, 8000)}")
    if rng.random() < 0.3:
        every, for_s = rng.randint(40, 180), rng.randint(2, 20)
        factor = rng.randint(2, max(2, min(15, every // for_s)))  # the class's mean share is kept
        lines.append(f"burst = {{ every_s = {every}, for_s = {for_s}, factor = {factor} }}")
    return "\n".join(lines)


def set_key(text, section, key, value):
    """text with `key = ...` of the first [section] (or [[section]]) after its header set to value."""
    head = re.search(rf"^\[\[?{re.escape(section)}\]\]?\s*$", text, re.M)
    line = re.compile(rf"^{re.escape(key)}\s*=[^\n]*", re.M)  # its comment goes with it
    found = line.search(text, head.end())
    if head is None or found is None:
        raise SystemExit(f"random_mixes: {CONFIG} has no {section}.{key} to vary")
    return text[:found.start()] + f"{key} = {value}" + text[found.end():]


def machine(rng, folder, seed):
    """A config like the shipped one on a machine and tiers drawn at random: its path and a summary."""
    with open(CONFIG) as f:
        text = f.read()
    blocks = round(log_uniform(rng, 2500, 21000))
    step_tokens = rng.choice([2048, 4096, 8192, 16384])
    step_seqs = rng.choice([64, 128, 256, 512])
    text = set_key(text, "kv", "blocks", blocks)
    text = set_key(text, "engine", "max_step_tokens", step_tokens)
    text = set_key(text, "engine", "max_step_seqs", step_seqs)
    tiers = []
    # Each [[tiers]] in turn: ttft and tpot scaled from the shipped targets, the order kept.
    scale_ttft, scale_tpot = log_uniform(rng, 0.5, 4.0), log_uniform(rng, 0.6, 2.5)
    parts = re.split(r"(?m)^(?=\[\[tiers\]\]\s*$)", text)
    for i in range(1, len(parts)):
        ttft = int(re.search(r"(?m)^ttft_ms\s*=\s*(\d+)", parts[i]).group(1))
        tpot = int(re.search(r"(?m)^tpot_ms\s*=\s*(\d+)", parts[i]).group(1))
        ttft, tpot = round(ttft * scale_ttft), round(tpot * scale_tpot)
        parts[i] = set_key(set_key(parts[i], "tiers", "ttft_ms", ttft), "tiers", "tpot_ms", tpot)
        tiers.append(f"{ttft}/{tpot}")
    text = "".join(parts)
    path = os.path.join(folder, f"machine-{seed}.toml")
    with open(path, "w") as f:
        f.write(f"# Generated by tests/load_driver/random_mixes.py from {CONFIG}, seed {seed}.\n" + text)
    return path, (f"kv {blocks} blocks, step {step_tokens} tokens / {step_seqs} seqs, "
                  f"tiers ttft/tpot ms {' '.join(tiers)}")


def scenario(seed, multiples, config=CONFIG):
    rng = random.Random(seed)
    name = f"random-{seed}"
    keys = list(KEYS)
    n = rng.randint(2, 6)
    # The top tier in every mix (its promise is what is checked), the rest at random.
    chosen = [rng.choice(keys[:2])] + [rng.choice(keys) for _ in range(n - 1)]
    profile = ""
    if rng.random() < 0.5:
        steps = sorted(rng.uniform(60, 1100) for _ in range(rng.randint(2, 5)))
        points = [[0, 1.0]] + [[round(t), round(rng.uniform(0.3, 4.0), 2)] for t in steps] + [[1200, 1.0]]
        profile = f"profile = {json.dumps(points)}"
    classes = "\n\n".join(mix_class(rng, i, k) for i, k in enumerate(chosen))
    return name, f"""# Generated by tests/load_driver/random_mixes.py, seed {seed}.
name = "{name}"
description = "a random mix (seed {seed})"

[target]
kind = "virtual"
config = "{config}"
quotas = "{rng.choice(['lifted', 'config'])}"

[run]
duration_s = 1200
warmup_s = 120
seed = {seed}
multiples = {json.dumps(multiples)}
policies = ["priority", "tireless"]
sample_every_s = 1

[capacity]
calibration_s = 300
warmup_s = 60
concurrency = 128

[arrivals]
process = "poisson"
{profile}

{classes}
"""


def check(results, tolerance):
    """The hard failures and the report lines of one scenario's results.json."""
    failures, notes = [], []
    for bar in results["bars"]:
        if bar["name"].startswith(HARD_BARS) and bar["result"] == "fail":
            failures.append(f"{bar['name']}: {bar['detail']}")
    runs = {(r["policy"], r["multiple"]): r for r in results["runs"]}
    for (policy, mult), run in sorted(runs.items()):
        if policy != "tireless":
            continue
        top = run["tiers"][0]
        late = ", ".join(f"{t['tier']} {t['late']}/{t['completed']}" for t in run["tiers"] if t["late"])
        after = sum(t["rejected_after_admission"] for t in run["tiers"])
        notes.append(f"{mult:g}x: {top['tier']} {100 * (top['slo_attainment_feasible'] or 0):.1f}% of "
                     f"{top['feasible']} feasible, goodput {run['total']['goodput_tokens_per_s']:.0f}, "
                     f"late {late or 'none'}, refused after admission {after}")
        peer = runs.get(("priority", mult))
        if peer is None or top["feasible"] == 0:
            continue
        mine, theirs = top["slo_attainment_feasible"] or 0, peer["tiers"][0]["slo_attainment_feasible"] or 0
        if mine < theirs - tolerance / 100:
            failures.append(f"{mult:g}x: the top tier's SLO among feasible requests {100 * mine:.1f}% under tireless, "
                            f"{100 * theirs:.1f}% under priority")
        # priority enforces no tenant quota: where tireless refused for one, the goodputs differ
        # by the quota, not by the scheduling.
        quota = sum(t["rejected_by_reason"].get("quota_exceeded", 0) for t in run["tiers"])
        g_mine, g_theirs = run["total"]["goodput_tokens_per_s"], peer["total"]["goodput_tokens_per_s"]
        if quota == 0 and g_mine < g_theirs * (1 - tolerance / 100):
            failures.append(f"{mult:g}x: goodput {g_mine:.0f} tokens/s under tireless, {g_theirs:.0f} under priority")
    return failures, notes


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--load", required=True, help="the tireless-load program")
    p.add_argument("--count", type=int, default=3)
    p.add_argument("--seed", type=int, default=1, help="the first scenario's seed; the others follow")
    p.add_argument("--seeds", help="the seeds, comma-separated (instead of --seed and --count)")
    p.add_argument("--multiples", default="1,2,3")
    p.add_argument("--tolerance", type=float, default=1.0, help="points of SLO, percent of goodput")
    p.add_argument("--keep", action="store_true", help="keep the scenarios and results")
    p.add_argument("--vary-config", action="store_true",
                   help="each mix on a machine and tiers drawn at random (KV blocks, step budgets, SLO targets)")
    args = p.parse_args()
    multiples = [float(m) for m in args.multiples.split(",")]
    work = tempfile.mkdtemp(prefix="tireless-random-mixes-")
    folder = os.path.join(work, "mixes")
    machines = os.path.join(work, "machines")
    os.makedirs(folder)
    os.makedirs(machines)
    names, summaries = [], {}
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else range(args.seed, args.seed + args.count)
    for seed in seeds:
        config = CONFIG
        if args.vary_config:
            # Its own stream: the traffic of a seed is the same with and without --vary-config.
            config, summaries[seed] = machine(random.Random(f"machine-{seed}"), machines, seed)
        name, text = scenario(seed, multiples, config)
        with open(os.path.join(folder, f"{name}.toml"), "w") as f:
            f.write(text)
        names.append((seed, name))
    out = os.path.join(work, "out")
    cmd = [args.load, "--suite", folder, "--short", "--virtual-only", "--policies", "priority", "tireless",
           "--multiples", *(f"{m:g}" for m in multiples), "--out", out]
    print("$", " ".join(cmd), flush=True)
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout[-4000:], run.stderr[-4000:])
        print(f"FAIL: tireless-load exited {run.returncode}; scenarios kept in {folder}")
        return 1
    broken = 0
    for seed, name in names:
        with open(os.path.join(out, name, "results.json")) as f:
            failures, notes = check(json.load(f), args.tolerance)
        print(f"{'FAIL' if failures else 'ok  '}  seed {seed}")
        if seed in summaries:
            print(f"        machine: {summaries[seed]}")
        for line in notes:
            print(f"        {line}")
        for line in failures:
            print(f"        broken: {line}")
        if failures:
            broken += 1
            print(f"        scenario: {os.path.join(folder, name + '.toml')}")
    print(f"{len(names) - broken} of {len(names)} random mixes kept every promise")
    if broken or args.keep:
        print(f"scenarios and results kept in {work}")
    else:
        shutil.rmtree(work)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
