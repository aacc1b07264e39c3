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

workspace_layout workspace_of(const memory_request& r) {
  const int64_t rows = r.max_step_tokens;
  const int64_t seqs = std::min<int64_t>(r.max_step_seqs, r.max_step_tokens);
  const bool moe = r.n_expert > 0;
  const int64_t k = std::max(r.n_expert_used, 1);
  const int64_t pairs = moe ? rows * k : 0;
  const int64_t ffn_rows = std::max(rows, pairs);
  const int64_t widest = std::max({r.hidden, r.q_dim, r.ffn});
  const int64_t blocks = (widest + 31) / 32;
  const int64_t head_dim = r.q_dim / std::max(r.n_head, 1);
  step_shape shape;
  shape.block_size = r.block_size;
  shape.n_head_kv = std::max(r.n_head_kv, 1);
  shape.group = std::max(r.n_head / shape.n_head_kv, 1);
  const int64_t words = max_step_words(r.max_step_tokens, static_cast<int32_t>(seqs), r.max_context, shape);

  workspace_layout w;
  int64_t at = 0;
  const auto slice = [&](int64_t bytes) {
    at = (at + 255) / 256 * 256;
    const workspace_slice s{at, bytes};
    at += bytes;
    return s;
  };
  w.x = slice(rows * r.hidden * 4);
  w.h = slice(rows * r.hidden * 4);
  w.qkv = slice(rows * (r.q_dim + 2 * r.kv_dim) * 4);
  w.att = slice(rows * r.q_dim * 4);
  w.logits = slice(seqs * r.vocab * 4);
  w.partial = slice(3 * int64_t{r.multiprocessors} * attention_tile_rows * (head_dim + 2) * 4);
  w.ffn_in = slice(ffn_rows * 2 * r.ffn * 4);
  w.ffn_act = slice(ffn_rows * r.ffn * 4);
  w.q8_q = slice(ffn_rows * blocks * 32);
  w.q8_d = slice(ffn_rows * blocks * 4);
  w.q8_s = slice(ffn_rows * blocks * 4);
  w.halves = slice(rows * widest * 2);
  w.argmax = slice(seqs * 4);
  w.inputs = slice(words * 4);
  if (moe) {
    w.router = slice(rows * r.n_expert * 4);
    w.gates = slice(rows * k * 4);
    w.chosen = slice(rows * k * 4);
    w.pair_row = slice(rows * k * 4);
    w.slot_pair = slice(rows * k * 4);
    w.offsets = slice((int64_t{r.n_expert} + 1) * 4);
    w.pairs_in = slice(pairs * r.hidden * 4);
    w.pairs_out = slice(pairs * r.hidden * 4);
    w.counts = slice(int64_t{r.n_layer} * r.n_expert * 8);
  }
  w.total = at;
  return w;
}

int64_t activation_bytes(const memory_request& r) { return workspace_of(r).total; }

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
    throw std::runtime_error(fmt::format(
        "a KV pool of {} blocks (kv.blocks, or what kv.memory_mb holds) does not fit on the device: {} blocks of {} KiB "
        "fit in the {} that weights {}, activations {} and reserve {} leave; ask for at most {} blocks, or set neither "
        "kv.blocks nor kv.memory_mb (the device's memory decides)",
        r.kv_blocks, fit, p.kv_block_bytes / 1024, gib(left), gib(p.weights), gib(p.activations), gib(p.reserve), fit));
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

namespace {

int32_t align4(int32_t n) { return (n + 3) / 4 * 4; }

}  // namespace

int64_t max_step_words(int32_t max_step_tokens, int32_t max_step_seqs, int32_t max_context, const step_shape& shape) {
  const int64_t rows = max_step_tokens, seqs = max_step_seqs;
  const int64_t width = (int64_t{max_context} + shape.block_size - 1) / shape.block_size;
  // Items: per sequence and KV head, its rows in tiles; the sum is largest with one long
  // sequence and the rest single tokens, bounded by (rows * group / tile + seqs) per head.
  const int64_t items = int64_t{shape.n_head_kv} * (rows * shape.group / attention_tile_rows + seqs);
  return 4 + 3 * (rows + 3) + 3 * (seqs + 3) + 3 * items + 3 + (seqs + 3) + seqs * width + 3;
}

