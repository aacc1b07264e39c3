// The CUDA backend as a whole against the CPU backend: the same steps (prefill chunks and decode
// tokens mixed, scattered block tables) give the same logits within the products' tolerance and
// the same greedy tokens, replayed decode graphs give what launched steps give, copied blocks
// carry their KV, expert counts agree; SmolLM2's answers (greedy, and sampled with a seed) are
// the CPU's token for token.
// Needs a device (GTEST_SKIP otherwise), except the refusals, which run everywhere.
#include "gpu/cuda/cuda_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gpu/cpu/cpu_backend.hpp"
#include "gpu/sequence_runner.hpp"
#include "model/model.hpp"

namespace tireless::cuda {
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

std::shared_ptr<const model> load(const std::string& name) {
  if (!std::filesystem::exists(model_path(name))) return nullptr;
  return model::load(model_path(name));
}

std::string refusal(const std::shared_ptr<const model>& m, const cuda_backend_options& o) {
  try {
    make_cuda_backend(m, o);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST(cuda_backend, without_a_device_it_refuses_to_start_and_says_why) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is here";
  auto m = load("tiny-dense");
  if (!m) GTEST_SKIP() << "no tiny model";
  std::string why;
  EXPECT_FALSE(cuda_available(&why));
  EXPECT_FALSE(why.empty());
  const std::string message = refusal(m, {});
  if (cuda_built()) {
    EXPECT_THAT(message, HasSubstr("no usable CUDA device here"));
    EXPECT_THAT(message, HasSubstr("kind = \"cpu\""));
  } else {
    EXPECT_THAT(message, HasSubstr("this build has no CUDA backend"));
  }
}

TEST(cuda_backend, options_it_cannot_run_are_refused_before_any_device_is_touched) {
  if (!cuda_built()) GTEST_SKIP() << "no CUDA in this build";
  auto m = load("tiny-dense");
  if (!m) GTEST_SKIP() << "no tiny model";
  cuda_backend_options o;
  o.block_size = 12;
  EXPECT_THAT(refusal(m, o), HasSubstr("block size 12"));
  o.block_size = 16;
  o.max_step_tokens = 0;
  EXPECT_THAT(refusal(m, o), HasSubstr("max_step_tokens"));
}

#define REQUIRE_DEVICE()                            \
  do {                                              \
    std::string why;                                \
    if (!cuda_available(&why)) GTEST_SKIP() << why; \
  } while (0)

// Tokens [n], the same for the same seed.
std::vector<token_id> some_tokens(int32_t n, uint64_t seed, int32_t n_vocab) {
  std::vector<token_id> t(static_cast<size_t>(n));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (token_id& id : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<token_id>((x >> 33) % static_cast<uint64_t>(n_vocab));
  }
  return t;
}

double nmse(std::span<const float> got, std::span<const float> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return num / den;
}

// The two largest logits' gap, relative to the spread: below it a greedy choice may flip.
double margin(std::span<const float> l) {
  float a = -INFINITY, b = -INFINITY, lo = INFINITY;
  for (float v : l) {
    if (v > a) b = a, a = v; else if (v > b) b = v;
    lo = std::min(lo, v);
  }
  return (a - b) / std::max(1e-6f, a - lo);
}

struct live {
  uint64_t id;
  std::vector<token_id> tokens;
  std::vector<int32_t> blocks;
  int32_t done = 0;
};

// Runs one step of (sequence, tokens) chunks on both backends, every chunk sampled greedily
// with its logits; the CPU's choice is appended to each sequence (both see the same inputs).
void both_steps(backend& cpu, backend& gpu, std::vector<std::pair<live*, int32_t>> chunks, const std::string& what,
                double tolerance, double min_margin) {
  step_batch b;
  for (auto& [s, n] : chunks) {
    sequence_step q;
    q.seq_id = s->id;
    q.tokens = std::span<const token_id>(s->tokens).subspan(static_cast<size_t>(s->done), static_cast<size_t>(n));
    q.start_pos = s->done;
    q.block_table = s->blocks;
    q.sample = true;
    q.want_logits = true;
    b.seqs.push_back(q);
  }
  step_result rc, rg;
  cpu.execute(b, rc);
  gpu.execute(b, rg);
  ASSERT_EQ(rg.next.size(), chunks.size());
  ASSERT_EQ(rg.logits.size(), rc.logits.size());
  const size_t v = static_cast<size_t>(cpu.n_vocab());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const std::span<const float> lc(rc.logits.data() + i * v, v), lg(rg.logits.data() + i * v, v);
    EXPECT_LT(nmse(lg, lc), tolerance) << what << ", sequence " << chunks[i].first->id;
    if (margin(lc) > min_margin) {
      EXPECT_EQ(rg.next[i], rc.next[i]) << what << ", sequence " << chunks[i].first->id;
    }
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    live* s = chunks[i].first;
    s->done += chunks[i].second;
    if (s->done == static_cast<int32_t>(s->tokens.size())) s->tokens.push_back(rc.next[i]);
  }
}

// The tiny models mix every weight type; their f16/bf16 layers' prefill products go through
// cuBLAS with the activations rounded to fp16/bf16 (the CPU keeps f32): logits within 1e-4
// NMSE, and greedy tokens compared where the top two are 2% of the spread apart.
struct tiny_case {
  std::string model;
  double tolerance, margin;
};

class cuda_backend_tiny : public ::testing::TestWithParam<tiny_case> {};

TEST_P(cuda_backend_tiny, mixed_steps_give_the_cpu_backends_logits_and_tokens) {
  REQUIRE_DEVICE();
  auto m = load(GetParam().model);
  if (!m) GTEST_SKIP() << "no tiny model";
  cpu::cpu_backend_options co;
  co.threads = 2;
  co.kv_blocks = 64;
  co.max_context = 128;
  co.max_step_tokens = 64;
  co.max_step_seqs = 8;
  cuda_backend_options go;
  go.kv_blocks = 64;
  go.max_context = 128;
  go.max_step_tokens = 64;
  go.max_step_seqs = 8;
  auto cpu = cpu::make_cpu_backend(m, co);
  auto gpu = make_cuda_backend(m, go);
  const int32_t nv = cpu->n_vocab();
  // Blocks interleaved across the pool, as a busy server's are.
  live a{1, some_tokens(20, 1, nv), {3, 10, 17, 24, 31, 38}};
  live b{2, some_tokens(16, 2, nv), {5, 12, 19, 26, 33}};
  live c{3, some_tokens(5, 3, nv), {7, 14, 21, 28}};
  const double tol = GetParam().tolerance, gap = GetParam().margin;
  both_steps(*cpu, *gpu, {{&a, 20}, {&b, 7}}, "prefill", tol, gap);
  both_steps(*cpu, *gpu, {{&a, 1}, {&b, 9}, {&c, 5}}, "a decode token, a chunk and a new prompt", tol, gap);
  both_steps(*cpu, *gpu, {{&b, 1}, {&c, 1}}, "decode", tol, gap);  // b's rest was its chunk's end
  for (int step = 0; step < 6; ++step) {  // the same bucket again and again: graph capture and replay
    both_steps(*cpu, *gpu, {{&a, 1}, {&b, 1}, {&c, 1}}, "decode step " + std::to_string(step), tol, gap);
  }
  if (m->config().is_moe()) {
    EXPECT_EQ(gpu->expert_tokens(), cpu->expert_tokens());
  }
  EXPECT_EQ(gpu->kv().n_blocks, 64);
  EXPECT_EQ(gpu->kv().bytes_per_block, cpu->kv().bytes_per_block) << "the same KV layout and precision";
}

INSTANTIATE_TEST_SUITE_P(models, cuda_backend_tiny,
                         ::testing::Values(tiny_case{"tiny-dense", 1e-4, 2e-2}, tiny_case{"tiny-moe", 1e-4, 2e-2},
                                           tiny_case{"tiny-dense-tied", 1e-4, 2e-2}),
                         [](const auto& info) {
                           std::string n = info.param.model;
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

TEST(cuda_backend, replayed_decode_graphs_give_what_launched_steps_give) {
  REQUIRE_DEVICE();
  auto m = load("tiny-dense");
  if (!m) GTEST_SKIP() << "no tiny model";
  cuda_backend_options o;
  o.kv_blocks = 64;
  o.max_context = 128;
  o.max_step_tokens = 64;
  o.max_step_seqs = 16;
  auto graphed = make_cuda_backend(m, o);
  o.graphs = false;
  auto launched = make_cuda_backend(m, o);
  const int32_t nv = graphed->n_vocab();
  // One sequence (the 1-sequence bucket), then 12 at once (the 16-sequence bucket: 16 rows, past
  // the matvec, so the quantized products run mmq and the float ones cuBLAS inside the graph).
  for (const int32_t n_seqs : {1, 12}) {
    std::vector<std::vector<token_id>> tokens;
    std::vector<std::vector<int32_t>> blocks;
    for (int32_t i = 0; i < n_seqs; ++i) {
      tokens.push_back(some_tokens(30, 9 + static_cast<uint64_t>(i), nv));
      blocks.push_back({i, 63 - i});  // 30 positions: 2 blocks each, spread over the pool
    }
    for (int32_t pos = 0; pos < 30; ++pos) {  // one token a sequence a step: decode steps throughout
      step_batch b;
      for (int32_t i = 0; i < n_seqs; ++i) {
        sequence_step s;
        s.seq_id = static_cast<uint64_t>(i + 1);
        s.tokens = std::span<const token_id>(tokens[i]).subspan(static_cast<size_t>(pos), 1);
        s.start_pos = pos;
        s.block_table = blocks[i];
        s.sample = true;
        s.want_logits = true;
        b.seqs.push_back(s);
      }
      step_result rg, rl;
      graphed->execute(b, rg);
      launched->execute(b, rl);
      // The graph's attention grid has the splits of the longest context, a launched step's
      // those of its own; each item uses what its context needs: sums in another order at most.
      EXPECT_LT(nmse(rg.logits, rl.logits), 1e-12) << n_seqs << " sequences, position " << pos;
      EXPECT_EQ(rg.next, rl.next) << n_seqs << " sequences, position " << pos;
    }
  }
}

TEST(cuda_backend, a_copied_block_carries_its_keys_and_values) {
  REQUIRE_DEVICE();
  auto m = load("tiny-dense");
  if (!m) GTEST_SKIP() << "no tiny model";
  cuda_backend_options o;
  o.kv_blocks = 16;
  o.max_context = 64;
  o.max_step_tokens = 64;
  o.max_step_seqs = 4;
  o.graphs = false;
  auto gpu = make_cuda_backend(m, o);
  const std::vector<token_id> tokens = some_tokens(33, 4, gpu->n_vocab());
  const std::vector<int32_t> original{2, 9, 5}, copy{11, 3, 5};  // the last block is shared, written by each
  const auto run = [&](const std::vector<int32_t>& table, int32_t start, int32_t n) {
    step_batch b;
    sequence_step s;
    s.seq_id = 1;
    s.tokens = std::span<const token_id>(tokens).subspan(static_cast<size_t>(start), static_cast<size_t>(n));
    s.start_pos = start;
    s.block_table = table;
    s.want_logits = true;
    b.seqs.push_back(s);
    step_result r;
    gpu->execute(b, r);
    return r.logits;
  };
  run(original, 0, 32);
  const std::pair<int32_t, int32_t> pairs[] = {{2, 11}, {9, 3}};
  gpu->copy_blocks(pairs);
  EXPECT_EQ(run(copy, 32, 1), run(original, 32, 1));
  const std::pair<int32_t, int32_t> bad[] = {{2, 16}};
  EXPECT_THROW(gpu->copy_blocks(bad), std::invalid_argument);
}

TEST(cuda_backend, smollm2_answers_with_the_cpu_backends_tokens) {
  REQUIRE_DEVICE();
  auto m = load("smollm2");
  if (!m) GTEST_SKIP() << model_path("smollm2") << " is absent (scripts/fetch-model)";
  std::vector<generation_request> reqs;
  for (const char* question : {"What is the capital of France?", "Name three primary colors.",
                               "Write a haiku about the sea.", "Explain gravity to a child in one sentence."}) {
    generation_request r;
    r.prompt = m->tok().encode(m->chat().apply({{"user", question}}, true), true);
    r.max_tokens = 32;
    r.stop_tokens = m->chat().stop_tokens();
    r.keep_logits = true;
    reqs.push_back(r);
  }
  // Sampled: the CPU sampler runs on the downloaded logits, so the same seed draws the same
  // tokens wherever the logits agree to ~1e-6.
  generation_request sampled = reqs[1];
  sampled.sampling.temperature = 0.7f;
  sampled.sampling.top_k = 40;
  sampled.sampling.top_p = 0.95f;
  sampled.sampling.repetition_penalty = 1.1f;
  sampled.sampling.seed = 7;
  reqs.push_back(sampled);
  cpu::cpu_backend_options co;
  co.max_context = 512;
  co.kv_blocks = 5 * 32;
  co.max_step_seqs = 8;
  cuda_backend_options go;
  go.max_context = 512;
  go.kv_blocks = 5 * 32;
  go.max_step_seqs = 8;
  auto cpu = cpu::make_cpu_backend(m, co);
  auto gpu = make_cuda_backend(m, go);
  sequence_runner on_cpu(*cpu), on_gpu(*gpu);
  const auto want = on_cpu.run(reqs);
  const auto got = on_gpu.run(reqs);  // all five at once: prefill chunks, then decode steps of 5
  const auto alone = on_gpu.run({reqs[0]});  // and the first alone: the 1-sequence graphs
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i << ": " << m->tok().decode(want[i].tokens) << " | "
                                             << m->tok().decode(got[i].tokens);
    for (size_t t = 0; t < std::min(got[i].logits.size(), want[i].logits.size()); ++t) {
      EXPECT_LT(nmse(got[i].logits[t], want[i].logits[t]), 1e-6) << "prompt " << i << ", token " << t;
    }
  }
  EXPECT_EQ(alone[0].tokens, want[0].tokens);
}

}  // namespace
}  // namespace tireless::cuda
