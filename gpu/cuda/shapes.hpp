#pragma once
// Constants the host-side plan (cuda_plan.hpp) and the kernels (attention.cu) must agree on.
// No CUDA here.

#include <cstdint>

namespace tireless::cuda {

// Query rows (token, head) of one attention work item: a tile of the rows of one sequence and
// one KV head, row = token * group + head within the group (the CPU's order). The attention
// kernel's 4 warps take 4 rows each.
inline constexpr int32_t attention_tile_rows = 16;

}  // namespace tireless::cuda
