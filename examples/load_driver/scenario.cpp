#include "scenario.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

namespace tireless::load {

namespace {

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : "\n") + l;
  return out;
}

std::string_view type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date or time";
  }
}

// Typed reads that collect problems ("file:line:col: key.path: what") instead of stopping.
class reader {
 public:
  explicit reader(std::string source) : source_(std::move(source)) {}

  void error(const toml::node* at, std::string_view path, std::string_view what) {
    if (at) {
      const auto& b = at->source().begin;
      problems_.push_back(fmt::format("{}:{}:{}: {}: {}", source_, b.line, b.column, path, what));
    } else {
      problems_.push_back(fmt::format("{}: {}: {}", source_, path, what));
    }
  }

  // Every key of `t` not in `known` is a problem.
  void only(const toml::table& t, std::string_view path, std::initializer_list<std::string_view> known) {
    for (const auto& [k, v] : t) {
      if (std::find(known.begin(), known.end(), k.str()) == known.end()) {
        error(&v, join(path, k.str()), fmt::format("unknown key; known here: {}", fmt::join(known, ", ")));
      }
    }
  }

  static std::string join(std::string_view path, std::string_view key) {
    return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
  }

  const toml::table* table(const toml::table& t, std::string_view key, std::string_view path, bool required) {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) error(&t, join(path, key), "missing (a table)");
      return nullptr;
    }
    if (!n->is_table()) error(n, join(path, key), fmt::format("must be a table, not {}", type_name(*n)));
    return n->as_table();
  }

  std::optional<double> number(const toml::table& t, std::string_view key, std::string_view path, double lo,
                               double hi, bool required = false) {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) error(&t, join(path, key), fmt::format("missing (a number in [{}, {}])", lo, hi));
      return std::nullopt;
    }
    std::optional<double> v = n->value<double>();  // integers convert too
    if (!v || n->is_boolean() || n->is_string()) {
      error(n, join(path, key), fmt::format("must be a number, not {}", type_name(*n)));
      return std::nullopt;
    }
    if (!std::isfinite(*v) || *v < lo || *v > hi) {
      error(n, join(path, key), fmt::format("{} is out of range [{}, {}]", *v, lo, hi));
      return std::nullopt;
    }
    return v;
  }

  std::optional<int64_t> integer(const toml::table& t, std::string_view key, std::string_view path, int64_t lo,
                                 int64_t hi, bool required = false) {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) error(&t, join(path, key), fmt::format("missing (an integer in [{}, {}])", lo, hi));
      return std::nullopt;
    }
    if (!n->is_integer()) {
      error(n, join(path, key), fmt::format("must be an integer, not {}", type_name(*n)));
      return std::nullopt;
    }
    const int64_t v = *n->value<int64_t>();
    if (v < lo || v > hi) {
      error(n, join(path, key), fmt::format("{} is out of range [{}, {}]", v, lo, hi));
      return std::nullopt;
    }
    return v;
  }

  std::optional<std::string> string(const toml::table& t, std::string_view key, std::string_view path,
                                    bool required = false) {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) error(&t, join(path, key), "missing (a string)");
      return std::nullopt;
    }
    if (!n->is_string()) {
      error(n, join(path, key), fmt::format("must be a string, not {}", type_name(*n)));
      return std::nullopt;
    }
    return *n->value<std::string>();
  }

  // One of `choices`.
  std::optional<std::string> choice(const toml::table& t, std::string_view key, std::string_view path,
                                    std::initializer_list<std::string_view> choices, bool required = false) {
    auto v = string(t, key, path, required);
    if (v && std::find(choices.begin(), choices.end(), *v) == choices.end()) {
      error(t.get(key), join(path, key), fmt::format("\"{}\" is not one of: {}", *v, fmt::join(choices, ", ")));
      return std::nullopt;
    }
    return v;
  }

  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::string source_;
  std::vector<std::string> problems_;
};

std::filesystem::path resolve(const std::filesystem::path& base, const std::string& p) {
  if (p.starts_with("~/")) {
    const char* home = std::getenv("HOME");
    return std::filesystem::path(home ? home : "") / p.substr(2);
  }
  const std::filesystem::path path(p);
  return path.is_absolute() ? path : (base / path).lexically_normal();
}