step_inputs pack_step(const step_batch& batch, const step_shape& shape, int32_t pad_to) {
  const int32_t bs = shape.block_size;
  if (bs < 1 || shape.n_head_kv < 1 || shape.group < 1) throw std::invalid_argument("pack_step: bad shape");
  const auto n_seqs = static_cast<int32_t>(batch.seqs.size());
  step_inputs in;
  in.decode_only = std::all_of(batch.seqs.begin(), batch.seqs.end(), [](const sequence_step& s) { return s.tokens.size() == 1; });
  if (pad_to > 0 && (!in.decode_only || pad_to < n_seqs)) {
    throw std::invalid_argument(fmt::format("pack_step: a step of {} sequences{} cannot be padded to {}", n_seqs,
                                            in.decode_only ? "" : " with prompt chunks", pad_to));
  }
  in.real_seqs = n_seqs;
  for (const sequence_step& s : batch.seqs) {
    const int64_t end = int64_t{s.start_pos} + static_cast<int64_t>(s.tokens.size());
    const int64_t need = (end + bs - 1) / bs;
    if (static_cast<int64_t>(s.block_table.size()) < need) {
      throw std::invalid_argument(fmt::format("sequence {}: {} positions need {} blocks, its table has {}", s.seq_id, end,
                                              need, s.block_table.size()));
    }
    in.width = std::max(in.width, static_cast<int32_t>(need));
    in.real_rows += static_cast<int32_t>(s.tokens.size());
  }
  in.seqs = pad_to > 0 ? pad_to : n_seqs;
  in.rows = pad_to > 0 ? pad_to : in.real_rows;
  const int32_t tiles_of_token = (shape.group + attention_tile_rows - 1) / attention_tile_rows;
  in.items = 0;
  for (const sequence_step& s : batch.seqs) {
    const int64_t q_rows = static_cast<int64_t>(s.tokens.size()) * shape.group;
    in.items += shape.n_head_kv * static_cast<int32_t>((q_rows + attention_tile_rows - 1) / attention_tile_rows);
  }
  if (pad_to > 0) in.items = pad_to * shape.n_head_kv * tiles_of_token;
  in.out_of_seq.assign(static_cast<size_t>(n_seqs), -1);
  if (pad_to > 0) {
    in.outs = pad_to;
    for (int32_t i = 0; i < n_seqs; ++i) in.out_of_seq[i] = i;
  } else {
    for (int32_t i = 0; i < n_seqs; ++i) {
      if (batch.seqs[i].sample || batch.seqs[i].want_logits) in.out_of_seq[i] = in.outs++;
    }
  }

  int32_t at = 4;
  const auto section = [&](int32_t n) {
    const int32_t start = at;
    at = align4(at + n);
    return start;
  };
  in.tokens_at = section(in.rows);
  in.pos_at = section(in.rows);
  in.row_seq_at = section(in.rows);
  in.seq_start_at = section(in.seqs);
  in.seq_len_at = section(in.seqs);
  in.seq_row_at = section(in.seqs);
  in.items_at = section(3 * in.items);
  in.outs_at = section(in.outs);
  in.table_at = section(in.seqs * in.width);
  in.words.assign(static_cast<size_t>(at), 0);
  int32_t* w = in.words.data();
  w[0] = in.width;
  std::fill(w + in.row_seq_at, w + in.row_seq_at + in.rows, -1);
  std::fill(w + in.table_at, w + in.table_at + in.seqs * in.width, -1);
  for (int32_t i = 0; i < in.items; ++i) w[in.items_at + 3 * i] = -1;

  int32_t row = 0, item = 0;
  for (int32_t i = 0; i < n_seqs; ++i) {
    const sequence_step& s = batch.seqs[i];
    const auto n = static_cast<int32_t>(s.tokens.size());
    w[in.seq_start_at + i] = s.start_pos;
    w[in.seq_len_at + i] = n;
    w[in.seq_row_at + i] = row;
    for (int32_t t = 0; t < n; ++t) {
      w[in.tokens_at + row + t] = s.tokens[t];
      w[in.pos_at + row + t] = s.start_pos + t;
      w[in.row_seq_at + row + t] = i;
    }
    const int32_t q_rows = n * shape.group;
    for (int32_t h = 0; h < shape.n_head_kv; ++h) {
      for (int32_t first = 0; first < q_rows; first += attention_tile_rows, ++item) {
        w[in.items_at + 3 * item] = i;
        w[in.items_at + 3 * item + 1] = h;
        w[in.items_at + 3 * item + 2] = first;
      }
    }
    const int64_t need = (int64_t{s.start_pos} + n + bs - 1) / bs;
    std::copy_n(s.block_table.begin(), need, w + in.table_at + i * in.width);
    if (pad_to == 0 && in.out_of_seq[i] >= 0) w[in.outs_at + in.out_of_seq[i]] = row + n - 1;
    row += n;
  }
  // Padding sequences: no tokens, their rows (token 0 at position 0) write nothing.
  for (int32_t i = n_seqs; i < in.seqs; ++i) w[in.seq_row_at + i] = i;
  if (pad_to > 0) {
    for (int32_t i = 0; i < in.outs; ++i) w[in.outs_at + i] = i;  // one row per sequence
  }
  return in;
}

int32_t graph_bucket_for(const step_batch& batch, std::span<const int32_t> buckets) {
  if (batch.seqs.empty()) return -1;
  for (const sequence_step& s : batch.seqs) {
    if (s.tokens.size() != 1) return -1;
  }
  return graph_bucket(buckets, static_cast<int32_t>(batch.seqs.size()));
}

}  // namespace tireless::cuda
