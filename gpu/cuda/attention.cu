#include "gpu/cuda/attention.cuh"
#include "gpu/cuda/device.cuh"
#include "gpu/cuda/elementwise.cuh"
#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/shapes.hpp"

#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tireless::cuda {

namespace detail {
namespace {

constexpr int warps_of_block = attention_threads / 32;
constexpr int rows_per_warp = attention_tile_rows / warps_of_block;
static_assert(rows_per_warp * warps_of_block == attention_tile_rows, "4 warps of 4 rows make a tile");

// Row i of warp w is row i * 4 + w of the tile: rows go round the warps, so that a decode
// token's GQA group (4 rows, often) gives every warp one, and a warp's live rows come first.
__device__ __forceinline__ int tile_row(int warp, int i) { return i * warps_of_block + warp; }

// What an item covers, read from the step's inputs.
struct item_view {
  int seq = -1, kv_head = 0, first = 0;  // first query row of the tile within the sequence's rows
  int q_rows = 0, start = 0, seq_row = 0, max_pos = 0;
  const int32_t* table = nullptr;
};

__device__ __forceinline__ item_view read_item(const step_view& st, int item, int group) {
  item_view v;
  v.seq = st.items[3 * item];
  if (v.seq < 0) return v;
  v.kv_head = st.items[3 * item + 1];
  v.first = st.items[3 * item + 2];
  v.q_rows = st.seq_len[v.seq] * group;
  v.start = st.seq_start[v.seq];
  v.seq_row = st.seq_row[v.seq];
  const int last = min(v.first + attention_tile_rows, v.q_rows) - 1;
  v.max_pos = v.start + last / group;
  v.table = st.table + static_cast<int64_t>(v.seq) * st.words[0];
  return v;
}

// Shared memory: q [16][hd] f32, then K [2][hd][32] and V [2][32][hd] fp16.
size_t attention_shared(int hd) { return static_cast<size_t>(attention_tile_rows) * hd * 4 + 2u * 2u * hd * attention_keys * 2; }

// head_dim <= 32 * EPL. At most 128 registers (4 blocks a multiprocessor), none spilled.
template <int EPL>
__global__ void __launch_bounds__(attention_threads, 4)
    attention_kernel(const float* qkv, int64_t ldq, float* out, int64_t ldo, step_view st, attention_shape a,
                     kv_cache kv, int32_t layer, int32_t splits, float* partial) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int hd = a.head_dim, group = a.n_head / a.n_head_kv, bs = kv.block_size;
  const int item = blockIdx.x, split = blockIdx.y;
  const item_view it = read_item(st, item, group);
  if (it.seq < 0) return;  // the whole block: a padding item
  // The splits this item's context needs, of the launch's (graph-legal: read from the step).
  const int used = attention_item_splits(splits, it.max_pos + 1);
  if (split >= used) return;  // the whole block: a split this context does not need
  float* qs = reinterpret_cast<float*>(smem);
  __half* ks = reinterpret_cast<__half*>(smem + static_cast<size_t>(attention_tile_rows) * hd * 4);
  __half* vs = ks + 2 * hd * attention_keys;

  for (int i = threadIdx.x; i < attention_tile_rows * hd; i += attention_threads) {
    const int r = i / hd, e = i % hd, row = it.first + r;
    float v = 0.0f;
    if (row < it.q_rows) {
      const int tok = row / group, head = it.kv_head * group + row % group;
      v = qkv[static_cast<int64_t>(it.seq_row + tok) * ldq + head * hd + e];
    }
    qs[i] = v;
  }