void read_length(reader& r, const toml::table& t, std::string_view key, std::string_view path, length_dist& d) {
  const std::string where = reader::join(path, key);
  const toml::node* n = t.get(key);
  if (!n) {
    r.error(&t, where, "missing: a token count, or a table with dist = \"fixed\" | \"uniform\" | \"lognormal\"");
    return;
  }
  if (n->is_integer()) {
    if (auto v = r.integer(t, key, path, 1, 1'000'000)) d.min = d.max = static_cast<int32_t>(*v);
    return;
  }
  const toml::table* dt = r.table(t, key, path, true);
  if (!dt) return;
  r.only(*dt, where, {"dist", "tokens", "min", "max", "median", "sigma"});
  const auto dist = r.choice(*dt, "dist", where, {"fixed", "uniform", "lognormal"}, true);
  if (!dist) return;
  if (*dist == "fixed") {
    d.shape = length_dist::kind::fixed;
    if (auto v = r.integer(*dt, "tokens", where, 1, 1'000'000, true)) d.min = d.max = static_cast<int32_t>(*v);
    return;
  }
  const auto lo = r.integer(*dt, "min", where, 1, 1'000'000, true);
  const auto hi = r.integer(*dt, "max", where, 1, 1'000'000, true);
  if (lo && hi) {
    d.min = static_cast<int32_t>(*lo);
    d.max = static_cast<int32_t>(*hi);
    if (d.min > d.max) r.error(dt->get("max"), where + ".max", fmt::format("{} is below min = {}", d.max, d.min));
  }
  if (*dist == "uniform") {
    d.shape = length_dist::kind::uniform;
    return;
  }
  d.shape = length_dist::kind::lognormal;
  const auto median = r.number(*dt, "median", where, 1, 1e6, true);
  const auto sigma = r.number(*dt, "sigma", where, 0.01, 5, true);
  if (median && sigma) {
    d.median = *median;
    d.sigma = *sigma;
    if (lo && hi && (d.median < d.min || d.median > d.max)) {
      r.error(dt->get("median"), where + ".median", fmt::format("{} lies outside [min, max] = [{}, {}]", d.median, d.min, d.max));
    }
  }
}

// The tier of a tenant key in the target config; -1 when no tenant has it.
int32_t tier_of_key(const runtime_config& c, const std::string& key) {
  for (const tenant_settings& t : c.tenants) {
    if (std::find(t.keys.begin(), t.keys.end(), key) == t.keys.end()) continue;
    for (size_t i = 0; i < c.tiers.size(); ++i) {
      if (c.tiers[i].name == t.tier) return static_cast<int32_t>(i);
    }
  }
  if (c.tenants.empty()) return 0;  // no tenants: every request is the first tier's
  return -1;
}

void read_profile(reader& r, const toml::node& n, rate_profile& p) {
  const toml::array* a = n.as_array();
  const char* example = "must be an array of [time_s, factor] pairs in time order, e.g. [[0, 0.5], [600, 4], [1200, 0.5]]";
  if (!a || a->empty()) {
    r.error(&n, "arrivals.profile", example);
    return;
  }
  for (size_t i = 0; i < a->size(); ++i) {
    const toml::array* pair = a->get(i)->as_array();
    std::optional<double> t, f;
    if (pair && pair->size() == 2) {
      t = pair->get(0)->value<double>();
      f = pair->get(1)->value<double>();
    }
    const std::string path = fmt::format("arrivals.profile[{}]", i);
    if (!t || !f || *t < 0 || *f < 0 || *f > 1000) {
      r.error(a->get(i), path, "must be [time_s >= 0, factor in [0, 1000]]");
    } else if (!p.points.empty() && *t <= p.points.back().first) {
      r.error(a->get(i), path, fmt::format("time {} is not after the previous point's {}", *t, p.points.back().first));
    } else {
      p.points.emplace_back(*t, *f);
    }
  }
  if (!p.points.empty() && p.peak() <= 0) r.error(&n, "arrivals.profile", "every factor is 0: nothing would arrive");
}

