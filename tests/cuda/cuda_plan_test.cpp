#include "gpu/cuda/cuda_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tireless::cuda {
namespace {

// SmolLM2-135M (Q4_1, ~90 MB) on an H200 (141 GB), the shipped engine limits.
memory_request smollm2_on_h200() {
  memory_request r;
  r.device_bytes = 141ll << 30;
  r.weight_bytes = 90ll << 20;
  r.kv_bytes_per_token = 30ll * 192 * 2 * 2;  // 30 layers, kv_dim 192, K and V, fp16
  r.block_size = 16;
  r.max_step_tokens = 512;
  r.max_step_seqs = 64;
  r.max_context = 8192;
  r.hidden = 576, r.ffn = 1536, r.vocab = 49152, r.q_dim = 576, r.kv_dim = 192;
  return r;
}

TEST(cuda_plan, the_kv_pool_takes_what_weights_workspace_and_reserve_leave) {
  const memory_request r = smollm2_on_h200();
  const memory_plan p = plan_memory(r);
  EXPECT_EQ(p.weights, r.weight_bytes);
  EXPECT_EQ(p.activations, activation_bytes(r));
  EXPECT_EQ(p.kv_block_bytes, r.kv_bytes_per_token * 16);
  EXPECT_LE(p.total(), r.device_bytes);
  EXPECT_GT(p.total() + p.kv_block_bytes, r.device_bytes - p.reserve);  // nothing usable left over
  EXPECT_GT(p.reserve, 0);
  // The logits of 64 sequences dominate SmolLM2's workspace: 64 x 49,152 floats.
  EXPECT_GE(p.activations, 64ll * 49152 * 4);
  EXPECT_NE(p.describe().find("KV"), std::string::npos);
}

TEST(cuda_plan, asked_for_blocks_are_given_or_refused_with_what_fits) {
  memory_request r = smollm2_on_h200();
  r.kv_blocks = 1000;
  EXPECT_EQ(plan_memory(r).kv_blocks, 1000);
  r.kv_blocks = 1 << 30;
  try {
    plan_memory(r);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("kv.blocks"), std::string::npos) << e.what();
  }
}

TEST(cuda_plan, a_model_too_big_for_the_device_is_refused_with_the_numbers) {
  memory_request r = smollm2_on_h200();
  r.weight_bytes = 140ll << 30;  // a 140 GB model on a 141 GB device
  try {
    plan_memory(r);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("does not fit"), std::string::npos) << m;
    EXPECT_NE(m.find("140.00 GiB"), std::string::npos) << m;
  }
}

TEST(cuda_plan, decode_steps_replay_the_smallest_graph_bucket_that_holds_them) {
  const std::vector<int32_t> b = graph_buckets(256);
  EXPECT_EQ(b.front(), 1);
  EXPECT_EQ(b.back(), 256);
  EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
  EXPECT_EQ(graph_bucket(b, 1), 1);
  EXPECT_EQ(graph_bucket(b, 3), 4);
  EXPECT_EQ(graph_bucket(b, 9), 16);
  EXPECT_EQ(graph_bucket(b, 64), 64);
  EXPECT_EQ(graph_bucket(b, 65), 96);
  EXPECT_EQ(graph_bucket(b, 250), 256);
  EXPECT_EQ(graph_bucket(b, 257), -1);
  EXPECT_EQ(graph_bucket(b, 0), -1);
  EXPECT_EQ(graph_buckets(1), std::vector<int32_t>{1});
  EXPECT_EQ(graph_buckets(6), (std::vector<int32_t>{1, 2, 4, 6}));
}

TEST(cuda_plan, block_tables_are_packed_in_rows_padded_with_minus_one) {
  const std::vector<token_id> prefill(20, 7), one(1, 9);
  const std::vector<int32_t> t0{5, 3}, t1{8, 2, 6, 4};
  step_batch b;
  auto seq = [](uint64_t id, std::span<const token_id> tokens, int32_t start, std::span<const int32_t> table) {
    sequence_step s;
    s.seq_id = id;
    s.tokens = tokens;
    s.start_pos = start;
    s.block_table = table;
    return s;
  };
  b.seqs.push_back(seq(1, prefill, 0, t0));  // 20 positions: 2 blocks
  b.seqs.push_back(seq(2, one, 40, t1));     // position 40: 3 blocks
  const block_table_upload u = pack_block_tables(b, 16);
  EXPECT_EQ(u.width, 3);
  EXPECT_EQ(u.table, (std::vector<int32_t>{5, 3, -1, 8, 2, 6}));
  EXPECT_EQ(u.start_pos, (std::vector<int32_t>{0, 40}));
  EXPECT_EQ(u.n_tokens, (std::vector<int32_t>{20, 1}));
  EXPECT_EQ(u.first_row, (std::vector<int32_t>{0, 20}));
  EXPECT_EQ(u.rows, 21);
  const std::vector<int32_t> short_table{1};
  b.seqs[1].block_table = short_table;
  EXPECT_THROW(pack_block_tables(b, 16), std::invalid_argument);
}