  const int64_t head_at = static_cast<int64_t>(layer) * kv.layer_stride() + static_cast<int64_t>(it.kv_head) * bs * hd;
  const uint16_t* kbase = kv.k + head_at;
  const uint16_t* vbase = kv.v + head_at;
  const int64_t block_stride = kv.block_stride();
  const int tiles = it.max_pos / attention_keys + 1;
  // Copies keys and values of positions [kt * 32, kt * 32 + 32) into buffer buf; positions past
  // the tile's last are zero-filled (and never used).
  const auto issue = [&](int kt, int buf) {
    const int key0 = kt * attention_keys;
    __half* kd = ks + buf * hd * attention_keys;
    __half* vd = vs + buf * hd * attention_keys;
    for (int c = threadIdx.x; c < hd * 4; c += attention_threads) {  // K: [hd][32] in chunks of 8 slots
      const int e = c / 4, p = key0 + (c % 4) * 8;
      const bool valid = p <= it.max_pos;
      const uint16_t* src = valid ? kbase + it.table[p / bs] * block_stride + static_cast<int64_t>(e) * bs + p % bs : kbase;
      cp_async16(kd + e * attention_keys + (c % 4) * 8, src, valid);
    }
    for (int c = threadIdx.x; c < attention_keys * (hd / 8); c += attention_threads) {  // V: [32][hd] in chunks of 8
      const int j = c / (hd / 8), e8 = (c % (hd / 8)) * 8, p = key0 + j;
      const bool valid = p <= it.max_pos;
      const uint16_t* src = valid ? vbase + it.table[p / bs] * block_stride + static_cast<int64_t>(p % bs) * hd + e8 : vbase;
      cp_async16(vd + j * hd + e8, src, valid);
    }
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int pos[rows_per_warp];
  bool live[rows_per_warp];
  int n_live = 0;  // live rows come first: rows 0 .. n_live - 1 of the warp
  float m[rows_per_warp], l[rows_per_warp], acc[rows_per_warp][EPL];
#pragma unroll
  for (int i = 0; i < rows_per_warp; ++i) {
    const int row = it.first + tile_row(warp, i);
    live[i] = row < it.q_rows;
    n_live += live[i] ? 1 : 0;
    pos[i] = it.start + row / group;
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < EPL; ++k) acc[i][k] = 0.0f;
  }