void read_burst(reader& r, const toml::table& t, const std::string& path, request_class& c) {
  const toml::table* b = r.table(t, "burst", path, false);
  if (!b) return;
  const std::string where = path + ".burst";
  r.only(*b, where, {"every_s", "for_s", "factor"});
  c.burst_every_s = r.number(*b, "every_s", where, 1e-3, 1e7, true).value_or(0);
  c.burst_for_s = r.number(*b, "for_s", where, 1e-3, 1e7, true).value_or(0);
  c.burst_factor = r.number(*b, "factor", where, 1, 1000, true).value_or(1);
  if (c.burst_every_s > 0 && c.burst_factor * c.burst_for_s > c.burst_every_s) {
    r.error(b, where, fmt::format("factor x for_s ({:g}) exceeds every_s ({:g}): the class's mean share cannot be kept; "
                                  "lower the factor or for_s",
                                  c.burst_factor * c.burst_for_s, c.burst_every_s));
    c.burst_every_s = 0;
  }
}

void read_mix(reader& r, const toml::table& doc, scenario& s) {
  const toml::node* n = doc.get("mix");
  if (!n) {
    r.error(nullptr, "mix", "missing: at least one [[mix]] class (or arrivals.process = \"trace\")");
    return;
  }
  const toml::array* classes = n->as_array();
  if (!classes || classes->empty()) {
    r.error(n, "mix", "must be a non-empty array of tables ([[mix]])");
    return;
  }
  double total = 0;
  for (size_t i = 0; i < classes->size(); ++i) {
    const std::string path = fmt::format("mix[{}]", i);
    const toml::table* t = classes->get(i)->as_table();
    if (!t) {
      r.error(classes->get(i), path, "must be a table");
      continue;
    }
    r.only(*t, path, {"name", "share", "tenant_key", "prompt", "output", "system_prompt_tokens", "timeout_ms", "burst"});
    request_class c;
    c.name = r.string(*t, "name", path).value_or(fmt::format("class{}", i));
    c.share = r.number(*t, "share", path, 1e-9, 1e9, true).value_or(0);
    total += c.share;
    if (auto key = r.string(*t, "tenant_key", path, s.config.tenants.empty() ? false : true)) {
      c.tenant_key = *key;
      c.tier = tier_of_key(s.config, *key);
      if (c.tier < 0) {
        r.error(t->get("tenant_key"), path + ".tenant_key",
                fmt::format("\"{}\" is not a key of any tenant in {}", *key, s.config_path.string()));
      }
    }
    read_length(r, *t, "prompt", path, c.prompt);
    read_length(r, *t, "output", path, c.output);
    c.system_prompt_tokens = static_cast<int32_t>(r.integer(*t, "system_prompt_tokens", path, 0, 1'000'000).value_or(0));
    c.timeout_ms = r.integer(*t, "timeout_ms", path, 0, 86'400'000).value_or(0);
    read_burst(r, *t, path, c);
    s.mix.push_back(std::move(c));
  }
  for (auto& c : s.mix) c.share /= total > 0 ? total : 1;
}

std::vector<trace_row> read_trace(reader& r, const scenario& s, const scenario_files& files) {
  std::vector<trace_row> rows;
  const std::optional<std::string> text = files.text(s.trace_path);
  if (!text) {
    r.error(nullptr, "arrivals.trace", fmt::format("cannot read {}", s.trace_path.string()));
    return rows;
  }
  std::istringstream in(*text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
    auto bad = [&](std::string_view what) {
      r.error(nullptr, "arrivals.trace", fmt::format("{}:{}: {}", s.trace_path.string(), number, what));
    };
    if (f.size() != 4) {
      bad("expected 4 fields: arrival_s, tenant_key, prompt_tokens, output_tokens");
      continue;
    }
    trace_row row;
    try {
      row.arrival_s = std::stod(f[0]);
      row.prompt_tokens = std::stoi(f[2]);
      row.output_tokens = std::stoi(f[3]);
    } catch (const std::exception&) {
      if (rows.empty() && number == 1) continue;  // a header
      bad("arrival_s, prompt_tokens and output_tokens must be numbers");
      continue;
    }
    row.tenant_key = f[1];
    row.tier = tier_of_key(s.config, row.tenant_key);
    if (row.tier < 0) bad(fmt::format("\"{}\" is not a key of any tenant in {}", row.tenant_key, s.config_path.string()));
    if (row.arrival_s < 0 || row.prompt_tokens < 1 || row.output_tokens < 1) bad("negative time or a count below 1");
    rows.push_back(std::move(row));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const trace_row& a, const trace_row& b) { return a.arrival_s < b.arrival_s; });
  if (rows.empty()) r.error(nullptr, "arrivals.trace", fmt::format("{} has no requests", s.trace_path.string()));
  return rows;
}

