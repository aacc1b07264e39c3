#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "config/runtime_config.hpp"

namespace tireless {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;

std::string tier_with_ladder(std::string_view ladder, std::string_view sheddable = "true") {
  return "[[tiers]]\nname = \"t\"\npriority = 1\nttft_ms = 1000\ntpot_ms = 100\nsheddable = " +
         std::string(sheddable) + "\n" + std::string(ladder);
}

std::string problem(std::string_view text) {
  try {
    parse_config(text, "ladder.toml");
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

TEST(degrade_ladder, table_and_inline_forms_read_the_same) {
  const auto tables = parse_config(tier_with_ladder(R"(
[[tiers.degrade]]
pressure = 0.5
max_tokens = 128
[[tiers.degrade]]
pressure = 0.9
shed = true
)"),
                                   "a");
  const auto inline_form = parse_config(
      tier_with_ladder(
          "degrade = [ { pressure = 0.5, max_tokens = 128 }, { pressure = 0.9, shed = true } ]\n"),
      "b");
  for (const auto* c : {&tables, &inline_form}) {
    ASSERT_EQ(c->tiers[0].degrade.size(), 2u);
    EXPECT_EQ(c->tiers[0].degrade[0].action, degrade_action::cap_max_tokens);
    EXPECT_EQ(c->tiers[0].degrade[0].limit, 128);
    EXPECT_DOUBLE_EQ(c->tiers[0].degrade[0].pressure, 0.5);
    EXPECT_EQ(c->tiers[0].degrade[1].action, degrade_action::shed);
  }
}

TEST(degrade_ladder, rungs_apply_cumulatively_from_their_pressure_up) {
  const auto c = parse_config(tier_with_ladder(R"(degrade = [
  { pressure = 0.4, max_tokens = 160 },
  { pressure = 0.55, max_prompt_tokens = 1000 },
  { pressure = 0.7, max_tokens = 96 },
  { pressure = 0.85, shed = true },
])"),
                              "x");
  const tier_settings& t = c.tiers[0];
  EXPECT_FALSE(t.degradation_at(0.39).any());
  EXPECT_EQ(t.degradation_at(0.4).max_tokens, 160);
  EXPECT_FALSE(t.degradation_at(0.4).max_prompt_tokens);
  const degradation at_07 = t.degradation_at(0.7);
  EXPECT_EQ(at_07.max_tokens, 96);
  EXPECT_EQ(at_07.max_prompt_tokens, 1000);
  EXPECT_FALSE(at_07.shed);
  EXPECT_TRUE(t.degradation_at(3.0).shed);
}

TEST(degrade_ladder, pressures_must_strictly_increase) {
  EXPECT_THAT(
      problem(tier_with_ladder(
          "degrade = [ { pressure = 0.8, max_tokens = 100 }, { pressure = 0.8, shed = true } ]\n")),
      AllOf(HasSubstr("ladder.toml:7:"), HasSubstr("tiers[0].degrade[1].pressure"),
            HasSubstr("strictly increase")));
}

TEST(degrade_ladder, each_rung_has_exactly_one_action) {
  EXPECT_THAT(
      problem(tier_with_ladder("degrade = [ { pressure = 0.5, max_tokens = 10, shed = true } ]\n")),
      AllOf(HasSubstr("tiers[0].degrade[0]"), HasSubstr("has 2 actions"),
            HasSubstr("max_tokens = N, max_prompt_tokens = N, shed = true")));
  EXPECT_THAT(problem(tier_with_ladder("degrade = [ { pressure = 0.5 } ]\n")),
              HasSubstr("has 0 actions"));
  EXPECT_THAT(problem(tier_with_ladder("degrade = [ { pressure = 0.5, shed = false } ]\n")),
              AllOf(HasSubstr("tiers[0].degrade[0].shed"), HasSubstr("not an action")));
}

TEST(degrade_ladder, a_rung_needs_a_pressure_in_range) {
  EXPECT_THAT(problem(tier_with_ladder("degrade = [ { max_tokens = 10 } ]\n")),
              HasSubstr("tiers[0].degrade[0].pressure: missing"));
  EXPECT_THAT(problem(tier_with_ladder("degrade = [ { pressure = 60, max_tokens = 10 } ]\n")),
              AllOf(HasSubstr("tiers[0].degrade[0].pressure"), HasSubstr("[0, 10]")));
  EXPECT_THAT(problem(tier_with_ladder("degrade = [ { pressure = 0.5, max_tokens = 0 } ]\n")),
              HasSubstr("tiers[0].degrade[0].max_tokens: 0 is out of range"));
}

TEST(degrade_ladder, each_cap_tightens_the_one_before) {
  EXPECT_THAT(problem(tier_with_ladder("degrade = [ { pressure = 0.5, max_tokens = 100 }, { "
                                       "pressure = 0.7, max_tokens = 200 } ]\n")),
              AllOf(HasSubstr("tiers[0].degrade[1].max_tokens"), HasSubstr("no tighter")));
}

TEST(degrade_ladder, nothing_follows_a_shed) {
  EXPECT_THAT(
      problem(tier_with_ladder(
          "degrade = [ { pressure = 0.5, shed = true }, { pressure = 0.7, max_tokens = 20 } ]\n")),
      AllOf(HasSubstr("tiers[0].degrade[1]"), HasSubstr("after a shed")));
}

TEST(degrade_ladder, a_tier_that_is_not_sheddable_cannot_shed) {
  EXPECT_THAT(problem(tier_with_ladder("degrade = [ { pressure = 0.9, shed = true } ]\n", "false")),
              AllOf(HasSubstr("tiers[0].degrade[0].shed"), HasSubstr("not sheddable")));
}

TEST(degrade_ladder, a_prompt_cap_above_the_global_limit_is_a_warning) {
  const auto c = parse_config(
      "[admission]\nmax_prompt_tokens = 500\n" +
          tier_with_ladder("degrade = [ { pressure = 0.5, max_prompt_tokens = 800 } ]\n"),
      "w");
  EXPECT_THAT(c.warnings,
              Contains(HasSubstr("tiers[0].degrade[0].max_prompt_tokens: 800 has no effect")));
}

}  // namespace
}  // namespace tireless
