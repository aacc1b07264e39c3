#pragma once
// The limits the configuration leaves to the model ("0 = the model's"), settled once the
// model (or the sim profile) is open, with the checks that need it.

#include <chrono>
#include <cstdint>

#include "config/runtime_config.hpp"

namespace tireless {

// What the model and its backend tell the configuration.
struct model_facts {
  int32_t context_length = 0;  // the model's trained context, tokens
  int64_t kv_bytes_per_token =
      0;  // K and V of one token over all layers, as the backend stores them
  // The backend sizes its KV pool from its device's free memory when asked for 0 blocks (CUDA).
  bool backend_sizes_kv = false;
};

struct resolved_limits {
  int32_t max_context = 0;          // tokens per sequence
  int32_t max_prompt_tokens = 0;    // longest prompt admitted (< max_context)
  // Blocks of kv.block_size tokens in the pool; 0: the backend's to choose (backend_sizes_kv,
  // and the config sets neither kv.blocks nor kv.memory_mb).
  int32_t kv_blocks = 0;
  int32_t kv_watermark_blocks = 0;  // watermark_blocks(kv.watermark, kv_blocks)
  std::chrono::milliseconds step_time_target{0};
};

// Throws config_error naming the key when the configuration asks for more than the model
// allows: backend.max_context beyond the model's context, a prompt limit or default answer
// that does not fit the context, a KV pool that cannot hold one max_context sequence (one the
// backend sizes is its own to check). Both facts must be positive (a bug otherwise).
resolved_limits resolve_limits(const runtime_config& config, const model_facts& model);

// floor(watermark × blocks): the blocks kept free of a pool of `blocks`.
int32_t watermark_blocks(double watermark, int32_t blocks);

}  // namespace tireless
