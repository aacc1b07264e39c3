#include "gpu/step_probe.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "gpu/cpu/cpu_backend.hpp"
#include "model/model.hpp"

// Sanitizers change what a step costs from one run of it to the next (shadow memory touched
// first by one of them): timing ratios under them are not the machine's.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TIRELESS_TIMING_UNRELIABLE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TIRELESS_TIMING_UNRELIABLE 1
#endif
#endif

namespace tireless {
namespace {

std::filesystem::path smollm2() {
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : "") / ".cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

cpu::cpu_backend_options options(int32_t kv_blocks) {
  cpu::cpu_backend_options o;
  o.threads = 2;
  o.block_size = 16;
  o.kv_blocks = kv_blocks;
  o.max_context = 512;
  o.max_step_tokens = 256;
  o.max_step_seqs = 8;
  return o;
}

// The real backend, each step run `times` times: a machine that many times slower.
class slower : public backend {
 public:
  slower(std::unique_ptr<backend> b, int times) : b_(std::move(b)), times_(times) {}
  std::string describe() const override { return b_->describe(); }
  kv_geometry kv() const override { return b_->kv(); }
  backend_limits limits() const override { return b_->limits(); }
  int32_t n_vocab() const override { return b_->n_vocab(); }
  step_cost_prior cost_prior() const override { return b_->cost_prior(); }
  void execute(const step_batch& batch, step_result& result) override {
    for (int i = 0; i < times_; ++i) b_->execute(batch, result);
  }
  void copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) override { b_->copy_blocks(src_dst); }

 private:
  std::unique_ptr<backend> b_;
  int times_;
};

TEST(step_probe, scales_the_prior_by_how_fast_the_machine_runs_the_steps) {
  if (!std::filesystem::exists(smollm2())) GTEST_SKIP() << "no SmolLM2 (scripts/fetch-model)";
#ifdef TIRELESS_TIMING_UNRELIABLE
  GTEST_SKIP() << "under a sanitizer (its prefill read 1.05-1.25x for steps run twice)";
#endif
  auto m = model::load(smollm2());
  slower plain(cpu::make_cpu_backend(m, options(64)), 1), doubled(cpu::make_cpu_backend(m, options(64)), 2);
  // A decode step of 8 at a chat's context, and a 64-token prefill, as each probe predicts them.
  auto decode_step = [](const step_cost_prior& p) { return p.c0 + 8 * p.per_decode_seq + 8 * 0.2 * p.per_thousand_context; };
  auto prefill_step = [](const step_cost_prior& p) { return p.c0 + 64 * p.per_prefill_token; };
  // Ratios measured in one run, alternating: the fastest of three probes of each (other work on
  // the machine only slows a probe down, under sanitizers and parallel tests too). Each step run
  // twice reads as steps about twice as dear.
  double plain_decode = 1e9, plain_prefill = 1e9, doubled_decode = 1e9, doubled_prefill = 1e9;
  for (int i = 0; i < 3; ++i) {
    const step_cost_prior a = probe_step_cost(plain, 8), b = probe_step_cost(doubled, 8);
    for (const step_cost_prior& p : {a, b}) {
      EXPECT_GT(p.c0, 0);
      EXPECT_GT(p.per_prefill_token, 0);
      EXPECT_GT(p.per_decode_seq, 0);
    }
    plain_decode = std::min(plain_decode, decode_step(a));
    plain_prefill = std::min(plain_prefill, prefill_step(a));
    doubled_decode = std::min(doubled_decode, decode_step(b));
    doubled_prefill = std::min(doubled_prefill, prefill_step(b));
  }
  const double decode = doubled_decode / plain_decode, prefill = doubled_prefill / plain_prefill;
  EXPECT_GT(prefill, 1.3) << "decode " << decode;
  EXPECT_LT(prefill, 3.5);
  EXPECT_GT(decode, 1.3) << "prefill " << prefill;
  EXPECT_LT(decode, 3.5);
}

TEST(step_probe, leaves_the_prior_as_it_is_where_the_pool_has_no_room_for_two_sequences) {
  if (!std::filesystem::exists(smollm2())) GTEST_SKIP() << "no SmolLM2 (scripts/fetch-model)";
  auto b = cpu::make_cpu_backend(model::load(smollm2()), options(3));
  const step_cost_prior prior = b->cost_prior(), probed = probe_step_cost(*b, 8);
  EXPECT_EQ(probed.c0, prior.c0);
  EXPECT_EQ(probed.per_prefill_token, prior.per_prefill_token);
  EXPECT_EQ(probed.per_decode_seq, prior.per_decode_seq);
}

}  // namespace
}  // namespace tireless
