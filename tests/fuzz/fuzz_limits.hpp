#pragma once
// The request limits the request-decoding fuzz targets decode with: small, so that inputs reach
// every limit.

#include <chrono>

#include "server/decode_limits.hpp"

namespace tireless {

inline decode_limits fuzz_limits() {
  decode_limits l;
  l.model_name = "smollm2";
  l.default_timeout = std::chrono::milliseconds(300'000);
  l.stream_window = 64;
  l.max_stop_sequences = 4;
  l.max_stop_bytes = 16;
  l.max_prompt_bytes = 512;
  l.max_prompt_tokens = 64;
  return l;
}

}  // namespace tireless
