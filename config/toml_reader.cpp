#include "config/toml_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace tireless::config_detail {

namespace {

std::string location(const std::string& source, const toml::source_region& where) {
  if (where.begin.line == 0) return source;
  return fmt::format("{}:{}:{}", source, where.begin.line, where.begin.column);
}

std::string normalized(std::string_view s) {
  std::string out;
  for (char c : s)
    out += c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Optimal string alignment distance (Levenshtein plus adjacent transpositions).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string joined(std::span<const std::string> items, std::string_view quote = "") {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{}{}{}", quote, item, quote);
  }
  return out;
}

std::string shown(const toml::node& node) {
  if (const auto* s = node.as_string())
    return fmt::format("{} \"{}\"", describe(node.type()), s->get());
  if (const auto* i = node.as_integer())
    return fmt::format("{} {}", describe(node.type()), i->get());
  if (const auto* f = node.as_floating_point())
    return fmt::format("{} {}", describe(node.type()), f->get());
  if (const auto* b = node.as_boolean())
    return fmt::format("{} {}", describe(node.type()), b->get());
  return std::string(describe(node.type()));
}

std::string range_text(int_range r) {
  std::string text = r.max == std::numeric_limits<int64_t>::max()
                         ? fmt::format("at least {}", r.min)
                         : fmt::format("{} to {}", r.min, r.max);
  return r.unit.empty() ? text : fmt::format("{} ({})", text, r.unit);
}

std::string range_text(real_range r) {
  return fmt::format("{}{}, {}{}", r.min_open ? "(" : "[", r.min, r.max, r.max_open ? ")" : "]");
}

bool in_range(double v, real_range r) {
  if (!std::isfinite(v)) return false;
  if (r.min_open ? v <= r.min : v < r.min) return false;
  if (r.max_open ? v >= r.max : v > r.max) return false;
  return true;
}

}  // namespace

