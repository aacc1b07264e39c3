// libFuzzer target: any text either reads as a tireless configuration or is refused with a
// config_error that names what is wrong; a configuration that reads is consistent (every tenant
// in a known tier, tiers by strictly falling priority, keys unique). Nothing else may escape.

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "config/runtime_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const tireless::runtime_config c = tireless::parse_config(text, "fuzz.toml");
    if (c.tiers.empty()) __builtin_trap();
    for (size_t i = 1; i < c.tiers.size(); ++i) {
      if (c.tiers[i].priority >= c.tiers[i - 1].priority) __builtin_trap();
    }
    std::set<std::string> keys;
    for (const tireless::tenant_settings& t : c.tenants) {
      if (c.find_tier(t.tier) == nullptr) __builtin_trap();
      for (const std::string& k : t.keys) {
        if (!keys.insert(k).second) __builtin_trap();
      }
    }
    if (c.step_time_target().count() <= 0) __builtin_trap();
  } catch (const tireless::config_error& e) {
    if (std::string_view(e.what()).empty()) __builtin_trap();
  }
  return 0;
}
