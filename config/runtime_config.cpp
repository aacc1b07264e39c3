#include "config/runtime_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "config/config_sections.hpp"
#include "config/toml_reader.hpp"

namespace tireless {

namespace {

std::string joined_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) {
    if (!out.empty()) out += '\n';
    out += line;
  }
  return out;
}

toml::table parse_toml(std::string_view text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw config_error({fmt::format("{}:{}:{}: not valid TOML: {}", source, where.line,
                                    where.column, e.description())});
  }
}

runtime_config parse(std::string_view text, std::string source,
                     const std::filesystem::path& base_dir) {
  const toml::table document = parse_toml(text, source);
  config_detail::diagnostics diag(source);
  runtime_config config = config_detail::read_document(document, base_dir, diag);
  config.source = std::move(source);
  if (auto errors = diag.errors(); !errors.empty()) throw config_error(std::move(errors));
  config.warnings = diag.warnings();
  return config;
}

}  // namespace

config_error::config_error(std::vector<std::string> problems)
    : std::runtime_error(joined_lines(problems)), problems_(std::move(problems)) {}

std::string_view to_string(log_level level) {
  switch (level) {
    case log_level::trace: return "trace";
    case log_level::debug: return "debug";
    case log_level::info: return "info";
    case log_level::warn: return "warn";
    case log_level::error: return "error";
    case log_level::off: return "off";
  }
  return "?";
}

std::string_view to_string(backend_kind kind) {
  switch (kind) {
    case backend_kind::cpu: return "cpu";
    case backend_kind::sim: return "sim";
    case backend_kind::cuda: return "cuda";
    case backend_kind::automatic: return "auto";
  }
  return "?";
}

std::string_view to_string(admission_policy policy) {
  switch (policy) {
    case admission_policy::fcfs: return "fcfs";
    case admission_policy::priority: return "priority";
    case admission_policy::tireless: return "tireless";
    case admission_policy::least_slack: return "least-slack";
  }
  return "?";
}

std::string_view to_string(degrade_action action) {
  switch (action) {
    case degrade_action::cap_max_tokens: return "max_tokens";
    case degrade_action::cap_prompt_tokens: return "max_prompt_tokens";
    case degrade_action::shed: return "shed";
  }
  return "?";
}

degradation tier_settings::degradation_at(double pressure) const {
  degradation out;
  for (const auto& step : degrade) {
    if (step.pressure > pressure) break;
    switch (step.action) {
      case degrade_action::cap_max_tokens:
        out.max_tokens = std::min(out.max_tokens.value_or(step.limit), step.limit);
        break;
      case degrade_action::cap_prompt_tokens:
        out.max_prompt_tokens = std::min(out.max_prompt_tokens.value_or(step.limit), step.limit);
        break;
      case degrade_action::shed: out.shed = true; break;
    }
  }
  return out;
}

const tier_settings* runtime_config::find_tier(std::string_view name) const {
  for (const auto& tier : tiers)
    if (tier.name == name) return &tier;
  return nullptr;
}

const tenant_settings* runtime_config::find_tenant(std::string_view name) const {
  for (const auto& tenant : tenants)
    if (tenant.name == name) return &tenant;
  return nullptr;
}

std::chrono::milliseconds runtime_config::step_time_target() const {
  if (engine.step_time_target.count() > 0 || tiers.empty()) return engine.step_time_target;
  auto tightest = tiers.front().tpot;
  for (const auto& tier : tiers) tightest = std::min(tightest, tier.tpot);
  return tightest;
}

runtime_config load_config(const std::filesystem::path& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))
    throw config_error({fmt::format("{}: is a folder; expected a TOML file", file.string())});
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw config_error(
        {fmt::format("{}: cannot read the configuration file ({})", file.string(),
                     std::filesystem::exists(file, ec) ? "permission denied" : "no such file")});
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), file.string(), file.parent_path());
}

runtime_config parse_config(std::string_view toml_text, std::string_view source_name) {
  return parse(toml_text, source_name.empty() ? "<config>" : std::string(source_name), {});
}

fault_settings parse_faults(std::string_view toml_text, std::string_view source_name) {
  const std::string source = source_name.empty() ? "<faults>" : std::string(source_name);
  const toml::table table = parse_toml(toml_text, source);
  config_detail::diagnostics diag(source);
  config_detail::table_reader r(table, "faults", diag);
  const fault_settings faults = config_detail::read_faults(r);
  r.finish();
  diag.finish();
  if (auto errors = diag.errors(); !errors.empty()) throw config_error(std::move(errors));
  return faults;
}

}  // namespace tireless