std::string_view describe(toml::node_type type) {
  switch (type) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

diagnostics::diagnostics(std::string source) : source_(std::move(source)) {}

void diagnostics::error(const toml::source_region& where, std::string_view path,
                        std::string_view what) {
  add(where, path.empty() ? fmt::format("{}: {}", location(source_, where), what)
                          : fmt::format("{}: {}: {}", location(source_, where), path, what));
}

void diagnostics::add(const toml::source_region& where, std::string text) {
  errors_.push_back({where.begin, std::move(text)});
}

std::vector<std::string> diagnostics::errors() const {
  std::vector<problem> sorted = errors_;
  std::stable_sort(sorted.begin(), sorted.end(), [](const problem& a, const problem& b) {
    return std::pair(a.where.line, a.where.column) < std::pair(b.where.line, b.where.column);
  });
  std::vector<std::string> out;
  for (auto& p : sorted) out.push_back(std::move(p.text));
  return out;
}

void diagnostics::warn(std::string_view path, std::string_view what) {
  warnings_.push_back(fmt::format("{}: {}: {}", source_, path, what));
}

void diagnostics::unknown_key(const toml::source_region& where, std::string path, std::string key,
                              std::vector<std::string> siblings) {
  unknown_.push_back({where, std::move(path), std::move(key), std::move(siblings)});
}

void diagnostics::section_keys(std::string section, std::vector<std::string> keys) {
  sections_.emplace_back(std::move(section), std::move(keys));
}

void diagnostics::finish() {
  for (const auto& u : unknown_) {
    std::string message = fmt::format("{}: unknown key '{}'", location(source_, u.where), u.path);
    if (auto near = closest_key(u.key, u.siblings); !near.empty()) {
      add(u.where, fmt::format("{} — did you mean '{}'?", message, near));
      continue;
    }
    // Written into the wrong [section]? Only plain top-level sections are searched.
    std::string home;
    for (const auto& [section, keys] : sections_) {
      if (section.empty() || section.find_first_of("[.") != std::string::npos) continue;
      if (u.path.starts_with(section + ".")) continue;
      if (std::find(keys.begin(), keys.end(), u.key) != keys.end()) home = section;
    }
    if (!home.empty()) {
      add(u.where, fmt::format("{} — '{}' belongs in [{}]", message, u.key, home));
    } else {
      add(u.where, fmt::format("{}; known keys here: {}", message, joined(u.siblings)));
    }
  }
  unknown_.clear();
}

std::string closest_key(std::string_view key, std::span<const std::string> candidates) {
  const std::string k = normalized(key);
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const auto& candidate : candidates) {
    const std::string c = normalized(candidate);
    size_t d = edit_distance(k, c);
    // A prefix of a known key ("ttft" for "ttft_ms") is a plausible slip whatever its length.
    if (k.size() >= 3 && (c.starts_with(k) || k.starts_with(c))) d = std::min<size_t>(d, 1);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  const size_t allowed = std::max<size_t>(2, std::max(k.size(), best.size()) / 3);
  return best_distance <= allowed && best_distance < k.size() ? best : std::string();
}

table_reader::table_reader(const toml::table& table, std::string path, diagnostics& diag)
    : table_(table), path_(std::move(path)), diag_(diag) {}

std::string table_reader::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

bool table_reader::has(std::string_view key) {
  known_.emplace_back(key);
  return table_.contains(key);
}

toml::source_region table_reader::where(std::string_view key) const {
  if (const toml::node* node = table_.get(key)) return node->source();
  return table_.source();
}

const toml::node* table_reader::find(std::string_view key, need n, std::string_view expected) {
  known_.emplace_back(key);
  const toml::node* node = table_.get(key);
  if (!node && n == need::required)
    diag_.error(table_.source(), key_path(key), fmt::format("missing; required: {}", expected));
  return node;
}

void table_reader::wrong_type(std::string_view key, const toml::node& node,
                              std::string_view expected) {
  diag_.error(node.source(), key_path(key),
              fmt::format("expected {}, got {}", expected, shown(node)));
}

void table_reader::bad_choice(std::string_view key, std::string_view name,
                              std::span<const std::string> names) {
  diag_.error(
      where(key), key_path(key),
      fmt::format("\"{}\" is not one of the allowed values: {}", name, joined(names, "\"")));
}

bool table_reader::read(std::string_view key, int64_t& out, int_range range, need n) {
  const std::string expected = fmt::format("an integer, {}", range_text(range));
  const toml::node* node = find(key, n, expected);
  if (!node) return false;
  const auto* value = node->as_integer();
  if (!value) {
    wrong_type(key, *node, expected);
    return false;
  }
  if (value->get() < range.min || value->get() > range.max) {
    diag_.error(node->source(), key_path(key),
                fmt::format("{} is out of range; allowed {}", value->get(), range_text(range)));
    return false;
  }
  out = value->get();
  return true;
}

bool table_reader::read(std::string_view key, int32_t& out, int_range range, need n) {
  range.min = std::max<int64_t>(range.min, std::numeric_limits<int32_t>::min());
  range.max = std::min<int64_t>(range.max, std::numeric_limits<int32_t>::max());
  int64_t wide = out;
  if (!read(key, wide, range, n)) return false;
  out = static_cast<int32_t>(wide);
  return true;
}

bool table_reader::read(std::string_view key, std::chrono::milliseconds& out, int_range range,
                        need n) {
  int64_t ms = out.count();
  if (!read(key, ms, range, n)) return false;
  out = std::chrono::milliseconds(ms);
  return true;
}

bool table_reader::read(std::string_view key, double& out, real_range range, need n) {
  const std::string expected = fmt::format("a number in {}", range_text(range));
  const toml::node* node = find(key, n, expected);
  if (!node) return false;
  if (!node->is_number()) {
    wrong_type(key, *node, expected);
    return false;
  }
  const double value = *node->value<double>();
  if (!in_range(value, range)) {
    diag_.error(node->source(), key_path(key),
                fmt::format("{} is out of range; allowed {}", value, range_text(range)));
    return false;
  }
  out = value;
  return true;
}

bool table_reader::read(std::string_view key, bool& out, need n) {
  const toml::node* node = find(key, n, "true or false");
  if (!node) return false;
  const auto* value = node->as_boolean();
  if (!value) {
    wrong_type(key, *node, "true or false");
    return false;
  }
  out = value->get();
  return true;
}

bool table_reader::read(std::string_view key, std::string& out, need n) {
  const toml::node* node = find(key, n, "a string");
  if (!node) return false;
  const auto* value = node->as_string();
  if (!value) {
    wrong_type(key, *node, "a string");
    return false;
  }
  out = value->get();
  return true;
}

bool table_reader::read(std::string_view key, std::vector<std::string>& out, bool allow_empty_list,
                        need n) {
  const std::string_view expected =
      allow_empty_list ? "a list of strings" : "a non-empty list of strings";
  const toml::node* node = find(key, n, expected);
  if (!node) return false;
  const auto* array = node->as_array();
  if (!array) {
    wrong_type(key, *node, expected);
    return false;
  }
  if (array->empty() && !allow_empty_list) {
    diag_.error(node->source(), key_path(key), fmt::format("is empty; expected {}", expected));
    return false;
  }
  std::vector<std::string> values;
  bool ok = true;
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& item = *array->get(i);
    const std::string item_path = fmt::format("{}[{}]", key_path(key), i);
    if (const auto* s = item.as_string(); !s) {
      diag_.error(item.source(), item_path, fmt::format("expected a string, got {}", shown(item)));
      ok = false;
    } else if (s->get().empty()) {
      diag_.error(item.source(), item_path, "is empty; expected a non-empty string");
      ok = false;
    } else {
      values.push_back(s->get());
    }
  }
  if (ok) out = std::move(values);
  return ok;
}

