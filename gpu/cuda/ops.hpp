#pragma once
// The CUDA kernels' host entry points (gpu/cuda/*.cu). No CUDA types here, so any C++ file may
// include it: pointers are device pointers, a stream is a cudaStream_t passed as void*
// (nullptr: the default stream). Every launcher checks its shapes (std::invalid_argument) and
// throws std::runtime_error with CUDA's message when a launch fails; errors inside a kernel
// surface at the next synchronization. Launchers allocate nothing and never synchronize, so
// a sequence of them can be captured into a CUDA graph.
//
// Built only where nvcc is found (TIRELESS_HAVE_CUDA); compiled and reviewed, not yet run on a
// GPU (gpu/cuda/README.md).

#include <cstddef>
#include <cstdint>
#include <string>

#include "gpu/cuda/weight_layout.hpp"
#include "gpu/tensor_type.hpp"

namespace tireless::cuda {

// ---- devices, memory, streams, graphs (device.cu) -------------------------------------------

// Whether a CUDA device can be used here; `why` says why not (no driver, no device, ...).
bool device_available(std::string* why = nullptr);
int device_count();  // 0 where none can be used
void set_device(int device);
struct device_info {
  std::string name;
  int64_t total_bytes = 0, free_bytes = 0;
  int multiprocessors = 0;
  int major = 0, minor = 0;
};
device_info info_of(int device);
// Waits for the current device; throws with the first error a kernel raised.
void synchronize();
// Forgets the last (non-sticky) CUDA error, as after a refused graph capture.
void clear_last_error();

// Device memory on the current device, freed when it goes.
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(size_t bytes);
  ~device_buffer();
  device_buffer(device_buffer&& o) noexcept;
  device_buffer& operator=(device_buffer&& o) noexcept;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  void* data() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return n_; }
  void upload(const void* src, size_t bytes, size_t offset = 0);  // synchronous
  void download(void* dst, size_t bytes, size_t offset = 0) const;
  void zero();

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host memory: what async copies to and from the device need to be async.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(size_t bytes);
  ~pinned_buffer();
  pinned_buffer(pinned_buffer&& o) noexcept;
  pinned_buffer& operator=(pinned_buffer&& o) noexcept;
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  void* data() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// A non-blocking stream of the current device.
class stream {
 public:
  stream();
  ~stream();
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  void* handle() const { return s_; }
  void synchronize() const;  // throws with a kernel's error

 private:
  void* s_ = nullptr;
};

// A CUDA event of the current device (timing off): recorded on a stream, waited for by the
// host. One never recorded counts as complete.
class event {
 public:
  event();
  ~event();
  event(event&& o) noexcept;
  event& operator=(event&& o) noexcept;
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  void record(void* stream);
  void synchronize() const;  // until the work before the last record is done

 private:
  void* e_ = nullptr;
};

void copy_to_device_async(void* dst, const void* src, size_t bytes, void* stream);
void copy_to_host(void* dst, const void* src, size_t bytes);  // synchronous
void copy_to_host_async(void* dst, const void* src, size_t bytes, void* stream);
void copy_on_device_async(void* dst, const void* src, size_t bytes, void* stream);

// Launches recorded once from a stream and replayed (cudaGraph_t, cudaGraphExec_t).
class graph {
 public:
  graph() = default;
  ~graph();
  graph(const graph&) = delete;
  graph& operator=(const graph&) = delete;
  // Launches between the two calls are recorded, not run; nothing in between may synchronize
  // or allocate. end_capture throws when the capture was broken.
  void begin_capture(void* stream);
  void end_capture(void* stream);
  void launch(void* stream) const;
  bool ready() const { return exec_ != nullptr; }

 private:
  void* graph_ = nullptr;
  void* exec_ = nullptr;
};

// ---- weights and quantized activations ------------------------------------------------------

// A weight matrix in device memory, laid out as weight_layout.hpp says.
struct device_matrix {
  tensor_type type = tensor_type::f32;
  int64_t rows = 0, cols = 0;
  int64_t qs_row_bytes = 0;
  const void* qs = nullptr;  // quantized: the quants; float types: the rows
  const void* d = nullptr;   // quantized: fp16 scales [rows][cols / 32]
  const void* m = nullptr;   // q4_1: fp16 minimums [rows][cols / 32]
};
device_matrix view_of(const matrix_layout& layout, const void* base);

// Activations quantized to 8 bits for the products with quantized weights, exactly as the CPU
// backend does (gpu/cpu/matmul.hpp, q8_view): per row and 32 values, d = max|x| / 127,
// q = round-to-nearest-even(x · 127 / max|x|), s = d · Σq. Row r: q + r * blocks * 32 (int8),
// d + r * blocks, s + r * blocks.
struct q8_rows {
  int8_t* q = nullptr;
  float* d = nullptr;
  float* s = nullptr;
  int64_t blocks = 0;
};

