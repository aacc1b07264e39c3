#pragma once
// Paged attention over the fp16 KV pool and the KV writes (gpu/cuda/attention.cu).
//
// One block of 4 warps per (attention work item, split): an item is a tile of 16 query rows
// (token, head) of one sequence and one KV head (GQA: the group's query heads share the KV
// head's keys); warp w takes rows 4w .. 4w + 3. Keys come 32 at a time (lane l: key l), K and V
// of the next 32 copied into shared memory (cp.async) while the current 32 are used; online
// softmax per row; each lane accumulates head_dim / 32 of the row's output. A row sees the
// positions up to its own (the causal mask of a prefill chunk; all earlier positions for a
// decode token). With splits > 1, split s takes key tiles s, s + splits, ...: its unnormalized
// output, max and sum go to a scratch buffer that a second kernel combines.
#include <cstdint>

#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/shapes.hpp"

namespace tireless::cuda::detail {

inline constexpr int attention_threads = 128, attention_keys = attention_tile_keys;

}  // namespace tireless::cuda::detail