bool table_reader::read(std::string_view key, std::vector<int32_t>& out, int_range range, bool allow_empty_list,
                        need n) {
  const std::string expected = fmt::format("a {}list of distinct integers in {}..{} ({})",
                                           allow_empty_list ? "" : "non-empty ", range.min, range.max, range.unit);
  const toml::node* node = find(key, n, expected);
  if (!node) return false;
  const auto* array = node->as_array();
  if (!array || (array->empty() && !allow_empty_list)) {
    wrong_type(key, *node, expected);
    return false;
  }
  std::vector<int32_t> values;
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& item = *array->get(i);
    const std::string item_path = fmt::format("{}[{}]", key_path(key), i);
    const auto* v = item.as_integer();
    if (!v) {
      diag_.error(item.source(), item_path, fmt::format("expected an integer, got {}", shown(item)));
      return false;
    }
    if (v->get() < range.min || v->get() > range.max) {
      diag_.error(item.source(), item_path,
                  fmt::format("{} is out of range; allowed {}..{} ({})", v->get(), range.min, range.max, range.unit));
      return false;
    }
    if (std::find(values.begin(), values.end(), v->get()) != values.end()) {
      diag_.error(item.source(), item_path, fmt::format("{} is listed twice; each may appear once", v->get()));
      return false;
    }
    values.push_back(static_cast<int32_t>(v->get()));
  }
  out = std::move(values);
  return true;
}

bool table_reader::read(std::string_view key, std::vector<double>& out, real_range range, need n) {
  const std::string expected =
      fmt::format("a non-empty, strictly increasing list of numbers in {}", range_text(range));
  const toml::node* node = find(key, n, expected);
  if (!node) return false;
  const auto* array = node->as_array();
  if (!array || array->empty()) {
    wrong_type(key, *node, expected);
    return false;
  }
  std::vector<double> values;
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& item = *array->get(i);
    const std::string item_path = fmt::format("{}[{}]", key_path(key), i);
    if (!item.is_number()) {
      diag_.error(item.source(), item_path, fmt::format("expected a number, got {}", shown(item)));
      return false;
    }
    const double v = *item.value<double>();
    if (!in_range(v, range)) {
      diag_.error(item.source(), item_path,
                  fmt::format("{} is out of range; allowed {}", v, range_text(range)));
      return false;
    }
    if (!values.empty() && v <= values.back()) {
      diag_.error(item.source(), item_path,
                  fmt::format("{} does not exceed the value before it ({}); the list must be "
                              "strictly increasing",
                              v, values.back()));
      return false;
    }
    values.push_back(v);
  }
  out = std::move(values);
  return true;
}

const toml::table* table_reader::sub_table(std::string_view key, need n) {
  const toml::node* node = find(key, n, "a table");
  if (!node) return nullptr;
  if (!node->is_table()) {
    wrong_type(key, *node, "a table");
    return nullptr;
  }
  return node->as_table();
}

std::vector<const toml::table*> table_reader::tables(std::string_view key, need n) {
  constexpr std::string_view expected = "an array of tables";
  std::vector<const toml::table*> out;
  const toml::node* node = find(key, n, expected);
  if (!node) return out;
  const auto* array = node->as_array();
  if (!array) {
    wrong_type(key, *node, expected);
    return out;
  }
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& item = *array->get(i);
    out.push_back(item.as_table());
    if (!out.back()) {
      diag_.error(item.source(), fmt::format("{}[{}]", key_path(key), i),
                  fmt::format("expected a table, got {}", shown(item)));
    }
  }
  return out;
}

void table_reader::finish() {
  std::sort(known_.begin(), known_.end());
  known_.erase(std::unique(known_.begin(), known_.end()), known_.end());
  for (const auto& [key, node] : table_) {
    if (!std::binary_search(known_.begin(), known_.end(), key.str()))
      diag_.unknown_key(key.source(), key_path(key.str()), std::string(key.str()), known_);
  }
  diag_.section_keys(path_, known_);
}

}  // namespace tireless::config_detail
