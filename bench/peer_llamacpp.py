#!/usr/bin/env python3
"""Measures the peer runtime, llama.cpp (through llama-cpp-python's low-level ctypes bindings),
on the real model, so tireless's CPU speed can be compared with it on the same GGUF file.

Not part of CI. Install the peer first with scripts/peer-llamacpp-setup, then run with that
virtual environment's python:

    scripts/peer-llamacpp-setup
    ~/.cache/tireless/peer-venv/bin/python bench/peer_llamacpp.py \
        --json bench/results/peer_llamacpp.json

What is measured, for each thread count (n_threads = n_threads_batch = 1, then 2), each
repeated --reps times (fresh context, so a fresh KV cache, each time; one untimed warm-up
first), reporting the median:

  decode      batch 1: one sequence, a short prompt prefilled, then --decode-tokens tokens
              generated one per llama_decode call; only the llama_decode calls (plus
              llama_synchronize) are timed, not the argmax.
  prefill     one llama_decode of a --prefill-tokens prompt, logits for the last token only;
              n_batch = n_ubatch = prompt length, so it is a single ubatch (no chunking).
  batched     N sequences (distinct seq_ids 0..N-1 in one llama_batch, one token each per step)
              after a distinct --batch-prompt-tokens prompt each (prefilled together, untimed);
              then --batch-steps steps, each one llama_decode of N tokens; aggregate tokens/s =
              N * steps / (time in llama_decode). N = 8 and 32; n_seq_max = max(32, N).

Flash attention uses llama.cpp's default (LLAMA_FLASH_ATTN_TYPE_AUTO); what AUTO resolved to
is read from llama.cpp's log and reported. The batched decode is also run with flash attention
forced on and forced off (--no-fa-variants skips that).

The machine may be shared. Before each repetition the script waits (up to --wait-idle s) until
other processes use less than --idle-threshold cores, measures what they used during the
repetition (from /proc/stat), and redoes a disturbed repetition up to --retries times; a median
that still includes a disturbed repetition is marked '*' in the table, and every repetition's
value and foreign load is in the JSON. On a busy shared machine, give the benchmark its own
scheduler autogroup with a high weight instead of waiting (as root; the kernel's autogroups make
plain `nice` ineffective against other sessions' processes):

    setsid bash -c 'echo -20 > /proc/$$/autogroup; exec nice -n -20 \
        ~/.cache/tireless/peer-venv/bin/python bench/peer_llamacpp.py --wait-idle 0 --json ...'

Peak RSS is getrusage's ru_maxrss of this process (the
model is mmap'd, so its pages count once touched).
"""

import argparse
import ctypes
import json
import os
import platform
import re
import resource
import statistics
import sys
import time

import numpy as np

try:
    import llama_cpp
except ImportError:  # pragma: no cover
    sys.exit("peer_llamacpp: llama_cpp is not importable; run scripts/peer-llamacpp-setup and use "
             "~/.cache/tireless/peer-venv/bin/python")

DEFAULT_MODEL = os.path.expanduser("~/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf")

TEXT = (
    "The history of computing is a story of people who wanted to calculate faster than they "
    "could by hand. Early mechanical calculators used gears and levers; later machines used "
    "relays, vacuum tubes, transistors and finally integrated circuits holding billions of "
    "switches. Along the way programmers learned to describe work as sequences of simple "
    "instructions, and compilers learned to translate readable languages into those "
    "instructions. Today a small language model can run on an ordinary laptop, predicting one "
    "token after another, and the speed at which it does so depends on memory bandwidth, cache "
    "sizes, vector instructions and the care taken by the people who wrote its kernels. "
)

FA_NAMES = {llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO: "auto",
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED: "off",
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED: "on"}

# ---------------------------------------------------------------------------------------------
# llama.cpp log capture (kept to find what flash attention AUTO resolved to, the KV layout and
# any weight repacking); printed to stderr only with --verbose.

_log_lines = []
_log_partial = []
_verbose = False


@llama_cpp.llama_log_callback
def _log_cb(level, text, user_data):
    s = text.decode("utf-8", "replace") if text else ""
    if _verbose:
        sys.stderr.write(s)
    _log_partial.append(s)
    if s.endswith("\n"):
        _log_lines.append("".join(_log_partial).rstrip("\n"))
        _log_partial.clear()


def log_mark():
    return len(_log_lines)


def log_since(mark):
    return _log_lines[mark:]


# ---------------------------------------------------------------------------------------------

