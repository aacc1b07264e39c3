#!/usr/bin/env python3
"""Turn a dense llama-layout GGUF (SmolLM2) into a Mixtral-layout mixture of experts.

    tools/upcycle_moe.py DENSE.gguf OUT.gguf --experts 8 --used 2 [--perturb 0.02] [--skew 1.0] [--seed 1]

Sparse upcycling: every layer's feed-forward block becomes --experts experts
(blk.N.ffn_{gate,up,down}_exps, 3-D, in the dense block's own weight types) that start as
copies of it, and a router (blk.N.ffn_gate_inp, F32) that sends each token to --used of them
(softmax over all experts, top-k, weights renormalized: llama.cpp's and tireless's Mixtral
routing). Everything else (attention, embeddings, tokenizer, chat template) is copied as is.

- --perturb 0: the experts are byte-for-byte copies. Whatever the router picks, the weighted sum
  of k equal outputs with weights summing to 1 is the dense output, so greedy text equals the
  dense model's (tests/moe/test_upcycle.py checks it through tireless).
- --perturb S: each expert's weights get Gaussian noise of S times the weight's RMS, then are
  requantized to the original type: experts differ, text stays sensible for small S.
- --skew A: how unevenly the router spreads tokens. Expert j's target share is proportional
  to (j + 1) ** -A (Zipf; 0: even). The router is calibrated on the hidden states of a short
  text run through the numpy reference forward pass (tests/reference): its weights are random
  directions (so tokens spread over experts) plus, per expert, the layer's mean hidden state
  scaled to give that expert its logit offset log(share). The shares reached on the
  calibration tokens are printed per layer, max/mean over experts.

The routing is deterministic for a given --seed. Needs numpy and gguf (PyPI).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
from reference_forward import ReferenceModel, dequantize_tensor  # noqa: E402

FFN = ("ffn_gate", "ffn_up", "ffn_down")
FLOAT_TYPES = (QT.F32, QT.F16)


def calibration_tokens() -> list[list[int]]:
    """SmolLM2's reference prompts and their greedy continuations (tests/reference/prompts.json)."""
    with open(os.path.join(HERE, "..", "tests", "reference", "prompts.json")) as f:
        prompts = json.load(f)["prompts"]
    return [p["ids"] + p["greedy_ids"] for p in prompts]


def ffn_inputs(dense_path: str, sequences: list[list[int]]) -> list[np.ndarray]:
    """Per layer, the feed-forward block's input (the normed hidden state) at every token."""
    model = ReferenceModel(dense_path, dtype=np.float32)
    seen: list[list[np.ndarray]] = [[] for _ in range(model.hp.n_layer)]
    dense_ffn = model.ffn

    def recording_ffn(il, h):
        seen[il].append(np.array(h, dtype=np.float32))
        return dense_ffn(il, h)

    model.ffn = recording_ffn
    for ids in sequences:
        model.forward(ids)
    return [np.concatenate(x) for x in seen]


def router(h: np.ndarray, n_expert: int, skew: float, rng: np.random.Generator) -> np.ndarray:
    """Router weights (n_expert, n_embd): logits spread tokens across experts, expert j offset
    by log of its Zipf share."""
    n, e = h.shape
    mean = h.mean(axis=0)
    centered = h - mean
    directions = rng.standard_normal((n_expert, e)).astype(np.float32)
    # each direction's logit has unit spread over the calibration tokens
    spread = np.std(centered @ directions.T, axis=0)
    directions /= np.maximum(spread, 1e-12)[:, None]
    directions -= np.outer(directions @ mean, mean) / float(mean @ mean)  # no offset of their own
    share = (np.arange(n_expert) + 1.0) ** -skew
    share /= share.sum()
    offset = np.log(share) - np.log(share).mean()
    return (directions + np.outer(offset, mean) / float(mean @ mean)).astype(np.float32)


def routing_shares(h: np.ndarray, w: np.ndarray, k: int) -> np.ndarray:
    logits = h @ w.T
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    return np.bincount(top.reshape(-1), minlength=w.shape[0]) / top.size


