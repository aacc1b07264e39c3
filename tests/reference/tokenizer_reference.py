#!/usr/bin/env python3
"""Compares tireless's tokenizer with Hugging Face's `tokenizers` on the real SmolLM2 model.

The Hugging Face tokenizer is built from the GGUF file's own vocabulary and merges, with
SmolLM2's pre-tokenizer (Digits(individual_digits) then ByteLevel with the GPT-2 regex), the
ByteLevel decoder and the control/user-defined tokens added as special tokens. Every string
of a corpus of tricky texts is tokenized by both, with and without special-token parsing, and
the ids must be equal. tireless's ids come from the tireless-tokenize program, which also
reports whether decode(encode(text)) == text; that must hold for every text whose bytes all
have a token, including texts that are not valid UTF-8.

Exits 0 when all agree, 1 on a difference, 77 (ctest's skip code) when the model file or the
Python packages are absent. --perturb-merge N moves merge N to the lowest priority on the
Hugging Face side, to show that the comparison catches a wrong merge order.
"""

import argparse
import os
import random
import subprocess
import sys

SKIP = 77


def byte_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def hf_tokenizer(tokens, types, merges, perturb):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    pairs = [tuple(m.split(" ", 1)) for m in merges]
    if perturb is not None:
        pairs.append(pairs.pop(perturb))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(tokens, types) if ty in (3, 4)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok, specials


def random_text(rng, n_chars):
    ranges = [
        (0x20, 0x7E, 30), (0x00, 0x1F, 2), (0xA0, 0xFF, 4), (0x100, 0x24F, 3), (0x370, 0x3FF, 2),
        (0x400, 0x4FF, 3), (0x590, 0x5FF, 1), (0x600, 0x6FF, 3), (0x900, 0x97F, 2),
        (0x300, 0x36F, 2), (0x4E00, 0x9FFF, 5), (0x3040, 0x30FF, 2), (0xAC00, 0xD7A3, 2),
        (0x1F300, 0x1FAFF, 4), (0x2000, 0x206F, 2), (0xFF00, 0xFFEF, 1), (0x660, 0x669, 1),
        (0x10000, 0x10FFFF, 1),
    ]
    weights = [w for _, _, w in ranges]
    out = []
    while len(out) < n_chars:
        lo, hi, _ = rng.choices(ranges, weights)[0]
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        out.append(chr(cp))
        if rng.random() < 0.15:
            out.append(rng.choice([" ", "  ", "\n", "\t", " \n ", "'s", "'ll", "123", "<|im_end|>"]))
    return "".join(out)


def corpus(rng):
    fixed = [
        "Hello world", "Hello, world! How are you today?", "The quick brown fox jumps over the lazy dog.",
        "I'll", "I'll be there. You're right, it's John's, we've, they'd, I'm, don't, can't",
        "I'LL SHOUT 'S 'T 'RE", "'s's''s '", "12345.67", "3.14159 and 2,718 and 1e-10",
        "phone: +1 (555) 123-4567", "v1.2.3-rc4", "0x7fffffff", "１２３ ٠١٢ ४२",
        "a  b   c    d", "tabs\tand\t\ttabs", "new\nlines\n\n\nthree", "\r\nwindows\r\n",
        "trailing space ", "trailing spaces   ", "trailing newline\n", "   leading", " ", "  ",
        "\n", "\t \n \t", "", "x", " x", "  x", "\n x", " \u00a0x", "\u3000word\u2003em space",
        "日本語のテキストです。東京は日本の首都です。", "中文测试：你好，世界！", "한국어 텍스트",
        "مرحبا بالعالم، كيف حالك؟", "שלום עולם", "Привет, мир! Ёлка.", "Ελληνικά κείμενα",
        "हिन्दी पाठ", "ภาษาไทย",
        "😀 emoji 🎉🎉 test", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "👍🏽 skin tone", "❤️", "🇫🇷🇩🇪",
        "café naïve résumé Zürich São Paulo Ångström", "e\u0301 combining", "ﬁ ligature",
        "def f(x):\n    return x**2 + 1  # comment\n", "if (a != b && c <= d) { x->y[0] = {}; }",
        "<html><body class=\"x\">&amp;</body></html>", "SELECT * FROM t WHERE id=42;",
        "$ ls -la ~/.cache | grep -v '^d'", "path/to/file_name.cpp:123:45: error: ...",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|><|im_end|><|endoftext|>", "a<|im_end|>b", "<|im_start", "<|im_end|>>",
        "<repo_name>x<reponame>y<file_sep>", "text <jupyter_code>print(1)<empty_output>",
        "\u0085\u2028\u2029 line separators", "\u200b zero width \u200d joiner \ufeff bom",
        "\x7f\x01\x1b[31mred\x1b[0m", "¡¿«»§¶©®™°±µ·", "½ ¼ ² ³ Ⅻ ⑤",
    ]
    paragraph = (
        "Tokenization is the process of splitting text into units that a language model can "
        "process. Byte-level BPE, introduced with GPT-2, starts from the 256 possible bytes and "
        "repeatedly merges the most frequent adjacent pair. In 2024, SmolLM2 (135M, 360M and "
        "1.7B parameters) used a 49,152-token vocabulary; its pre-tokenizer splits digits one "
        "by one so that 12345 becomes 1 2 3 4 5.  Double  spaces,\ttabs and\n\nnewlines matter. "
    ) * 20
    texts = fixed + [paragraph]
    texts += [random_text(rng, rng.randint(1, 120)) for _ in range(300)]
    texts += [random_text(rng, 3000)]
    return texts


