#pragma once
// Private to config/: reading each section of a parsed document into runtime_config, with
// the checks that span sections (tenants name tiers, the step-time target fits the tiers).

#include <toml++/toml.h>

#include <filesystem>

#include "config/runtime_config.hpp"
#include "config/toml_reader.hpp"

namespace tireless::config_detail {

// Every problem goes to diag; the result is meaningful only when diag has no errors.
// base_dir: what relative paths are relative to ("" = the working directory).
runtime_config read_document(const toml::table& document, const std::filesystem::path& base_dir,
                             diagnostics& diag);
// The [faults] table.
fault_settings read_faults(table_reader& r);

}  // namespace tireless::config_detail
