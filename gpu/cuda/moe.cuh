#pragma once
// Mixture-of-experts on the device (gpu/cuda/moe.cu): the router's top-k and gates (one warp a
// row, the CPU's rule and roundings), the step's slots grouped by expert (one block: counts,
// CUB's block scan for the offsets, a scatter), the weighted sum of the experts' outputs added
// to the residual stream, and a row gather.
#include <cstdint>

namespace tireless::cuda::detail {

inline constexpr int moe_max_experts = 1024;  // moe_group scans one count per thread
inline constexpr int moe_max_used = 16;       // chosen experts a row, held in registers

}  // namespace tireless::cuda::detail
