#include "gpu/cuda/device.cuh"
#include "gpu/cuda/mmq.cuh"
#include "gpu/cuda/quant.cuh"

#include <stdexcept>

namespace tireless::cuda::detail {

namespace {

constexpr int x_stride = mmq_stage_blocks * 32 + 16;  // bytes of a token's stage row (16 of padding)

template <tensor_type T>
constexpr int w_stride() {
  return mmq_stage_blocks * block_qs_bytes<T>() + 16;  // q4: 80 bytes, q8_0: 144
}

// With these strides the 8 rows x 4 words a fragment load touches fall in 32 distinct banks.

__device__ __forceinline__ void mma_s8(int (&d)[4], const int (&a)[4], const int (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
}

// The tile a block computes: weight rows [row0, row0 + 64) of rows [row_base, row_base +
// row_limit), tokens [tok0, tok0 + 64) of [.., tok_end).
struct tile {
  int64_t row0 = 0, row_base = 0, row_limit = 0;
  int64_t tok0 = 0, tok_end = 0;
};

__device__ __forceinline__ bool find_tile(const device_matrix& w, int32_t n, const int32_t* offsets, int32_t groups,
                                          int64_t rows_per_group, tile& t) {
  t.row0 = static_cast<int64_t>(blockIdx.x) * mmq_rows;
  if (!offsets) {
    t.row_limit = w.rows;
    t.tok0 = static_cast<int64_t>(blockIdx.y) * mmq_tokens;
    t.tok_end = n;
    return t.row0 < t.row_limit && t.tok0 < t.tok_end;
  }
  t.row_limit = rows_per_group;
  if (t.row0 >= t.row_limit) return false;
  int64_t left = blockIdx.y;
  for (int32_t g = 0; g < groups; ++g) {
    const int64_t first = offsets[g], count = offsets[g + 1] - first;
    const int64_t tiles = (count + mmq_tokens - 1) / mmq_tokens;
    if (left < tiles) {
      t.row_base = static_cast<int64_t>(g) * rows_per_group;
      t.tok0 = first + left * mmq_tokens;
      t.tok_end = first + count;
      return true;
    }
    left -= tiles;
  }
  return false;  // more blocks were launched than the groups have tiles
}

template <tensor_type T>
struct stage_buffers {
  alignas(16) uint8_t w[2][mmq_rows * w_stride<T>()];
  alignas(16) uint8_t x[2][mmq_tokens * x_stride];
  float wd[2][mmq_rows][mmq_stage_blocks];
  float wm[2][mmq_rows][mmq_stage_blocks];
  float xd[2][mmq_tokens][mmq_stage_blocks];
  float xs[2][mmq_tokens][mmq_stage_blocks];
};

// Each thread's share of a stage's scales: 64 rows x 4 blocks of d (and m), 64 tokens x 4 of
// d_x and s_x: 2 of each.
struct scale_regs {
  float wd[2], wm[2], xd[2], xs[2];
};

template <tensor_type T>
__device__ __forceinline__ void load_quants(stage_buffers<T>& sb, int buf, const device_matrix& w, const q8_rows& x,
                                            const tile& t, int64_t nb, int64_t stage) {
  constexpr int qb = block_qs_bytes<T>(), parts = qb / 16;
  // Weights: 64 rows x 4 blocks x parts chunks of 16 bytes.
  for (int i = threadIdx.x; i < mmq_rows * mmq_stage_blocks * parts; i += mmq_threads) {
    const int r = i / (mmq_stage_blocks * parts), kb = (i / parts) % mmq_stage_blocks, part = i % parts;
    const int64_t b = stage * mmq_stage_blocks + kb;
    const bool valid = t.row0 + r < t.row_limit && b < nb;
    const auto* src = valid ? static_cast<const uint8_t*>(w.qs) + (t.row_base + t.row0 + r) * w.qs_row_bytes + b * qb + part * 16
                            : static_cast<const uint8_t*>(w.qs);
    cp_async16(&sb.w[buf][r * w_stride<T>() + kb * qb + part * 16], src, valid);
  }
  // Activations: 64 tokens x 4 blocks x 2 chunks.
  for (int i = threadIdx.x; i < mmq_tokens * mmq_stage_blocks * 2; i += mmq_threads) {
    const int tk = i / (mmq_stage_blocks * 2), kb = (i / 2) % mmq_stage_blocks, part = i % 2;
    const int64_t b = stage * mmq_stage_blocks + kb;
    const bool valid = t.tok0 + tk < t.tok_end && b < nb;
    const int8_t* src = valid ? x.q + ((t.tok0 + tk) * nb + b) * 32 + part * 16 : x.q;
    cp_async16(&sb.x[buf][tk * x_stride + kb * 32 + part * 16], src, valid);
  }
}

template <tensor_type T>
__device__ __forceinline__ scale_regs load_scales(const device_matrix& w, const q8_rows& x, const tile& t, int64_t nb,
                                                  int64_t stage) {
  scale_regs s;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int i = threadIdx.x + k * mmq_threads;  // 0 .. 255
    const int r = i / mmq_stage_blocks, kb = i % mmq_stage_blocks;
    const int64_t b = stage * mmq_stage_blocks + kb;
    const bool wv = t.row0 + r < t.row_limit && b < nb;
    const int64_t at = (t.row_base + t.row0 + r) * nb + b;
    s.wd[k] = wv ? scale_at(w.d, at) : 0.0f;
    s.wm[k] = wv && T == tensor_type::q4_1 ? scale_at(w.m, at) : 0.0f;
    const bool xv = t.tok0 + r < t.tok_end && b < nb;
    s.xd[k] = xv ? x.d[(t.tok0 + r) * nb + b] : 0.0f;
    s.xs[k] = xv ? x.s[(t.tok0 + r) * nb + b] : 0.0f;
  }
  return s;
}

template <tensor_type T>
__device__ __forceinline__ void store_scales(stage_buffers<T>& sb, int buf, const scale_regs& s) {
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int i = threadIdx.x + k * mmq_threads;
    const int r = i / mmq_stage_blocks, kb = i % mmq_stage_blocks;
    sb.wd[buf][r][kb] = s.wd[k];
    sb.wm[buf][r][kb] = s.wm[k];
    sb.xd[buf][r][kb] = s.xd[k];
    sb.xs[buf][r][kb] = s.xs[k];
  }
}

template <tensor_type T>
__global__ void __launch_bounds__(mmq_threads) mmq_kernel(device_matrix w, q8_rows x, int32_t n, float* y, int64_t ldy,
                                                          int accumulate, const int32_t* offsets, int32_t groups,
                                                          int64_t rows_per_group) {
  __shared__ stage_buffers<T> sb;
  tile t;
  if (!find_tile(w, n, offsets, groups, rows_per_group, t)) return;  // the whole block
  const int64_t nb = w.cols / 32;
  const int64_t stages = (nb + mmq_stage_blocks - 1) / mmq_stage_blocks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 2, wn = warp % 2;  // the warp's 32 rows and 32 tokens of the tile
  const int g = lane / 4, tq = lane % 4;    // mma fragment coordinates
  constexpr int qb = block_qs_bytes<T>(), ws = w_stride<T>();

  float acc[2][4][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
    }
  }

