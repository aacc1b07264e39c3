#include "config/config_sections.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <map>

namespace tireless::config_detail {

namespace {

namespace fs = std::filesystem;

constexpr int64_t unbounded = std::numeric_limits<int64_t>::max();
constexpr int64_t max_tokens_ever = int64_t{1} << 24;  // 16M tokens: beyond any context
constexpr int_range ms_hour{1, 3'600'000, "milliseconds"};

constexpr std::array log_levels{
    choice<log_level>{"trace", log_level::trace}, choice<log_level>{"debug", log_level::debug},
    choice<log_level>{"info", log_level::info},   choice<log_level>{"warn", log_level::warn},
    choice<log_level>{"error", log_level::error}, choice<log_level>{"off", log_level::off}};
constexpr std::array backend_kinds{choice<backend_kind>{"cpu", backend_kind::cpu},
                                   choice<backend_kind>{"sim", backend_kind::sim},
                                   choice<backend_kind>{"cuda", backend_kind::cuda},
                                   choice<backend_kind>{"auto", backend_kind::automatic}};
constexpr std::array policies{choice<admission_policy>{"fcfs", admission_policy::fcfs},
                              choice<admission_policy>{"priority", admission_policy::priority},
                              choice<admission_policy>{"tireless", admission_policy::tireless},
                              choice<admission_policy>{"least-slack", admission_policy::least_slack}};

// Tier and tenant names appear in metric labels and log lines.
bool valid_name(std::string_view name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

void check_name(table_reader& r, std::string_view key, const std::string& name) {
  if (!name.empty() && !valid_name(name)) {
    r.diag().error(r.where(key), r.key_path(key),
                   fmt::format("\"{}\" is not a valid name; use 1 to 64 letters, digits, '_', "
                               "'-' or '.'",
                               name));
  }
}

// "host:port" (port 0 to 65535, 0 = any free port), "[v6 address]:port", or, where allowed,
// "unix:/path". Returns what is wrong, or "" when nothing is.
std::string address_problem(std::string_view address, bool allow_unix) {
  const std::string expected =
      allow_unix ? "expected \"host:port\" or \"unix:/path\"" : "expected \"host:port\"";
  if (address.starts_with("unix:")) {
    if (!allow_unix) return fmt::format("a unix socket is not supported here; {}", expected);
    return address.size() > 5 ? "" : fmt::format("names no socket path; {}", expected);
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0)
    return fmt::format("\"{}\" has no host and port; {}", address, expected);
  const std::string_view host = address.substr(0, colon);
  const std::string_view port = address.substr(colon + 1);
  const bool bracketed = host.front() == '[' && host.back() == ']' && host.size() > 2;
  if (!bracketed && host.find(':') != std::string_view::npos)
    return fmt::format("\"{}\": write an IPv6 host in brackets, \"[::1]:7433\"", address);
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(std::string(port)) > 65535)
    return fmt::format("\"{}\" has no valid port; {} with a port from 0 to 65535", address,
                       expected);
  return "";
}

void read_address(table_reader& r, std::string_view key, std::string& out, bool allow_unix) {
  if (!r.read(key, out) || out.empty()) return;
  if (auto problem = address_problem(out, allow_unix); !problem.empty())
    r.diag().error(r.where(key), r.key_path(key), problem);
}

// A leading "~" or "~/" becomes $HOME; a relative path is taken relative to base_dir.
void read_path(table_reader& r, std::string_view key, fs::path& out, std::string raw,
               const fs::path& base_dir) {
  r.read(key, raw);
  if (raw.empty()) {
    r.diag().error(r.where(key), r.key_path(key), "is empty; expected a file path");
    return;
  }
  if (raw.front() == '~') {
    if (raw.size() > 1 && raw[1] != '/') {
      r.diag().error(r.where(key), r.key_path(key),
                     fmt::format("\"{}\": only a leading \"~/\" is expanded (to $HOME); write "
                                 "the full path",
                                 raw));
      return;
    }
    const char* home = std::getenv("HOME");
    if (!home || !*home) {
      r.diag().error(
          r.where(key), r.key_path(key),
          fmt::format("\"{}\" starts with ~ but $HOME is not set; write the full path", raw));
      return;
    }
    raw = std::string(home) + raw.substr(1);
  }
  fs::path path(raw);
  if (path.is_relative() && !base_dir.empty()) path = base_dir / path;
  out = path.lexically_normal();
}

server_settings read_server(table_reader& r) {
  server_settings s;
  read_address(r, "listen", s.listen, true);
  read_address(r, "http_listen", s.http_listen, false);
  read_address(r, "metrics_listen", s.metrics_listen, false);
  r.read_choice<log_level>("log_level", s.log_level, log_levels);
  r.read("shutdown_grace_ms", s.shutdown_grace, {0, 600'000, "milliseconds"});
  r.read("max_connections", s.max_connections, {1, 1'000'000, "connections"});
  r.read("max_connections_per_peer", s.max_connections_per_peer, {1, 1'000'000, "connections"});
  r.read("idle_timeout_ms", s.idle_timeout, {100, 86'400'000, "milliseconds"});
  r.read("handshake_timeout_ms", s.handshake_timeout, {100, 600'000, "milliseconds"});
  r.read("http_keep_alive_ms", s.http_keep_alive, {100, 3'600'000, "milliseconds"});

  // Two listeners on one address: the second cannot bind. Port 0 picks distinct ports.
  const std::array<std::pair<std::string_view, const std::string*>, 3> listeners{
      {{"listen", &s.listen},
       {"http_listen", &s.http_listen},
       {"metrics_listen", &s.metrics_listen}}};
  for (size_t i = 0; i < listeners.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const std::string& a = *listeners[i].second;
      if (!a.empty() && a == *listeners[j].second && !a.ends_with(":0")) {
        r.diag().error(r.where(listeners[i].first), r.key_path(listeners[i].first),
                       fmt::format("\"{}\" is also server.{}; each listener needs its own address",
                                   a, listeners[j].first));
      }
    }
  }
  return s;
}

session_settings read_session(table_reader& r) {
  session_settings s;
  r.read("stream_buffer_tokens", s.stream_buffer_tokens, {1, 1 << 20, "tokens"});
  r.read("request_timeout_ms", s.request_timeout, {1, 86'400'000, "milliseconds"});
  return s;
}

model_settings read_model(table_reader& r, const fs::path& base_dir) {
  model_settings s;
  read_path(r, "path", s.path, std::string(default_model_path), base_dir);
  if (r.read("name", s.name) &&
      (s.name.empty() || std::any_of(s.name.begin(), s.name.end(), [](char c) {
         return std::isspace(static_cast<unsigned char>(c)) ||
                std::iscntrl(static_cast<unsigned char>(c));
       }))) {
    r.diag().error(r.where("name"), r.key_path("name"),
                   fmt::format("\"{}\": expected a non-empty name without spaces", s.name));
  }
  return s;
}

backend_settings read_backend(table_reader& r) {
  backend_settings s;
  r.read_choice<backend_kind>("kind", s.kind, backend_kinds);
  r.read("threads", s.threads, {0, 1024, "threads; 0 = all cores"});
  const bool devices_given = r.read("cuda_devices", s.cuda_devices, {0, 1023, "CUDA device ids"}, false);
  if (devices_given && s.kind != backend_kind::cuda && s.kind != backend_kind::automatic)
    r.diag().warn(r.key_path("cuda_devices"), "has no effect unless backend.kind = \"cuda\" or \"auto\"");
  const bool profile_given = r.read("sim_profile", s.sim_profile);
  r.read("max_context", s.max_context, {0, max_tokens_ever, "tokens; 0 = the model's"});
  const bool real_time_given = r.read("real_time", s.real_time);
  r.read("expert_shards", s.expert_shards, {0, 64, "expert shard actors; 0 = experts run in the attention shard"});
  if (r.read("expert_shard_addresses", s.expert_shard_addresses, true) && !s.expert_shard_addresses.empty() &&
      s.expert_shards > 0) {
    r.diag().error(r.where("expert_shard_addresses"), r.key_path("expert_shard_addresses"),
                   "and expert_shards are both set; use one: shard actors in this process (expert_shards) or "
                   "tireless-shard processes (expert_shard_addresses)");
  }
  using wire = backend_settings::wire_activations;
  static constexpr choice<wire> formats[] = {{"f32", wire::f32}, {"f16", wire::f16}, {"int8", wire::int8}};
  r.read_choice("expert_activations", s.expert_activations, std::span<const choice<wire>>(formats));
  r.read("expert_overlap", s.expert_overlap);
  r.read("expert_replicas_per_shard", s.expert_replicas_per_shard, {0, 1024, "experts per shard and layer"});
  r.read("expert_rebalance_every_steps", s.expert_rebalance_every_steps, {0, int64_t{1} << 40, "steps; 0 = never"});
  r.read("expert_call_timeout_ms", s.expert_call_timeout, {1, 3'600'000, "milliseconds"});
  if (const toml::table* t = r.sub_table("expert_parallel")) {
    table_reader e(*t, r.key_path("expert_parallel"), r.diag());
    auto& o = s.expert_parallel;
    const auto int_key = [&](std::string_view key, std::optional<int32_t>& out, int_range range) {
      if (int32_t v = 0; e.read(key, v, range)) out = v;
    };
    const auto real_key = [&](std::string_view key, std::optional<double>& out, real_range range) {
      if (double v = 0; e.read(key, v, range)) out = v;
    };
    int_key("degree", o.degree, {1, 1'000'000, "devices"});
    int_key("moe_layers", o.moe_layers, {1, 10'000, "layers"});
    int_key("hidden", o.hidden, {1, 1'000'000, "elements"});
    real_key("remote_copies", o.remote_copies, {0.0, 1e6});
    real_key("dispatch_bytes", o.dispatch_bytes, {0.0, 64.0});
    real_key("combine_bytes", o.combine_bytes, {0.0, 64.0});
    real_key("link_gbytes_per_s", o.link_gbytes_per_s, {0.0, 1e6, false, true});
    real_key("link_latency_us", o.link_latency_us, {0.0, 1e7});
    real_key("expert_share", o.expert_share, {0.0, 1.0});
    if (bool v = true; e.read("overlap", v)) o.overlap = v;
    e.finish();
  }
  r.read("max_shard_restarts", s.max_shard_restarts, {0, 1'000'000, "restarts"});
  r.read("shard_restart_window_ms", s.shard_restart_window, {1, 86'400'000, "milliseconds"});
  if (s.kind == backend_kind::cuda && (s.expert_shards > 0 || !s.expert_shard_addresses.empty())) {
    r.diag().error(r.where(s.expert_shards > 0 ? "expert_shards" : "expert_shard_addresses"),
                   r.key_path(s.expert_shards > 0 ? "expert_shards" : "expert_shard_addresses"),
                   "applies to the cpu backend; with kind = \"cuda\" the experts run on the GPUs of "
                   "backend.cuda_devices (NCCL between them)");
  }
  if (s.kind == backend_kind::sim) {
    if (s.sim_profile.empty())
      r.diag().error(r.where("sim_profile"), r.key_path("sim_profile"),
                     "is empty; kind = \"sim\" needs a cost-model profile such as \"cpu-smollm2\" "
                     "or \"h200-k2\"");
  } else {
    if (profile_given)
      r.diag().warn(r.key_path("sim_profile"), "has no effect unless backend.kind = \"sim\"");
    if (real_time_given)
      r.diag().warn(r.key_path("real_time"), "has no effect unless backend.kind = \"sim\"");
  }
  return s;
}

kv_settings read_kv(table_reader& r) {
  kv_settings s;
  if (int32_t size = s.block_size; r.read("block_size", size, {1, 1 << 16, "tokens"})) {
    if (size == 8 || size == 16 || size == 32 || size == 64) {
      s.block_size = size;
    } else {
      r.diag().error(r.where("block_size"), r.key_path("block_size"),
                     fmt::format("{} is not allowed; allowed: 8, 16, 32, 64 (tokens)", size));
    }
  }
  r.read("blocks", s.blocks, {0, int64_t{1} << 30, "blocks; 0 = derive from memory_mb"});
  const bool memory_given = r.read("memory_mb", s.memory_mb, {1, int64_t{1} << 24, "MiB"});
  s.memory_mb_given = memory_given;
  r.read("prefix_caching", s.prefix_caching);
  r.read("watermark", s.watermark, {0.0, 0.5, true});
  if (memory_given && s.blocks > 0)
    r.diag().warn(r.key_path("memory_mb"), "has no effect when kv.blocks is set");
  return s;
}

admission_settings read_admission(table_reader& r, const backend_settings& backend) {
  admission_settings s;
  r.read_choice<admission_policy>("policy", s.policy, policies);
  r.read("max_prompt_tokens", s.max_prompt_tokens, {0, max_tokens_ever, "tokens; 0 = context - 1"});
  r.read("default_max_tokens", s.default_max_tokens, {1, max_tokens_ever, "tokens"});
  r.read("max_queue_wait_ms", s.max_queue_wait, ms_hour);
  r.read("pressure_window_ms", s.pressure_window, {10, 600'000, "milliseconds"});
  if (backend.max_context > 0) {
    if (s.max_prompt_tokens >= backend.max_context)
      r.diag().error(
          r.where("max_prompt_tokens"), r.key_path("max_prompt_tokens"),
          fmt::format("{} leaves no room to generate in backend.max_context ({}); "
                      "allowed 0 to {}",
                      s.max_prompt_tokens, backend.max_context, backend.max_context - 1));
    if (s.default_max_tokens >= backend.max_context)
      r.diag().error(
          r.where("default_max_tokens"), r.key_path("default_max_tokens"),
          fmt::format("{} does not fit backend.max_context ({}); allowed 1 to {}",
                      s.default_max_tokens, backend.max_context, backend.max_context - 1));
  }
  return s;
}

// One rung; false when it is not usable (the problem is recorded).
bool read_degrade_step(table_reader& r, degrade_step& step) {
  // Above 10 is surely a percentage written for a fraction (60 for 0.6).
  bool ok = r.read("pressure", step.pressure, {0.0, 10.0}, need::required);
  int actions = 0;
  if (r.read("max_tokens", step.limit, {1, max_tokens_ever, "tokens"})) {
    step.action = degrade_action::cap_max_tokens;
    ++actions;
  }
  if (r.read("max_prompt_tokens", step.limit, {1, max_tokens_ever, "tokens"})) {
    step.action = degrade_action::cap_prompt_tokens;
    ++actions;
  }
  if (bool shed = false; r.read("shed", shed)) {
    if (!shed) {
      r.diag().error(r.where("shed"), r.key_path("shed"),
                     "shed = false is not an action; write shed = true or remove the rung");
      return false;
    }
    step.action = degrade_action::shed;
    step.limit = 0;
    ++actions;
  }
  const int written = int{r.table().contains("max_tokens")} +
                      int{r.table().contains("max_prompt_tokens")} +
                      int{r.table().contains("shed")};
  if (written != 1) {
    r.diag().error(r.table().source(), r.path(),
                   fmt::format("has {} actions; each rung has exactly one of max_tokens = N, "
                               "max_prompt_tokens = N, shed = true",
                               written));
    return false;
  }
  return ok && actions == 1;
}

std::vector<degrade_step> read_ladder(table_reader& tier_reader, const tier_settings& tier,
                                      const admission_settings& admission) {
  std::vector<degrade_step> ladder;
  const auto rungs = tier_reader.tables("degrade");
  for (size_t j = 0; j < rungs.size(); ++j) {
    if (!rungs[j]) continue;
    table_reader r(*rungs[j], fmt::format("{}.degrade[{}]", tier_reader.path(), j),
                   tier_reader.diag());
    degrade_step step;
    const bool ok = read_degrade_step(r, step);
    r.finish();
    if (!ok) continue;
    auto error = [&](std::string_view key, std::string what) {
      r.diag().error(r.where(key), r.key_path(key), what);
    };
    if (!ladder.empty() && step.pressure <= ladder.back().pressure) {
      error("pressure", fmt::format("{} does not exceed the rung before it ({}); pressures must "
                                    "strictly increase down the ladder",
                                    step.pressure, ladder.back().pressure));
      continue;
    }
    if (!ladder.empty() && ladder.back().action == degrade_action::shed) {
      error("pressure", "comes after a shed rung, which already refuses every new request");
      continue;
    }
    const std::string_view key = to_string(step.action);
    if (step.action == degrade_action::shed && !tier.sheddable) {
      error(key, fmt::format("tier '{}' is not sheddable, so its ladder cannot shed; set "
                             "sheddable = true or remove the rung",
                             tier.name));
      continue;
    }
    bool looser = false;
    for (const auto& before : ladder)
      if (before.action == step.action && step.limit >= before.limit) looser = true;
    if (looser) {
      error(key, fmt::format("{} is no tighter than an earlier {} rung; each rung must tighten",
                             step.limit, key));
      continue;
    }
    if (step.action == degrade_action::cap_prompt_tokens && admission.max_prompt_tokens > 0 &&
        step.limit >= admission.max_prompt_tokens) {
      r.diag().warn(r.key_path(key), fmt::format("{} has no effect: admission.max_prompt_tokens "
                                                 "({}) is already lower",
                                                 step.limit, admission.max_prompt_tokens));
    }
    ladder.push_back(step);
  }
  return ladder;
}

std::vector<tier_settings> read_tiers(table_reader& root, const admission_settings& admission) {
  std::vector<tier_settings> tiers;
  if (!root.has("tiers")) {
    root.diag().error(root.table().source(), "tiers",
                      "missing; at least one [[tiers]] is required (name, priority, ttft_ms, "
                      "tpot_ms)");
    return tiers;
  }
  const auto tables = root.tables("tiers");
  if (tables.empty())
    root.diag().error(root.where("tiers"), "tiers", "is empty; at least one tier is required");
  std::map<std::string, std::string> names;   // name -> path
  std::map<int32_t, std::string> priorities;  // priority -> path
  for (size_t i = 0; i < tables.size(); ++i) {
    if (!tables[i]) continue;
    table_reader r(*tables[i], fmt::format("tiers[{}]", i), root.diag());
    tier_settings tier;
    r.read("name", tier.name, need::required);
    check_name(r, "name", tier.name);
    const bool has_priority =
        r.read("priority", tier.priority, {-1'000'000, 1'000'000, ""}, need::required);
    const bool has_ttft = r.read("ttft_ms", tier.ttft, ms_hour, need::required);
    r.read("tpot_ms", tier.tpot, {1, 60'000, "milliseconds"}, need::required);
    r.read("queue_bound", tier.queue_bound, {1, 1'000'000, "requests"});
    r.read("sheddable", tier.sheddable);
    r.read("start_within_ms", tier.start_within, ms_hour);
    if (!tier.name.empty() && !names.emplace(tier.name, r.path()).second)
      r.diag().error(r.where("name"), r.key_path("name"),
                     fmt::format("\"{}\" is also the name of {}; tier names must be unique",
                                 tier.name, names[tier.name]));
    if (has_priority && !priorities.emplace(tier.priority, r.path()).second)
      r.diag().error(r.where("priority"), r.key_path("priority"),
                     fmt::format("{} is also the priority of {}; priorities must be unique "
                                 "(higher is more important)",
                                 tier.priority, priorities[tier.priority]));
    if (has_ttft && tier.ttft > admission.max_queue_wait)
      r.diag().error(r.where("ttft_ms"), r.key_path("ttft_ms"),
                     fmt::format("{} exceeds admission.max_queue_wait_ms ({}): requests would be "
                                 "rejected before reaching their target; allowed 1 to {}",
                                 tier.ttft.count(), admission.max_queue_wait.count(),
                                 admission.max_queue_wait.count()));
    tier.degrade = read_ladder(r, tier, admission);
    r.finish();
    tiers.push_back(std::move(tier));
  }
  std::stable_sort(tiers.begin(), tiers.end(),
                   [](const auto& a, const auto& b) { return a.priority > b.priority; });
  return tiers;
}

engine_settings read_engine(table_reader& r, const std::vector<tier_settings>& tiers) {
  engine_settings s;
  r.read("max_step_tokens", s.max_step_tokens, {1, 1 << 20, "tokens"});
  r.read("max_step_seqs", s.max_step_seqs, {1, 65'536, "sequences"});
  r.read("max_preemptions", s.max_preemptions, {0, 1'000, "per request"});
  r.read("step_time_target_ms", s.step_time_target,
         {0, 60'000, "milliseconds; 0 = the tightest tier's tpot_ms"});
  if (s.max_step_tokens < s.max_step_seqs)
    r.diag().error(r.where("max_step_tokens"), r.key_path("max_step_tokens"),
                   fmt::format("{} is below engine.max_step_seqs ({}): a step could not give "
                               "every sequence its token; allowed {} or more",
                               s.max_step_tokens, s.max_step_seqs, s.max_step_seqs));
  const tier_settings* tightest = nullptr;
  for (const auto& tier : tiers)
    if (tier.tpot.count() > 0 && (!tightest || tier.tpot < tightest->tpot)) tightest = &tier;
  if (tightest && s.step_time_target > tightest->tpot)
    r.diag().error(r.where("step_time_target_ms"), r.key_path("step_time_target_ms"),
                   fmt::format("{} exceeds the tightest tier's tpot_ms ({}, tier '{}'): every "
                               "step would miss it; allowed 0 to {}",
                               s.step_time_target.count(), tightest->tpot.count(), tightest->name,
                               tightest->tpot.count()));
  return s;
}

std::vector<tenant_settings> read_tenants(table_reader& root,
                                          const std::vector<tier_settings>& tiers,
                                          const admission_settings& admission) {
  std::vector<tenant_settings> tenants;
  std::vector<std::string> tier_names;
  for (const auto& tier : tiers)
    if (!tier.name.empty() &&
        std::find(tier_names.begin(), tier_names.end(), tier.name) == tier_names.end())
      tier_names.push_back(tier.name);
  std::map<std::string, std::string> names;  // name -> path
  std::map<std::string, std::string> keys;   // API key -> path (the key itself is never shown)
  const auto tables = root.tables("tenants");
  for (size_t i = 0; i < tables.size(); ++i) {
    if (!tables[i]) continue;
    table_reader r(*tables[i], fmt::format("tenants[{}]", i), root.diag());
    tenant_settings tenant;
    r.read("name", tenant.name, need::required);
    check_name(r, "name", tenant.name);
    if (!tenant.name.empty() && !names.emplace(tenant.name, r.path()).second)
      r.diag().error(r.where("name"), r.key_path("name"),
                     fmt::format("\"{}\" is also the name of {}; tenant names must be unique",
                                 tenant.name, names[tenant.name]));
    if (r.read("keys", tenant.keys, false, need::required)) {
      const auto& array = *r.table().get("keys")->as_array();
      for (size_t k = 0; k < tenant.keys.size(); ++k) {
        const std::string path = fmt::format("{}[{}]", r.key_path("keys"), k);
        const std::string& key = tenant.keys[k];
        if (std::any_of(key.begin(), key.end(), [](char c) { return c <= ' ' || c == 0x7f; }))
          r.diag().error(array[k].source(), path,
                         "contains spaces or control characters; an API key is printable text");
        else if (!keys.emplace(key, path).second)
          r.diag().error(
              array[k].source(), path,
              fmt::format("is the same API key as {}; each key names one tenant", keys[key]));
      }
    }
    if (r.read("tier", tenant.tier, need::required) &&
        std::find(tier_names.begin(), tier_names.end(), tenant.tier) == tier_names.end()) {
      std::string near = closest_key(tenant.tier, tier_names);
      r.diag().error(r.where("tier"), r.key_path("tier"),
                     fmt::format("\"{}\" names no tier{}; tiers: {}", tenant.tier,
                                 near.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", near),
                                 fmt::join(tier_names, ", ")));
    }
    r.read("weight", tenant.weight, {0.0, 1e6, false, true});
    r.read("requests_per_minute", tenant.requests_per_minute, {0, 1'000'000'000, "0 = unlimited"});
    const int64_t least_tokens = int64_t{admission.default_max_tokens} + 1;
    if (r.read("tokens_per_minute", tenant.tokens_per_minute, {0, unbounded, "0 = unlimited"}) &&
        tenant.tokens_per_minute > 0 && tenant.tokens_per_minute < least_tokens)
      r.diag().error(
          r.where("tokens_per_minute"), r.key_path("tokens_per_minute"),
          fmt::format("{} is below one request's reservation (a 1-token prompt plus "
                      "admission.default_max_tokens = {}); allowed 0 or at least {}",
                      tenant.tokens_per_minute, admission.default_max_tokens, least_tokens));
    r.read("max_concurrent", tenant.max_concurrent, {0, 1'000'000, "0 = unlimited"});
    r.finish();
    tenants.push_back(std::move(tenant));
  }
  if (tables.empty()) root.diag().warn("tenants", "none configured: no API key is checked and every request is the first tier's");
  return tenants;
}

metrics_settings read_metrics(table_reader& r) {
  metrics_settings s;
  if (r.read("prefix", s.prefix) &&
      (s.prefix.empty() || std::isdigit(static_cast<unsigned char>(s.prefix.front())) ||
       !std::all_of(s.prefix.begin(), s.prefix.end(), [](char c) {
         return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':';
       })))
    r.diag().error(r.where("prefix"), r.key_path("prefix"),
                   fmt::format("\"{}\" is not a Prometheus metric name prefix; use letters, "
                               "digits, '_' and ':', not starting with a digit",
                               s.prefix));
  r.read("per_tenant", s.per_tenant);
  const real_range bucket{0.0, 1e7, false, true};
  r.read("ttft_buckets_ms", s.ttft_buckets_ms, bucket);
  r.read("tpot_buckets_ms", s.tpot_buckets_ms, bucket);
  r.read("step_time_buckets_ms", s.step_time_buckets_ms, bucket);
  return s;
}

// Runs read on the document's [name] table (an empty one when absent), then reports its
// unknown keys.
template <class Read>
auto read_section(table_reader& root, std::string_view name, Read read) {
  static const toml::table empty;
  const toml::table* table = root.sub_table(name);
  table_reader r(table ? *table : empty, std::string(name), root.diag());
  auto settings = read(r);
  r.finish();
  return settings;
}

}  // namespace

fault_settings read_faults(table_reader& r) {
  fault_settings s;
  r.read("shard_crash_per_step", s.shard_crash_per_step, {0.0, 1.0});
  r.read("shard_crash_every_steps", s.shard_crash_every_steps, {0, INT64_MAX, "steps"});
  r.read("shard_slow_per_step", s.shard_slow_per_step, {0.0, 1.0});
  r.read("shard_slow_ms", s.shard_slow, {0, 3'600'000, "milliseconds"});
  r.read("shard_slow_factor", s.shard_slow_factor, {1.0, 1000.0});
  r.read("seed", s.seed, {0, INT64_MAX, "a seed"});
  const auto events = r.tables("expert_group");
  for (size_t i = 0; i < events.size(); ++i) {
    if (!events[i]) continue;
    table_reader e(*events[i], fmt::format("{}[{}]", r.key_path("expert_group"), i), r.diag());
    fault_settings::expert_group_event ev;
    e.read("at_s", ev.at_s, {0.0, 1e9}, need::required);
    e.read("for_s", ev.for_s, {0.0, 1e9});
    e.read("down", ev.down, {0, 1'000'000, "devices"});
    e.read("imbalance", ev.imbalance, {1.0, 1e6});
    e.read("stall_ms", ev.stall_ms, {0.0, 3.6e6});
    e.finish();
    s.expert_group.push_back(ev);
  }
  if (s.any()) r.diag().warn(r.key_path("shard_crash_per_step"), "faults are injected on purpose ([faults])");
  return s;
}

runtime_config read_document(const toml::table& document, const fs::path& base_dir,
                             diagnostics& diag) {
  runtime_config c;
  table_reader root(document, "", diag);
  c.server = read_section(root, "server", read_server);
  c.session = read_section(root, "session", read_session);
  c.model = read_section(root, "model", [&](table_reader& r) { return read_model(r, base_dir); });
  c.backend = read_section(root, "backend", read_backend);
  c.kv = read_section(root, "kv", read_kv);
  c.admission = read_section(root, "admission",
                             [&](table_reader& r) { return read_admission(r, c.backend); });
  c.tiers = read_tiers(root, c.admission);
  c.engine = read_section(root, "engine", [&](table_reader& r) { return read_engine(r, c.tiers); });
  c.tenants = read_tenants(root, c.tiers, c.admission);
  c.metrics = read_section(root, "metrics", read_metrics);
  c.faults = read_section(root, "faults", read_faults);
  root.finish();
  diag.finish();
  return c;
}

}  // namespace tireless::config_detail