class Model:
    def __init__(self, path):
        mp = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            sys.exit(f"peer_llamacpp: cannot load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.model, buf, len(buf))
        self.desc = buf.value.decode()
        self.size = llama_cpp.llama_model_size(self.model)
        self.n_params = llama_cpp.llama_model_n_params(self.model)

    def tokenize(self, text, add_special=True):
        raw = text.encode()
        n_max = len(raw) + 16
        arr = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), arr, n_max, add_special, False)
        if n < 0:
            raise RuntimeError("tokenize failed")
        return list(arr[:n])

    def tokens_of_length(self, n, prefix=""):
        """n tokens: BOS (if the model adds one) + prefix + TEXT repeated, cut to n."""
        toks = self.tokenize(prefix + TEXT, add_special=True)
        more = self.tokenize(TEXT, add_special=False)
        while len(toks) < n:
            toks += more
        return toks[:n]

    def free(self):
        llama_cpp.llama_model_free(self.model)


class Context:
    def __init__(self, model, n_ctx, n_batch, n_ubatch, n_seq_max, threads, fa):
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.n_ubatch = n_ubatch
        p.n_seq_max = n_seq_max
        p.n_threads = threads
        p.n_threads_batch = threads
        if fa is not None:
            p.flash_attn_type = fa
        self.params = p
        mark = log_mark()
        self.ctx = llama_cpp.llama_init_from_model(model.model, p)
        if not self.ctx:
            sys.exit("peer_llamacpp: llama_init_from_model failed:\n" + "\n".join(log_since(mark)))
        self.log = log_since(mark)
        self.model = model

    def decode(self, batch):
        rc = llama_cpp.llama_decode(self.ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        llama_cpp.llama_synchronize(self.ctx)

    def argmax_ith(self, i):
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
        return int(np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).argmax())

    def free(self):
        llama_cpp.llama_free(self.ctx)


class Batch:
    def __init__(self, capacity, n_seq_max=1):
        self.b = llama_cpp.llama_batch_init(capacity, 0, n_seq_max)
        self.capacity = capacity

    def set(self, entries):
        """entries: list of (token, pos, seq_id, want_logits)."""
        assert len(entries) <= self.capacity
        b = self.b
        for i, (tok, pos, seq, out) in enumerate(entries):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if out else 0
        b.n_tokens = len(entries)
        return b

    def free(self):
        llama_cpp.llama_batch_free(self.b)


# ---------------------------------------------------------------------------------------------
# The three measurements. Each returns tokens/s of one repetition (plus details).

def run_decode(model, threads, fa, prompt_tokens, n_gen):
    prompt = model.tokens_of_length(prompt_tokens)
    ctx = Context(model, n_ctx=512, n_batch=512, n_ubatch=512, n_seq_max=1, threads=threads, fa=fa)
    batch = Batch(512)
    try:
        ctx.decode(batch.set([(t, i, 0, i == len(prompt) - 1) for i, t in enumerate(prompt)]))
        tok = ctx.argmax_ith(len(prompt) - 1)
        pos = len(prompt)
        t_decode = 0.0
        for _ in range(n_gen):
            b = batch.set([(tok, pos, 0, True)])
            t0 = time.perf_counter()
            ctx.decode(b)
            t_decode += time.perf_counter() - t0
            tok = ctx.argmax_ith(0)
            pos += 1
        return n_gen / t_decode, ctx.log
    finally:
        batch.free()
        ctx.free()


def run_prefill(model, threads, fa, n_prompt):
    prompt = model.tokens_of_length(n_prompt)
    ctx = Context(model, n_ctx=max(1024, n_prompt), n_batch=n_prompt, n_ubatch=n_prompt,
                  n_seq_max=1, threads=threads, fa=fa)
    batch = Batch(n_prompt)
    try:
        b = batch.set([(t, i, 0, i == n_prompt - 1) for i, t in enumerate(prompt)])
        t0 = time.perf_counter()
        ctx.decode(b)
        dt = time.perf_counter() - t0
        ctx.argmax_ith(n_prompt - 1)
        return n_prompt / dt, ctx.log
    finally:
        batch.free()
        ctx.free()


