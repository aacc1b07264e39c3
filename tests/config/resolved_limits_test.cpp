#include "config/resolved_limits.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace tireless {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::string_view one_tier =
    "[[tiers]]\nname = \"only\"\npriority = 1\nttft_ms = 1000\ntpot_ms = 120\n";
// SmolLM2-135M: 8192 positions, 30 layers × 3 KV heads × 64 × fp16 K and V.
constexpr model_facts smollm2{8192, 23'040};

runtime_config parse(std::string_view extra) {
  return parse_config(std::string(extra) + std::string(one_tier), "r.toml");
}

std::string problem(std::string_view extra, model_facts model = smollm2) {
  try {
    resolve_limits(parse(extra), model);
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

TEST(resolved_limits, zeros_take_the_models_values) {
  const resolved_limits l = resolve_limits(parse(""), smollm2);
  EXPECT_EQ(l.max_context, 8192);
  EXPECT_EQ(l.max_prompt_tokens, 8191);
  EXPECT_EQ(l.kv_blocks, 728);  // 256 MiB / (16 × 23,040 bytes)
  EXPECT_EQ(l.kv_watermark_blocks, 7);
  EXPECT_EQ(l.step_time_target, 120ms);
}

TEST(resolved_limits, explicit_values_are_kept) {
  const resolved_limits l =
      resolve_limits(parse("[backend]\nmax_context = 2048\n[admission]\nmax_prompt_tokens = "
                           "1500\n[kv]\nblocks = 300\n"),
                     smollm2);
  EXPECT_EQ(l.max_context, 2048);
  EXPECT_EQ(l.max_prompt_tokens, 1500);
  EXPECT_EQ(l.kv_blocks, 300);
}

TEST(resolved_limits, the_context_cannot_exceed_the_models) {
  EXPECT_THAT(
      problem("[backend]\nmax_context = 16384\n"),
      AllOf(HasSubstr("r.toml: backend.max_context"), HasSubstr("model's context length (8192)")));
}

TEST(resolved_limits, the_prompt_limit_must_leave_room_to_generate) {
  EXPECT_THAT(problem("[admission]\nmax_prompt_tokens = 8192\n"),
              AllOf(HasSubstr("admission.max_prompt_tokens"),
                    HasSubstr("allowed 0 (= context - 1) to 8191")));
}

TEST(resolved_limits, the_kv_pool_must_hold_one_full_sequence) {
  EXPECT_THAT(problem("[kv]\nmemory_mb = 64\n"),
              AllOf(HasSubstr("kv.memory_mb"), HasSubstr("one 8192-token sequence"),
                    HasSubstr("at least 183 MiB")));
  EXPECT_THAT(problem("[kv]\nblocks = 100\n"),
              AllOf(HasSubstr("kv.blocks"), HasSubstr("at least 518")));
}

TEST(resolved_limits, a_gpu_sizes_its_pool_unless_the_config_says_how_large) {
  // Llama-3-8B on a GPU: 128 KiB a token, so the default 256 MiB would not hold one 8192-token
  // sequence; left open, the device's memory decides (the backend checks that one fits).
  const model_facts gpu{8192, 131'072, true};
  const resolved_limits open = resolve_limits(parse(""), gpu);
  EXPECT_EQ(open.kv_blocks, 0);
  EXPECT_EQ(open.kv_watermark_blocks, 0);
  EXPECT_EQ(open.max_context, 8192);
  // Said in the file: the blocks, or what memory_mb holds, and the same checks as on the CPU.
  EXPECT_EQ(resolve_limits(parse("[kv]\nblocks = 600\n"), gpu).kv_blocks, 600);
  EXPECT_EQ(resolve_limits(parse("[kv]\nmemory_mb = 2048\n"), gpu).kv_blocks, 1024);  // 2 GiB / (16 x 128 KiB)
  EXPECT_THAT(problem("[kv]\nmemory_mb = 256\n", gpu), HasSubstr("kv.memory_mb"));
  EXPECT_THAT(problem("[kv]\nblocks = 100\n", gpu), HasSubstr("kv.blocks"));
  // The other checks still run.
  EXPECT_THAT(problem("[backend]\nmax_context = 16384\n", gpu), HasSubstr("backend.max_context"));
  EXPECT_EQ(watermark_blocks(0.01, 50'000), 500);
}

TEST(resolved_limits, the_shipped_sim_file_fits_its_own_context) {
  const runtime_config c =
      load_config(std::string(TIRELESS_SOURCE_DIR) + "/config/sim-h200-k2.toml");
  // Kimi K2's MLA latent: 61 layers × (512 + 64) × bf16.
  const resolved_limits l = resolve_limits(c, {131072, 70'272});
  EXPECT_EQ(l.max_context, 131072);
  EXPECT_EQ(l.kv_blocks, 21000);
  EXPECT_EQ(l.step_time_target, 50ms);
}

}  // namespace
}  // namespace tireless