// Rows r < rows of x (row stride ldx; row row_of[r] when row_of is not null), cols a multiple
// of 32, into out (out.blocks = cols / 32).
void quantize_q8(const float* x, int64_t ldx, int32_t rows, int64_t cols, const int32_t* row_of, const q8_rows& out,
                 void* stream = nullptr);

// ---- norms, RoPE, SwiGLU, embedding (elementwise.cu, embedding.cu) --------------------------

// out[r] = x[row r] / sqrt(mean(x[row r]²) + eps) * w, rows of n floats (x row stride n; row
// row_of[r] when row_of is not null; out row stride n). With q8: also quantizes out (n a
// multiple of 32).
void rms_norm(const float* x, const float* w, float* out, int32_t rows, int32_t n, float eps, void* stream = nullptr,
              const q8_rows* q8 = nullptr, const int32_t* row_of = nullptr);
// out[r][c] = silu(g[r * ld + c]) * u[r * ld + c] for c < n (out row stride n), as the CPU
// computes it; with q8 (n a multiple of 32) also quantized.
void silu_mul(const float* g, const float* u, int64_t ld, int32_t rows, int64_t n, float* out, const q8_rows* q8 = nullptr,
              void* stream = nullptr);
// RoPE in place on rows of heads x head_dim floats (row stride ld), row r at position pos[r]:
// adjacent pairs of each head's first rope_dims values turned by pos * base^(-2i / rope_dims)
// (llama.cpp's "normal" RoPE, as the CPU backend does, with the same roundings).
void rope(float* x, int64_t ld, int32_t rows, int32_t heads, int32_t head_dim, int32_t rope_dims, const int32_t* pos,
          float base, void* stream = nullptr);
// out[r] = row ids[r] of the table, dequantized; an id outside the table gives a row of NaN
// (the backend checks token ids on the host before they go up).
void embed_rows(const device_matrix& table, const int32_t* ids, int32_t rows, float* out, void* stream = nullptr);

// ---- matrix products (matvec.cu, mmq.cu, matmul.cu) -----------------------------------------

// cuBLAS for the float-typed weights' prefill products (f16, bf16: activations converted to the
// weight's type; f32: in f32), with a workspace of its own so that it can be captured: cuBLAS
// then allocates nothing while a graph is recorded. cublasSetStream drops a handle's workspace
// (back to cuBLAS's own pool), so the stream is set once, here, and the workspace after it.
class blas {
 public:
  explicit blas(void* stream);
  ~blas();
  blas(const blas&) = delete;
  blas& operator=(const blas&) = delete;
  // The handle, running on `stream` with this workspace. Another stream than the last one
  // rebinds both (cublasSetStream, then cublasSetWorkspace); the backend has one stream, bound
  // at construction, so nothing is rebound inside a capture.
  void* bound_to(void* stream);
  void* stream() const { return stream_; }

 private:
  void bind(void* stream);
  void* h_ = nullptr;
  void* stream_ = nullptr;
  device_buffer workspace_;
};

struct product_scratch {
  blas* cublas = nullptr;   // float-typed weights with more than matvec_max_tokens rows
  void* halves = nullptr;   // [rows][cols] fp16/bf16 activations for cuBLAS
  size_t halves_bytes = 0;
};

// Up to this many tokens a product is a matrix-vector product (weights read once for all of
// them); beyond, a matrix-matrix product on tensor cores (int8 for quantized weights; cuBLAS
// for float ones).
inline constexpr int32_t matvec_max_tokens = 8;

// y[t * ldy + r] (+)= row r of w · x[t], for t < n and every row r. Quantized w reads xq (x
// quantized by quantize_q8 or a norm, xq.blocks = w.cols / 32); float w reads x (row stride
// ldx). The quantized products compute what the CPU backend computes: per 32-value block the
// integer dot product times d_w · d_x (plus m_w · s_x for q4_1), summed block after block.
void matmul(const device_matrix& w, const float* x, int64_t ldx, const q8_rows* xq, int32_t n, float* y, int64_t ldy,
            bool accumulate, const product_scratch& scratch, void* stream = nullptr);

// Mixture of experts: `pairs` rows sorted by group (expert), group g's pairs being
// [offsets[g], offsets[g + 1]) (device memory, groups + 1 entries, offsets[groups] = pairs);
// y[p * ldy + r] = row g * rows_per_group + r of w · x[p] for r < rows_per_group. Float w reads
// x, quantized w reads xq.
void grouped_matmul(const device_matrix& w, int64_t rows_per_group, int32_t groups, const int32_t* offsets,
                    const float* x, int64_t ldx, const q8_rows* xq, int32_t pairs, float* y, int64_t ldy,
                    const product_scratch& scratch, void* stream = nullptr);

// ---- paged attention (attention.cu) ---------------------------------------------------------

