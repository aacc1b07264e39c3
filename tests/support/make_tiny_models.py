#!/usr/bin/env python3
"""Write tiny, deterministic GGUF test models for tireless.

Usage: make_tiny_models.py OUTPUT_DIR

Writes (each well under 1 MB):
  tiny-dense.gguf       Llama layout, 4 layers, GQA (4 heads / 2 KV heads), untied
                        output.weight, every supported weight type across layers
                        (F32, F16, BF16, Q8_0, Q4_0, Q4_1).
  tiny-moe.gguf         Mixtral-style MoE in the llama architecture: 4 experts, 2 used,
                        3 layers, 3-D expert tensors, tied embeddings.
  tiny-dense-tied.gguf  2 layers, 2 heads of 32 (no GQA), tied embeddings, F16 embedding table, mostly F32/F16
                        matrices: a low-quantization-noise model for exactness checks.

Every model carries a small but working GPT-2-style byte-level BPE tokenizer shaped like
SmolLM2's: the 17 SmolLM2 special tokens (control, ids 0-16), the 256 byte-to-unicode
characters, and the first 47 merges of SmolLM2 (vocabulary of 320), with the SmolLM2 ChatML
chat template.

Determinism: weights come from a SplitMix64 counter generator implemented here with numpy
integer arithmetic (not numpy's Generator, whose distributions may change between numpy
versions), seeded per tensor from the CRC32 of its name. Quantization uses
gguf.quants.quantize, so the bytes are identical run to run for a given gguf version.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import zlib

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

# --------------------------------------------------------------------------------------------
# Deterministic random numbers

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(counter: np.ndarray) -> np.ndarray:
    z = counter * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniform(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Deterministic uniform values in [-1, 1), float64, from a tensor name and a model seed."""
    n = int(np.prod(shape))
    base = np.uint64((zlib.crc32(name.encode()) << 20) ^ (seed << 52) ^ 0x1234567)
    with np.errstate(over="ignore"):
        bits = _splitmix64(np.arange(n, dtype=np.uint64) + base)
    u = (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))  # [0, 1)
    return (2.0 * u - 1.0).reshape(shape)


def randn_like(name: str, shape: tuple[int, ...], std: float, seed: int) -> np.ndarray:
    """Values with mean 0 and standard deviation `std` (uniform distribution), float32."""
    return (uniform(name, shape, seed) * (std * np.sqrt(3.0))).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Tokenizer shaped like SmolLM2's

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
    "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
    "<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>",
    "<jupyter_script>", "<empty_output>",
]

# The first 47 merges of SmolLM2-135M (common English pairs); every part of a merge is a
# byte character or the result of an earlier merge.
MERGES = [
    "Ġ t", "Ġ a", "i n", "h e", "Ġ Ġ", "r e", "o n", "e r", "Ġt he", "a t", "Ġ s", "Ġ o",
    "e n", "Ġ c", "e s", "Ġ w", "n d", "i t", "o r", "i s", "a l", "Ġ p", "in g", "Ġ f",
    "a n", "e d", "Ġ b", "o u", "a r", "Ġ in", "Ġo f", "Ġ m", "Ġa nd", "i on", "i c", "Ġ d",
    "Ġt o", "ĠĠ ĠĠ", "l e", "r o", "a s", "en t", "Ġ h", "Ġt h", "c t", "Ġ e", "Ġ re",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def bytes_to_unicode_chars() -> list[str]:
    """GPT-2's byte-to-unicode table, in GPT-2's order (printable bytes first)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def build_vocab() -> tuple[list[str], list[int], list[str]]:
    tokens = list(SPECIAL_TOKENS)
    types = [int(gguf.TokenType.CONTROL)] * len(SPECIAL_TOKENS)
    for ch in bytes_to_unicode_chars():
        tokens.append(ch)
        types.append(int(gguf.TokenType.NORMAL))
    known = set(tokens)
    for merge in MERGES:
        left, right = merge.split(" ")
        assert left in known and right in known, merge
        result = left + right
        assert result not in known, merge
        tokens.append(result)
        types.append(int(gguf.TokenType.NORMAL))
        known.add(result)
    assert len(tokens) == len(set(tokens))
    return tokens, types, list(MERGES)


# --------------------------------------------------------------------------------------------
# Writing tensors

def add_matrix(w: gguf.GGUFWriter, name: str, values: np.ndarray, qtype: QT) -> None:
    """values: float32 numpy array in numpy order (ggml shape reversed), e.g. (out, in)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if qtype == QT.F32:
        w.add_tensor(name, values)
    elif qtype == QT.F16:
        w.add_tensor(name, values.astype(np.float16))
    else:  # BF16, Q8_0, Q4_0, Q4_1: bytes from gguf's quantizers
        data = gguf.quants.quantize(values, qtype)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)


