#include "gpu/cuda/cuda_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
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

}  // namespace
}  // namespace tireless::cuda
