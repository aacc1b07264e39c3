#pragma once
// Private to config/: typed, range-checked reads from a toml++ table that collect problems
// instead of stopping at the first, and report every key nobody asked for as unknown, with
// the closest known key as a suggestion. Nothing outside config/ includes this header.

#include <toml++/toml.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tireless::config_detail {

// Where a value was found, and the problems and warnings found so far in one document.
class diagnostics {
 public:
  explicit diagnostics(std::string source);

  // "source:line:column: path: what"
  void error(const toml::source_region& where, std::string_view path, std::string_view what);
  void warn(std::string_view path, std::string_view what);

  // A key nobody read. Held back until finish(), so that a key written into the wrong section
  // can be pointed to the section that has it.
  void unknown_key(const toml::source_region& where, std::string path, std::string key,
                   std::vector<std::string> siblings);
  // The keys a section knows, for those cross-section suggestions.
  void section_keys(std::string section, std::vector<std::string> keys);
  // Turns the held-back unknown keys into errors.
  void finish();

  const std::string& source() const { return source_; }
  // In the order of the file (problems without a place first).
  std::vector<std::string> errors() const;
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  struct unknown {
    toml::source_region where;
    std::string path;
    std::string key;
    std::vector<std::string> siblings;
  };
  struct problem {
    toml::source_position where;
    std::string text;
  };
  void add(const toml::source_region& where, std::string text);

  std::string source_;
  std::vector<problem> errors_;
  std::vector<std::string> warnings_;
  std::vector<unknown> unknown_;
  std::vector<std::pair<std::string, std::vector<std::string>>> sections_;
};

// The closest of `candidates` to `key` (edit distance, ignoring case and '-' vs '_'), or ""
// when none is close enough to be a plausible typo.
std::string closest_key(std::string_view key, std::span<const std::string> candidates);

enum class need { optional, required };

// Inclusive bounds, and the unit a person should read them in ("milliseconds", "tokens").
struct int_range {
  int64_t min;
  int64_t max;
  std::string_view unit;
};

struct real_range {
  double min;
  double max;
  bool max_open = false;  // [min, max) instead of [min, max]
  bool min_open = false;  // (min, ...
};

template <class E>
struct choice {
  std::string_view name;
  E value;
};

// Every read_* returns true when the key is present with a valid value, which it stores in
// `out`; when the key is absent `out` keeps its default (a problem if `need` is required);
// when the value is wrong `out` keeps its default and the problem is recorded.
class table_reader {
 public:
  // path: the key path of the table ("server", "tiers[1]"); "" for the document root.
  table_reader(const toml::table& table, std::string path, diagnostics& diag);

  std::string key_path(std::string_view key) const;
  const toml::table& table() const { return table_; }
  const std::string& path() const { return path_; }
  diagnostics& diag() { return diag_; }
  // Records a key as known without reading it. true when the table has it.
  bool has(std::string_view key);
  // Where to point a problem with `key`: its value, else the table.
  toml::source_region where(std::string_view key) const;

  bool read(std::string_view key, int32_t& out, int_range range, need n = need::optional);
  bool read(std::string_view key, int64_t& out, int_range range, need n = need::optional);
  bool read(std::string_view key, std::chrono::milliseconds& out, int_range range,
            need n = need::optional);
  bool read(std::string_view key, double& out, real_range range, need n = need::optional);
  bool read(std::string_view key, bool& out, need n = need::optional);
  bool read(std::string_view key, std::string& out, need n = need::optional);
  // A list of non-empty strings; `allow_empty_list` false makes [] a problem.
  bool read(std::string_view key, std::vector<std::string>& out, bool allow_empty_list,
            need n = need::optional);
  // A list of distinct integers within range (device ids); `allow_empty_list` false makes []
  // a problem.
  bool read(std::string_view key, std::vector<int32_t>& out, int_range range, bool allow_empty_list,
            need n = need::optional);
  // A strictly increasing list of numbers within range.
  bool read(std::string_view key, std::vector<double>& out, real_range range,
            need n = need::optional);

  template <class E>
  bool read_choice(std::string_view key, E& out, std::span<const choice<E>> choices,
                   need n = need::optional) {
    std::string name;
    if (!read(key, name, n)) return false;
    for (const auto& c : choices) {
      if (c.name == name) {
        out = c.value;
        return true;
      }
    }
    std::vector<std::string> names;
    for (const auto& c : choices) names.emplace_back(c.name);
    bad_choice(key, name, names);
    return false;
  }

  // A sub-table (a [section] or an inline table); nullptr when absent or not a table.
  const toml::table* sub_table(std::string_view key, need n = need::optional);
  // An array of tables ([[tiers]] or tiers = [{...}, ...]), one pointer per entry, nullptr
  // (and a problem recorded) for an entry that is not a table.
  std::vector<const toml::table*> tables(std::string_view key, need n = need::optional);

  // Reports every key of the table that no read_*, has, sub_table or tables asked for.
  void finish();

 private:
  const toml::node* find(std::string_view key, need n, std::string_view expected);
  void wrong_type(std::string_view key, const toml::node& node, std::string_view expected);
  void bad_choice(std::string_view key, std::string_view name, std::span<const std::string> names);

  const toml::table& table_;
  std::string path_;
  diagnostics& diag_;
  std::vector<std::string> known_;
};

// "integer", "string", ... with an article, for messages.
std::string_view describe(toml::node_type type);

}  // namespace tireless::config_detail