  load_quants<T>(sb, 0, w, x, t, nb, 0);
  cp_async_commit();
  store_scales<T>(sb, 0, load_scales<T>(w, x, t, nb, 0));
  for (int64_t stage = 0; stage < stages; ++stage) {
    const int buf = static_cast<int>(stage & 1);
    scale_regs next{};
    const bool more = stage + 1 < stages;
    if (more) {
      load_quants<T>(sb, buf ^ 1, w, x, t, nb, stage + 1);  // buf ^ 1 was last read before the barrier ending the previous stage
      cp_async_commit();
      next = load_scales<T>(w, x, t, nb, stage + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    for (int kb = 0; kb < mmq_stage_blocks; ++kb) {
      if (stage * mmq_stage_blocks + kb >= nb) break;  // the same for every thread
      int a[2][4], b[4][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint8_t* r_lo = &sb.w[buf][(wm * 32 + mt * 16 + g) * ws + kb * qb];
        const uint8_t* r_hi = r_lo + 8 * ws;
        if constexpr (T == tensor_type::q8_0) {
          a[mt][0] = *reinterpret_cast<const int*>(r_lo + tq * 4);
          a[mt][1] = *reinterpret_cast<const int*>(r_hi + tq * 4);
          a[mt][2] = *reinterpret_cast<const int*>(r_lo + 16 + tq * 4);
          a[mt][3] = *reinterpret_cast<const int*>(r_hi + 16 + tq * 4);
        } else {
          // Word tq of a block's 16 bytes: low nibbles are elements 4tq .. 4tq + 3 (k 0..15),
          // high nibbles elements 16 + 4tq .. (k 16..31), exactly the A fragment's halves.
          const uint32_t lo = *reinterpret_cast<const uint32_t*>(r_lo + tq * 4);
          const uint32_t hi = *reinterpret_cast<const uint32_t*>(r_hi + tq * 4);
          uint32_t f[4] = {lo & 0x0F0F0F0Fu, hi & 0x0F0F0F0Fu, (lo >> 4) & 0x0F0F0F0Fu, (hi >> 4) & 0x0F0F0F0Fu};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if constexpr (T == tensor_type::q4_0) f[i] = __vsub4(f[i], 0x08080808u);
            a[mt][i] = static_cast<int>(f[i]);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const uint8_t* col = &sb.x[buf][(wn * 32 + nt * 8 + g) * x_stride + kb * 32];
        b[nt][0] = *reinterpret_cast<const int*>(col + tq * 4);
        b[nt][1] = *reinterpret_cast<const int*>(col + 16 + tq * 4);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int rl = wm * 32 + mt * 16 + g, rh = rl + 8;
        const float dw[2] = {sb.wd[buf][rl][kb], sb.wd[buf][rh][kb]};
        const float mw[2] = {sb.wm[buf][rl][kb], sb.wm[buf][rh][kb]};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          int d[4];
          mma_s8(d, a[mt], b[nt]);
          const int t0 = wn * 32 + nt * 8 + tq * 2;
          const float dx[2] = {sb.xd[buf][t0][kb], sb.xd[buf][t0 + 1][kb]};
          const float sx[2] = {sb.xs[buf][t0][kb], sb.xs[buf][t0 + 1][kb]};
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // d[i]: row (i < 2 ? rl : rh), token t0 + (i & 1)
            float& c = acc[mt][nt][i];
            c = fmaf(static_cast<float>(d[i]), __fmul_rn(dw[i / 2], dx[i & 1]), c);
            if constexpr (T == tensor_type::q4_1) c = fmaf(mw[i / 2], sx[i & 1], c);
          }
        }
      }
    }
    if (more) store_scales<T>(sb, buf ^ 1, next);
    __syncthreads();  // this stage's buffers are free for the stage after next
  }

#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t r = t.row0 + wm * 32 + mt * 16 + g + (i / 2) * 8;
        const int64_t tok = t.tok0 + wn * 32 + nt * 8 + tq * 2 + (i & 1);
        if (r < t.row_limit && tok < t.tok_end) {
          float& out = y[tok * ldy + r];
          out = accumulate ? out + acc[mt][nt][i] : acc[mt][nt][i];
        }
      }
    }
  }
}

}  // namespace