// [target.autoscale]: the HPA's knobs (scheduler/autoscaler.hpp) and its metrics.
void read_autoscale(reader& r, const toml::table& target, scenario& s) {
  const toml::table* t = r.table(target, "autoscale", "target", false);
  if (!t) return;
  const std::string path = "target.autoscale";
  if (s.target != target_kind::virtual_sim) {
    r.error(t, path, "applies to kind = \"virtual\" only (a real fleet scales with its HPA: deploy/kubernetes/hpa.yaml)");
    return;
  }
  r.only(*t, path, {"min_replicas", "max_replicas", "period_s", "tolerance", "startup_s", "up_window_s", "down_window_s",
                    "up_step", "up_period_s", "down_step", "down_period_s", "metrics"});
  autoscale_options o;
  o.min_replicas = static_cast<int32_t>(r.integer(*t, "min_replicas", path, 1, 4096).value_or(o.min_replicas));
  o.max_replicas = static_cast<int32_t>(r.integer(*t, "max_replicas", path, 1, 4096).value_or(o.max_replicas));
  o.period_s = r.number(*t, "period_s", path, 0.1, 3600).value_or(o.period_s);
  o.tolerance = r.number(*t, "tolerance", path, 0, 0.99).value_or(o.tolerance);
  o.startup_s = r.number(*t, "startup_s", path, 0, 86400).value_or(o.startup_s);
  o.up_window_s = r.number(*t, "up_window_s", path, 0, 86400).value_or(o.up_window_s);
  o.down_window_s = r.number(*t, "down_window_s", path, 0, 86400).value_or(o.down_window_s);
  o.up_step = static_cast<int32_t>(r.integer(*t, "up_step", path, 1, 4096).value_or(o.up_step));
  o.up_period_s = r.number(*t, "up_period_s", path, 0.1, 86400).value_or(o.up_period_s);
  o.down_step = static_cast<int32_t>(r.integer(*t, "down_step", path, 1, 4096).value_or(o.down_step));
  o.down_period_s = r.number(*t, "down_period_s", path, 0.1, 86400).value_or(o.down_period_s);
  const toml::node* n = t->get("metrics");
  const toml::array* a = n ? n->as_array() : nullptr;
  if (!a || a->empty()) {
    r.error(n ? n : t, path + ".metrics",
            "give one or more metrics, e.g. metrics = [{ what = \"queue_depth\", tier = \"premium\", target = 2 }]");
    return;
  }
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string where = fmt::format("{}.metrics[{}]", path, i);
    const toml::table* m = a->get(i)->as_table();
    if (!m) {
      r.error(a->get(i), where, "must be a table { what = ..., target = ... }");
      continue;
    }
    r.only(*m, where, {"what", "tier", "target"});
    autoscale_metric metric;
    if (auto what = r.choice(*m, "what", where, {"queue_depth", "waiting", "refused_per_s"}, true)) {
      metric.what = parse_autoscale_metric(*what);
    }
    metric.tier = r.string(*m, "tier", where).value_or("");
    if (!metric.tier.empty() && metric.what != autoscale_metric::kind::queue_depth) {
      r.error(m->get("tier"), where + ".tier", "applies to what = \"queue_depth\" only");
    }
    if (!metric.tier.empty() && s.config.find_tier(metric.tier) == nullptr) {
      r.error(m->get("tier"), where + ".tier", fmt::format("\"{}\" is not a tier of {}", metric.tier, s.config_path.string()));
    }
    metric.target = r.number(*m, "target", where, 1e-6, 1e9, true).value_or(1);
    o.metrics.push_back(std::move(metric));
  }
  try {
    autoscaler check(o);
  } catch (const std::invalid_argument& e) {
    r.error(t, path, e.what());
    return;
  }
  s.autoscale = std::move(o);
}

