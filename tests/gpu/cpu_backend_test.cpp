// The whole forward pass of the CPU backend, at the logits level: a sequence's logits do not
// depend on what else runs in its step or on how its prompt is chunked (bit for bit, on every
// instruction set), and a bad step is refused with a message that names the problem.
#include "gpu/cpu/cpu_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <numeric>
#include <string>
#include <tuple>

#include "model/model.hpp"

namespace tireless::cpu {
namespace {

using ::testing::HasSubstr;

std::filesystem::path model_path(const std::string& name) {
  if (name == "smollm2") {
    const char* home = std::getenv("HOME");
    return std::filesystem::path(home ? home : "") / ".cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  const char* dir = std::getenv("TIRELESS_TEST_DATA");
  return std::filesystem::path(dir ? dir : TIRELESS_BINARY_DIR "/test-data") / (name + ".gguf");
}

// Tokens [n], the same for the same seed, spread over the vocabulary.
std::vector<token_id> some_tokens(int32_t n, uint64_t seed, int32_t n_vocab) {
  std::vector<token_id> t(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (token_id& id : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<token_id>((x >> 33) % static_cast<uint64_t>(n_vocab));
  }
  return t;
}

// A sequence the test feeds: every token it will take (prompt, then one decode input per
// later step), its blocks, and how many positions are already in the KV cache.
struct sequence {
  uint64_t id;
  std::vector<token_id> tokens;
  std::vector<int32_t> blocks;
  int32_t done = 0;
};

struct chunk {
  sequence* seq;
  int32_t n;  // tokens this step
  bool want_logits;
};

constexpr int32_t blocks_per_seq = 8, seq_slots = 8;

// Sequence `slot`'s blocks, interleaved with the other slots' across the pool:
// slot + seq_slots * i for i in 0 .. blocks_per_seq - 1.
std::vector<int32_t> blocks_of(int32_t slot) {
  std::vector<int32_t> b(blocks_per_seq);
  for (int32_t i = 0; i < blocks_per_seq; ++i) b[i] = slot + seq_slots * i;
  return b;
}

sequence make_sequence(uint64_t id, int32_t slot, int32_t n_tokens, int32_t n_vocab) {
  return {id, some_tokens(n_tokens, id, n_vocab), blocks_of(slot)};
}

// Runs one step of these chunks, in this order, and moves the sequences on. Gives each
// chunk's last logits (empty where it wants none).
std::vector<std::vector<float>> run_step(backend& b, const std::vector<chunk>& chunks) {
  step_batch batch;
  for (const chunk& c : chunks) {
    sequence_step s;
    s.seq_id = c.seq->id;
    s.tokens = std::span<const token_id>(c.seq->tokens).subspan(c.seq->done, c.n);
    s.start_pos = c.seq->done;
    s.block_table = c.seq->blocks;
    s.want_logits = c.want_logits;
    s.sample = c.seq->id % 3 != 0;  // sampling must not disturb anyone's logits
    s.sampling.temperature = c.seq->id % 2 ? 0.0f : 0.8f;
    s.sampling.seed = c.seq->id;
    batch.seqs.push_back(s);
  }
  step_result result;
  b.execute(batch, result);
  EXPECT_EQ(result.next.size(), chunks.size());
  const size_t v = static_cast<size_t>(b.n_vocab());
  std::vector<std::vector<float>> out(chunks.size());
  size_t at = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    chunks[i].seq->done += chunks[i].n;
    if (!chunks[i].want_logits) continue;
    EXPECT_LE((at + 1) * v, result.logits.size());
    out[i].assign(result.logits.begin() + at * v, result.logits.begin() + (at + 1) * v);
    ++at;
  }
  EXPECT_EQ(at * v, result.logits.size());
  return out;
}

::testing::AssertionResult bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " logits vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "logit " << i << " differs: " << std::setprecision(9)
                                           << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

cpu_backend_options options_for(isa which) {
  cpu_backend_options o;
  o.threads = 2;
  o.block_size = 16;
  o.kv_blocks = blocks_per_seq * seq_slots;
  o.max_context = 16 * blocks_per_seq;
  o.kernels = which;
  return o;
}

class cpu_backend_test : public ::testing::TestWithParam<std::tuple<std::string, isa>> {
 protected:
  void SetUp() override {
    const auto& [name, which] = GetParam();
    if (!cpu_supports(which)) GTEST_SKIP() << "CPU lacks " << cpu::name(which);
    if (!std::filesystem::exists(model_path(name))) GTEST_SKIP() << model_path(name) << " is absent";
    backend_ = make_cpu_backend(model::load(model_path(name)), options_for(which));
    n_vocab_ = backend_->n_vocab();
  }
  sequence make(uint64_t id, int32_t slot, int32_t n_tokens) { return make_sequence(id, slot, n_tokens, n_vocab_); }

  std::unique_ptr<backend> backend_;
  int32_t n_vocab_ = 0;
};

TEST_P(cpu_backend_test, a_sequence_gets_the_same_logits_alone_and_in_a_mixed_batch) {
  constexpr int32_t prompt = 11, decodes = 4;
  backend& b = *backend_;

  sequence alone = make(100, 0, prompt + decodes);
  std::vector<std::vector<float>> want;
  want.push_back(run_step(b, {{&alone, prompt, true}})[0]);
  for (int i = 0; i < decodes; ++i) want.push_back(run_step(b, {{&alone, 1, true}})[0]);

  // The same tokens in other blocks, among five sequences of other lengths: some prefilling
  // (one across two attention tasks of 64 rows, one in two chunks), some decoding, all at
  // other positions, the target in a different place in each step.
  sequence target = make(100, 1, prompt + decodes);
  sequence o1 = make(1, 2, 3 + 5), o2 = make(2, 3, 17 + 5), o3 = make(3, 4, 30 + 5);
  sequence o4 = make(4, 5, 5 + 5), o5 = make(5, 6, 70 + 5);
  run_step(b, {{&o1, 3, true}, {&o2, 17, false}, {&o3, 20, false}});
  std::vector<std::vector<float>> got;
  got.push_back(run_step(b, {{&o1, 1, true}, {&o3, 10, true}, {&target, prompt, true}, {&o2, 1, false},
                             {&o4, 5, true}, {&o5, 40, false}})[2]);
  got.push_back(run_step(b, {{&o5, 30, true}, {&target, 1, true}, {&o4, 1, false}, {&o1, 1, true},
                             {&o2, 1, true}, {&o3, 1, false}})[1]);
  got.push_back(run_step(b, {{&o2, 1, true}, {&o3, 1, true}, {&o4, 1, true}, {&o5, 1, true},
                             {&o1, 1, true}, {&target, 1, true}})[5]);
  got.push_back(run_step(b, {{&target, 1, true}, {&o1, 1, false}, {&o5, 1, true}, {&o2, 1, true},
                             {&o3, 1, true}, {&o4, 1, false}})[0]);
  got.push_back(run_step(b, {{&o3, 1, false}, {&o4, 1, true}, {&target, 1, true}, {&o1, 1, true},
                             {&o2, 1, false}, {&o5, 1, true}})[2]);

  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(bit_identical(got[i], want[i])) << "step " << i;
}

TEST_P(cpu_backend_test, a_prompt_chunked_by_7_ends_with_the_same_logits_as_in_one_chunk) {
  constexpr int32_t prompt = 40;
  backend& b = *backend_;
  sequence whole = make(7, 0, prompt);
  const std::vector<float> want = run_step(b, {{&whole, prompt, true}})[0];

  sequence chunked = make(7, 1, prompt);
  std::vector<float> got;
  for (int32_t at = 0; at < prompt; at += 7) {
    const int32_t n = std::min(7, prompt - at);
    got = run_step(b, {{&chunked, n, at + n == prompt}})[0];
  }
  EXPECT_TRUE(bit_identical(got, want));
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, isa>>& info) {
  std::string model = std::get<0>(info.param);
  std::replace(model.begin(), model.end(), '-', '_');
  return model + "_" + std::string(name(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(models_and_sets, cpu_backend_test,
                         ::testing::Combine(::testing::Values("tiny-dense", "tiny-moe", "tiny-dense-tied", "smollm2"),
                                            ::testing::Values(isa::generic, isa::avx2, isa::avx512)),
                         param_name);

// What execute() says about a step it refuses; "accepted" when it runs it.
std::string refusal(backend& b, const step_batch& batch) {
  step_result r;
  try {
    b.execute(batch, r);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

class cpu_backend_refuses : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(model_path("tiny-dense"))) GTEST_SKIP() << "no tiny-dense.gguf";
    cpu_backend_options o;
    o.threads = 2;
    o.block_size = 16;
    o.kv_blocks = 8;
    o.max_context = 128;
    o.max_step_tokens = 32;
    o.max_step_seqs = 4;
    backend_ = make_cpu_backend(model::load(model_path("tiny-dense")), o);
  }

  // One sequence's step: n tokens from start_pos, with these blocks.
  step_batch step(std::span<const token_id> tokens, int32_t start_pos, std::span<const int32_t> blocks) {
    step_batch b;
    sequence_step s;
    s.seq_id = 9;
    s.tokens = tokens;
    s.start_pos = start_pos;
    s.block_table = blocks;
    s.want_logits = true;
    b.seqs.push_back(s);
    return b;
  }

  std::unique_ptr<backend> backend_;
  const std::vector<int32_t> blocks_ = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<token_id> tokens_ = std::vector<token_id>(40, 65);
};

TEST_F(cpu_backend_refuses, a_token_outside_the_vocabulary) {
  const std::vector<token_id> too_big = {65, backend_->n_vocab(), 66}, negative = {-1};
  EXPECT_THAT(refusal(*backend_, step(too_big, 0, blocks_)),
              HasSubstr("token " + std::to_string(backend_->n_vocab()) + " is outside the vocabulary"));
  EXPECT_THAT(refusal(*backend_, step(negative, 0, blocks_)), HasSubstr("token -1 is outside the vocabulary"));
}

TEST_F(cpu_backend_refuses, a_block_table_too_short_for_the_positions) {
  const std::vector<int32_t> one = {0};
  EXPECT_THAT(refusal(*backend_, step(std::span(tokens_).first(17), 0, one)),
              HasSubstr("2 blocks needed, block table has 1"));
  EXPECT_THAT(refusal(*backend_, step(std::span(tokens_).first(1), 16, one)),
              HasSubstr("2 blocks needed, block table has 1"));
}

TEST_F(cpu_backend_refuses, a_block_outside_the_pool) {
  const std::vector<int32_t> past_end = {3, 8}, negative = {-1};
  EXPECT_THAT(refusal(*backend_, step(std::span(tokens_).first(20), 0, past_end)),
              HasSubstr("block 8 is outside the pool"));
  EXPECT_THAT(refusal(*backend_, step(std::span(tokens_).first(1), 0, negative)),
              HasSubstr("block -1 is outside the pool"));
}

TEST_F(cpu_backend_refuses, too_many_tokens_or_sequences) {
  EXPECT_THAT(refusal(*backend_, step(std::span(tokens_).first(33), 0, blocks_)),
              HasSubstr("step has 33 tokens, the limit is 32"));
  step_batch two = step(std::span(tokens_).first(20), 0, blocks_);
  two.seqs.push_back(two.seqs[0]);
  two.seqs[1].tokens = std::span(tokens_).first(13);
  EXPECT_THAT(refusal(*backend_, two), HasSubstr("step has 33 tokens, the limit is 32"));
  step_batch five = step(std::span(tokens_).first(1), 0, blocks_);
  for (int i = 0; i < 4; ++i) five.seqs.push_back(five.seqs[0]);
  EXPECT_THAT(refusal(*backend_, five), HasSubstr("step has 5 sequences, the limit is 4"));
}

TEST_F(cpu_backend_refuses, positions_past_the_context_or_no_tokens) {
  EXPECT_THAT(refusal(*backend_, step(std::span(tokens_).first(2), 127, blocks_)),
              HasSubstr("positions 127..128 are outside 0..127"));
  EXPECT_THAT(refusal(*backend_, step({}, 0, blocks_)), HasSubstr("outside 0..127"));
}

TEST_F(cpu_backend_refuses, and_a_refused_step_changes_nothing) {
  // A refused step that would first rewrite positions 10..19 of a sequence leaves them as
  // they were: the next decode sees the same cache.
  const std::vector<token_id> prompt = some_tokens(21, 3, backend_->n_vocab());
  const std::vector<token_id> other = some_tokens(10, 4, backend_->n_vocab());
  const std::vector<token_id> bad = {65, -5};
  step_result prefill, before, after;
  backend_->execute(step(std::span(prompt).first(20), 0, blocks_), prefill);
  backend_->execute(step(std::span(prompt).subspan(20), 20, blocks_), before);

  step_batch refused = step(other, 10, blocks_);
  refused.seqs.push_back(step(bad, 0, std::span(blocks_).subspan(4)).seqs[0]);
  EXPECT_THAT(refusal(*backend_, refused), HasSubstr("token -5 is outside the vocabulary"));

  backend_->execute(step(std::span(prompt).subspan(20), 20, blocks_), after);
  EXPECT_TRUE(bit_identical(after.logits, before.logits));
}

}  // namespace
}  // namespace tireless::cpu

namespace tireless::cpu {
namespace {

TEST(cpu_backend_experts, every_routed_token_is_counted_once_per_slot_and_layer) {
  if (!std::filesystem::exists(model_path("tiny-moe"))) GTEST_SKIP() << "no tiny-moe.gguf";
  auto m = model::load(model_path("tiny-moe"));
  const auto& c = m->config();
  cpu_backend_options o;
  o.threads = 2;
  o.kv_blocks = 8;
  o.max_context = 128;
  auto b = make_cpu_backend(m, o);
  const std::vector<int64_t> before = b->expert_tokens();
  ASSERT_EQ(before.size(), static_cast<size_t>(c.n_layer * c.n_expert));
  EXPECT_EQ(std::accumulate(before.begin(), before.end(), int64_t{0}), 0);
  const std::vector<token_id> tokens = some_tokens(23, 5, b->n_vocab());
  const std::vector<int32_t> blocks = {0, 1};
  step_batch batch;
  sequence_step s;
  s.seq_id = 1;
  s.tokens = tokens;
  s.block_table = blocks;
  s.sample = true;
  batch.seqs.push_back(s);
  step_result r;
  b->execute(batch, r);
  const std::vector<int64_t> counts = b->expert_tokens();
  for (int32_t l = 0; l < c.n_layer; ++l) {
    int64_t layer = 0;
    for (int32_t e = 0; e < c.n_expert; ++e) layer += counts[static_cast<size_t>(l * c.n_expert + e)];
    EXPECT_EQ(layer, 23 * c.n_expert_used) << "layer " << l;
  }
  EXPECT_TRUE(make_cpu_backend(model::load(model_path("tiny-dense")), o)->expert_tokens().empty());
}

}  // namespace
}  // namespace tireless::cpu