void launch_mmq(const device_matrix& w, const q8_rows& xq, int32_t n, float* y, int64_t ldy, bool accumulate,
                const int32_t* offsets, int32_t groups, int64_t rows_per_group, cudaStream_t s) {
  if (n <= 0) return;
  const int64_t rows = offsets ? rows_per_group : w.rows;
  const int64_t token_tiles = offsets ? (n + mmq_tokens - 1) / mmq_tokens + groups : (n + mmq_tokens - 1) / mmq_tokens;
  const dim3 grid(static_cast<unsigned>((rows + mmq_rows - 1) / mmq_rows), static_cast<unsigned>(token_tiles));
  if (token_tiles > 65535) throw std::invalid_argument("mmq: too many token tiles for one launch");
  const int acc = accumulate ? 1 : 0;
  switch (w.type) {
    case tensor_type::q4_0:
      mmq_kernel<tensor_type::q4_0><<<grid, mmq_threads, 0, s>>>(w, xq, n, y, ldy, acc, offsets, groups, rows_per_group);
      break;
    case tensor_type::q4_1:
      mmq_kernel<tensor_type::q4_1><<<grid, mmq_threads, 0, s>>>(w, xq, n, y, ldy, acc, offsets, groups, rows_per_group);
      break;
    case tensor_type::q8_0:
      mmq_kernel<tensor_type::q8_0><<<grid, mmq_threads, 0, s>>>(w, xq, n, y, ldy, acc, offsets, groups, rows_per_group);
      break;
    default: throw std::invalid_argument("mmq: the weights are not quantized");
  }
  check_launch("mmq");
}

}  // namespace tireless::cuda::detail
