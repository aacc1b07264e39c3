#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "config/runtime_config.hpp"

namespace tireless {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr std::string_view one_tier =
    "[[tiers]]\nname = \"only\"\npriority = 1\nttft_ms = 1000\ntpot_ms = 100\n";

std::string problem(std::string_view text) {
  try {
    parse_config(text, "u.toml");
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

TEST(unknown_keys, a_shortened_key_suggests_the_full_one) {
  EXPECT_THAT(problem("[[tiers]]\nname = \"a\"\npriority = 1\nttft = 1000\ntpot_ms = 100\n"),
              HasSubstr("u.toml:4:1: unknown key 'tiers[0].ttft' — did you mean 'ttft_ms'?"));
}

TEST(unknown_keys, a_misspelt_section_suggests_the_right_one) {
  EXPECT_THAT(problem(std::string("[sever]\nlisten = \"a:1\"\n") + std::string(one_tier)),
              HasSubstr("unknown key 'sever' — did you mean 'server'?"));
  EXPECT_THAT(problem("[[tier]]\nname = \"x\"\n"),
              HasSubstr("unknown key 'tier' — did you mean 'tiers'?"));
}

TEST(unknown_keys, typos_and_dashes_are_forgiven_in_the_suggestion) {
  EXPECT_THAT(problem(std::string("[kv]\nprefix-caching = true\nwatremark = 0.1\n") +
                      std::string(one_tier)),
              AllOf(HasSubstr("'kv.prefix-caching' — did you mean 'prefix_caching'?"),
                    HasSubstr("'kv.watremark' — did you mean 'watermark'?")));
}

TEST(unknown_keys, a_key_in_the_wrong_section_is_pointed_home) {
  EXPECT_THAT(problem(std::string("[engine]\nblock_size = 16\n") + std::string(one_tier)),
              HasSubstr("unknown key 'engine.block_size' — 'block_size' belongs in [kv]"));
}

TEST(unknown_keys, with_no_close_key_the_known_ones_are_listed) {
  EXPECT_THAT(problem(std::string("[model]\nquantization = \"q4\"\n") + std::string(one_tier)),
              AllOf(HasSubstr("unknown key 'model.quantization'"),
                    HasSubstr("known keys here: name, path")));
}

TEST(unknown_keys, inside_ladders_and_tenants_too) {
  const std::string text = std::string(one_tier) +
                           "degrade = [ { pressure = 0.5, max_token = 10 } ]\n"
                           "[[tenants]]\nname = \"t\"\nkeys = [\"k\"]\ntier = \"only\"\nrpm = 10\n";
  const std::string message = problem(text);
  EXPECT_THAT(message, HasSubstr("'tiers[0].degrade[0].max_token' — did you mean 'max_tokens'?"));
  EXPECT_THAT(message, HasSubstr("unknown key 'tenants[0].rpm'"));
}

}  // namespace
}  // namespace tireless