def invalid_utf8_texts(rng, representable):
    """Byte strings that are not valid UTF-8 (only bytes the vocabulary has tokens for)."""
    pool = sorted(representable)
    fixed = [b"\x80", b"abc\xbfdef", b"\xe2\x82", b"\xe2\x82 euro", b"\xed\xa0\x80 surrogate",
             b"\xe0\x80\xaf overlong", b"\xf0\x9f\x98", b"caf\xc3", b"\xf4\x90\x80\x80 too big",
             "日本".encode() + b"\x80" + "語".encode()]
    fixed = [t for t in fixed if all(b in representable for b in t)]
    rand = [bytes(rng.choice(pool) for _ in range(rng.randint(1, 60))) for _ in range(200)]
    return fixed + rand


def run_tireless(exe, model, texts, special):
    payload = b"".join(b"%d\n" % len(t) + t for t in texts)
    args = [exe, model] + ([] if special else ["--no-special"])
    res = subprocess.run(args, input=payload, capture_output=True, check=False)
    if res.returncode != 0:
        sys.exit(f"FAILED: {' '.join(args)} exited {res.returncode}: {res.stderr.decode()}")
    lines = res.stdout.decode().splitlines()
    if len(lines) != len(texts):
        sys.exit(f"FAILED: tireless-tokenize printed {len(lines)} lines for {len(texts)} texts")
    out = []
    for line in lines:
        fields = line.split()
        out.append((fields[0] == "1", [int(x) for x in fields[1:]]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenize", required=True, help="the tireless-tokenize program")
    ap.add_argument("--perturb-merge", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    if not os.path.exists(args.model):
        print(f"SKIPPED: model file {args.model} is absent (scripts/fetch-model fetches it)")
        return SKIP
    try:
        import gguf  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: Python package missing ({e}); scripts/setup installs it")
        return SKIP
    import gguf

    if not os.access(args.tokenize, os.X_OK):
        sys.exit(f"FAILED: {args.tokenize} is missing; build the tireless-tokenize target first")
    fields = gguf.GGUFReader(args.model).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    merges = fields["tokenizer.ggml.merges"].contents()
    pre = fields["tokenizer.ggml.pre"].contents()
    if pre != "smollm":
        sys.exit(f"FAILED: this comparison is written for tokenizer.ggml.pre = smollm, not {pre}")
    hf, specials = hf_tokenizer(tokens, types, merges, args.perturb_merge)

    rng = random.Random(args.seed)
    texts = corpus(rng)
    encoded = [t.encode("utf-8") for t in texts]
    to_char = byte_to_unicode()
    vocab = set(tokens)
    representable = {b for b in range(256) if to_char[b] in vocab}

    failures = 0
    for special in (True, False):
        ours = run_tireless(args.tokenize, args.model, encoded, special)
        hf.encode_special_tokens = not special
        theirs = hf.encode_batch(texts, add_special_tokens=False)
        for text, raw, (round_trip, ids), ref in zip(texts, encoded, ours, theirs):
            expect_round_trip = all(b in representable for b in raw)
            if ids != ref.ids or round_trip != expect_round_trip:
                failures += 1
                if failures <= 10:
                    print(f"MISMATCH (parse_special={special}) on {text[:80]!r}:\n"
                          f"  tireless: {ids[:40]}\n  hf:       {ref.ids[:40]}\n"
                          f"  round trip: {round_trip} (expected {expect_round_trip})")
    hf.encode_special_tokens = False

    invalid = invalid_utf8_texts(rng, representable)
    for raw, (round_trip, ids) in zip(invalid, run_tireless(args.tokenize, args.model, invalid, False)):
        if not round_trip:
            failures += 1
            print(f"ROUND TRIP FAILED on invalid UTF-8 {raw[:40]!r}: {ids[:20]}")

    n_tokens = sum(len(hf.encode(t, add_special_tokens=False).ids) for t in texts)
    if failures:
        print(f"FAILED: {failures} differences ({len(texts)} texts x 2 modes, "
              f"{len(invalid)} invalid UTF-8 round trips)")
        return 1
    print(f"OK: {len(texts)} texts ({n_tokens} tokens) tokenize identically to Hugging Face "
          f"tokenizers {tokenizers.__version__}, with and without special tokens; "
          f"{len(invalid)} invalid UTF-8 texts round-trip ({len(specials)} special tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