  if (split < tiles) issue(split, 0);
  cp_async_commit();
  for (int kt = split, n = 0; kt < tiles; kt += used, ++n) {
    const int buf = n & 1;
    if (kt + used < tiles) {
      issue(kt + used, buf ^ 1);  // buf ^ 1 was last read before the barrier that ended the previous tile
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (n_live == 0) {  // a warp of dead rows only loads and waits (warp-uniform)
      __syncthreads();
      continue;
    }
    const int key0 = kt * attention_keys;
    const __half* kb = ks + buf * hd * attention_keys;
    const __half* vb = vs + buf * hd * attention_keys;
    float s[rows_per_warp];
#pragma unroll
    for (int i = 0; i < rows_per_warp; ++i) s[i] = 0.0f;
    for (int e = 0; e < hd; ++e) {
      const float k = __half2float(kb[e * attention_keys + lane]);
#pragma unroll
      for (int i = 0; i < rows_per_warp; ++i) {
        if (i < n_live) s[i] = fmaf(qs[tile_row(warp, i) * hd + e], k, s[i]);  // dead rows: no products
      }
    }
#pragma unroll
    for (int i = 0; i < rows_per_warp; ++i) {
      if (!live[i] || key0 > pos[i]) continue;  // the same for the whole warp
      const bool seen = key0 + lane <= pos[i];
      const float score = seen ? s[i] * a.scale : -INFINITY;
      const float m_new = fmaxf(m[i], warp_max(score));  // finite: key0 itself is seen
      const float corr = expf(m[i] - m_new);
      const float p = seen ? expf(score - m_new) : 0.0f;
      l[i] = fmaf(l[i], corr, warp_sum(p));
      m[i] = m_new;
#pragma unroll
      for (int k = 0; k < EPL; ++k) acc[i][k] *= corr;
      const int n_seen = min(attention_keys, pos[i] - key0 + 1);
      for (int j = 0; j < n_seen; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int k = 0; k < EPL; ++k) {
          const int e = lane + 32 * k;
          if (e < hd) acc[i][k] = fmaf(pj, __half2float(vb[j * hd + e]), acc[i][k]);
        }
      }
    }
    __syncthreads();  // the buffers are free for the tile after next
  }

#pragma unroll
  for (int i = 0; i < rows_per_warp; ++i) {
    if (!live[i]) continue;
    const int r = tile_row(warp, i), row = it.first + r;
    if (used == 1) {
      const int tok = row / group, head = it.kv_head * group + row % group;
      float* o = out + static_cast<int64_t>(it.seq_row + tok) * ldo + head * hd;
      const float inv = __fdiv_rn(1.0f, l[i]);
#pragma unroll
      for (int k = 0; k < EPL; ++k) {
        const int e = lane + 32 * k;
        if (e < hd) o[e] = __fmul_rn(acc[i][k], inv);
      }
    } else {
      float* p = partial + ((static_cast<int64_t>(item) * splits + split) * attention_tile_rows + r) * (hd + 2);
#pragma unroll
      for (int k = 0; k < EPL; ++k) {
        const int e = lane + 32 * k;
        if (e < hd) p[e] = acc[i][k];
      }
      if (lane == 0) {
        p[hd] = m[i];
        p[hd + 1] = l[i];
      }
    }
  }
}

// One block per item: out = Σ_s e^(m_s - M) acc_s / Σ_s e^(m_s - M) l_s over the splits the
// item used (one: its output is written already).
__global__ void combine_kernel(float* out, int64_t ldo, step_view st, attention_shape a, int32_t splits,
                               const float* partial) {
  const int hd = a.head_dim, group = a.n_head / a.n_head_kv;
  const int item = blockIdx.x;
  const item_view it = read_item(st, item, group);
  if (it.seq < 0) return;
  const int used = attention_item_splits(splits, it.max_pos + 1);
  if (used == 1) return;
  for (int i = threadIdx.x; i < attention_tile_rows * hd; i += blockDim.x) {
    const int r = i / hd, e = i % hd, row = it.first + r;
    if (row >= it.q_rows) continue;
    const float* p = partial + (static_cast<int64_t>(item) * splits * attention_tile_rows + r) * (hd + 2);
    const int64_t split_stride = static_cast<int64_t>(attention_tile_rows) * (hd + 2);
    float big = -INFINITY;
    for (int s = 0; s < used; ++s) big = fmaxf(big, p[s * split_stride + hd]);
    float sum = 0.0f, v = 0.0f;
    for (int s = 0; s < used; ++s) {
      const float* q = p + s * split_stride;
      const float w = expf(q[hd] - big);  // a split that saw no key: e^-inf = 0
      sum = fmaf(w, q[hd + 1], sum);
      v = fmaf(w, q[e], v);
    }
    const int tok = row / group, head = it.kv_head * group + row % group;
    out[static_cast<int64_t>(it.seq_row + tok) * ldo + head * hd + e] = __fmul_rn(v, __fdiv_rn(1.0f, sum));
  }
}

// One block per row: RoPE on its q and k heads (angles once per row, in shared memory), then
// k and v into the KV pool.
__global__ void rope_store_kernel(float* qkv, int64_t ld, step_view st, attention_shape a, kv_cache kv, int32_t layer) {
  __shared__ float cs[128], sn[128];
  const int r = blockIdx.x, half = a.rope_dims / 2, hd = a.head_dim;
  const int pos = st.pos[r];
  for (int i = threadIdx.x; i < half; i += blockDim.x) rope_angle(pos, i, a.rope_dims, a.rope_base, &cs[i], &sn[i]);
  __syncthreads();
  float* row = qkv + static_cast<int64_t>(r) * ld;
  // q heads then k heads: k head h is at (n_head + h) * head_dim, right after q.
  for (int k = threadIdx.x; k < (a.n_head + a.n_head_kv) * half; k += blockDim.x) {
    const int h = k / half, i = k % half;
    rope_turn(row + h * hd + 2 * i, cs[i], sn[i]);
  }
  __syncthreads();
  const int seq = st.row_seq[r];
  if (seq < 0) return;
  const int bs = kv.block_size;
  const int64_t block = st.table[static_cast<int64_t>(seq) * st.words[0] + pos / bs];
  const int slot = pos % bs;
  const int q_dim = a.n_head * hd, kv_dim = a.n_head_kv * hd;
  const int64_t layer_at = static_cast<int64_t>(layer) * kv.layer_stride() + block * kv.block_stride();
  for (int k = threadIdx.x; k < kv_dim; k += blockDim.x) {
    const int h = k / hd, e = k % hd;
    const int64_t head_at = layer_at + static_cast<int64_t>(h) * bs * hd;
    kv.k[head_at + static_cast<int64_t>(e) * bs + slot] = __half_as_ushort(__float2half_rn(row[q_dim + k]));
    kv.v[head_at + static_cast<int64_t>(slot) * hd + e] = __half_as_ushort(__float2half_rn(row[q_dim + kv_dim + k]));
  }
}

// One block per (layer, K or V): the pairs copied in their order, as the CPU copies them.
__global__ void copy_blocks_kernel(kv_cache kv, const int32_t* pairs, int32_t n) {
  const int layer = blockIdx.x / 2;
  uint16_t* pool = blockIdx.x % 2 ? kv.v : kv.k;
  const int64_t stride = kv.block_stride();  // a multiple of 8 halves
  uint4* base = reinterpret_cast<uint4*>(pool + static_cast<int64_t>(layer) * kv.layer_stride());
  for (int32_t i = 0; i < n; ++i) {
    const uint4* src = base + pairs[2 * i] * stride / 8;
    uint4* dst = base + pairs[2 * i + 1] * stride / 8;
    for (int64_t c = threadIdx.x; c < stride / 8; c += blockDim.x) dst[c] = src[c];
    __syncthreads();
  }
}

void check_shape(const attention_shape& a, const kv_cache& kv, const char* what) {
  const auto fail = [&](const std::string& why) { throw std::invalid_argument(std::string(what) + ": " + why); };
  if (a.n_head_kv < 1 || a.n_head % a.n_head_kv != 0) fail("the query heads must be a multiple of the KV heads");
  if (a.head_dim < 8 || a.head_dim > 256 || a.head_dim % 8 != 0) fail("head_dim must be a multiple of 8 up to 256");
  if (a.rope_dims < 0 || a.rope_dims % 2 != 0 || a.rope_dims > a.head_dim) fail("rope_dims must be even and at most head_dim");
  if (kv.block_size < 8 || kv.block_size % 8 != 0) fail("the KV block size must be a multiple of 8");
  if (kv.head_dim != a.head_dim || kv.n_head_kv != a.n_head_kv) fail("the KV pool's heads differ from the model's");
}

}  // namespace
}  // namespace detail

