#!/usr/bin/env python3
"""Independent numpy reference forward pass for Llama-family GGUF models (dense and
Mixtral-style MoE), with llama.cpp semantics.

It reads the file with gguf.GGUFReader, dequantizes every weight with
gguf.quants.dequantize (the numpy dequantizers maintained with llama.cpp) and computes the
logits of every position of a token sequence with causal attention.

Precision: all activations and arithmetic are float64 by default. The weights are the exact
float32 values gguf's dequantizers produce (the same values ggml's dequantize_row_* produce),
widened to float64. Computing in float64 makes the reference's own rounding error negligible
(~1e-12 relative), so any difference against tireless is tireless's own (accumulation order,
f16 intermediates, quantized activations as in ggml's q8 dot products). `--dtype float32`
halves memory and time when that matters more.

Numerics (`--numerics`, constructor argument `numerics`):
  exact     (default) the float forward pass above: activations enter every matrix product
            unrounded and the KV cache holds keys and values at full precision.
  tireless  emulates the roundings that tireless (like llama.cpp) applies by design, so that
            what remains against tireless is float32 accumulation noise:
            - before each product with a block-quantized matrix (Q4_0, Q4_1, Q8_0 ...: every
              type but F32/F16/BF16), including the MoE experts, the router if it is
              quantized and the output (LM-head) matrix, the activations are rounded to 8 bits
              per block of 32 values along the input dimension (zero-padded), in float32:
              amax = max|x|, d = amax / 127, q = round-half-even(x * (127 / amax)), value
              q * d (an all-zero block stays zero). Float-typed matrices take the float
              activations.
            - keys (after RoPE) and values are rounded to fp16 as they enter the KV cache.
            Float noise still moves the odd value across a rounding boundary. On the tiny test
            models that leaves most positions within ~1e-5 of tireless. On SmolLM2 the flips
            cascade, and agreement is only statistical (see check_logits.py).

Semantics (llama.cpp, LLM_ARCH_LLAMA):
  x = token_embd[tokens]
  per layer:
    h = rmsnorm(x) * attn_norm                      rmsnorm(x) = x / sqrt(mean(x^2) + eps)
    q, k, v = Wq h, Wk h, Wv h                      W: ggml [in, out] -> numpy (out, in)
    RoPE "normal" mode on q, k: adjacent pairs (x[2i], x[2i+1]) rotated by
      pos * base^(-2i / rope_dim), i < rope_dim / 2; dims >= rope_dim pass through
    attention: head h uses KV head h // (n_head / n_head_kv), scale 1/sqrt(head_dim), causal
    x = x + Wo attn
    h = rmsnorm(x) * ffn_norm
    dense: x = x + down(silu(gate h) * up h)
    MoE:   p = softmax(ffn_gate_inp h) over all experts; top-k by p; renormalize the k
           weights to sum 1; x = x + sum_e w_e down_e(silu(gate_e h) * up_e h)
  logits = W_out rmsnorm(x) * output_norm, W_out = output.weight or token_embd.weight (tied)

CLI:
  reference_forward.py --model M.gguf --tokens 1,2,3 --out logits.npy [--last-only]
      writes float32 logits, shape (n_tokens, n_vocab) or (1, n_vocab)
  reference_forward.py --model M.gguf --tokens 1,2,3 --greedy N
      greedily extends the sequence by N tokens and prints the generated ids
  --text / --chat (needs the PyPI package `tokenizers`): build the prompt from text with a
      byte-level BPE tokenizer made from the file's vocabulary (for validation only).
  reference_forward.py --model SmolLM2-135M-Instruct.Q4_1.gguf --make-prompts prompts.json
      regenerates tests/reference/prompts.json (needs `tokenizers`).

  --numerics exact|tireless: see Numerics above (default exact).

Importable: ReferenceModel(path[, numerics="tireless"]).logits(tokens) / .greedy(tokens, n).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field

# Single-threaded BLAS unless the caller says otherwise: the matrices here are small, and a
# multithreaded OpenBLAS spinning on cores that a parallel build or test run also uses was
# measured 10x slower (0.3 s -> 4 s for a 30-token forward of SmolLM2-135M).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402


# --------------------------------------------------------------------------------------------
# Reading and dequantizing

# Types that matrix products read with float activations; every other (block-quantized)
# type reads activations rounded by q8_round() under the `tireless` numerics.
FLOAT_TYPES = (QT.F32, QT.F16, QT.BF16)
NUMERICS = ("exact", "tireless")


def q8_round(x: np.ndarray) -> np.ndarray:
    """x rounded as tireless (and ggml's quantize_row_q8_0) rounds activations for a product
    with a block-quantized matrix: per block of 32 values along the last axis (zero-padded),
    in float32, d = amax / 127, q = round-half-even(x * (127 / amax)), value q * d (amax = 0
    gives 0). Returned in x's dtype."""
    n = x.shape[-1]
    x32 = x.astype(np.float32)
    pad = (-n) % 32
    if pad:
        x32 = np.concatenate([x32, np.zeros(x.shape[:-1] + (pad,), np.float32)], axis=-1)
    b = x32.reshape(x.shape[:-1] + (-1, 32))
    amax = np.max(np.abs(b), axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv)  # float32 product, round half to even like nearbyintf
    out = (q * d).reshape(x32.shape)[..., :n]
    return out.astype(x.dtype)


def _field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def dequantize_tensor(t) -> np.ndarray:
    """A ReaderTensor as float32 in numpy order: the reverse of its ggml shape, so a matrix
    of ggml shape [in, out] becomes (out, in) and y = W @ x."""
    expected = tuple(int(d) for d in reversed(t.shape))
    if t.tensor_type == QT.F32:
        w = np.asarray(t.data, dtype=np.float32)
    elif t.tensor_type == QT.F16:
        w = np.asarray(t.data).astype(np.float32)
    else:
        # the reader gives block bytes shaped (..., rows, bytes_per_row) as uint8
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    if w.shape != expected:  # the reader's data is already in numpy order: no reshape needed
        raise ValueError(f"{t.name}: dequantized shape {w.shape}, expected {expected}")
    return w


@dataclass
class HParams:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dim: int
    rope_base: float
    eps: float
    n_ctx: int
    n_expert: int = 0
    n_expert_used: int = 0


@dataclass
class KVCache:
    """Keys (after RoPE) and values per layer, each (n_head_kv, n_past, head_dim)."""
    k: list = field(default_factory=list)
    v: list = field(default_factory=list)

    @property
    def n_past(self) -> int:
        return 0 if not self.k else self.k[0].shape[1]


class ReferenceModel:
    def __init__(self, path: str, dtype=np.float64, numerics: str = "exact"):
        if numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, not {numerics!r}")
        self.path = path
        self.dtype = np.dtype(dtype)
        self.numerics = numerics
        self.reader = gguf.GGUFReader(path)
        r = self.reader
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"unsupported architecture {arch!r} (only 'llama')")
        self.tensors = {t.name: t for t in r.tensors}
        a = arch + "."
        n_embd = int(_field(r, a + "embedding_length"))
        n_head = int(_field(r, a + "attention.head_count"))
        n_head_kv = int(_field(r, a + "attention.head_count_kv", n_head))
        head_dim = int(_field(r, a + "attention.key_length", n_embd // n_head))
        if int(_field(r, a + "attention.value_length", head_dim)) != head_dim:
            raise ValueError("value_length != key_length is not supported")
        scaling = _field(r, a + "rope.scaling.type", "none")
        if scaling not in ("none", None) and float(_field(r, a + "rope.scaling.factor", 1.0)) != 1.0:
            raise ValueError(f"rope scaling {scaling!r} is not supported")
        tok_embd = self.tensors["token_embd.weight"]
        n_vocab = int(tok_embd.shape[1])
        self.hp = HParams(
            n_vocab=n_vocab,
            n_embd=n_embd,
            n_layer=int(_field(r, a + "block_count")),
            n_ff=int(_field(r, a + "feed_forward_length")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            rope_dim=int(_field(r, a + "rope.dimension_count", head_dim)),
            rope_base=float(_field(r, a + "rope.freq_base", 10000.0)),
            eps=float(_field(r, a + "attention.layer_norm_rms_epsilon", 1e-5)),
            n_ctx=int(_field(r, a + "context_length", 2048)),
            n_expert=int(_field(r, a + "expert_count", 0)),
            n_expert_used=int(_field(r, a + "expert_used_count", 0)),
        )
        hp = self.hp
        if int(tok_embd.shape[0]) != n_embd:
            raise ValueError("token_embd.weight shape does not match embedding_length")
        if n_head % n_head_kv:
            raise ValueError("head_count is not a multiple of head_count_kv")
        if hp.rope_dim % 2 or hp.rope_dim > head_dim:
            raise ValueError("bad rope.dimension_count")
        self.tied = "output.weight" not in self.tensors
        self._cache: dict[str, np.ndarray] = {}
        self.routing_gaps: list[tuple[int, float]] = []  # MoE only, from the last forward()
        # RoPE inverse frequencies base^(-2i/rope_dim)
        i = np.arange(hp.rope_dim // 2, dtype=np.float64)
        self._inv_freq = hp.rope_base ** (-2.0 * i / hp.rope_dim)

    # weights, dequantized once and cached
    def w(self, name: str) -> np.ndarray:
        a = self._cache.get(name)
        if a is None:
            a = dequantize_tensor(self.tensors[name]).astype(self.dtype, copy=False)
            self._cache[name] = a
        return a

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        """The activations a product with weight `name` reads: x itself, or under the
        `tireless` numerics x rounded by q8_round() when that weight is block-quantized."""
        if self.numerics == "tireless" and self.tensors[name].tensor_type not in FLOAT_TYPES:
            return q8_round(x)
        return x

    def mm(self, x: np.ndarray, name: str) -> np.ndarray:
        """x @ W.T for the 2-D weight `name`, with the activations act() gives."""
        return self.act(x, name) @ self.w(name).T

    def kv_round(self, a: np.ndarray) -> np.ndarray:
        """A key or value as the KV cache stores it: fp16 under the `tireless` numerics."""
        if self.numerics == "tireless":
            return a.astype(np.float16).astype(self.dtype)
        return a

    def load_all(self) -> None:
        for name in self.tensors:
            self.w(name)

    # building blocks
    def rmsnorm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.hp.eps) * weight

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: (n_tokens, n_heads, head_dim); normal (non-NeoX) mode: adjacent pairs."""
        rd = self.hp.rope_dim
        theta = pos.astype(np.float64)[:, None] * self._inv_freq[None, :]  # (n, rd/2)
        cos = np.cos(theta).astype(self.dtype)[:, None, :]
        sin = np.sin(theta).astype(self.dtype)[:, None, :]
        out = x.copy()
        x0 = x[..., 0:rd:2]
        x1 = x[..., 1:rd:2]
        out[..., 0:rd:2] = x0 * cos - x1 * sin
        out[..., 1:rd:2] = x0 * sin + x1 * cos
        return out

    @staticmethod
    def silu(x: np.ndarray) -> np.ndarray:
        return x / (1.0 + np.exp(-x))

    @staticmethod
    def softmax(x: np.ndarray, axis=-1) -> np.ndarray:
        m = np.max(x, axis=axis, keepdims=True)
        e = np.exp(x - m)
        return e / np.sum(e, axis=axis, keepdims=True)

    def attention(self, il: int, h: np.ndarray, pos: np.ndarray, cache: KVCache) -> np.ndarray:
        hp = self.hp
        n = h.shape[0]
        H, KV, D = hp.n_head, hp.n_head_kv, hp.head_dim
        p = f"blk.{il}."
        q = self.mm(h, p + "attn_q.weight").reshape(n, H, D)
        k = self.mm(h, p + "attn_k.weight").reshape(n, KV, D)
        v = self.kv_round(self.mm(h, p + "attn_v.weight").reshape(n, KV, D))
        q = self.rope(q, pos)
        k = self.kv_round(self.rope(k, pos))
        k = k.transpose(1, 0, 2)  # (KV, n, D)
        v = v.transpose(1, 0, 2)
        if len(cache.k) > il:
            cache.k[il] = np.concatenate([cache.k[il], k], axis=1)
            cache.v[il] = np.concatenate([cache.v[il], v], axis=1)
        else:
            cache.k.append(k)
            cache.v.append(v)
        K, V = cache.k[il], cache.v[il]  # (KV, T, D)
        T = K.shape[1]
        G = H // KV  # query heads per KV head: head h uses KV head h // G
        qg = q.reshape(n, KV, G, D).transpose(1, 2, 0, 3)  # (KV, G, n, D)
        scores = np.einsum("kgnd,ktd->kgnt", qg, K) * (1.0 / math.sqrt(D))  # python float: keeps dtype
        key_pos = np.arange(T)  # cache positions 0..T-1
        mask = key_pos[None, :] > pos[:, None]  # (n, T): future keys
        scores = np.where(mask[None, None], -np.inf, scores)
        probs = self.softmax(scores, axis=-1)
        out = np.einsum("kgnt,ktd->kgnd", probs, V)  # (KV, G, n, D)
        out = out.transpose(2, 0, 1, 3).reshape(n, H * D)  # head index = kv * G + g
        return self.mm(out, p + "attn_output.weight")

    def ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        p = f"blk.{il}."
        if self.hp.n_expert:
            return self.moe(il, h)
        g = self.mm(h, p + "ffn_gate.weight")
        u = self.mm(h, p + "ffn_up.weight")
        return self.mm(self.silu(g) * u, p + "ffn_down.weight")

    def moe_routing(self, il: int, h: np.ndarray):
        """(experts (n, k) by decreasing probability, weights (n, k) summing to 1)."""
        k = self.hp.n_expert_used
        logits = self.mm(h, f"blk.{il}.ffn_gate_inp.weight")  # (n, n_expert)
        probs = self.softmax(logits, axis=-1)
        experts = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        if self.hp.n_expert > k:
            # how close the k-th and (k+1)-th router logits came: a tiny gap means another
            # correct implementation may legitimately route that token differently
            srt = np.sort(logits, axis=-1)
            self.routing_gaps.append((il, float(np.min(srt[:, -k] - srt[:, -k - 1]))))
        weights = np.take_along_axis(probs, experts, axis=-1)
        weights = weights / np.sum(weights, axis=-1, keepdims=True)
        return experts, weights

    def moe(self, il: int, h: np.ndarray) -> np.ndarray:
        p = f"blk.{il}."
        experts, weights = self.moe_routing(il, h)
        gate = self.w(p + "ffn_gate_exps.weight")  # (n_expert, n_ff, n_embd)
        up = self.w(p + "ffn_up_exps.weight")
        down = self.w(p + "ffn_down_exps.weight")  # (n_expert, n_embd, n_ff)
        out = np.zeros_like(h)
        for e in range(self.hp.n_expert):
            rows, slots = np.nonzero(experts == e)
            if rows.size == 0:
                continue
            x = h[rows]
            xg = self.act(x, p + "ffn_gate_exps.weight")
            xu = self.act(x, p + "ffn_up_exps.weight")
            m = self.silu(xg @ gate[e].T) * (xu @ up[e].T)
            y = self.act(m, p + "ffn_down_exps.weight") @ down[e].T
            out[rows] += weights[rows, slots][:, None] * y
        return out

    def forward(self, tokens, cache: KVCache | None = None, last_only: bool = False) -> np.ndarray:
        """Logits (n_tokens, n_vocab) (or (1, n_vocab) if last_only) in self.dtype for tokens
        appended after what `cache` already holds (a fresh cache if None)."""
        hp = self.hp
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("no tokens")
        if tokens.min() < 0 or tokens.max() >= hp.n_vocab:
            raise ValueError(f"token id out of range [0, {hp.n_vocab})")
        if cache is None:
            cache = KVCache()
        self.routing_gaps = []  # (layer, min router-logit gap between k-th and (k+1)-th)
        n_past = cache.n_past
        pos = np.arange(n_past, n_past + tokens.size)
        x = self.w("token_embd.weight")[tokens]
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            h = self.rmsnorm(x, self.w(p + "attn_norm.weight"))
            x = x + self.attention(il, h, pos, cache)
            h = self.rmsnorm(x, self.w(p + "ffn_norm.weight"))
            x = x + self.ffn(il, h)
        if last_only:
            x = x[-1:]
        x = self.rmsnorm(x, self.w("output_norm.weight"))
        logits = self.mm(x, "token_embd.weight" if self.tied else "output.weight")
        assert logits.dtype == self.dtype, logits.dtype  # no silent float32 -> float64 mixing
        return logits

    def logits(self, tokens, last_only: bool = False) -> np.ndarray:
        """float32 logits for every position (causal), or only the last one."""
        return self.forward(tokens, None, last_only).astype(np.float32)

    def greedy(self, tokens, n_new: int, stop_ids=()) -> list[int]:
        """Greedy continuation (argmax, ties to the lowest id) of n_new tokens, stopping after
        a token in stop_ids. Uses a KV cache (equal to recomputing the whole sequence)."""
        cache = KVCache()
        logits = self.forward(tokens, cache, last_only=True)
        out: list[int] = []
        for _ in range(n_new):
            t = int(np.argmax(logits[-1]))
            out.append(t)
            if t in stop_ids:
                break
            logits = self.forward([t], cache, last_only=True)
        return out

    def token_strings(self) -> list[str]:
        return list(_field(self.reader, "tokenizer.ggml.tokens", []))


# --------------------------------------------------------------------------------------------
# Optional text tokenizer (validation only; needs the PyPI package `tokenizers`)

CHAT_PREFIX = "<|im_start|>user\n"
CHAT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"


def build_hf_tokenizer(reader: gguf.GGUFReader):
    """A byte-level BPE tokenizer from the file's vocabulary and merges, with SmolLM2's
    pre-tokenizer (single digits, then GPT-2's byte-level split)."""
    from tokenizers import Tokenizer, AddedToken, decoders, models, pre_tokenizers

    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


SYSTEM_TURN = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
               "Hugging Face<|im_end|>\n")

# (name, user message, whether the template's default system turn is included)
PROMPTS = [
    ("capital_bare", "What is the capital of France?", False),
    ("week_days", "How many days are there in a week?", True),
    ("primary_colors", "Name three primary colors.", True),
    ("digits_sum", "What is 12 + 7?", True),
]


def make_prompts_json(model: ReferenceModel, path: str, n_new: int = 32) -> None:
    """Token ids of a few ChatML prompts (tokenized here so C++ tests need no Python
    tokenizer) with this reference's greedy continuation and, per generated token, the gap
    between the top two logits (a small gap means a correct implementation may diverge)."""
    hf = build_hf_tokenizer(model.reader)
    out = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "note": ("ids from a byte-level BPE built with the `tokenizers` package from the file's "
                 "vocabulary and merges (pre-tokenizer: single digits, then GPT-2 byte-level); "
                 "greedy_ids from tests/reference/reference_forward.py (float64), at most "
                 f"{n_new} tokens, stopping after id 0 or 2; regenerate with --make-prompts"),
        "stop_ids": [0, 2],
        "prompts": [],
    }
    for name, user, with_system in PROMPTS:
        text = (SYSTEM_TURN if with_system else "") + CHAT_PREFIX + user + CHAT_SUFFIX
        ids = hf.encode(text, add_special_tokens=False).ids
        assert hf.decode(ids, skip_special_tokens=False) == text, text
        cache = KVCache()
        logits = model.forward(ids, cache, last_only=True)
        gen, gaps = [], []
        for _ in range(n_new):
            top2 = np.sort(logits[-1])[-2:]
            gaps.append(round(float(top2[1] - top2[0]), 4))
            t = int(np.argmax(logits[-1]))
            gen.append(t)
            if t in (0, 2):
                break
            logits = model.forward([t], cache, last_only=True)
        out["prompts"].append({
            "name": name,
            "messages": [{"role": "user", "content": user}],
            "with_default_system_turn": with_system,
            "text": text,
            "ids": ids,
            "greedy_ids": gen,
            "greedy_text": hf.decode(gen, skip_special_tokens=False),
            "greedy_top2_gaps": gaps,
        })
    text = json.dumps(out, indent=1, ensure_ascii=False)
    # lists of numbers on one line each
    text = re.sub(r"\[\s*([-0-9.e, \n]+?)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")


# --------------------------------------------------------------------------------------------
# CLI

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="numpy reference forward pass for GGUF llama models")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--text", help="prompt text (needs `tokenizers`; validation only)")
    ap.add_argument("--chat", action="store_true",
                    help="wrap --text as a ChatML user turn followed by the assistant header")
    ap.add_argument("--out", help="write float32 logits here (.npy)")
    ap.add_argument("--last-only", action="store_true", help="logits of the last position only")
    ap.add_argument("--greedy", type=int, default=0, metavar="N",
                    help="greedily generate N tokens and print their ids")
    ap.add_argument("--stop", default="", help="comma-separated ids that end --greedy early")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--numerics", choices=list(NUMERICS), default="exact",
                    help="exact float activations and KV (default), or tireless's roundings: "
                         "q8 activations before quantized matrices, fp16 KV cache")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--make-prompts", metavar="JSON",
                    help="write the validation prompts (ids, greedy continuation) and exit")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    model = ReferenceModel(args.model, dtype=np.dtype(args.dtype), numerics=args.numerics)
    if args.make_prompts:
        make_prompts_json(model, args.make_prompts)
        return 0
    hf = None
    if args.text is not None:
        hf = build_hf_tokenizer(model.reader)
        text = CHAT_PREFIX + args.text + CHAT_SUFFIX if args.chat else args.text
        tokens = hf.encode(text, add_special_tokens=False).ids
        if not args.quiet:
            print("tokens:", ",".join(map(str, tokens)), file=sys.stderr)
    elif args.tokens:
        tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    else:
        ap.error("give --tokens or --text")

    model.load_all()
    t1 = time.perf_counter()
    if args.out or not args.greedy:
        logits = model.logits(tokens, last_only=args.last_only)
        t2 = time.perf_counter()
        if args.out:
            np.save(args.out, logits)
        if not args.quiet:
            print(f"load+dequantize {t1 - t0:.2f}s, forward of {len(tokens)} tokens {t2 - t1:.2f}s; "
                  f"logits {logits.shape}, last argmax {int(np.argmax(logits[-1]))}", file=sys.stderr)
            if model.routing_gaps:
                il, gap = min(model.routing_gaps, key=lambda g: g[1])
                print(f"MoE: smallest router-logit gap at the top-k boundary {gap:.4g} (layer {il})",
                      file=sys.stderr)
    if args.greedy:
        stop = [int(s) for s in args.stop.split(",") if s.strip()]
        t2 = time.perf_counter()
        gen = model.greedy(tokens, args.greedy, stop_ids=stop)
        t3 = time.perf_counter()
        print(",".join(map(str, gen)))
        if not args.quiet:
            print(f"greedy {len(gen)} tokens in {t3 - t2:.2f}s", file=sys.stderr)
            if hf is None:
                try:
                    hf = build_hf_tokenizer(model.reader)
                except ImportError:
                    pass
            if hf is not None:
                print("text:", json.dumps(hf.decode(gen, skip_special_tokens=False)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