void read_target(reader& r, const toml::table& doc, scenario& s) {
  const toml::table* t = r.table(doc, "target", "", true);
  if (!t) return;
  r.only(*t, "target", {"kind", "config", "quotas", "address", "serve", "base_url", "keys", "replicas", "autoscale"});
  const auto kind = r.choice(*t, "kind", "target", {"virtual", "server", "openai"}, true);
  s.target = kind == "server" ? target_kind::server : kind == "openai" ? target_kind::openai : target_kind::virtual_sim;
  s.base_url = r.string(*t, "base_url", "target").value_or("");
  if (s.target == target_kind::openai && s.base_url.rfind("http://", 0) != 0) {
    r.error(t, "target.base_url", "kind = \"openai\" needs base_url = \"http://host:port\" (an OpenAI-compatible server)");
  }
  if (s.target != target_kind::openai && !s.base_url.empty()) r.error(t, "target", "base_url applies to kind = \"openai\" only");
  if (const toml::table* keys = r.table(*t, "keys", "target", false)) {
    for (const auto& [k, v] : *keys) {
      if (!v.is_string()) {
        r.error(&v, "target.keys", "each key maps to a string (the key sent to the server)");
        continue;
      }
      s.target_keys[std::string(k.str())] = *v.value<std::string>();
    }
  }
  const auto base = s.file.parent_path();
  if (auto c = r.string(*t, "config", "target", true)) s.config_path = resolve(base, *c);
  s.lift_quotas = r.choice(*t, "quotas", "target", {"config", "lifted"}).value_or("config") == "lifted";
  s.address = r.string(*t, "address", "target").value_or("");
  s.replicas = static_cast<int32_t>(r.integer(*t, "replicas", "target", 1, 4096).value_or(1));
  if (s.replicas > 1 && s.target != target_kind::virtual_sim) {
    r.error(t->get("replicas"), "target.replicas", "applies to kind = \"virtual\" only (a fleet of servers sits behind a load balancer)");
  }
  if (auto p = r.string(*t, "serve", "target")) s.serve = resolve(base, *p);
  if (s.target == target_kind::virtual_sim && (!s.address.empty() || !s.serve.empty())) {
    r.error(t, "target", "address and serve apply to kind = \"server\" only");
  }
  if (!s.address.empty() && s.address.rfind(':') == std::string::npos) {
    r.error(t->get("address"), "target.address", fmt::format("\"{}\" is not HOST:PORT", s.address));
  }
}

void read_faults(reader& r, const toml::table& doc, scenario& s) {
  const toml::table* t = r.table(doc, "faults", "", false);
  if (!t) return;
  r.only(*t, "faults", {"expert_group"});
  const toml::node* n = t->get("expert_group");
  if (!n) return;
  const toml::array* a = n->as_array();
  if (!a) {
    r.error(n, "faults.expert_group", "must be an array of tables ([[faults.expert_group]])");
    return;
  }
  if (s.target != target_kind::virtual_sim) {
    r.error(n, "faults.expert_group", "applies to the virtual target only (a server takes [[faults.expert_group]] in its config)");
  }
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string path = fmt::format("faults.expert_group[{}]", i);
    const toml::table* e = a->get(i)->as_table();
    if (!e) {
      r.error(a->get(i), path, "must be a table: at_s, for_s, down, imbalance, stall_ms");
      continue;
    }
    r.only(*e, path, {"at_s", "for_s", "down", "imbalance", "stall_ms"});
    fault_settings::expert_group_event ev;
    ev.at_s = r.number(*e, "at_s", path, 0, 1e9, true).value_or(0);
    ev.for_s = r.number(*e, "for_s", path, 0, 1e9).value_or(0);
    ev.down = static_cast<int32_t>(r.integer(*e, "down", path, 0, 1'000'000).value_or(0));
    ev.imbalance = r.number(*e, "imbalance", path, 1, 1e6).value_or(1);
    ev.stall_ms = r.number(*e, "stall_ms", path, 0, 3.6e6).value_or(0);
    s.expert_group.push_back(ev);
  }
}

