#pragma once
// Shapes the host side (cuda_plan.hpp, the launchers) and the kernels (attention.cu, matvec.cu)
// must agree on, as constants and constexpr functions: no CUDA here (C++17, so that nvcc and
// the host tests read the same lines).

#include <algorithm>
#include <cstdint>

namespace tireless::cuda {

// Query rows (token, head) of one attention work item: a tile of the rows of one sequence and
// one KV head, row = token * group + head within the group (the CPU's order). The attention
// kernel's 4 warps take the rows in turn: warp w rows w, w + 4, w + 8, w + 12 (a decode token
// of a GQA group of 4 gives each warp a row).
inline constexpr int32_t attention_tile_rows = 16;
inline constexpr int32_t attention_tile_keys = 32;

// The key splits an item of `positions` positions uses out of the `splits` its launch has: at
// least two key tiles a split. Decided per item on the device (from the context the step
// brings), so a graph launched with the splits of the longest context runs one split, and no
// combine, for a short one.
constexpr int32_t attention_item_splits(int32_t splits, int32_t positions) {
  const int32_t tiles = (std::max(positions, 1) + attention_tile_keys - 1) / attention_tile_keys;
  return std::max(1, std::min(splits, (tiles + 1) / 2));
}

// The decode matvec (matvec.cu) for nt tokens (1, 2, 4 or 8 a kernel): a warp takes
// matvec_warp_rows(nt) rows; activations are staged in shared memory matvec_chunk(nt) blocks
// of 32 values (quantized weights; float weights: chunks of 8 values) of every token at a
// time, each block padded to matvec_q_stride bytes (8-value chunks: matvec_f_stride floats).
inline constexpr int32_t matvec_q_stride = 48, matvec_f_stride = 12;
constexpr int32_t matvec_warp_rows(int32_t nt) { return nt <= 2 ? 2 : 4; }
constexpr int32_t matvec_chunk(int32_t nt) { return 512 / nt; }
constexpr int32_t matvec_kernel_tokens(int64_t n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8; }

struct matvec_launch {
  int32_t nt = 1;          // tokens a block takes (a kernel instance)
  int32_t warps = 8;       // a block's
  int64_t blocks_x = 0;    // over the rows
  int64_t blocks_y = 1;    // dense: 1; grouped: tiles of up to nt pairs of one group (room for the worst spread)
  int64_t shared = 0;      // bytes of dynamic shared memory a block stages
};

// The launch of a product of a rows x cols matrix with n tokens (grouped: n pairs over
// `groups` groups of `rows` rows each; 0 groups: dense), on a device of `multiprocessors`.
// Shared memory stays below ~28 KiB whatever nt, so that shared memory never limits a
// multiprocessor to one block; warps shrink from 8 (to 2) only to give every multiprocessor
// two blocks.
constexpr matvec_launch plan_matvec(bool quantized, int64_t rows, int64_t cols, int64_t n, int32_t groups,
                                    int32_t multiprocessors) {
  matvec_launch l;
  const bool grouped = groups > 0;
  // Grouped: nt from the pairs a group has on average (their spread is known on the device only).
  l.nt = matvec_kernel_tokens(grouped ? (n + groups - 1) / groups : n);
  const int64_t chunk = matvec_chunk(l.nt);
  l.shared = quantized ? int64_t{l.nt} * std::min(chunk, cols / 32) * (matvec_q_stride + 8)
                       : int64_t{l.nt} * std::min(chunk, cols / 8) * matvec_f_stride * 4;
  const int64_t warp_tiles = (rows + matvec_warp_rows(l.nt) - 1) / matvec_warp_rows(l.nt);
  while (l.warps > 2 && warp_tiles / l.warps < 2 * int64_t{multiprocessors}) l.warps /= 2;
  l.blocks_x = (warp_tiles + l.warps - 1) / l.warps;
  l.blocks_y = !grouped ? 1 : l.nt == 1 ? n : (n + l.nt - 1) / l.nt + groups;
  return l;
}

}  // namespace tireless::cuda