def run_batched(model, threads, fa, n_seqs, prompt_tokens, steps, kv_per_seq):
    n_seq_max = max(32, n_seqs)
    prompts = [model.tokens_of_length(prompt_tokens, prefix=f"Note {s}: ") for s in range(n_seqs)]
    n_prefill = n_seqs * prompt_tokens
    ctx = Context(model, n_ctx=n_seq_max * kv_per_seq, n_batch=max(512, n_prefill),
                  n_ubatch=512, n_seq_max=n_seq_max, threads=threads, fa=fa)
    batch = Batch(max(n_prefill, n_seqs), n_seq_max=1)
    try:
        entries = []
        last_index = []
        for s, p in enumerate(prompts):
            for i, t in enumerate(p):
                entries.append((t, i, s, i == len(p) - 1))
            last_index.append(len(entries) - 1)
        ctx.decode(batch.set(entries))
        toks = [ctx.argmax_ith(i) for i in last_index]
        pos = prompt_tokens
        t_decode = 0.0
        for _ in range(steps):
            b = batch.set([(toks[s], pos, s, True) for s in range(n_seqs)])
            t0 = time.perf_counter()
            ctx.decode(b)
            t_decode += time.perf_counter() - t0
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx.ctx),
                                           shape=(n_seqs, model.n_vocab))
            toks = [int(x) for x in logits.argmax(axis=1)]
            pos += 1
        return n_seqs * steps / t_decode, ctx.log
    finally:
        batch.free()
        ctx.free()


class CpuMonitor:
    """How many cores other processes kept busy over an interval: machine-wide busy time from
    /proc/stat minus this process's own CPU time. The machine may be shared (builds, tests);
    llama.cpp's OpenMP threads spin at barriers, so a second busy process can slow a 2-thread
    run many times over. Used to wait for a quiet machine and to redo disturbed repetitions."""

    def __init__(self):
        self.hz = os.sysconf("SC_CLK_TCK")

    def _sample(self):
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except OSError:
            return None
        busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
        t = os.times()
        return time.perf_counter(), busy / self.hz, t.user + t.system

    def start(self):
        self._s0 = self._sample()

    def foreign_cores(self):
        return self.stop()[0]

    def stop(self):
        """(cores other processes used, cores this process used) since start()."""
        s1 = self._sample()
        if self._s0 is None or s1 is None or s1[0] <= self._s0[0]:
            return 0.0, 0.0
        wall = s1[0] - self._s0[0]
        own = (s1[2] - self._s0[2]) / wall
        return max(0.0, (s1[1] - self._s0[1]) / wall - own), own

    def wait_idle(self, threshold, timeout):
        """Waits (in 1 s samples) until other processes use < threshold cores; returns the
        seconds waited and the last sample."""
        t0 = time.perf_counter()
        while True:
            self.start()
            time.sleep(1.0)
            f = self.foreign_cores()
            if f < threshold or time.perf_counter() - t0 >= timeout:
                return time.perf_counter() - t0, f


MON = CpuMonitor()
OPTS = argparse.Namespace(idle_threshold=0.15, wait_idle=120.0, retries=3, min_share=0.9)
NCPU = os.cpu_count() or 1


def measure(fn, reps, threads, *args):
    """One warm-up, then `reps` repetitions. A repetition is disturbed when other processes
    used more than the cores this run leaves spare (NCPU - threads) plus OPTS.idle_threshold,
    or when this process got less than OPTS.min_share of `threads` cores (it was preempted;
    llama.cpp's OpenMP workers spin, so an undisturbed run keeps all its threads on a core).
    A disturbed repetition is redone (after waiting for the machine to quieten) up to
    OPTS.retries extra times; a median that still includes one is marked disturbed."""
    fn(*args)  # warm-up: page in the mmap'd weights, let the thread pool start
    allowed = max(0, NCPU - threads) + OPTS.idle_threshold
    vals, foreign, share, discarded = [], [], [], []
    waited = 0.0
    log = None
    kept_bad = []
    for _ in range(reps):
        for attempt in range(OPTS.retries + 1):
            if OPTS.wait_idle > 0:
                w, _f = MON.wait_idle(allowed, OPTS.wait_idle)
                waited += w
            MON.start()
            v, log = fn(*args)
            f, own = MON.stop()
            bad = f > allowed or own < OPTS.min_share * threads
            if not bad or attempt == OPTS.retries:
                break
            discarded.append({"value": v, "foreign_cores": round(f, 3), "own_cores": round(own, 3)})
        vals.append(v)
        foreign.append(round(f, 3))
        share.append(round(own, 3))
        kept_bad.append(bad)
    print(f"    median {statistics.median(vals):.1f} tok/s  runs {[round(x, 1) for x in vals]}  "
          f"other procs {foreign} cores, own {share} cores, {len(discarded)} redone, "
          f"waited {waited:.0f} s", flush=True)
    return {"median": statistics.median(vals), "runs": vals, "foreign_cores": foreign,
            "own_cores": share, "disturbed": any(kept_bad), "discarded_runs": discarded,
            "waited_idle_s": round(waited, 1)}, log