void read_run(reader& r, const toml::table& doc, scenario& s) {
  const toml::table* t = r.table(doc, "run", "", false);
  if (!t) return;
  r.only(*t, "run", {"duration_s", "warmup_s", "drain_s", "sample_every_s", "seed", "multiples", "policies"});
  s.duration_s = r.number(*t, "duration_s", "run", 1, 1e7).value_or(s.duration_s);
  s.warmup_s = r.number(*t, "warmup_s", "run", 0, 1e7).value_or(s.warmup_s);
  s.drain_s = r.number(*t, "drain_s", "run", 0, 1e7).value_or(0);
  s.sample_every_s = r.number(*t, "sample_every_s", "run", 0.01, 3600).value_or(s.sample_every_s);
  s.seed = static_cast<uint64_t>(r.integer(*t, "seed", "run", 0, INT64_MAX).value_or(1));
  if (const toml::node* n = t->get("multiples")) {
    const toml::array* a = n->as_array();
    s.multiples.clear();
    for (size_t i = 0; a && i < a->size(); ++i) {
      auto v = a->get(i)->value<double>();
      if (!v || *v <= 0 || *v > 1000) r.error(a->get(i), fmt::format("run.multiples[{}]", i), "must be a number in (0, 1000]");
      else s.multiples.push_back(*v);
    }
    if (!a || a->empty()) r.error(n, "run.multiples", "must be a non-empty array of numbers, e.g. [1, 2, 3, 5]");
  }
  if (const toml::node* n = t->get("policies")) {
    const toml::array* a = n->as_array();
    std::vector<std::string> names;
    for (size_t i = 0; a && i < a->size(); ++i) names.push_back(a->get(i)->value<std::string>().value_or("?"));
    try {
      if (!a || a->empty()) throw std::invalid_argument("must be a non-empty array, e.g. [\"fcfs\", \"priority\", \"tireless\"]");
      s.policies = parse_policies(names);
    } catch (const std::invalid_argument& e) {
      r.error(n, "run.policies", e.what());
    }
  }
}

void read_clients(reader& r, const toml::table& doc, scenario& s) {
  const toml::table* t = r.table(doc, "clients", "", false);
  if (!t) return;
  r.only(*t, "clients", {"retries"});
  s.retries = static_cast<int32_t>(r.integer(*t, "retries", "clients", 0, 10).value_or(0));
}

void read_capacity(reader& r, const toml::table& doc, scenario& s) {
  const toml::table* t = r.table(doc, "capacity", "", false);
  if (!t) return;
  r.only(*t, "capacity", {"rps", "calibration_s", "warmup_s", "concurrency"});
  s.capacity_rps = r.number(*t, "rps", "capacity", 1e-6, 1e9).value_or(0);
  s.calibration_s = r.number(*t, "calibration_s", "capacity", 1, 1e7).value_or(s.calibration_s);
  s.calibration_warmup_s = r.number(*t, "warmup_s", "capacity", 0, 1e7).value_or(s.calibration_warmup_s);
  s.concurrency = static_cast<int32_t>(r.integer(*t, "concurrency", "capacity", 0, 1'000'000).value_or(0));
}

void read_arrivals(reader& r, const toml::table& doc, scenario& s, const scenario_files& files) {
  const toml::table* t = r.table(doc, "arrivals", "", false);
  if (t) {
    r.only(*t, "arrivals", {"process", "trace", "profile"});
    if (const toml::node* n = t->get("profile")) read_profile(r, *n, s.profile);
    s.arrivals = r.choice(*t, "process", "arrivals", {"poisson", "trace"}).value_or("poisson") == "trace"
                     ? arrival_kind::trace
                     : arrival_kind::poisson;
    if (auto p = r.string(*t, "trace", "arrivals")) s.trace_path = resolve(s.file.parent_path(), *p);
  }
  if (s.arrivals == arrival_kind::trace) {
    if (s.trace_path.empty()) r.error(t, "arrivals.trace", "missing: the trace CSV (with process = \"trace\")");
    else if (r.problems().empty()) s.trace = read_trace(r, s, files);
    if (doc.get("mix")) r.error(doc.get("mix"), "mix", "a trace replay takes its requests from the trace; remove [[mix]]");
    if (!s.profile.points.empty()) r.error(t->get("profile"), "arrivals.profile", "applies to process = \"poisson\" only");
  } else {
    if (!s.trace_path.empty()) r.error(t->get("trace"), "arrivals.trace", "applies to process = \"trace\" only");
    read_mix(r, doc, s);
  }
}

}  // namespace

double request_class::burst_at(double t) const {
  if (burst_every_s <= 0) return 1.0;
  if (std::fmod(t, burst_every_s) < burst_for_s) return burst_factor;
  return (burst_every_s - burst_factor * burst_for_s) / (burst_every_s - burst_for_s);
}

double rate_profile::at(double t) const {
  if (points.empty()) return 1.0;
  if (t <= points.front().first) return points.front().second;
  for (size_t i = 1; i < points.size(); ++i) {
    if (t <= points[i].first) {
      const auto& [t0, f0] = points[i - 1];
      const auto& [t1, f1] = points[i];
      return f0 + (f1 - f0) * (t - t0) / (t1 - t0);
    }
  }
  return points.back().second;
}

