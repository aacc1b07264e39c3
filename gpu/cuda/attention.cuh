#pragma once
// Paged attention over the fp16 KV pool and the KV writes (gpu/cuda/attention.cu).
//
// One block of 4 warps per (attention work item, split): an item is a tile of 16 query rows
// (token, head) of one sequence and one KV head (GQA: the group's query heads share the KV
// head's keys); warp w takes rows w, w + 4, w + 8, w + 12 (a decode token's group of 4 heads:
// one row each; a warp with no live row only helps load). Keys come 32 at a time (lane l: key
// l), K and V of the next 32 copied into shared memory (cp.async) while the current 32 are
// used; online softmax per row; each lane accumulates head_dim / 32 of the row's output. A row
// sees the positions up to its own (the causal mask of a prefill chunk; all earlier positions
// for a decode token). A launch has `splits` blocks per item; an item uses
// attention_item_splits(splits, its positions) of them (shapes.hpp: two key tiles a split at
// least), the rest return at once. With u > 1 splits used, split s takes key tiles s, s + u,
// ...: its unnormalized output, max and sum go to a scratch buffer that a second kernel
// combines; with one, it writes the output and the combine skips the item.
#include <cstdint>

#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/shapes.hpp"

namespace tireless::cuda::detail {

inline constexpr int attention_threads = 128, attention_keys = attention_tile_keys;

}  // namespace tireless::cuda::detail