# ---------------------------------------------------------------------------------------------

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def resolved_flash_attn(ctx_log):
    """What llama.cpp chose for flash attention, from its context-creation log."""
    for line in ctx_log:
        m = re.search(r"Flash Attention (enabled|disabled)", line) or \
            re.search(r"Flash Attention was auto, set to (\w+)", line)
        if m:
            return m.group(1)
    for line in ctx_log:
        m = re.search(r"flash_attn\s*=\s*(\w+)", line)
        if m:
            return m.group(1)
    return "unknown"


def read_autogroup():
    try:
        with open("/proc/self/autogroup") as f:
            return f.read().strip()
    except OSError:
        return None


def any_disturbed(obj):
    if isinstance(obj, dict):
        return bool(obj.get("disturbed")) or any(any_disturbed(v) for v in obj.values())
    return False


def main():
    global _verbose
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode-prompt-tokens", type=int, default=8)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--batch-sizes", default="8,32")
    ap.add_argument("--batch-prompt-tokens", type=int, default=16)
    ap.add_argument("--batch-steps", type=int, default=64)
    ap.add_argument("--kv-per-seq", type=int, default=256,
                    help="KV cells per sequence in the batched runs (n_ctx = n_seq_max * this)")
    ap.add_argument("--no-fa-variants", action="store_true",
                    help="skip the batched decode with flash attention forced on and off")
    ap.add_argument("--idle-threshold", type=float, default=0.15,
                    help="cores other processes may use during a repetition before it is redone")
    ap.add_argument("--min-share", type=float, default=0.9,
                    help="fraction of its threads' cores this process must get in a repetition")
    ap.add_argument("--wait-idle", type=float, default=120.0,
                    help="seconds to wait for a quiet machine before each repetition (0: don't)")
    ap.add_argument("--retries", type=int, default=3,
                    help="times a disturbed repetition is redone")
    ap.add_argument("--json", help="write every number to this path")
    ap.add_argument("--verbose", action="store_true", help="show llama.cpp's log")
    args = ap.parse_args()
    _verbose = args.verbose
    OPTS.idle_threshold, OPTS.wait_idle, OPTS.retries = args.idle_threshold, args.wait_idle, args.retries
    OPTS.min_share = args.min_share

    llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    sysinfo = llama_cpp.llama_print_system_info().decode().strip()

    threads = [int(x) for x in args.threads.split(",")]
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    mark = log_mark()
    model = Model(args.model)
    load_log = log_since(mark)

    dflt = llama_cpp.llama_context_default_params()
    defaults = {"flash_attn_type": FA_NAMES.get(dflt.flash_attn_type, dflt.flash_attn_type),
                "n_batch": dflt.n_batch, "n_ubatch": dflt.n_ubatch,
                "kv_unified": bool(dflt.kv_unified), "type_k": dflt.type_k, "type_v": dflt.type_v}

    print(f"llama-cpp-python {llama_cpp.__version__}", flush=True)
    print(f"system info: {sysinfo}")
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs)")
    print(f"model: {args.model}\n       {model.desc}, {model.n_params/1e6:.1f} M params, "
          f"{model.size/2**20:.1f} MiB, vocab {model.n_vocab}")
    print(f"context defaults: {defaults}")

    res = {"threads": {}}
    fa_resolved = None
    fa_variants = [] if args.no_fa_variants else [llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                                                  llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED]
    t_start = time.perf_counter()
    for t in threads:
        r = {}
        print(f"\n[threads={t}] decode ...", flush=True)
        r["decode_tps"], log = measure(run_decode, args.reps, t, model, t, None,
                                       args.decode_prompt_tokens, args.decode_tokens)
        fa_resolved = resolved_flash_attn(log)
        print(f"[threads={t}] prefill ...", flush=True)
        r["prefill_tps"], _ = measure(run_prefill, args.reps, t, model, t, None, args.prefill_tokens)
        r["batched_decode_tps"] = {}
        for n in batch_sizes:
            print(f"[threads={t}] batched decode x{n} ...", flush=True)
            r["batched_decode_tps"][str(n)], blog = measure(
                run_batched, args.reps, t, model, t, None, n, args.batch_prompt_tokens,
                args.batch_steps, args.kv_per_seq)
        r["batched_ctx_log"] = [l for l in blog if "llama_context" in l or "kv" in l.lower()]
        for fa in fa_variants:
            key = f"batched_decode_tps_flash_attn_{FA_NAMES[fa]}"
            r[key] = {}
            for n in batch_sizes:
                print(f"[threads={t}] batched decode x{n}, flash_attn {FA_NAMES[fa]} ...", flush=True)
                r[key][str(n)], _ = measure(run_batched, args.reps, t, model, t, fa, n,
                                            args.batch_prompt_tokens, args.batch_steps,
                                            args.kv_per_seq)
        res["threads"][str(t)] = r
    elapsed = time.perf_counter() - t_start

    peak_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux

    # ---- table
    def fmt(m):
        return f"{m['median']:9.1f}" + ("*" if m["disturbed"] else " ")

    cols = [str(t) for t in threads]
    rows = [(f"decode, batch 1 ({args.decode_tokens} tokens)", "decode_tps", None),
            (f"prefill, {args.prefill_tokens}-token prompt (1 ubatch)", "prefill_tps", None)]
    for n in batch_sizes:
        rows.append((f"batched decode, {n} seqs x {args.batch_steps} steps", "batched_decode_tps", str(n)))
    for fa in fa_variants:
        for n in batch_sizes:
            rows.append((f"  same, {n} seqs, flash_attn {FA_NAMES[fa]}",
                         f"batched_decode_tps_flash_attn_{FA_NAMES[fa]}", str(n)))
    w = max(len(r[0]) for r in rows)
    print(f"\nllama.cpp (llama-cpp-python {llama_cpp.__version__}), tokens/s, median of {args.reps}; "
          f"flash_attn default = {defaults['flash_attn_type']} -> {fa_resolved}")
    print(f"{'':{w}}  " + "  ".join(f"{'threads=' + c:>11}" for c in cols))
    for label, key, sub in rows:
        cells = []
        for c in cols:
            m = res["threads"][c][key]
            if sub is not None:
                m = m[sub]
            cells.append(f"{fmt(m):>11}")
        print(f"{label:{w}}  " + "  ".join(cells))
    if any_disturbed(res):
        print("* some kept repetition was disturbed by other processes (machine busy); "
              "see foreign_cores / own_cores in the JSON")
    print(f"peak RSS: {peak_rss_kib/1024:.1f} MiB (model file mmap'd: {model.size/2**20:.1f} MiB of "
          f"tensors); wall time {elapsed:.0f} s")

    out = {
        "peer": "llama.cpp",
        "llama_cpp_python_version": llama_cpp.__version__,
        "system_info": sysinfo,
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "model": {"path": args.model, "desc": model.desc, "n_params": model.n_params,
                  "size_bytes": model.size, "n_vocab": model.n_vocab},
        "settings": {
            "threads": threads, "n_threads_equals_n_threads_batch": True, "reps": args.reps,
            "statistic": "median", "warmup_runs": 1,
            "decode_prompt_tokens": args.decode_prompt_tokens, "decode_tokens": args.decode_tokens,
            "prefill_tokens": args.prefill_tokens,
            "prefill_chunking": f"single llama_decode, n_batch = n_ubatch = {args.prefill_tokens} "
                                "(one ubatch), logits for the last token only",
            "batch_sizes": batch_sizes, "batch_prompt_tokens": args.batch_prompt_tokens,
            "batch_steps": args.batch_steps, "batched_n_seq_max": [max(32, n) for n in batch_sizes],
            "batched_n_ctx": [max(32, n) * args.kv_per_seq for n in batch_sizes],
            "timing": "llama_decode + llama_synchronize only (argmax sampling excluded); "
                      "fresh context (fresh KV) per repetition",
            "idle_threshold_cores": args.idle_threshold, "wait_idle_s": args.wait_idle,
            "retries": args.retries, "min_share": args.min_share,
            "nice": os.getpriority(os.PRIO_PROCESS, 0), "autogroup": read_autogroup(),
            "context_defaults": defaults,
            "flash_attn_default": defaults["flash_attn_type"],
            "flash_attn_default_resolved": fa_resolved,
        },
        "results": res,
        "peak_rss_kib": peak_rss_kib,
        "wall_s": elapsed,
        "model_load_log": [l for l in load_log if re.search(r"repack|CPU_REPACK|buffer size|file type", l)],
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")
    model.free()
    llama_cpp.llama_backend_free()


if __name__ == "__main__":
    main()