class Spec:
    def __init__(self, *, name, seed, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff,
                 n_ctx, rope_base, eps, layer_types, embd_type, output_type,
                 n_expert=0, n_expert_used=0, embd_std=0.35, output_std=0.35, res_gain=1.0,
                 router_gain=4.0):
        self.__dict__.update(locals())
        del self.__dict__["self"]


def write_model(path: str, s: Spec) -> None:
    tokens, token_types, merges = build_vocab()
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(path, "llama")

    w.add_name(s.name)
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(s.eps)
    w.add_rope_dimension_count(s.head_dim)
    w.add_vocab_size(n_vocab)
    if s.n_expert:
        w.add_expert_count(s.n_expert)
        w.add_expert_used_count(s.n_expert_used)
    w.add_file_type(1)  # mostly-F16 (nominal; the types are mixed)
    w.add_quantization_version(2)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(CHAT_TEMPLATE)

    E, H, KV, D, F = s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff
    seed = s.seed

    def norm_weight(name):
        # around 1, so RMSNorm keeps activations O(1)
        return (1.0 + 0.2 * uniform(name, (E,), seed)).astype(np.float32)

    add_matrix(w, "token_embd.weight",
               randn_like("token_embd.weight", (n_vocab, E), s.embd_std, seed), s.embd_type)
    for i in range(s.n_layer):
        t = s.layer_types[i]
        p = f"blk.{i}."
        add_matrix(w, p + "attn_norm.weight", norm_weight(p + "attn_norm.weight"), QT.F32)
        # std 1/sqrt(in) keeps q, k, v ~ O(1) for a unit-RMS input; scores ~ O(1)
        add_matrix(w, p + "attn_q.weight",
                   randn_like(p + "attn_q.weight", (H * D, E), 1.0 / np.sqrt(E), seed), t["attn_q"])
        add_matrix(w, p + "attn_k.weight",
                   randn_like(p + "attn_k.weight", (KV * D, E), 1.0 / np.sqrt(E), seed), t["attn_k"])
        add_matrix(w, p + "attn_v.weight",
                   randn_like(p + "attn_v.weight", (KV * D, E), 1.0 / np.sqrt(E), seed), t["attn_v"])
        add_matrix(w, p + "attn_output.weight",
                   randn_like(p + "attn_output.weight", (E, H * D), 0.5 * s.res_gain / np.sqrt(H * D), seed),
                   t["attn_output"])
        add_matrix(w, p + "ffn_norm.weight", norm_weight(p + "ffn_norm.weight"), QT.F32)
        if s.n_expert:
            X = s.n_expert
            add_matrix(w, p + "ffn_gate_inp.weight",
                       randn_like(p + "ffn_gate_inp.weight", (X, E), s.router_gain / np.sqrt(E), seed),
                       QT.F32)
            add_matrix(w, p + "ffn_gate_exps.weight",
                       randn_like(p + "ffn_gate_exps.weight", (X, F, E), 1.0 / np.sqrt(E), seed),
                       t["ffn_gate_exps"])
            add_matrix(w, p + "ffn_up_exps.weight",
                       randn_like(p + "ffn_up_exps.weight", (X, F, E), 1.0 / np.sqrt(E), seed),
                       t["ffn_up_exps"])
            add_matrix(w, p + "ffn_down_exps.weight",
                       randn_like(p + "ffn_down_exps.weight", (X, E, F), s.res_gain / np.sqrt(F), seed),
                       t["ffn_down_exps"])
        else:
            add_matrix(w, p + "ffn_gate.weight",
                       randn_like(p + "ffn_gate.weight", (F, E), 1.0 / np.sqrt(E), seed), t["ffn_gate"])
            add_matrix(w, p + "ffn_up.weight",
                       randn_like(p + "ffn_up.weight", (F, E), 1.0 / np.sqrt(E), seed), t["ffn_up"])
            add_matrix(w, p + "ffn_down.weight",
                       randn_like(p + "ffn_down.weight", (E, F), s.res_gain / np.sqrt(F), seed), t["ffn_down"])
    add_matrix(w, "output_norm.weight", norm_weight("output_norm.weight"), QT.F32)
    if s.output_type is not None:
        add_matrix(w, "output.weight",
                   randn_like("output.weight", (n_vocab, E), s.output_std, seed), s.output_type)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def dense_layer_types(all_type, **overrides):
    names = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    t = {n: all_type for n in names}
    t.update(overrides)
    return t


