#pragma once
// The CUDA backend's host-side decisions, with no CUDA in them so they are unit-tested on any
// machine: how device memory is split (weights in their GGUF types, activation workspace for the
// largest step, a reserve, the paged KV pool with what is left), which CUDA-graph bucket a decode
// step of n sequences is replayed in, and how a step's block tables are laid out for one upload
// (the same block tables the CPU backend reads). The kernels (gpu/cuda/*.cu) and the backend
// that will use them follow these.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpu/backend.hpp"

namespace tireless::cuda {

struct memory_request {
  int64_t device_bytes = 0;        // the device's total memory
  int64_t weight_bytes = 0;        // every tensor in its GGUF type (dequantized in the kernels)
  int64_t kv_bytes_per_token = 0;  // all layers, keys and values, fp16
  int32_t block_size = 16;         // tokens per KV block
  int32_t max_step_tokens = 512, max_step_seqs = 64, max_context = 8192;
  int64_t hidden = 0, ffn = 0, vocab = 0, q_dim = 0, kv_dim = 0;  // the model's widths
  double reserve_fraction = 0.06;  // CUDA context, cuBLAS workspace, graphs, fragmentation
  int32_t kv_blocks = 0;           // wanted; 0: as many as fit
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

// Bytes of the workspace of one step at the request's limits: the residual stream and its
// normed copy, q/k/v, attention output, the FFN's gate and up, the logits of every sampled
// sequence, and the step's block tables and positions.
int64_t activation_bytes(const memory_request& r);

// Decode steps are replayed from CUDA graphs captured for a few batch sizes: 1, 2, 4, 8, then
// multiples of 8 up to 64, then of 32, the last being max_step_seqs.
std::vector<int32_t> graph_buckets(int32_t max_step_seqs);
// The smallest bucket holding n sequences (a step is padded up to it); -1 past the largest
// (run without a graph) or for n < 1.
int32_t graph_bucket(std::span<const int32_t> buckets, int32_t n_seqs);

// A step's block tables for one copy to the device: sequence i's physical blocks in row i of
// `table` (width columns, padded with -1), its start position, token count and first token row.
struct block_table_upload {
  int32_t width = 0;                 // the most logical blocks any sequence of the step needs
  std::vector<int32_t> table;        // [seqs][width]
  std::vector<int32_t> start_pos, n_tokens, first_row;
  int32_t rows = 0;                  // tokens in the step
};
// Throws std::invalid_argument when a sequence's table does not cover its positions.
block_table_upload pack_block_tables(const step_batch& batch, int32_t block_size);

}  // namespace tireless::cuda