int64_t attention_partial_floats(int32_t items, int32_t splits, int32_t head_dim) {
  return static_cast<int64_t>(items) * splits * attention_tile_rows * (head_dim + 2);
}

int32_t attention_splits(int32_t items, int32_t max_positions, int32_t multiprocessors) {
  if (items <= 0 || items >= multiprocessors) return 1;
  const int32_t tiles = (std::max(max_positions, 1) + detail::attention_keys - 1) / detail::attention_keys;
  int32_t s = (2 * multiprocessors + items - 1) / items;  // about two blocks per multiprocessor
  s = std::min({s, (tiles + 1) / 2, attention_max_splits});  // at least two key tiles a split
  return std::max(s, 1);
}

void rope_store_kv(float* qkv, int64_t ld, const step_view& step, const attention_shape& a, const kv_cache& kv,
                   int32_t layer, void* stream) {
  detail::check_shape(a, kv, "rope_store_kv");
  if (step.rows <= 0) return;
  detail::rope_store_kernel<<<step.rows, 128, 0, detail::stream_of(stream)>>>(qkv, ld, step, a, kv, layer);
  detail::check_launch("rope_store_kv");
}

void paged_attention(const float* qkv, int64_t ldq, float* out, int64_t ldo, const step_view& step,
                     const attention_shape& a, const kv_cache& kv, int32_t layer, int32_t splits, float* partial,
                     void* stream) {
  detail::check_shape(a, kv, "paged_attention");
  if (step.items_n <= 0) return;
  if (splits < 1 || splits > attention_max_splits) throw std::invalid_argument("paged_attention: splits outside 1..16");
  if (splits > 1 && !partial) throw std::invalid_argument("paged_attention: split keys need a partial-results buffer");
  const cudaStream_t s = detail::stream_of(stream);
  const size_t shared = detail::attention_shared(a.head_dim);
  const dim3 grid(static_cast<unsigned>(step.items_n), static_cast<unsigned>(splits));
  const auto launch = [&](auto kernel) {
    detail::allow_shared(reinterpret_cast<const void*>(kernel), static_cast<int>(shared), "paged_attention");
    kernel<<<grid, detail::attention_threads, shared, s>>>(qkv, ldq, out, ldo, step, a, kv, layer, splits, partial);
  };
  if (a.head_dim <= 32) launch(detail::attention_kernel<1>);
  else if (a.head_dim <= 64) launch(detail::attention_kernel<2>);
  else if (a.head_dim <= 128) launch(detail::attention_kernel<4>);
  else launch(detail::attention_kernel<8>);
  detail::check_launch("paged_attention");
  if (splits > 1) {
    detail::combine_kernel<<<step.items_n, 128, 0, s>>>(out, ldo, step, a, splits, partial);
    detail::check_launch("paged_attention: combine");
  }
}

void copy_kv_blocks(const kv_cache& kv, const int32_t* pairs, int32_t n, void* stream) {
  if (n <= 0) return;
  if (kv.block_stride() % 8 != 0) throw std::invalid_argument("copy_kv_blocks: blocks of a multiple of 8 halves");
  detail::copy_blocks_kernel<<<kv.n_layer * 2, 256, 0, detail::stream_of(stream)>>>(kv, pairs, n);
  detail::check_launch("copy_kv_blocks");
}

}  // namespace tireless::cuda