def moe_layer_types(attn_type, gate, up, down):
    t = {n: attn_type for n in ["attn_q", "attn_k", "attn_v", "attn_output"]}
    t.update(ffn_gate_exps=gate, ffn_up_exps=up, ffn_down_exps=down)
    return t


# res_gain scales attn_output and ffn_down: with tied embeddings and a residual stream
# dominated by the input embedding, a random model mostly predicts its input token again;
# a larger gain lets the layers dominate so logits depend on context.
MODELS = {
    "tiny-dense.gguf": Spec(
        name="tireless tiny dense", seed=1, n_embd=64, n_layer=4, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=128, n_ctx=256, rope_base=10000.0, eps=1e-5,
        layer_types=[
            dense_layer_types(QT.Q4_0),
            dense_layer_types(QT.Q4_1),
            dense_layer_types(QT.Q8_0),
            dense_layer_types(QT.F16, attn_k=QT.BF16, ffn_down=QT.F32),
        ],
        embd_type=QT.Q8_0, output_type=QT.Q4_1),
    "tiny-moe.gguf": Spec(
        name="tireless tiny moe", seed=2, n_embd=64, n_layer=3, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=96, n_ctx=256, rope_base=10000.0, eps=1e-5,
        n_expert=4, n_expert_used=2,
        layer_types=[
            moe_layer_types(QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q8_0),
            moe_layer_types(QT.Q4_1, QT.Q8_0, QT.Q4_0, QT.Q4_1),
            moe_layer_types(QT.F16, QT.F16, QT.BF16, QT.F32),
        ],
        embd_type=QT.Q8_0, output_type=None, res_gain=3.0),
    "tiny-dense-tied.gguf": Spec(
        name="tireless tiny dense tied", seed=3, n_embd=64, n_layer=2, n_head=2, n_head_kv=2,
        head_dim=32, n_ff=96, n_ctx=256, rope_base=10000.0, eps=1e-5,
        layer_types=[
            dense_layer_types(QT.F32),
            dense_layer_types(QT.F16),
        ],
        embd_type=QT.F16, output_type=None, res_gain=3.0),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    for fname, spec in MODELS.items():
        path = os.path.join(args.out_dir, fname)
        tmp = path + ".tmp"
        write_model(tmp, spec)
        os.replace(tmp, path)  # atomic: a reader never sees a half-written model
        if not args.quiet:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            print(f"{path}: {os.path.getsize(path)} bytes, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
