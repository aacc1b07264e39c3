#pragma once
// The kernels one instruction set provides. Each set lives in its own translation unit,
// compiled for that instruction set; isa.cpp picks the best the CPU runs.

#include <cstdint>
#include <string_view>

#include "gpu/cpu/packed_matrix.hpp"

namespace tireless::cpu {

enum class isa { generic, avx2, avx512 };
std::string_view name(isa i);

// Activations quantized to 8 bits in blocks of 32, one row per token:
//   q    [n][blocks * 32] int8, zero-padded
//   d    [n][blocks] block scales (max|x| / 127)
//   s    [n][blocks] d times the block's sum of q
//   qsum [n][blocks] the block's sum of q
struct q8_view {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const float* s = nullptr;
  const int32_t* qsum = nullptr;
  int64_t blocks = 0;
};

// Attention of one sequence's new tokens over its cached keys and values, for one KV head
// and the query heads that share it.
struct attention_args {
  const float* q;        // [n_new][q_stride], head h at q + h * head_dim
  int64_t q_stride;
  float* out;            // [n_new][out_stride], same head layout as q
  int64_t out_stride;
  int n_new;             // tokens of this step, at positions start_pos .. start_pos + n_new - 1
  int start_pos;
  int first_head;        // query heads first_head .. first_head + heads - 1
  int heads;
  int head_dim;
  int block_size;        // tokens per KV block
  const int32_t* block_table;  // physical block of each logical block
  const uint16_t* k_base;      // fp16 keys of this layer and KV head: block b at
                               // k_base + b * block_stride, [head_dim][block_size]
  const uint16_t* v_base;      // fp16 values, same blocks, [block_size][head_dim]
  int64_t block_stride;        // elements between consecutive physical blocks
  float scale;                 // 1 / sqrt(head_dim)
};

struct isa_kernels {
  isa id;
  void (*quantize_rows)(const float* x, int64_t n, int64_t cols, int64_t ldx, int8_t* q, float* d,
                        float* s, int32_t* qsum, int64_t blocks);
  // y[t * ldy + r] = row r of w · row t of x (or += with accumulate), for rows of groups
  // [g0, g1), t < n.
  void (*matmul_q)(const packed_matrix& w, const q8_view& x, int64_t n, int64_t g0, int64_t g1,
                   float* y, int64_t ldy, bool accumulate);
  void (*matmul_f)(const packed_matrix& w, const float* x, int64_t ldx, int64_t n, int64_t g0,
                   int64_t g1, float* y, int64_t ldy, bool accumulate);
  void (*attention)(const attention_args& a);
  // out = x / sqrt(mean(x²) + eps) * w, for n values.
  void (*rms_norm)(const float* x, const float* w, float* out, int64_t n, float eps);
  // out = silu(g) * u, for n values.
  void (*silu_mul)(const float* g, const float* u, float* out, int64_t n);
  void (*floats_to_halves)(const float* src, uint16_t* dst, int64_t n);
};

const isa_kernels& generic_kernels();
const isa_kernels& avx2_kernels();    // only call where the CPU has AVX2, FMA and F16C
const isa_kernels& avx512_kernels();  // only call where the CPU has AVX-512 F/BW/VL/VNNI

// The best set this CPU runs, or the one named by TIRELESS_CPU_ISA (generic, avx2, avx512).
const isa_kernels& best_kernels();
bool cpu_supports(isa i);
const isa_kernels& kernels_for(isa i);  // requires cpu_supports(i)

}  // namespace tireless::cpu