sequence_step seq_step(uint64_t id, std::span<const token_id> tokens, int32_t start, std::span<const int32_t> table,
                       bool sample = true) {
  sequence_step s;
  s.seq_id = id;
  s.tokens = tokens;
  s.start_pos = start;
  s.block_table = table;
  s.sample = sample;
  return s;
}

std::vector<int32_t> section(const step_inputs& in, int32_t at, int32_t n) {
  return std::vector<int32_t>(in.words.begin() + at, in.words.begin() + at + n);
}

// SmolLM2's attention: 3 KV heads, 3 query heads each; blocks of 16.
step_shape smollm2_shape() {
  step_shape s;
  s.block_size = 16;
  s.n_head_kv = 3;
  s.group = 3;
  return s;
}

TEST(cuda_plan, a_mixed_step_packs_tokens_positions_tables_and_attention_work_in_one_array) {
  const std::vector<token_id> prompt{11, 12, 13, 14, 15, 16, 17}, one{99};
  const std::vector<int32_t> t0{4}, t1{7, 2, 9};
  step_batch b;
  b.seqs.push_back(seq_step(1, prompt, 0, t0, false));  // a prefill chunk, no sample
  b.seqs.push_back(seq_step(2, one, 35, t1));           // a decode token at position 35: block 2
  const step_inputs in = pack_step(b, smollm2_shape());
  EXPECT_FALSE(in.decode_only);
  EXPECT_EQ(in.rows, 8);
  EXPECT_EQ(in.seqs, 2);
  EXPECT_EQ(in.width, 3);
  EXPECT_EQ(in.words[0], 3);
  for (int32_t at : {in.tokens_at, in.pos_at, in.row_seq_at, in.seq_start_at, in.items_at, in.outs_at, in.table_at}) {
    EXPECT_EQ(at % 4, 0) << "sections start on 16 bytes";
  }
  EXPECT_EQ(section(in, in.tokens_at, 8), (std::vector<int32_t>{11, 12, 13, 14, 15, 16, 17, 99}));
  EXPECT_EQ(section(in, in.pos_at, 8), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 35}));
  EXPECT_EQ(section(in, in.row_seq_at, 8), (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(section(in, in.seq_start_at, 2), (std::vector<int32_t>{0, 35}));
  EXPECT_EQ(section(in, in.seq_len_at, 2), (std::vector<int32_t>{7, 1}));
  EXPECT_EQ(section(in, in.seq_row_at, 2), (std::vector<int32_t>{0, 7}));
  EXPECT_EQ(section(in, in.table_at, 6), (std::vector<int32_t>{4, -1, -1, 7, 2, 9}));
  // The chunk: 7 tokens x 3 heads = 21 query rows per KV head, tiles of 16: 2 items per head;
  // the decode token: 3 rows, one item per head.
  ASSERT_EQ(in.items, 3 * 2 + 3);
  EXPECT_EQ(section(in, in.items_at, 3 * in.items),
            (std::vector<int32_t>{0, 0, 0, 0, 0, 16, 0, 1, 0, 0, 1, 16, 0, 2, 0, 0, 2, 16, 1, 0, 0, 1, 1, 0, 1, 2, 0}));
  // Only the sampled sequence's last row gets logits.
  EXPECT_EQ(in.outs, 1);
  EXPECT_EQ(section(in, in.outs_at, 1), std::vector<int32_t>{7});
  EXPECT_EQ(in.out_of_seq, (std::vector<int32_t>{-1, 0}));
  EXPECT_LE(static_cast<int64_t>(in.words.size()), max_step_words(8, 2, 48, smollm2_shape()));
}

TEST(cuda_plan, a_decode_step_padded_to_its_bucket_keeps_its_offsets_whatever_the_context) {
  const std::vector<token_id> a{5}, c{6};
  const std::vector<int32_t> short_table{3}, long_table{1, 2, 3, 4, 5, 6, 7, 8};
  step_batch small, large;
  small.seqs.push_back(seq_step(1, a, 3, short_table));
  small.seqs.push_back(seq_step(2, c, 4, short_table));
  large.seqs.push_back(seq_step(1, a, 100, long_table));
  large.seqs.push_back(seq_step(2, c, 120, long_table));
  const step_inputs s = pack_step(small, smollm2_shape(), 4), l = pack_step(large, smollm2_shape(), 4);
  EXPECT_TRUE(s.decode_only);
  EXPECT_EQ(s.rows, 4);
  EXPECT_EQ(s.seqs, 4);
  EXPECT_EQ(s.outs, 4);
  EXPECT_EQ(s.items, 4 * 3);
  // A graph captured for one replays the other: every offset but the table's width agrees.
  for (auto member : {&step_inputs::tokens_at, &step_inputs::pos_at, &step_inputs::row_seq_at, &step_inputs::seq_start_at,
                      &step_inputs::seq_len_at, &step_inputs::seq_row_at, &step_inputs::items_at, &step_inputs::outs_at,
                      &step_inputs::table_at}) {
    EXPECT_EQ(s.*member, l.*member);
  }
  EXPECT_EQ(s.width, 1);
  EXPECT_EQ(l.width, 8);
  // Padding sequences: no tokens, no KV writes, no attention work.
  EXPECT_EQ(section(s, s.row_seq_at, 4), (std::vector<int32_t>{0, 1, -1, -1}));
  EXPECT_EQ(section(s, s.seq_len_at, 4), (std::vector<int32_t>{1, 1, 0, 0}));
  EXPECT_EQ(s.words[s.items_at + 3 * 6], -1);
  EXPECT_EQ(section(s, s.outs_at, 4), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.out_of_seq, (std::vector<int32_t>{0, 1}));
  EXPECT_THROW(pack_step(small, smollm2_shape(), 1), std::invalid_argument);  // 2 sequences in a bucket of 1
}

TEST(cuda_plan, only_decode_steps_within_the_buckets_are_replayed_from_graphs) {
  const std::vector<int32_t> buckets = graph_buckets(8);
  const std::vector<token_id> one{1}, two{1, 2};
  const std::vector<int32_t> table{0};
  step_batch b;
  b.seqs.push_back(seq_step(1, one, 0, table));
  EXPECT_EQ(graph_bucket_for(b, buckets), 1);
  b.seqs.push_back(seq_step(2, one, 0, table));
  b.seqs.push_back(seq_step(3, one, 0, table));
  EXPECT_EQ(graph_bucket_for(b, buckets), 4);
  b.seqs.push_back(seq_step(4, two, 0, table));
  EXPECT_EQ(graph_bucket_for(b, buckets), -1);  // a prompt chunk: run as launched
  EXPECT_EQ(graph_bucket_for(step_batch{}, buckets), -1);
}

TEST(cuda_plan, no_step_within_the_limits_outgrows_the_input_buffer) {
  // Random steps at SmolLM2's limits: the words never exceed max_step_words.
  std::mt19937 g(7);
  const step_shape shape = smollm2_shape();
  const int32_t max_tokens = 512, max_seqs = 64, max_context = 2048;
  const int64_t room = max_step_words(max_tokens, max_seqs, max_context, shape);
  std::vector<std::vector<token_id>> tokens(max_seqs);
  const std::vector<int32_t> table(max_context / 16, 0);
  for (int round = 0; round < 200; ++round) {
    step_batch b;
    int32_t left = max_tokens;
    for (int32_t i = 0; i < max_seqs && left > 0; ++i) {
      const int32_t n = std::min<int32_t>(left, round % 2 ? 1 : 1 + static_cast<int32_t>(g() % 100));
      tokens[i].assign(static_cast<size_t>(n), 3);
      const int32_t start = static_cast<int32_t>(g() % static_cast<uint32_t>(max_context - n));
      b.seqs.push_back(seq_step(static_cast<uint64_t>(i), tokens[i], start, table));
      left -= n;
    }
    EXPECT_LE(static_cast<int64_t>(pack_step(b, shape).words.size()), room) << "round " << round;
  }
  memory_request r = smollm2_on_h200();
  r.n_head = 9, r.n_head_kv = 3;
  EXPECT_GE(workspace_of(r).inputs.bytes, max_step_words(r.max_step_tokens, r.max_step_seqs, r.max_context, shape) * 4);
}

// Mixtral 8x7B (q4_0) on an H200 with 8192-token steps: 2 of 8 experts a token.
memory_request mixtral_on_h200() {
  memory_request r;
  r.device_bytes = 141ll << 30;
  r.weight_bytes = 26ll << 30;
  r.kv_bytes_per_token = 32ll * 1024 * 2 * 2;
  r.block_size = 16;
  r.max_step_tokens = 8192;
  r.max_step_seqs = 256;
  r.max_context = 32768;
  r.hidden = 4096, r.ffn = 14336, r.vocab = 32000, r.q_dim = 4096, r.kv_dim = 1024;
  r.n_head = 32, r.n_head_kv = 8, r.n_layer = 32;
  r.n_expert = 8, r.n_expert_used = 2;
  return r;
}

// Every slice of the workspace as the backend carves it (slice_of over workspace_of): 256-byte
// aligned, apart from the others, inside what the plan set aside, and as large as the backend's
// use of it needs (sizes worked out here again, from the shapes).
void expect_the_backend_can_carve_it(const memory_request& r) {
  const workspace_layout w = workspace_of(r);
  EXPECT_EQ(plan_memory(r).activations, w.total);
  const int64_t rows = r.max_step_tokens, seqs = std::min(r.max_step_seqs, r.max_step_tokens);
  const int64_t k = r.n_expert > 0 ? r.n_expert_used : 0, pairs = rows * k, ffn_rows = std::max(rows, pairs);
  const int64_t widest = std::max({r.hidden, r.q_dim, r.ffn}), hd = r.q_dim / r.n_head;
  const std::vector<std::pair<workspace_slice, int64_t>> need{
      {w.x, rows * r.hidden * 4},
      {w.h, rows * r.hidden * 4},
      {w.qkv, rows * (r.q_dim + 2 * r.kv_dim) * 4},
      {w.att, rows * r.q_dim * 4},
      {w.logits, seqs * r.vocab * 4},
      {w.partial, 3ll * r.multiprocessors * 16 * (hd + 2) * 4},
      {w.ffn_in, ffn_rows * 2 * r.ffn * 4},
      {w.ffn_act, ffn_rows * r.ffn * 4},
      {w.q8_q, ffn_rows * widest},
      {w.q8_d, ffn_rows * widest / 32 * 4},
      {w.q8_s, ffn_rows * widest / 32 * 4},
      {w.halves, rows * widest * 2},
      {w.argmax, seqs * 4},
      {w.router, rows * r.n_expert * 4},
      {w.gates, pairs * 4},
      {w.chosen, pairs * 4},
      {w.pair_row, pairs * 4},
      {w.slot_pair, pairs * 4},
      {w.offsets, r.n_expert > 0 ? (r.n_expert + 1) * 4 : 0},
      {w.pairs_in, pairs * r.hidden * 4},
      {w.pairs_out, pairs * r.hidden * 4},
      {w.counts, int64_t{r.n_layer} * r.n_expert * 8},
  };
  std::vector<workspace_slice> used{w.inputs};
  for (const auto& [s, bytes] : need) {
    EXPECT_GE(s.bytes, bytes) << "slice at " << s.at;
    if (s.bytes > 0) used.push_back(s);
  }
  std::sort(used.begin(), used.end(), [](const workspace_slice& a, const workspace_slice& b) { return a.at < b.at; });
  for (size_t i = 0; i < used.size(); ++i) {
    EXPECT_EQ(used[i].at % 256, 0);
    EXPECT_LE(used[i].end(), i + 1 < used.size() ? used[i + 1].at : w.total) << "slice at " << used[i].at << " overlaps";
  }
  EXPECT_EQ(used.back().end(), w.total);
}

TEST(cuda_plan, the_workspace_the_backend_carves_is_what_the_plan_sets_aside) {
  expect_the_backend_can_carve_it(smollm2_on_h200());
  const memory_request mixtral = mixtral_on_h200();
  expect_the_backend_can_carve_it(mixtral);
  // Mixtral's experts: 16,384 pairs of 4,096 floats in and out (256 MiB each) and the per-layer
  // counts are in the plan, not taken from the reserve.
  const workspace_layout w = workspace_of(mixtral);
  EXPECT_EQ(w.pairs_in.bytes, 16384ll * 4096 * 4);
  EXPECT_EQ(w.pairs_out.bytes, 16384ll * 4096 * 4);
  EXPECT_EQ(w.counts.bytes, 32 * 8 * 8);
  EXPECT_EQ(workspace_of(smollm2_on_h200()).pairs_in.bytes, 0) << "a dense model has no expert buffers";
}

TEST(cuda_plan, left_to_the_device_the_pool_is_what_is_left_and_asked_for_it_must_fit) {
  memory_request r = mixtral_on_h200();
  r.kv_blocks = 0;
  const memory_plan open = plan_memory(r);
  EXPECT_GT(open.kv_blocks, 10 * r.max_context / r.block_size) << "far more than one max-length sequence";
  EXPECT_LE(open.total(), r.device_bytes);
  r.kv_blocks = open.kv_blocks;
  EXPECT_EQ(plan_memory(r).kv_blocks, open.kv_blocks);
  r.kv_blocks = open.kv_blocks + 1;
  try {
    plan_memory(r);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("at most " + std::to_string(open.kv_blocks) + " blocks"), std::string::npos) << m;
    EXPECT_NE(m.find("kv.memory_mb"), std::string::npos) << m;
  }
}

