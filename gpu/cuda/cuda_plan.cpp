#include "gpu/cuda/cuda_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace tireless::cuda {

namespace {

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30)); }

}  // namespace

std::string memory_plan::describe() const {
  return fmt::format("weights {}, activations {}, reserve {}, KV {} blocks of {} KiB ({}); {} in all", gib(weights),
                     gib(activations), gib(reserve), kv_blocks, kv_block_bytes / 1024, gib(kv_block_bytes * kv_blocks),
                     gib(total()));
}

int64_t activation_bytes(const memory_request& r) {
  const int64_t t = r.max_step_tokens;
  const int64_t floats = t * (2 * r.hidden + r.q_dim + 2 * r.kv_dim + r.q_dim + 2 * r.ffn) +
                         int64_t{r.max_step_seqs} * r.vocab;
  const int64_t table = int64_t{r.max_step_seqs} * ((r.max_context + r.block_size - 1) / r.block_size) +
                        4 * int64_t{r.max_step_seqs} + t;
  return floats * 4 + table * 4;
}

memory_plan plan_memory(const memory_request& r) {
  if (r.device_bytes <= 0) throw std::runtime_error("the device reports no memory");
  if (r.block_size < 1 || r.kv_bytes_per_token <= 0) throw std::runtime_error("the KV block size and bytes per token must be above 0");
  memory_plan p;
  p.weights = r.weight_bytes;
  p.activations = activation_bytes(r);
  p.reserve = static_cast<int64_t>(static_cast<double>(r.device_bytes) * r.reserve_fraction);
  p.kv_block_bytes = r.kv_bytes_per_token * r.block_size;
  const int64_t left = r.device_bytes - p.weights - p.activations - p.reserve;
  // A sequence of max_context positions must fit at least once.
  const int64_t one_sequence = (r.max_context + r.block_size - 1) / r.block_size;
  if (left < p.kv_block_bytes * one_sequence) {
    throw std::runtime_error(fmt::format(
        "the model does not fit on the device: {} of memory, weights {}, activations {} (max_step_tokens {}), reserve {}: "
        "{} left for the KV cache, one {}-token sequence needs {}; use a smaller backend.max_context or "
        "engine.max_step_tokens, a device with more memory, or shard the model",
        gib(r.device_bytes), gib(p.weights), gib(p.activations), r.max_step_tokens, gib(p.reserve), gib(std::max<int64_t>(left, 0)),
        r.max_context, gib(p.kv_block_bytes * one_sequence)));
  }
  const int64_t fit = left / p.kv_block_bytes;
  if (r.kv_blocks > 0 && r.kv_blocks > fit) {
    throw std::runtime_error(fmt::format("kv.blocks = {} does not fit: {} blocks of {} KiB fit in the {} left; "
                                         "set kv.blocks = 0 (as many as fit) or at most {}",
                                         r.kv_blocks, fit, p.kv_block_bytes / 1024, gib(left), fit));
  }
  p.kv_blocks = static_cast<int32_t>(std::min<int64_t>(r.kv_blocks > 0 ? r.kv_blocks : fit, INT32_MAX));
  return p;
}

std::vector<int32_t> graph_buckets(int32_t max_step_seqs) {
  std::vector<int32_t> b;
  for (int32_t n : {1, 2, 4}) {
    if (n < max_step_seqs) b.push_back(n);
  }
  for (int32_t n = 8; n < std::min(max_step_seqs, 64); n += 8) b.push_back(n);
  for (int32_t n = 64; n < max_step_seqs; n += 32) b.push_back(n);
  if (max_step_seqs >= 1) b.push_back(max_step_seqs);
  return b;
}

int32_t graph_bucket(std::span<const int32_t> buckets, int32_t n_seqs) {
  if (n_seqs < 1) return -1;
  auto it = std::lower_bound(buckets.begin(), buckets.end(), n_seqs);
  return it == buckets.end() ? -1 : *it;
}

block_table_upload pack_block_tables(const step_batch& batch, int32_t block_size) {
  if (block_size < 1) throw std::invalid_argument("block_size must be at least 1");
  block_table_upload u;
  for (const sequence_step& s : batch.seqs) {
    const int64_t end = int64_t{s.start_pos} + static_cast<int64_t>(s.tokens.size());
    const int64_t need = (end + block_size - 1) / block_size;
    if (static_cast<int64_t>(s.block_table.size()) < need) {
      throw std::invalid_argument(fmt::format("sequence {}: {} positions need {} blocks, its table has {}", s.seq_id, end,
                                              need, s.block_table.size()));
    }
    u.width = std::max(u.width, static_cast<int32_t>(need));
  }
  u.table.assign(batch.seqs.size() * static_cast<size_t>(u.width), -1);
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const sequence_step& s = batch.seqs[i];
    const int64_t end = int64_t{s.start_pos} + static_cast<int64_t>(s.tokens.size());
    const int64_t need = (end + block_size - 1) / block_size;
    std::copy_n(s.block_table.begin(), need, u.table.begin() + static_cast<int64_t>(i) * u.width);
    u.start_pos.push_back(s.start_pos);
    u.n_tokens.push_back(static_cast<int32_t>(s.tokens.size()));
    u.first_row.push_back(u.rows);
    u.rows += static_cast<int32_t>(s.tokens.size());
  }
  return u;
}

}  // namespace tireless::cuda