// The paged KV pool in device memory, laid out as the CPU backend's: fp16, keys and values
// apart, [layer][block][kv_head] then keys [head_dim][block_size] and values
// [block_size][head_dim].
struct kv_cache {
  uint16_t* k = nullptr;
  uint16_t* v = nullptr;
  int32_t n_layer = 0, n_blocks = 0, block_size = 16, n_head_kv = 0, head_dim = 0;
  constexpr int64_t block_stride() const { return int64_t{n_head_kv} * block_size * head_dim; }
  constexpr int64_t layer_stride() const { return block_stride() * n_blocks; }
};

// A step's inputs in device memory (cuda_plan.hpp, step_inputs: the same sections).
struct step_view {
  const int32_t* words = nullptr;  // words[0]: the block tables' width
  const int32_t *tokens = nullptr, *pos = nullptr, *row_seq = nullptr, *seq_start = nullptr, *seq_len = nullptr,
                *seq_row = nullptr, *items = nullptr, *outs = nullptr, *table = nullptr;
  int32_t rows = 0, seqs = 0, items_n = 0, outs_n = 0;
};

struct attention_shape {
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0, rope_dims = 0;
  float rope_base = 10000.0f;
  float scale = 1.0f;  // 1 / sqrt(head_dim)
};

// RoPE on q and k of every row of qkv ([rows][ld]: q at column 0, k at q_dim, v at q_dim +
// kv_dim), then k and v of every row whose row_seq is not -1 into its sequence's KV slot of
// `layer` (block table[seq][pos / block_size], slot pos % block_size), rounded to fp16.
void rope_store_kv(float* qkv, int64_t ld, const step_view& step, const attention_shape& a, const kv_cache& kv,
                   int32_t layer, void* stream = nullptr);

// out[row][head * head_dim ...] = softmax(q · K / sqrt(head_dim)) · V over the positions each
// row's token sees (its sequence's earlier positions and the chunk's up to itself), for every
// attention work item of the step; one launch for prefill chunks and decode tokens alike.
// `splits` > 1 spreads each item's keys over that many blocks (for few, long sequences), whose
// partial results go to `partial` (attention_partial_floats(...) floats) and are combined.
void paged_attention(const float* qkv, int64_t ldq, float* out, int64_t ldo, const step_view& step,
                     const attention_shape& a, const kv_cache& kv, int32_t layer, int32_t splits, float* partial,
                     void* stream = nullptr);
int64_t attention_partial_floats(int32_t items, int32_t splits, int32_t head_dim);
// How many splits suit a step of `items` work items whose longest sequence sees max_positions
// positions, on a device of `multiprocessors`.
int32_t attention_splits(int32_t items, int32_t max_positions, int32_t multiprocessors);
inline constexpr int32_t attention_max_splits = 16;

// Copies whole KV blocks of every layer, pairs [n][2] (src, dst) in device memory.
void copy_kv_blocks(const kv_cache& kv, const int32_t* pairs, int32_t n, void* stream = nullptr);

// ---- sampling and mixture of experts (sampling.cu, moe.cu) ----------------------------------

// out[r] = the index of the largest of logits[r][0 .. n) (the lowest index on ties), as the CPU
// sampler's greedy choice.
void argmax_rows(const float* logits, int32_t rows, int32_t n, int32_t* out, void* stream = nullptr);

// Mixtral routing, as the CPU backend's: per row the k experts of the highest logits (the lower
// index on ties), gates exp(logit - the row's max) renormalized over the k; chosen and gates
// [rows][k]. counts[e] += 1 per choice of rows whose row_seq is not -1 (row_seq may be null).
void moe_route(const float* logits, int32_t rows, int32_t n_expert, int32_t k, const int32_t* row_seq, int32_t* chosen,
               float* gates, unsigned long long* counts, void* stream = nullptr);
// The step's rows x k slots grouped by expert: offsets [n_expert + 1], pair_row[p] the row of
// pair p, slot_pair[row * k + j] the pair of slot j of a row. n_expert at most 1024.
void moe_group(const int32_t* chosen, int32_t rows, int32_t k, int32_t n_expert, int32_t* offsets, int32_t* pair_row,
               int32_t* slot_pair, void* stream = nullptr);
// x[r] += Σ_j gates[r * k + j] · y[slot_pair[r * k + j]] (j = 0 .. k - 1, as the CPU combines).
void moe_combine(const float* y, int64_t ldy, const int32_t* slot_pair, const float* gates, int32_t rows, int32_t k,
                 int64_t n, float* x, int64_t ldx, void* stream = nullptr);
// dst[r] = src[row_of[r]], rows of n floats.
void gather_rows(const float* src, int64_t lds, const int32_t* row_of, int32_t rows, int64_t n, float* dst, int64_t ldd,
                 void* stream = nullptr);

}  // namespace tireless::cuda