// Llama-3-8B's decode products on an H200 (132 multiprocessors, 227 KiB of shared memory each).
TEST(cuda_plan, decode_products_keep_several_blocks_a_multiprocessor_at_every_batch) {
  for (const int32_t n : {1, 2, 3, 4, 5, 6, 7, 8}) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{4096, 14336}, {6144, 4096}, {28672, 4096}, {128256, 4096}}) {
      const matvec_launch q = plan_matvec(true, rows, cols, n, 0, 132);
      EXPECT_GE(q.nt, n);
      EXPECT_LE(q.shared, 28 * 1024) << n << " tokens, " << cols << " columns: shared memory no longer limits the blocks";
      EXPECT_GE(q.blocks_x * q.warps * matvec_warp_rows(q.nt), rows) << "every row has a warp";
      EXPECT_EQ(q.blocks_y, 1);
      const matvec_launch f = plan_matvec(false, rows, cols, n, 0, 132);
      EXPECT_LE(f.shared, 28 * 1024);
    }
  }
  // Batch 1 stages a whole row of activations of up to 16,384 values at once, as before.
  EXPECT_EQ(plan_matvec(true, 4096, 14336, 1, 0, 132).shared, 448 * (matvec_q_stride + 8));
  // The down projection at 8 tokens: 4 rows a warp, 1024 warps, spread two blocks a multiprocessor.
  const matvec_launch down = plan_matvec(true, 4096, 14336, 8, 0, 132);
  EXPECT_EQ(down.nt, 8);
  EXPECT_EQ(down.shared, 8 * 64 * (matvec_q_stride + 8));
  EXPECT_GE(down.blocks_x, 2 * 132);
}

