#include "config/runtime_config.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

namespace tireless {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

const std::filesystem::path source_dir = TIRELESS_SOURCE_DIR;

// The smallest valid configuration: one tier.
constexpr std::string_view one_tier = R"(
[[tiers]]
name = "only"
priority = 1
ttft_ms = 1000
tpot_ms = 100
)";

runtime_config parse(std::string_view text) { return parse_config(text, "test.toml"); }

// The message of the config_error that parsing `text` throws ("" when it parses).
std::string problem(std::string_view text) {
  try {
    parse(text);
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

std::string with_tier(std::string_view text) { return std::string(text) + std::string(one_tier); }

// Sets an environment variable for one test and restores it after.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~scoped_env() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(shipped_config, the_default_file_serves_smollm2_on_the_cpu_with_three_tiers) {
  scoped_env home("HOME", "/home/someone");
  const runtime_config c = load_config(source_dir / "config/tireless.toml");
  EXPECT_EQ(c.backend.kind, backend_kind::cpu);
  EXPECT_EQ(c.model.path, "/home/someone/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf");
  ASSERT_EQ(c.tiers.size(), 3u);
  EXPECT_EQ(c.tiers[0].name, "premium");
  EXPECT_EQ(c.tiers[0].ttft, 1000ms);
  EXPECT_EQ(c.tiers[0].tpot, 150ms);
  EXPECT_FALSE(c.tiers[0].sheddable);
  EXPECT_EQ(c.tiers[1].name, "standard");
  EXPECT_EQ(c.tiers[1].ttft, 3000ms);
  EXPECT_EQ(c.tiers[1].tpot, 300ms);
  ASSERT_EQ(c.tiers[1].degrade.size(), 3u);
  EXPECT_EQ(c.tiers[1].degrade[1].action, degrade_action::cap_prompt_tokens);
  EXPECT_EQ(c.tiers[1].degrade[1].limit, 2000);
  EXPECT_EQ(c.tiers[2].name, "free");
  EXPECT_LE(c.tiers[2].ttft, 10s);  // under the point where users start doubting
  EXPECT_EQ(c.tenants.size(), 4u);
  EXPECT_EQ(c.find_tenant("free-alice")->tier, "free");
  EXPECT_EQ(c.find_tenant("free-bob")->tier, "free");
  EXPECT_EQ(c.step_time_target(), 150ms);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
}

TEST(shipped_config, the_sim_file_stands_in_for_an_h200) {
  const runtime_config c = load_config(source_dir / "config/sim-h200-k2.toml");
  EXPECT_EQ(c.backend.kind, backend_kind::sim);
  EXPECT_EQ(c.backend.sim_profile, "h200-k2");
  EXPECT_FALSE(c.backend.real_time);
  EXPECT_EQ(c.kv.block_size, 64);
  EXPECT_GT(c.kv.blocks, 10'000);
  ASSERT_EQ(c.tiers.size(), 3u);
  EXPECT_EQ(c.tiers[0].ttft, 500ms);
  EXPECT_EQ(c.tiers[0].tpot, 50ms);
  EXPECT_EQ(c.tiers[2].degrade.back().action, degrade_action::shed);
  EXPECT_GE(c.tenants.size(), 5u);
  EXPECT_EQ(c.find_tenant("enterprise-a")->keys.size(), 2u);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
}

TEST(defaults, a_file_with_one_tier_gets_every_default) {
  scoped_env home("HOME", "/h");
  const runtime_config c = parse(one_tier);
  EXPECT_EQ(c.source, "test.toml");
  EXPECT_EQ(c.server.listen, "127.0.0.1:7433");
  EXPECT_EQ(c.server.http_listen, "");
  EXPECT_EQ(c.server.metrics_listen, "");
  EXPECT_EQ(c.server.log_level, log_level::info);
  EXPECT_EQ(c.server.shutdown_grace, 10s);
  EXPECT_EQ(c.server.max_connections, 256);
  EXPECT_EQ(c.server.http_keep_alive, 5s);
  EXPECT_EQ(c.model.path, "/h/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(c.model.name, "smollm2");
  EXPECT_EQ(c.backend.kind, backend_kind::cpu);
  EXPECT_EQ(c.backend.threads, 0);
  EXPECT_EQ(c.backend.sim_profile, "cpu-smollm2");
  EXPECT_EQ(c.backend.max_context, 0);
  EXPECT_TRUE(c.backend.real_time);
  EXPECT_EQ(c.kv.block_size, 16);
  EXPECT_EQ(c.kv.blocks, 0);
  EXPECT_EQ(c.kv.memory_mb, 256);
  EXPECT_TRUE(c.kv.prefix_caching);
  EXPECT_DOUBLE_EQ(c.kv.watermark, 0.01);
  EXPECT_EQ(c.engine.max_step_tokens, 512);
  EXPECT_EQ(c.engine.max_step_seqs, 64);
  EXPECT_EQ(c.engine.max_preemptions, 3);
  EXPECT_EQ(c.engine.step_time_target, 0ms);
  EXPECT_EQ(c.admission.policy, admission_policy::tireless);
  EXPECT_EQ(c.admission.max_prompt_tokens, 0);
  EXPECT_EQ(c.admission.default_max_tokens, 256);
  EXPECT_EQ(c.admission.max_queue_wait, 60s);
  EXPECT_EQ(c.admission.pressure_window, 2s);
  EXPECT_EQ(c.session.stream_buffer_tokens, 64);
  ASSERT_EQ(c.tiers.size(), 1u);
  EXPECT_EQ(c.tiers[0].queue_bound, 256);
  EXPECT_TRUE(c.tiers[0].sheddable);
  EXPECT_TRUE(c.tiers[0].degrade.empty());
  EXPECT_TRUE(c.tenants.empty());
  EXPECT_THAT(c.warnings, Contains(HasSubstr("no API key is checked")));
  EXPECT_EQ(c.metrics.prefix, "tireless");
  EXPECT_EQ(c.step_time_target(), 100ms);  // the only tier's tpot
}

TEST(defaults, an_explicit_step_time_target_wins_over_the_tiers) {
  EXPECT_EQ(parse(with_tier("[engine]\nstep_time_target_ms = 40\n")).step_time_target(), 40ms);
}

TEST(defaults, tiers_are_ordered_highest_priority_first_whatever_the_file_order) {
  const runtime_config c = parse(R"(
[[tiers]]
name = "low"
priority = 1
ttft_ms = 5000
tpot_ms = 500
[[tiers]]
name = "high"
priority = 9
ttft_ms = 500
tpot_ms = 50
)");
  ASSERT_EQ(c.tiers.size(), 2u);
  EXPECT_EQ(c.tiers[0].name, "high");
  EXPECT_EQ(c.tiers[1].name, "low");
  EXPECT_EQ(c.find_tier("low")->priority, 1);
  EXPECT_EQ(c.find_tier("none"), nullptr);
}

TEST(model_path, a_leading_tilde_becomes_home) {
  scoped_env home("HOME", "/users/ada");
  EXPECT_EQ(parse(with_tier("[model]\npath = \"~/m/x.gguf\"\n")).model.path, "/users/ada/m/x.gguf");
  EXPECT_EQ(parse(with_tier("[model]\npath = \"/abs/~/x.gguf\"\n")).model.path, "/abs/~/x.gguf");
}

TEST(model_path, another_users_home_is_not_guessed) {
  EXPECT_THAT(problem(with_tier("[model]\npath = \"~bob/x.gguf\"\n")),
              AllOf(HasSubstr("model.path"), HasSubstr("only a leading \"~/\"")));
}

TEST(model_path, a_tilde_without_home_is_an_error) {
  scoped_env home("HOME", nullptr);
  EXPECT_THAT(problem(with_tier("[model]\npath = \"~/x.gguf\"\n")),
              AllOf(HasSubstr("model.path"), HasSubstr("$HOME is not set")));
}

TEST(model_path, a_relative_path_is_relative_to_the_config_file) {
  const auto dir = std::filesystem::temp_directory_path() / "tireless-config-test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "c.toml") << "[model]\npath = \"models/x.gguf\"\n" << one_tier;
  EXPECT_EQ(load_config(dir / "c.toml").model.path, dir / "models/x.gguf");
  EXPECT_EQ(parse(with_tier("[model]\npath = \"models/x.gguf\"\n")).model.path, "models/x.gguf");
  std::filesystem::remove_all(dir);
}

TEST(load, a_missing_file_is_named) {
  try {
    load_config("/nonexistent/tireless.toml");
    FAIL();
  } catch (const config_error& e) {
    EXPECT_THAT(e.what(),
                AllOf(HasSubstr("/nonexistent/tireless.toml"), HasSubstr("no such file")));
  }
}

TEST(load, bad_toml_is_reported_with_file_and_line) {
  EXPECT_THAT(problem("[server]\nlisten = \"a:1\"\nmax_connections = = 3\n"),
              AllOf(HasSubstr("test.toml:3:"), HasSubstr("not valid TOML")));
}

TEST(types, a_string_where_a_number_belongs_names_the_key_and_the_range) {
  const std::string text = R"(
[[tiers]]
name = "a"
priority = 2
ttft_ms = 1000
tpot_ms = 100
[[tiers]]
name = "b"
priority = 1
ttft_ms = "3s"
tpot_ms = 300
)";
  EXPECT_THAT(problem(text), AllOf(HasSubstr("test.toml:10:"), HasSubstr("tiers[1].ttft_ms"),
                                   HasSubstr("expected an integer"), HasSubstr("string \"3s\""),
                                   HasSubstr("1 to 3600000 (milliseconds)")));
}

TEST(types, a_float_where_an_integer_belongs_is_refused) {
  EXPECT_THAT(problem(with_tier("[engine]\nmax_step_tokens = 12.5\n")),
              AllOf(HasSubstr("engine.max_step_tokens"), HasSubstr("expected an integer")));
}

TEST(types, an_integer_where_a_float_belongs_is_fine) {
  const runtime_config c = parse(with_tier("[kv]\nwatermark = 0\n"));
  EXPECT_EQ(c.kv.watermark, 0.0);
}

TEST(types, a_section_that_is_not_a_table_is_refused) {
  EXPECT_THAT(problem(with_tier("server = 3\n")),
              AllOf(HasSubstr("server"), HasSubstr("expected a table")));
}

TEST(types, enumerations_list_their_allowed_values) {
  EXPECT_THAT(problem(with_tier("[server]\nlog_level = \"verbose\"\n")),
              AllOf(HasSubstr("server.log_level"), HasSubstr("\"verbose\""),
                    HasSubstr("\"trace\", \"debug\", \"info\", \"warn\", \"error\", \"off\"")));
  EXPECT_THAT(problem(with_tier("[backend]\nkind = \"gpu\"\n")),
              AllOf(HasSubstr("backend.kind"), HasSubstr("\"cpu\", \"sim\", \"cuda\"")));
  EXPECT_THAT(
      problem(with_tier("[admission]\npolicy = \"lifo\"\n")),
      AllOf(HasSubstr("admission.policy"), HasSubstr("\"fcfs\", \"priority\", \"tireless\"")));
}

TEST(ranges, negative_and_zero_values_name_the_key_and_the_range) {
  EXPECT_THAT(
      problem(with_tier("[backend]\nthreads = -2\n")),
      AllOf(HasSubstr("backend.threads"), HasSubstr("-2 is out of range"), HasSubstr("0 to 1024")));
  EXPECT_THAT(problem(with_tier("[engine]\nmax_step_tokens = 0\n")),
              AllOf(HasSubstr("engine.max_step_tokens"), HasSubstr("0 is out of range")));
  EXPECT_THAT(problem(with_tier("[engine]\nmax_step_seqs = 0\n")),
              HasSubstr("engine.max_step_seqs"));
  EXPECT_THAT(problem(with_tier("[kv]\nmemory_mb = 0\n")), HasSubstr("kv.memory_mb"));
  EXPECT_THAT(problem(with_tier("[admission]\ndefault_max_tokens = 0\n")),
              HasSubstr("admission.default_max_tokens"));
  EXPECT_THAT(problem(with_tier("[server]\nmax_connections = 0\n")),
              HasSubstr("server.max_connections"));
  EXPECT_THAT(problem(with_tier("[server]\nhttp_keep_alive_ms = 10\n")),
              AllOf(HasSubstr("server.http_keep_alive_ms"), HasSubstr("10 is out of range")));
}

TEST(ranges, the_watermark_lies_in_zero_to_one_half) {
  EXPECT_THAT(problem(with_tier("[kv]\nwatermark = 0.5\n")),
              AllOf(HasSubstr("kv.watermark"), HasSubstr("[0, 0.5)")));
  EXPECT_THAT(problem(with_tier("[kv]\nwatermark = -0.01\n")), HasSubstr("kv.watermark"));
  EXPECT_THAT(problem(with_tier("[kv]\nwatermark = nan\n")), HasSubstr("kv.watermark"));
  EXPECT_NO_THROW(parse(with_tier("[kv]\nwatermark = 0.49\n")));
}

TEST(ranges, block_size_is_a_power_of_two_from_8_to_64) {
  EXPECT_THAT(problem(with_tier("[kv]\nblock_size = 12\n")),
              AllOf(HasSubstr("kv.block_size"), HasSubstr("8, 16, 32, 64")));
  EXPECT_EQ(parse(with_tier("[kv]\nblock_size = 32\n")).kv.block_size, 32);
}

TEST(ranges, a_tenant_weight_must_be_positive) {
  const std::string text =
      with_tier("[[tenants]]\nname = \"t\"\nkeys = [\"k\"]\ntier = \"only\"\nweight = 0\n");
  EXPECT_THAT(problem(text), AllOf(HasSubstr("tenants[0].weight"), HasSubstr("(0, 1000000]")));
}

TEST(ranges, listen_addresses_need_a_host_and_a_port) {
  EXPECT_THAT(problem(with_tier("[server]\nlisten = \"localhost\"\n")),
              AllOf(HasSubstr("server.listen"), HasSubstr("host:port")));
  EXPECT_THAT(problem(with_tier("[server]\nhttp_listen = \"127.0.0.1:99999\"\n")),
              HasSubstr("server.http_listen"));
  EXPECT_THAT(problem(with_tier("[server]\nmetrics_listen = \"unix:/tmp/m\"\n")),
              HasSubstr("server.metrics_listen"));
  EXPECT_NO_THROW(
      parse(with_tier("[server]\nlisten = \"unix:/tmp/tireless.sock\"\n"
                      "http_listen = \"[::1]:8000\"\nmetrics_listen = \"0.0.0.0:0\"\n")));
}

TEST(consistency, two_listeners_cannot_share_an_address) {
  EXPECT_THAT(problem(with_tier("[server]\nhttp_listen = \"127.0.0.1:7433\"\n")),
              AllOf(HasSubstr("server.http_listen"), HasSubstr("also server.listen")));
}

TEST(missing, no_tiers_at_all) {
  EXPECT_THAT(problem("[server]\nlog_level = \"info\"\n"),
              AllOf(HasSubstr("tiers"), HasSubstr("at least one")));
  EXPECT_THAT(problem("tiers = []\n"), AllOf(HasSubstr("tiers"), HasSubstr("at least one")));
}

TEST(missing, every_required_tier_key_is_named) {
  const std::string message = problem("[[tiers]]\nname = \"x\"\n");
  EXPECT_THAT(message,
              AllOf(HasSubstr("tiers[0].priority: missing"), HasSubstr("tiers[0].ttft_ms: missing"),
                    HasSubstr("tiers[0].tpot_ms: missing")));
  EXPECT_THAT(problem("[[tiers]]\npriority = 1\nttft_ms = 1\ntpot_ms = 1\n"),
              HasSubstr("tiers[0].name: missing; required: a string"));
}

TEST(missing, a_tenant_needs_keys) {
  EXPECT_THAT(problem(with_tier("[[tenants]]\nname = \"t\"\ntier = \"only\"\n")),
              HasSubstr("tenants[0].keys: missing"));
  EXPECT_THAT(problem(with_tier("[[tenants]]\nname = \"t\"\ntier = \"only\"\nkeys = []\n")),
              AllOf(HasSubstr("tenants[0].keys"), HasSubstr("is empty")));
  EXPECT_THAT(problem(with_tier("[[tenants]]\nname = \"t\"\ntier = \"only\"\nkeys = [\"\"]\n")),
              HasSubstr("tenants[0].keys[0]"));
}

TEST(duplicates, tier_names_and_priorities_are_unique) {
  const std::string text = std::string(one_tier) + std::string(one_tier);
  EXPECT_THAT(problem(text),
              AllOf(HasSubstr("tiers[1].name: \"only\" is also the name of tiers[0]"),
                    HasSubstr("tiers[1].priority: 1 is also the priority of tiers[0]")));
}

TEST(duplicates, tenant_names_are_unique) {
  const std::string tenant = "[[tenants]]\nname = \"t\"\nkeys = [\"k1\"]\ntier = \"only\"\n";
  const std::string other = "[[tenants]]\nname = \"t\"\nkeys = [\"k2\"]\ntier = \"only\"\n";
  EXPECT_THAT(problem(with_tier(tenant + other)),
              HasSubstr("tenants[1].name: \"t\" is also the name of tenants[0]"));
}

TEST(duplicates, an_api_key_names_one_tenant_and_is_never_printed) {
  const std::string text = with_tier(
      "[[tenants]]\nname = \"a\"\nkeys = [\"sk-secret-1\"]\ntier = \"only\"\n"
      "[[tenants]]\nname = \"b\"\nkeys = [\"sk-other\", \"sk-secret-1\"]\ntier = \"only\"\n");
  const std::string message = problem(text);
  EXPECT_THAT(message, HasSubstr("tenants[1].keys[1]: is the same API key as tenants[0].keys[0]"));
  EXPECT_THAT(message, Not(HasSubstr("sk-secret-1")));
}

TEST(references, a_tenant_must_name_a_tier) {
  EXPECT_THAT(problem(with_tier("[[tenants]]\nname = \"t\"\nkeys = [\"k\"]\ntier = \"onyl\"\n")),
              AllOf(HasSubstr("tenants[0].tier"), HasSubstr("\"onyl\" names no tier"),
                    HasSubstr("did you mean \"only\"?"), HasSubstr("tiers: only")));
}

TEST(consistency, a_step_holds_at_least_one_token_per_sequence) {
  EXPECT_THAT(
      problem(with_tier("[engine]\nmax_step_tokens = 16\nmax_step_seqs = 32\n")),
      AllOf(HasSubstr("engine.max_step_tokens"), HasSubstr("below engine.max_step_seqs (32)")));
}

TEST(consistency, the_step_time_target_fits_the_tightest_tier) {
  EXPECT_THAT(problem(with_tier("[engine]\nstep_time_target_ms = 200\n")),
              AllOf(HasSubstr("engine.step_time_target_ms"), HasSubstr("tier 'only'"),
                    HasSubstr("allowed 0 to 100")));
}

TEST(consistency, a_tier_target_longer_than_the_longest_wait_is_refused) {
  EXPECT_THAT(problem(with_tier("[admission]\nmax_queue_wait_ms = 500\n")),
              AllOf(HasSubstr("tiers[0].ttft_ms"), HasSubstr("admission.max_queue_wait_ms (500)")));
}

TEST(consistency, a_token_quota_must_admit_one_default_request) {
  const std::string text = with_tier(
      "[[tenants]]\nname = \"t\"\nkeys = [\"k\"]\ntier = \"only\"\ntokens_per_minute = 100\n");
  EXPECT_THAT(problem(text),
              AllOf(HasSubstr("tenants[0].tokens_per_minute"), HasSubstr("at least 257")));
}

TEST(consistency, the_prompt_limit_fits_an_explicit_context) {
  EXPECT_THAT(
      problem(with_tier("[backend]\nmax_context = 1024\n[admission]\nmax_prompt_tokens = 1024\n")),
      AllOf(HasSubstr("admission.max_prompt_tokens"), HasSubstr("0 to 1023")));
}

TEST(consistency, the_sim_backend_needs_a_profile) {
  EXPECT_THAT(problem(with_tier("[backend]\nkind = \"sim\"\nsim_profile = \"\"\n")),
              HasSubstr("backend.sim_profile"));
}

TEST(warnings, settings_without_effect_are_reported_not_refused) {
  const runtime_config c = parse(
      with_tier("[backend]\nsim_profile = \"h200-k2\"\n[kv]\nblocks = 100\nmemory_mb = 64\n"));
  EXPECT_THAT(c.warnings, Contains(HasSubstr("backend.sim_profile: has no effect")));
  EXPECT_THAT(c.warnings, Contains(HasSubstr("kv.memory_mb: has no effect")));
}

TEST(problems, every_problem_in_a_file_is_reported_at_once) {
  try {
    parse(with_tier(
        "[engine]\nmax_step_tokens = 0\n[kv]\nblock_size = 7\n[server]\nlog_level = 3\n"));
    FAIL();
  } catch (const config_error& e) {
    EXPECT_EQ(e.problems().size(), 3u);
  }
}

TEST(faults, key_value_lines_are_read_and_checked_like_the_faults_table) {
  const fault_settings f = parse_faults("shard_crash_per_step=0.001\nshard_slow_ms=3000\n", "--fault");
  EXPECT_DOUBLE_EQ(f.shard_crash_per_step, 0.001);
  EXPECT_EQ(f.shard_slow.count(), 3000);
  EXPECT_DOUBLE_EQ(f.shard_slow_per_step, 0.0);
  auto problem_of = [](std::string_view text) -> std::string {
    try {
      parse_faults(text, "--fault");
    } catch (const config_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(problem_of("shard_crash_per_step=2").find("faults.shard_crash_per_step"), std::string::npos)
      << problem_of("shard_crash_per_step=2");
  EXPECT_NE(problem_of("shard_crash=0.1").find("shard_crash"), std::string::npos) << "an unknown key is named";
  EXPECT_NE(problem_of("seed=").find("not valid TOML"), std::string::npos);
}

}  // namespace
}  // namespace tireless