def expert_bytes(t, n_expert: int, perturb: float, rng: np.random.Generator) -> tuple[np.ndarray, QT]:
    """The 3-D expert tensor's data (numpy order: experts first) in the dense weight's type."""
    qtype = QT(t.tensor_type)
    raw = np.asarray(t.data)
    if perturb == 0:
        return np.ascontiguousarray(np.broadcast_to(raw, (n_expert,) + raw.shape)), qtype
    w = dequantize_tensor(t)
    rms = float(np.sqrt(np.mean(w * w)))
    out = []
    for _ in range(n_expert):
        v = w + rng.standard_normal(w.shape).astype(np.float32) * (perturb * rms)
        if qtype == QT.F32:
            out.append(v.astype(np.float32))
        elif qtype == QT.F16:
            out.append(v.astype(np.float16))
        else:
            out.append(gguf.quants.quantize(v, qtype))
    return np.stack(out), qtype


def upcycle(dense: str, out: str, n_expert: int, n_used: int, perturb: float, skew: float, seed: int) -> dict:
    reader = gguf.GGUFReader(dense)
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise SystemExit(f"upcycle_moe: {dense} is a {arch!r} model; only llama-layout dense models are supported")
    names = {t.name for t in reader.tensors}
    if any("ffn_gate_inp" in n for n in names):
        raise SystemExit(f"upcycle_moe: {dense} is already a mixture of experts")
    n_layer = int(reader.fields["llama.block_count"].contents())
    missing = [f"blk.{i}.{f}.weight" for i in range(n_layer) for f in FFN if f"blk.{i}.{f}.weight" not in names]
    if missing:
        raise SystemExit(f"upcycle_moe: {dense} lacks {', '.join(missing[:3])}: not a llama-layout dense model")
    if not 1 <= n_used <= n_expert:
        raise SystemExit(f"upcycle_moe: --used must be from 1 to --experts ({n_expert}), not {n_used}")

    rng = np.random.default_rng(seed)
    h = ffn_inputs(dense, calibration_tokens())
    routers = [router(h[i], n_expert, skew, rng) for i in range(n_layer)]
    shares = [routing_shares(h[i], routers[i], n_used) for i in range(n_layer)]

    writer = gguf.GGUFWriter(out, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name in ("llama.expert_count", "llama.expert_used_count"):
            continue
        value = field.contents()
        if field.name == gguf.Keys.General.NAME:
            value = f"{value} upcycled {n_expert}x{n_used}"
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    writer.add_expert_count(n_expert)
    writer.add_expert_used_count(n_used)

    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in FFN:
            il, kind = int(parts[1]), parts[2]
            if kind == "ffn_gate":
                writer.add_tensor(f"blk.{il}.ffn_gate_inp.weight", routers[il])
            data, qtype = expert_bytes(t, n_expert, perturb, rng)
            name = f"blk.{il}.{kind}_exps.weight"
            if qtype in FLOAT_TYPES:
                writer.add_tensor(name, data)
            else:
                writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
            continue
        data = np.asarray(t.data)
        if QT(t.tensor_type) in FLOAT_TYPES:
            writer.add_tensor(t.name, data)
        else:
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=QT(t.tensor_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    imbalance = [float(s.max() * n_expert) for s in shares]
    return {"layers": n_layer, "experts": n_expert, "used": n_used, "perturb": perturb, "skew": skew,
            "calibration_tokens": int(h[0].shape[0]), "max_over_mean_share": imbalance,
            "hottest_share": [float(s.max()) for s in shares]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dense", help="a dense llama-layout GGUF (e.g. SmolLM2-135M-Instruct.Q4_1.gguf)")
    p.add_argument("out", help="the MoE GGUF to write")
    p.add_argument("--experts", type=int, default=8, help="experts per layer (default 8)")
    p.add_argument("--used", type=int, default=2, help="experts per token (default 2)")
    p.add_argument("--perturb", type=float, default=0.0,
                   help="noise on each expert's weights, times the weight's RMS (default 0: exact copies)")
    p.add_argument("--skew", type=float, default=0.0, help="Zipf exponent of the experts' target shares (default 0: even)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if a.experts < 1 or a.experts > 256:
        p.error("--experts must be from 1 to 256")
    if a.perturb < 0 or a.skew < 0:
        p.error("--perturb and --skew must be 0 or more")
    report = upcycle(a.dense, a.out, a.experts, a.used, a.perturb, a.skew, a.seed)
    imb = report["max_over_mean_share"]
    print(f"wrote {a.out}: {report['layers']} layers x {a.experts} experts, {a.used} per token; "
          f"perturb {a.perturb}, skew {a.skew}; on {report['calibration_tokens']} calibration tokens the "
          f"hottest expert's share is {min(imb):.2f}..{max(imb):.2f} x the mean (per layer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
