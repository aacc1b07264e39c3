// libFuzzer target: the load driver's scenario reader and its trace reader. The input is a
// scenario's TOML, then (after a line "----") the CSV of the trace it may name; the target's
// configuration is config/sim-h200-k2.toml whatever path the scenario gives. Either it reads
// (a mix with shares summing to 1, or a trace sorted by arrival with every key a tenant's) or
// it is refused with scenario_error/config_error listing what is wrong; nothing else.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "examples/load_driver/scenario.hpp"

#ifndef TIRELESS_SOURCE_DIR
#define TIRELESS_SOURCE_DIR "."
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tireless;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.find("\n----\n");
  const std::string_view toml_text = input.substr(0, cut);
  const std::string trace = cut == std::string_view::npos ? std::string() : std::string(input.substr(cut + 6));
  static const runtime_config target = load_config(TIRELESS_SOURCE_DIR "/config/sim-h200-k2.toml");
  load::scenario_files files;
  files.config = [](const std::filesystem::path&) { return target; };
  files.text = [&](const std::filesystem::path&) -> std::optional<std::string> { return trace; };
  try {
    const load::scenario s = load::parse_scenario(toml_text, "fuzz/scenario.toml", files);
    if (s.arrivals == load::arrival_kind::trace) {
      if (s.trace.empty()) __builtin_trap();
      for (size_t i = 0; i < s.trace.size(); ++i) {
        if (s.trace[i].tier < 0 || s.trace[i].prompt_tokens < 1 || s.trace[i].output_tokens < 1) __builtin_trap();
        if (i > 0 && s.trace[i].arrival_s < s.trace[i - 1].arrival_s) __builtin_trap();
      }
    } else {
      double total = 0;
      for (const auto& c : s.mix) total += c.share;
      if (s.mix.empty() || std::abs(total - 1.0) > 1e-6) __builtin_trap();
    }
  } catch (const load::scenario_error& e) {
    if (e.problems().empty()) __builtin_trap();
  } catch (const config_error&) {
  }
  return 0;
}
