#!/usr/bin/env python3
"""The MoE upcycled from SmolLM2 by tools/upcycle_moe.py, checked three ways.

  test_upcycle.py --generate build/tools/tireless-generate \
      --logits-tool build/tests/support/tireless-logits --model SmolLM2-135M-Instruct.Q4_1.gguf

1. Exact copies (--perturb 0, 4 experts, a skewed router). One expert per token: tireless's
   greedy text equals the dense model's for every reference prompt, bit for bit. Two per
   token: the float64 reference gives the dense logits, and tireless's greedy tokens agree
   with the dense model's wherever the choice is not a near-tie (float32 rounds w1 y + w2 y).
2. Perturbed experts (--perturb 0.05): tireless's logits are as close to the reference's as
   the dense model's are (SmolLM2's per-sequence bound), and far from the dense model's; the
   greedy text is still text.
3. The router's skew: the hottest expert's share of the calibration tokens grows with --skew,
   and so does the imbalance tireless counts itself (tireless-generate --expert-stats).

Exits 77 (skipped) without the model, numpy or gguf.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
try:
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from reference_forward import ReferenceModel  # noqa: E402
    import upcycle_moe  # noqa: E402
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def generate(tool: str, model: str, text: str, n: int) -> str:
    p = subprocess.run([tool, "-m", model, "--prompt", text, "-n", str(n), "--temperature", "0", "-q", "-t", "2"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{tool} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def tireless_logits(tool: str, model: str, tokens: list[int], n_vocab: int, tmp: str) -> np.ndarray:
    out = os.path.join(tmp, "logits.f32")
    p = subprocess.run([tool, model, "--tokens", ",".join(map(str, tokens)), "--out", out, "--mode", "decode",
                        "--threads", "2"], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"tireless-logits failed ({p.returncode}): {p.stderr.strip()}")
    return np.fromfile(out, dtype=np.float32).reshape(len(tokens), n_vocab)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generate", required=True)
    ap.add_argument("--logits-tool", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    a = ap.parse_args(argv)
    if not os.path.exists(a.model):
        print(f"skipped: no model at {a.model} (scripts/fetch-model)")
        return 77
    with open(os.path.join(ROOT, "tests", "reference", "prompts.json")) as f:
        prompts = json.load(f)["prompts"]
    if os.environ.get("TIRELESS_SANITIZED"):
        # The model runs ~25x slower under ASan: three prompts and fewer tokens keep the checks.
        prompts[:] = prompts[:3]
        a.tokens = min(a.tokens, 12)
    with tempfile.TemporaryDirectory(prefix="tireless-moe-") as tmp:
        # 1. Exact copies. Top-1: the one expert's weight is exactly 1, so every float is the
        # dense model's and greedy tokens must be equal, bit for bit.
        top1 = os.path.join(tmp, "top1.gguf")
        upcycle_moe.upcycle(a.model, top1, 4, 1, 0.0, 1.5, 1)
        for p in prompts:
            dense_text = generate(a.generate, a.model, p["text"], a.tokens)
            moe_text = generate(a.generate, top1, p["text"], a.tokens)
            check(moe_text == dense_text, f"tireless greedy, top-1, {p['name']}: MoE {moe_text[:50]!r} == dense "
                                          f"{dense_text[:50]!r}")
        # Top-2: w1 y + w2 y with w1 + w2 = 1 is y in exact arithmetic (the float64 reference
        # must show no difference) but not in float32, where SmolLM2 amplifies one rounding
        # into logit changes of ~0.3 std (tests/reference/check_logits.py): greedy tokens must
        # agree wherever the dense model's top-2 gap is at least 0.75 logits (check_logits' rule).
        exact = os.path.join(tmp, "exact.gguf")
        report = upcycle_moe.upcycle(a.model, exact, 4, 2, 0.0, 1.5, 1)
        seq = prompts[0]["ids"] + prompts[0]["greedy_ids"][:8]
        dense_ref = ReferenceModel(a.model).logits(seq)
        moe_ref = ReferenceModel(exact)
        check(moe_ref.hp.n_expert == 4 and moe_ref.hp.n_expert_used == 2, "the file is a 4-expert, top-2 MoE")
        spread = float(np.std(dense_ref))
        diff = float(np.max(np.abs(moe_ref.logits(seq) - dense_ref)))
        check(diff <= 1e-6 * spread, f"reference (float64): exact-copy top-2 MoE logits equal the dense ones "
                                     f"(max diff {diff:.2e}, spread {spread:.2f})")
        del moe_ref
        for p in prompts:
            forced = p["ids"] + p["greedy_ids"]
            d = tireless_logits(a.logits_tool, a.model, forced, len(dense_ref[0]), tmp)
            m = tireless_logits(a.logits_tool, exact, forced, len(dense_ref[0]), tmp)
            bad = []
            for i in range(len(p["ids"]) - 1, len(forced) - 1):
                top2 = np.sort(d[i])[-2:]
                if top2[1] - top2[0] >= 0.75 and int(np.argmax(m[i])) != int(np.argmax(d[i])):
                    bad.append(i)
                if m[i][int(np.argmax(d[i]))] < m[i].max() - 0.75:
                    bad.append(i)
            check(not bad, f"tireless top-2, {p['name']}: greedy tokens agree with the dense model's "
                           f"({len(forced) - len(p['ids'])} positions{'; differ at ' + str(bad) if bad else ''})")

        # 2. Perturbed experts, checked against the reference with tireless's roundings
        # (float32, q8 activations): ours must be as close to it as the dense model's logits are
        # to theirs (SmolLM2's per-sequence bound, rms <= 0.075 of the spread), and much closer to
        # it than to the unperturbed model's (the experts really differ).
        perturbed = os.path.join(tmp, "perturbed.gguf")
        upcycle_moe.upcycle(a.model, perturbed, 4, 2, 0.05, 1.5, 1)

        def rms(x, ref):
            return float(np.sqrt(np.mean((x - ref) ** 2)) / np.std(ref))

        ref_dense = ReferenceModel(a.model, dtype=np.float32, numerics="tireless").logits(seq)
        ref = ReferenceModel(perturbed, dtype=np.float32, numerics="tireless").logits(seq)
        ours = tireless_logits(a.logits_tool, perturbed, seq, len(dense_ref[0]), tmp)
        near, far = rms(ours, ref), rms(ours, ref_dense)
        check(near <= 0.075 and near < 0.5 * far, f"tireless's logits on the perturbed MoE: rms {near:.3f} of the "
                                                  f"spread from the reference's (bound 0.075), {far:.3f} from the "
                                                  f"dense model's")
        text = generate(a.generate, perturbed, prompts[2]["text"], a.tokens)
        letters = sum(c.isalpha() or c.isspace() for c in text) / max(len(text), 1)
        check(len(text.strip()) > 0 and letters > 0.7, f"perturbed MoE still writes text: {text.strip()[:80]!r}")

        # 3. Skew.
        even = upcycle_moe.upcycle(a.model, os.path.join(tmp, "even.gguf"), 4, 2, 0.0, 0.0, 1)
        hot_even = float(np.mean(even["hottest_share"]))
        hot_skew = float(np.mean(report["hottest_share"]))
        check(hot_skew > hot_even + 0.05, f"--skew 1.5 makes the hottest expert hotter: {hot_skew:.2f} of the "
                                          f"routed slots vs {hot_even:.2f} at --skew 0")
        # ... and tireless's own counts (backend::expert_tokens, tireless-generate --expert-stats) see it.
        seen = {}
        for name in ("exact", "even"):
            p = subprocess.run([a.generate, "-m", os.path.join(tmp, name + ".gguf"), "--prompt", prompts[2]["text"],
                                "-n", "24", "--temperature", "0", "-q", "-t", "2", "--expert-stats", "2"],
                               capture_output=True, text=True, timeout=600)
            m = re.search(r"experts ([0-9.]+) \(worst", p.stderr)
            check(p.returncode == 0 and m is not None, f"--expert-stats prints the imbalance ({name}): {p.stderr.strip()[-200:]!r}")
            seen[name] = float(m.group(1)) if m else 0.0
        check(seen["exact"] > seen["even"], f"tireless counts the skew: experts max/mean {seen['exact']:.2f} at "
                                            f"--skew 1.5, {seen['even']:.2f} at --skew 0")
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
