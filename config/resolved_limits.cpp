#include "config/resolved_limits.hpp"

#include <fmt/format.h>

#include <cassert>
#include <cmath>
#include <string>
#include <vector>

namespace tireless {

resolved_limits resolve_limits(const runtime_config& config, const model_facts& model) {
  assert(model.context_length > 0 && model.kv_bytes_per_token > 0);
  std::vector<std::string> problems;
  auto problem = [&](std::string_view key, std::string what) {
    problems.push_back(fmt::format("{}: {}: {}", config.source, key, what));
  };
  resolved_limits out;
  out.step_time_target = config.step_time_target();

  out.max_context = model.context_length;
  if (config.backend.max_context > model.context_length) {
    problem("backend.max_context",
            fmt::format("{} exceeds the model's context length ({}); allowed 0 (the model's) to {}",
                        config.backend.max_context, model.context_length, model.context_length));
  } else if (config.backend.max_context > 0) {
    out.max_context = config.backend.max_context;
  }

  out.max_prompt_tokens = out.max_context - 1;
  if (config.admission.max_prompt_tokens >= out.max_context) {
    problem("admission.max_prompt_tokens",
            fmt::format("{} leaves no room to generate in a {}-token context; allowed 0 "
                        "(= context - 1) to {}",
                        config.admission.max_prompt_tokens, out.max_context, out.max_context - 1));
  } else if (config.admission.max_prompt_tokens > 0) {
    out.max_prompt_tokens = config.admission.max_prompt_tokens;
  }
  if (config.admission.default_max_tokens >= out.max_context) {
    problem("admission.default_max_tokens",
            fmt::format("{} does not fit a {}-token context; allowed 1 to {}",
                        config.admission.default_max_tokens, out.max_context, out.max_context - 1));
  }

  if (model.backend_sizes_kv && config.kv.blocks == 0 && !config.kv.memory_mb_given) {
    // The device's free memory sizes the pool; the backend refuses one that cannot hold a
    // max_context sequence.
    if (!problems.empty()) throw config_error(std::move(problems));
    return out;
  }
  const int64_t block_bytes = int64_t{config.kv.block_size} * model.kv_bytes_per_token;
  const int64_t blocks = config.kv.blocks > 0
                             ? config.kv.blocks
                             : config.kv.memory_mb * (int64_t{1} << 20) / block_bytes;
  out.kv_blocks = static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
  out.kv_watermark_blocks = watermark_blocks(config.kv.watermark, out.kv_blocks);
  const int64_t sequence_blocks =
      (out.max_context + config.kv.block_size - 1) / config.kv.block_size;
  if (out.kv_blocks - out.kv_watermark_blocks < sequence_blocks) {
    const auto needed = static_cast<int64_t>(
        std::ceil(static_cast<double>(sequence_blocks) / (1.0 - config.kv.watermark)));
    const int64_t needed_mb = (needed * block_bytes + (1 << 20) - 1) >> 20;
    const std::string detail = fmt::format(
        "{} blocks of {} tokens ({} bytes/token), too few for one {}-token sequence ({} blocks) "
        "plus the watermark ({} blocks)",
        out.kv_blocks, config.kv.block_size, model.kv_bytes_per_token, out.max_context,
        sequence_blocks, out.kv_watermark_blocks);
    if (config.kv.blocks > 0)
      problem("kv.blocks",
              fmt::format("{}; allowed at least {}, or lower backend.max_context", detail, needed));
    else
      problem("kv.memory_mb", fmt::format("{} MiB holds {}; allowed at least {} MiB, or lower "
                                          "backend.max_context",
                                          config.kv.memory_mb, detail, needed_mb));
  }
  if (!problems.empty()) throw config_error(std::move(problems));
  return out;
}

int32_t watermark_blocks(double watermark, int32_t blocks) {
  return static_cast<int32_t>(std::floor(watermark * blocks));
}

}  // namespace tireless