double rate_profile::peak() const {
  double m = points.empty() ? 1.0 : 0.0;
  for (const auto& [t, f] : points) m = std::max(m, f);
  return m;
}

scenario_error::scenario_error(std::vector<std::string> problems)
    : std::runtime_error(joined(problems)), problems_(std::move(problems)) {}

double length_dist::mean() const {
  switch (shape) {
    case kind::fixed: return min;
    case kind::uniform: return (min + max) / 2.0;
    case kind::lognormal: return std::clamp(median * std::exp(sigma * sigma / 2), double(min), double(max));
  }
  return min;
}

double scenario::drain_seconds() const {
  if (drain_s > 0) return drain_s;
  using secs = std::chrono::duration<double>;
  return secs(config.session.request_timeout).count() + secs(config.admission.max_queue_wait).count() + 60;
}

std::vector<admission_policy> parse_policies(const std::vector<std::string>& names) {
  std::vector<admission_policy> out;
  for (const std::string& n : names) {
    if (n == "fcfs") out.push_back(admission_policy::fcfs);
    else if (n == "priority") out.push_back(admission_policy::priority);
    else if (n == "tireless") out.push_back(admission_policy::tireless);
    else if (n == "least-slack") out.push_back(admission_policy::least_slack);
    else throw std::invalid_argument(fmt::format("\"{}\" is not a policy: use fcfs, priority, tireless or least-slack", n));
  }
  return out;
}

scenario_files scenario_files::from_disk() {
  scenario_files f;
  f.config = [](const std::filesystem::path& p) { return load_config(p); };
  f.text = [](const std::filesystem::path& p) -> std::optional<std::string> {
    std::ifstream in(p, std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream all;
    all << in.rdbuf();
    return all.str();
  };
  return f;
}

scenario load_scenario(const std::filesystem::path& file) {
  const scenario_files files = scenario_files::from_disk();
  const std::optional<std::string> text = files.text(file);
  if (!text) throw scenario_error({fmt::format("{}: cannot read the file", file.string())});
  return parse_scenario(*text, file, files);
}

scenario parse_scenario(std::string_view toml_text, const std::filesystem::path& file, const scenario_files& files) {
  scenario s;
  s.file = file;
  s.name = file.stem().string();
  toml::table doc;
  try {
    doc = toml::parse(toml_text, file.string());
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw scenario_error({fmt::format("{}:{}:{}: not valid TOML: {}", file.string(), b.line, b.column, e.description())});
  }
  reader r(file.string());
  r.only(doc, "", {"name", "description", "target", "run", "clients", "capacity", "arrivals", "mix", "faults"});
  s.name = r.string(doc, "name", "").value_or(s.name);
  s.description = r.string(doc, "description", "").value_or("");
  read_target(r, doc, s);
  if (!s.config_path.empty() && r.problems().empty()) {
    s.config = files.config(s.config_path);  // throws config_error naming its own keys
    if (s.target == target_kind::virtual_sim && s.config.backend.kind != backend_kind::sim) {
      r.error(doc.get("target"), "target.config",
              fmt::format("{} has backend.kind = \"{}\"; the virtual target runs the sim backend only",
                          s.config_path.string(), to_string(s.config.backend.kind)));
    }
  }
  if (const toml::table* t = doc["target"].as_table()) read_autoscale(r, *t, s);  // its tiers are the config's
  read_run(r, doc, s);
  read_clients(r, doc, s);
  read_capacity(r, doc, s);
  read_faults(r, doc, s);
  if (r.problems().empty()) read_arrivals(r, doc, s, files);
  if (!r.problems().empty()) throw scenario_error(r.problems());
  return s;
}

runtime_config run_config(const scenario& s, admission_policy policy, bool lift_quotas, bool faults) {
  runtime_config c = s.config;
  c.admission.policy = policy;
  if (faults) c.faults.expert_group.insert(c.faults.expert_group.end(), s.expert_group.begin(), s.expert_group.end());
  if (lift_quotas) {
    for (tenant_settings& t : c.tenants) {
      t.requests_per_minute = 0;
      t.tokens_per_minute = 0;
      t.max_concurrent = 0;
    }
  }
  return c;
}

}  // namespace tireless::load
