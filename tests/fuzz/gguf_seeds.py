#!/usr/bin/env python3
"""Writes small valid GGUF images (seeds for gguf_fuzz) into the folder given: every metadata
value type, nested arrays, f32/f16/q8_0/q4_0/q4_1 tensors, alignments 32 and 64, versions 2
and 3. Each file stays under 4 KiB so libFuzzer's default input size limit covers it."""

import pathlib
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q


def write(path, arch="llama", alignment=None, kv=True, tensors=(), version=None):
    w = gguf.GGUFWriter(str(path), arch)
    if alignment:
        w.add_custom_alignment(alignment)
    if kv:
        w.add_block_count(2)
        w.add_context_length(64)
        w.add_rope_freq_base(10000.0)
        w.add_bool("tokenizer.ggml.add_bos_token", False)
        w.add_tokenizer_model("gpt2")
        w.add_token_list(["a", "b", "ab", "<|im_end|>"])
        w.add_token_types([1, 1, 1, 3])
        w.add_token_merges(["a b"])
        w.add_uint8("t.u8", 7)
        w.add_int8("t.i8", -7)
        w.add_uint16("t.u16", 700)
        w.add_int16("t.i16", -700)
        w.add_int32("t.i32", -70000)
        w.add_uint64("t.u64", 1 << 40)
        w.add_int64("t.i64", -(1 << 40))
        w.add_float64("t.f64", 0.25)
        w.add_array("t.scores", [0.5, -1.0, 2.0])
        w.add_array("t.nested", [[1, 2], [3]])
    rng = np.random.default_rng(7)
    for name, qtype, shape in tensors:
        x = rng.standard_normal(shape).astype(np.float32)
        if qtype == Q.F32:
            w.add_tensor(name, x)
        elif qtype == Q.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version is not None:
        data = bytearray(path.read_bytes())
        data[4:8] = version.to_bytes(4, "little")
        path.write_bytes(bytes(data))


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    small = [("token_embd.weight", Q.Q8_0, (2, 32)), ("blk.0.attn_norm.weight", Q.F32, (8,)),
             ("blk.0.ffn_up.weight", Q.Q4_1, (2, 32)), ("blk.0.ffn_down.weight", Q.Q4_0, (1, 32)),
             ("blk.0.attn_q.weight", Q.F16, (2, 4))]
    write(out / "metadata_only.gguf")
    write(out / "tensors_only.gguf", kv=False, tensors=small)
    write(out / "model.gguf", tensors=small)
    write(out / "aligned64.gguf", alignment=64, kv=False, tensors=small[:2])
    write(out / "version2.gguf", kv=False, tensors=small[1:3], version=2)
    write(out / "empty.gguf", kv=False)
    for p in out.glob("*.gguf"):
        assert p.stat().st_size < 4096, p


if __name__ == "__main__":
    main()
