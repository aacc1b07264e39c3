#pragma once
// The CUDA backend's host-side decisions, with no CUDA in them so they are unit-tested on any
// machine: how device memory is split (weights in their GGUF types, activation workspace for the
// largest step, a reserve, the paged KV pool with what is left), which CUDA-graph bucket a decode
// step of n sequences is replayed in, and how a step's block tables are laid out for one upload
// (the same block tables the CPU backend reads), with the attention work of a mixed step and
// the rows whose logits are wanted. The backend (cuda_backend.cpp) and its kernels follow these.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpu/backend.hpp"
#include "gpu/cuda/shapes.hpp"

namespace tireless::cuda {

struct memory_request {
  int64_t device_bytes = 0;        // the device's memory (total, or free at start)
  int64_t weight_bytes = 0;        // every tensor in its GGUF type (dequantized in the kernels)
  int64_t kv_bytes_per_token = 0;  // all layers, keys and values, fp16
  int32_t block_size = 16;         // tokens per KV block
  int32_t max_step_tokens = 512, max_step_seqs = 64, max_context = 8192;
  int64_t hidden = 0, ffn = 0, vocab = 0, q_dim = 0, kv_dim = 0;  // the model's widths
  int32_t n_head = 1, n_head_kv = 1;                              // attention heads
  int32_t n_layer = 1;
  int32_t multiprocessors = 132;                                  // the device's (attention splits)
  int32_t n_expert = 0, n_expert_used = 0;                        // MoE models
  double reserve_fraction = 0.06;  // CUDA context, cuBLAS workspace, graphs, fragmentation
  int32_t kv_blocks = 0;           // wanted (kv.blocks, or what kv.memory_mb holds); 0: as many as fit
};

struct memory_plan {
  int64_t weights = 0, activations = 0, reserve = 0;
  int64_t kv_block_bytes = 0;
  int32_t kv_blocks = 0;
  int64_t total() const { return weights + activations + reserve + kv_block_bytes * kv_blocks; }
  std::string describe() const;
};

// Throws std::runtime_error saying what does not fit and by how much (and what to change).
memory_plan plan_memory(const memory_request& r);

// The device buffers of one step at the request's limits, as slices of one allocation, each
// starting on 256 bytes: plan_memory sets `total` aside and the backend carves exactly these
// (one source for both). R = max_step_tokens rows; S = the sequences a step may have, at most
// R; P = R x n_expert_used expert pairs (MoE), F = max(R, P) rows of the FFN; W = the widest
// input of a product, max(hidden, q_dim, ffn).
struct workspace_slice {
  int64_t at = 0, bytes = 0;
  int64_t end() const { return at + bytes; }
};
struct workspace_layout {
  workspace_slice x, h;             // the residual stream and its normed copy, [R][hidden] f32
  workspace_slice qkv, att;         // [R][q_dim + 2 kv_dim], [R][q_dim] f32
  workspace_slice logits;           // [S][vocab] f32
  workspace_slice partial;          // split attention's partial results: items x splits below
                                    // 3 x multiprocessors, [16][head_dim + 2] f32 each
  workspace_slice ffn_in, ffn_act;  // gate | up [F][2 ffn], silu(gate) * up [F][ffn], f32
  workspace_slice q8_q, q8_d, q8_s;  // 8-bit activations of F rows of W values: int8 [F][W],
                                     // scales and scaled sums [F][W / 32] f32
  workspace_slice halves;           // [R][W] fp16/bf16 activations for cuBLAS
  workspace_slice argmax;           // [S] int32
  workspace_slice inputs;           // step_inputs::words at its largest, int32
  // MoE only (empty otherwise):
  workspace_slice router;           // [R][n_expert] f32 logits
  workspace_slice gates;            // [R][k] f32
  workspace_slice chosen, pair_row, slot_pair;  // [R][k] int32 each
  workspace_slice offsets;          // [n_expert + 1] int32
  workspace_slice pairs_in, pairs_out;  // the pairs' inputs and outputs, [P][hidden] f32 each
  workspace_slice counts;           // [n_layer][n_expert] uint64: tokens routed, expert_tokens()
  int64_t total = 0;                // bytes: the end of the last slice
};
workspace_layout workspace_of(const memory_request& r);
// workspace_of(r).total: what plan_memory sets aside for activations.
int64_t activation_bytes(const memory_request& r);

// Decode steps are replayed from CUDA graphs captured for a few batch sizes: 1, 2, 4, 8, then
// multiples of 8 up to 64, then of 32, the last being max_step_seqs.
std::vector<int32_t> graph_buckets(int32_t max_step_seqs);
// The smallest bucket holding n sequences (a step is padded up to it); -1 past the largest
// (run without a graph) or for n < 1.
int32_t graph_bucket(std::span<const int32_t> buckets, int32_t n_seqs);

// A step's block tables for one copy to the device: sequence i's physical blocks in row i of
// `table` (width columns, padded with -1), its start position, token count and first token row.
// (step_inputs below is what the backend uploads; this is its block-table part.)
struct block_table_upload {
  int32_t width = 0;                 // the most logical blocks any sequence of the step needs
  std::vector<int32_t> table;        // [seqs][width]
  std::vector<int32_t> start_pos, n_tokens, first_row;
  int32_t rows = 0;                  // tokens in the step
};
// Throws std::invalid_argument when a sequence's table does not cover its positions.
block_table_upload pack_block_tables(const step_batch& batch, int32_t block_size);

// Everything a step's kernels read, in one int32 array copied up at once (`words`, each section
// starting on a 16-byte boundary):
//   [0]        the block tables' width (the kernels read it from the device, so that a decode
//              graph replays for any context length)
//   tokens     [rows]  token ids (padding rows: 0)
//   pos        [rows]  positions (padding rows: 0)
//   row_seq    [rows]  the sequence of each row; -1 for a padding row (writes no KV)
//   seq_start, seq_len, seq_row  [seqs]  start position, tokens and first row of each sequence
//   items      [items][3]  attention work: sequence (-1: none), KV head, first query row of the
//              sequence's rows (a multiple of attention_tile_rows)
//   outs       [outs]  the rows whose logits are computed, in sequence order
//   table      [seqs][width]  physical KV blocks, -1 past a sequence's blocks; last, so that the
//              other sections' offsets depend only on the padded shape
// A decode step replayed from a CUDA graph is padded to its bucket: `seqs` = `rows` = `outs` =
// the bucket, padding sequences having no tokens and no attention work.
struct step_inputs {
  int32_t rows = 0, seqs = 0, items = 0, outs = 0, width = 0;  // as launched (padded)
  int32_t real_rows = 0, real_seqs = 0;
  int32_t tokens_at = 0, pos_at = 0, row_seq_at = 0, seq_start_at = 0, seq_len_at = 0, seq_row_at = 0,
          items_at = 0, outs_at = 0, table_at = 0;  // offsets in words
  std::vector<int32_t> words;
  std::vector<int32_t> out_of_seq;  // per real sequence: its row among outs, or -1
  bool decode_only = false;         // every sequence brings one token
};

struct step_shape {
  int32_t block_size = 16;
  int32_t n_head_kv = 1, group = 1;  // KV heads; query heads per KV head
};

// Packs a step (checked by the caller: tables cover the positions) padded to `pad_to`
// sequences (0: not padded; else a decode-only step of at most pad_to sequences). Throws
// std::invalid_argument for a table that does not cover its sequence's positions, or a
// padding that does not apply.
step_inputs pack_step(const step_batch& batch, const step_shape& shape, int32_t pad_to = 0);

// The most words pack_step writes for a step within these limits.
int64_t max_step_words(int32_t max_step_tokens, int32_t max_step_seqs, int32_t max_context, const step_shape& shape);

// Whether a step is replayed from a CUDA graph, and which: decode-only steps of at most the
// largest bucket's sequences; -1 otherwise (run as launched).
int32_t graph_bucket_for(const step_batch& batch, std::span<const int32_t> buckets);

}  // namespace tireless::cuda