TEST(cuda_plan, grouped_decode_products_read_an_experts_rows_once_per_tile_of_pairs) {
  // Mixtral decode: 2 of 8 experts a token. One token: a pair a tile.
  EXPECT_EQ(plan_matvec(true, 14336, 4096, 2, 8, 132).nt, 1);
  EXPECT_EQ(plan_matvec(true, 14336, 4096, 2, 8, 132).blocks_y, 2);
  // 12 tokens, 24 pairs, ~3 an expert: tiles of 4 pairs, with room for the worst spread (every
  // expert's last tile partial).
  const matvec_launch l = plan_matvec(true, 14336, 4096, 24, 8, 132);
  EXPECT_EQ(l.nt, 4);
  EXPECT_EQ(l.blocks_y, 24 / 4 + 8);
  for (const std::vector<int32_t>& counts :
       {std::vector<int32_t>{24, 0, 0, 0, 0, 0, 0, 0}, {3, 3, 3, 3, 3, 3, 3, 3}, {1, 1, 1, 1, 1, 1, 1, 17}, {5, 5, 5, 5, 1, 1, 1, 1}}) {
    int64_t tiles = 0;
    for (int32_t c : counts) tiles += (c + l.nt - 1) / l.nt;
    EXPECT_LE(tiles, l.blocks_y);
  }
}

TEST(cuda_plan, a_split_of_attention_covers_two_key_tiles_or_the_item_runs_one_split) {
  EXPECT_EQ(attention_item_splits(16, 5), 1);      // a graph sized for 8192 positions, at position 5
  EXPECT_EQ(attention_item_splits(16, 64), 1);     // two tiles: one split
  EXPECT_EQ(attention_item_splits(16, 65), 2);     // three tiles
  EXPECT_EQ(attention_item_splits(16, 8192), 16);  // 256 tiles: all the launch has
  EXPECT_EQ(attention_item_splits(3, 8192), 3);
  EXPECT_EQ(attention_item_splits(1, 8192), 1);
}

}  // namespace
}  // namespace tireless::cuda
