#include "gpu/cpu/cpu_backend.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "gpu/cpu/local_experts.hpp"
#include "gpu/cpu/matmul.hpp"
#include "gpu/cpu/packed_matrix.hpp"
#include "gpu/cpu/thread_pool.hpp"
#include "model/model.hpp"

namespace tireless::cpu {

namespace {

// Query rows per attention task: long prefills split so both cores get work.
constexpr int attention_chunk = 64;

struct layer_weights {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  packed_matrix wq, wk, wv, wo;
  packed_matrix gate, up, down;  // dense
  packed_matrix router;          // MoE
};

packed_matrix pack(const gguf_tensor* t) {
  return packed_matrix::pack(t->type, t->data, t->shape[1], t->shape[0]);
}

const float* floats(const gguf_tensor* t) { return reinterpret_cast<const float*>(t->data); }

// Anonymous memory the kernel zero-fills on first touch: a large KV pool costs nothing
// until its blocks are written.
class zeroed_pages {
 public:
  explicit zeroed_pages(size_t bytes) : bytes_(std::max<size_t>(bytes, 1)) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = p;
  }
  ~zeroed_pages() { ::munmap(data_, bytes_); }
  zeroed_pages(const zeroed_pages&) = delete;
  zeroed_pages& operator=(const zeroed_pages&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  size_t bytes_;
  void* data_;
};

class cpu_backend final : public backend {
 public:
  cpu_backend(std::shared_ptr<const model> m, const cpu_backend_options& o);

  std::string describe() const override;
  kv_geometry kv() const override;
  backend_limits limits() const override;
  int32_t n_vocab() const override { return c_.n_vocab; }
  step_cost_prior cost_prior() const override;
  std::vector<int64_t> expert_tokens() const override { return expert_tokens_; }
  void execute(const step_batch& batch, step_result& result) override;
  void copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) override;

 private:
  void check(const step_batch& batch) const;
  void lay_out(const step_batch& batch);
  void embed();
  void attention_block(int layer);
  void rope_and_store_kv(int layer);
  void ffn_block(int layer);
  void moe_route(int layer, routed_tokens& rt);
  void moe_add();
  size_t overlap_split() const;
  void run_layers_overlapped(size_t split_seq);
  void use_rows(int64_t first, int64_t end, size_t first_task, size_t end_task);
  template <class T>
  T* at(std::vector<T>& v, int64_t width) {
    return v.data() + r0_ * width;
  }
  void output(const step_batch& batch, step_result& result);
  const q8_view* quantize_if(bool needed, const float* x, int64_t cols, q8_view& storage);
  template <class F>
  void for_rows(F&& f);

  std::shared_ptr<const model> model_;
  const model_config& c_;
  cpu_backend_options o_;
  thread_pool pool_;
  const isa_kernels& k_;
  packed_matrix token_embd_;
  packed_matrix untied_output_;
  const packed_matrix* output_ = nullptr;
  const float* output_norm_ = nullptr;
  std::vector<layer_weights> layers_;
  std::unique_ptr<local_experts> own_experts_;
  expert_ffn* experts_ = nullptr;

  // KV pool, fp16, keys and values apart: [layer][block][kv_head] then keys [head_dim][slot]
  // (so attention reads a block's keys as rows of slots) and values [slot][head_dim].
  int64_t block_stride_ = 0;
  int64_t layer_stride_ = 0;
  std::unique_ptr<zeroed_pages> k_pool_, v_pool_;

  // The step being run.
  const step_batch* batch_ = nullptr;
  int64_t n_rows_ = 0;
  std::vector<int64_t> first_row_;  // per sequence
  std::vector<int32_t> pos_;        // per row
  std::vector<int32_t> seq_of_row_;
  std::vector<float> cos_, sin_;    // [row][rope_dims / 2]
  struct attention_task {
    int32_t seq, kv_head, first, n;
  };
  std::vector<attention_task> tasks_;
  std::vector<size_t> first_task_;  // per sequence
  // The rows (and their attention tasks) the blocks work on: the whole step, or one
  // micro-batch of it when experts elsewhere overlap with attention here.
  int64_t r0_ = 0, r1_ = 0;
  size_t t0_ = 0, t1_ = 0;
  std::vector<int64_t> out_rows_;
  std::vector<int64_t> out_of_seq_;  // per sequence: its row of logits_, or -1

  // Scratch, sized once for max_step_tokens.
  std::vector<float> x_, h_, q_, kx_, vx_, att_, tmp_, g_, u_, router_, gates_, logits_;
  std::vector<int32_t> chosen_;
  std::vector<int64_t> expert_tokens_;  // [layer][expert]: token-expert pairs routed so far
  q8_buffer q8_;
};

cpu_backend::cpu_backend(std::shared_ptr<const model> m, const cpu_backend_options& o)
    : model_(std::move(m)),
      c_(model_->config()),
      o_(o),
      pool_(o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
      k_(o.kernels ? kernels_for(*o.kernels) : best_kernels()) {
  if (o_.kernels && !cpu_supports(*o_.kernels)) {
    throw std::invalid_argument(fmt::format("kernels '{}' are not supported by this CPU", name(*o_.kernels)));
  }
  if (o_.max_context <= 0) o_.max_context = c_.n_ctx_train;
  if (o_.block_size <= 0 || o_.block_size > 64) {
    throw std::invalid_argument(fmt::format("block_size {} is outside 1..64", o_.block_size));
  }
  if (c_.head_dim > 256 || c_.head_dim % 2 != 0) {
    throw std::invalid_argument(fmt::format("head size {} is not supported by the CPU backend (even, at most 256)", c_.head_dim));
  }
  if (o_.max_step_tokens <= 0 || o_.max_step_seqs <= 0) {
    throw std::invalid_argument("max_step_tokens and max_step_seqs must be positive");
  }
  if (o_.kv_blocks <= 0) o_.kv_blocks = (o_.max_context + o_.block_size - 1) / o_.block_size;

  const model_tensors& t = model_->tensors();
  token_embd_ = pack(t.token_embd);
  if (!c_.tied_embeddings) untied_output_ = pack(t.output);
  output_ = c_.tied_embeddings ? &token_embd_ : &untied_output_;
  output_norm_ = floats(t.output_norm);
  for (const layer_tensors& l : t.layers) {
    layer_weights w;
    w.attn_norm = floats(l.attn_norm);
    w.ffn_norm = floats(l.ffn_norm);
    w.wq = pack(l.wq);
    w.wk = pack(l.wk);
    w.wv = pack(l.wv);
    w.wo = pack(l.wo);
    if (c_.is_moe()) {
      w.router = pack(l.ffn_gate_inp);
    } else {
      w.gate = pack(l.ffn_gate);
      w.up = pack(l.ffn_up);
      w.down = pack(l.ffn_down);
    }
    layers_.push_back(std::move(w));
  }
  const int64_t rows = o_.max_step_tokens;
  if (c_.is_moe()) {
    expert_tokens_.assign(static_cast<size_t>(c_.n_layer) * static_cast<size_t>(c_.n_expert), 0);
    if (o_.experts) {
      experts_ = o_.experts;
    } else {
      own_experts_ = std::make_unique<local_experts>(model_, pool_, k_, rows);
      experts_ = own_experts_.get();
    }
  }
  // The quantized weights now live in their packed copies; the file's pages can go.
  model_->file().release_pages();

  block_stride_ = static_cast<int64_t>(c_.n_head_kv) * o_.block_size * c_.head_dim;
  layer_stride_ = block_stride_ * o_.kv_blocks;
  const size_t pool_bytes = static_cast<size_t>(layer_stride_) * c_.n_layer * sizeof(uint16_t);
  k_pool_ = std::make_unique<zeroed_pages>(pool_bytes);
  v_pool_ = std::make_unique<zeroed_pages>(pool_bytes);

  const int64_t widest = std::max({c_.n_embd, c_.q_dim(), c_.n_ff});
  x_.resize(rows * c_.n_embd);
  h_.resize(rows * c_.n_embd);
  tmp_.resize(rows * c_.n_embd);
  q_.resize(rows * c_.q_dim());
  att_.resize(rows * c_.q_dim());
  kx_.resize(rows * c_.kv_dim());
  vx_.resize(rows * c_.kv_dim());
  if (c_.is_moe()) {
    router_.resize(rows * c_.n_expert);
    gates_.resize(rows * c_.n_expert_used);
    chosen_.resize(rows * c_.n_expert_used);
  } else {
    g_.resize(rows * c_.n_ff);
    u_.resize(rows * c_.n_ff);
  }
  cos_.resize(rows * c_.rope_dims / 2);
  sin_.resize(rows * c_.rope_dims / 2);
  pos_.resize(rows);
  seq_of_row_.resize(rows);
  logits_.resize(static_cast<size_t>(o_.max_step_seqs) * c_.n_vocab);
  q8_ = q8_buffer(rows, widest);
}

std::string cpu_backend::describe() const {
  return fmt::format("cpu ({} kernels, {} threads)", name(k_.id), pool_.size());
}

// SmolLM2-135M on two cores of this machine kind (the cpu-smollm2 sim profile, fitted by
// bench/sim_calibrate), scaled by the model's size per token and the threads used.
step_cost_prior cpu_backend::cost_prior() const {
  const double smollm2 = 30.0 * (576.0 * 576 * 2 + 576.0 * 192 * 2 + 576.0 * 1536 * 3);
  const double size = c_.n_layer * (double(c_.n_embd) * c_.q_dim() * 2 + double(c_.n_embd) * c_.kv_dim() * 2 +
                                    double(c_.n_embd) * c_.n_ff * 3 * std::max(1, c_.n_expert_used));
  const double scale = size / smollm2 * 2.0 / pool_.size();
  return {0.00467, 0.000422 * scale, 0.000604 * scale, 0.00191 * scale};
}

kv_geometry cpu_backend::kv() const {
  return {o_.block_size, o_.kv_blocks,
          static_cast<int64_t>(block_stride_ * c_.n_layer * 2 * sizeof(uint16_t))};
}

backend_limits cpu_backend::limits() const {
  return {o_.max_step_tokens, o_.max_step_seqs, o_.max_context};
}

void cpu_backend::check(const step_batch& b) const {
  if (static_cast<int64_t>(b.seqs.size()) > o_.max_step_seqs) {
    throw std::invalid_argument(fmt::format("step has {} sequences, the limit is {}", b.seqs.size(), o_.max_step_seqs));
  }
  if (b.n_tokens() > o_.max_step_tokens) {
    throw std::invalid_argument(fmt::format("step has {} tokens, the limit is {}", b.n_tokens(), o_.max_step_tokens));
  }
  for (const sequence_step& s : b.seqs) {
    const int64_t end = s.start_pos + static_cast<int64_t>(s.tokens.size());
    if (s.tokens.empty() || s.start_pos < 0 || end > o_.max_context) {
      throw std::invalid_argument(fmt::format("sequence {}: positions {}..{} are outside 0..{}",
                                              s.seq_id, s.start_pos, end - 1, o_.max_context - 1));
    }
    const int64_t blocks = (end + o_.block_size - 1) / o_.block_size;
    if (static_cast<int64_t>(s.block_table.size()) < blocks) {
      throw std::invalid_argument(fmt::format("sequence {}: {} blocks needed, block table has {}",
                                              s.seq_id, blocks, s.block_table.size()));
    }
    for (int64_t i = 0; i < blocks; ++i) {
      if (s.block_table[i] < 0 || s.block_table[i] >= o_.kv_blocks) {
        throw std::invalid_argument(fmt::format("sequence {}: block {} is outside the pool", s.seq_id, s.block_table[i]));
      }
    }
    for (token_id t : s.tokens) {
      if (t < 0 || t >= c_.n_vocab) {
        throw std::invalid_argument(fmt::format("sequence {}: token {} is outside the vocabulary", s.seq_id, t));
      }
    }
  }
}

void cpu_backend::lay_out(const step_batch& b) {
  batch_ = &b;
  first_row_.clear();
  first_task_.clear();
  tasks_.clear();
  out_rows_.clear();
  int64_t row = 0;
  const int32_t group = c_.n_head / c_.n_head_kv;
  (void)group;
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const sequence_step& q = b.seqs[s];
    first_row_.push_back(row);
    first_task_.push_back(tasks_.size());
    const int32_t n = static_cast<int32_t>(q.tokens.size());
    for (int32_t i = 0; i < n; ++i) {
      pos_[row + i] = q.start_pos + i;
      seq_of_row_[row + i] = static_cast<int32_t>(s);
    }
    for (int32_t h = 0; h < c_.n_head_kv; ++h) {
      for (int32_t f = 0; f < n; f += attention_chunk) {
        tasks_.push_back({static_cast<int32_t>(s), h, f, std::min(attention_chunk, n - f)});
      }
    }
    if (q.sample || q.want_logits) out_rows_.push_back(row + n - 1);
    row += n;
  }
  n_rows_ = row;
  use_rows(0, n_rows_, 0, tasks_.size());
  const int32_t half = c_.rope_dims / 2;
  for (int64_t r = 0; r < n_rows_; ++r) {
    for (int32_t i = 0; i < half; ++i) {
      const double theta = pos_[r] * std::pow(static_cast<double>(c_.rope_base), -2.0 * i / c_.rope_dims);
      cos_[r * half + i] = static_cast<float>(std::cos(theta));
      sin_[r * half + i] = static_cast<float>(std::sin(theta));
    }
  }
}

void cpu_backend::use_rows(int64_t first, int64_t end, size_t first_task, size_t end_task) {
  r0_ = first;
  r1_ = end;
  t0_ = first_task;
  t1_ = end_task;
}

template <class F>
void cpu_backend::for_rows(F&& f) {
  // Per-row work is under a microsecond: small batches run on the caller, without the cost
  // of waking the workers.
  const int64_t n = r1_ - r0_;
  pool_.parallel_for(n, std::max<int64_t>(16, n / (4 * pool_.size())), [&](int64_t b, int64_t e) {
    for (int64_t r = r0_ + b; r < r0_ + e; ++r) f(r);
  });
}

// x: the active rows' first.
const q8_view* cpu_backend::quantize_if(bool needed, const float* x, int64_t cols, q8_view& storage) {
  if (!needed) return nullptr;
  storage = q8_.quantize(pool_, k_, x, r1_ - r0_, cols, cols);
  return &storage;
}

void cpu_backend::embed() {
  const int64_t e = c_.n_embd;
  for_rows([&](int64_t r) {
    const sequence_step& s = batch_->seqs[seq_of_row_[r]];
    token_embd_.dequantize_row(s.tokens[pos_[r] - s.start_pos], &x_[r * e]);
  });
}

// Rotates adjacent pairs (x[2i], x[2i+1]) of each head's first rope_dims values (llama.cpp's
// "normal" RoPE, which Llama GGUF files expect).
void rope_rows(float* x, int64_t heads, int64_t head_dim, int32_t rope_dims, const float* cs,
               const float* sn) {
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (int32_t i = 0; i < rope_dims / 2; ++i) {
      const float a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * cs[i] - b * sn[i];
      v[2 * i + 1] = a * sn[i] + b * cs[i];
    }
  }
}

void cpu_backend::attention_block(int layer) {
  const layer_weights& w = layers_[layer];
  const int64_t e = c_.n_embd, qd = c_.q_dim(), kvd = c_.kv_dim();
  for_rows([&](int64_t r) { k_.rms_norm(&x_[r * e], w.attn_norm, &h_[r * e], e, c_.rms_eps); });
  q8_view hq_storage;
  const q8_view* hq =
      quantize_if(w.wq.quantized() || w.wk.quantized() || w.wv.quantized(), at(h_, e), e, hq_storage);
  const matmul_job qkv[] = {{&w.wq, at(h_, e), e, hq, at(q_, qd), qd, false},
                            {&w.wk, at(h_, e), e, hq, at(kx_, kvd), kvd, false},
                            {&w.wv, at(h_, e), e, hq, at(vx_, kvd), kvd, false}};
  matmul(pool_, k_, qkv, r1_ - r0_);
  rope_and_store_kv(layer);

  const int32_t group = c_.n_head / c_.n_head_kv;
  pool_.parallel_for(static_cast<int64_t>(t1_ - t0_), 1, [&](int64_t b, int64_t end) {
    for (int64_t i = static_cast<int64_t>(t0_) + b; i < static_cast<int64_t>(t0_) + end; ++i) {
      const attention_task& t = tasks_[i];
      const sequence_step& s = batch_->seqs[t.seq];
      const int64_t row = first_row_[t.seq] + t.first;
      attention_args a{};
      a.q = &q_[row * qd];
      a.q_stride = qd;
      a.out = &att_[row * qd];
      a.out_stride = qd;
      a.n_new = t.n;
      a.start_pos = s.start_pos + t.first;
      a.first_head = t.kv_head * group;
      a.heads = group;
      a.head_dim = c_.head_dim;
      a.block_size = o_.block_size;
      a.block_table = s.block_table.data();
      const int64_t head_offset = layer * layer_stride_ + static_cast<int64_t>(t.kv_head) * o_.block_size * c_.head_dim;
      a.k_base = k_pool_->as<uint16_t>() + head_offset;
      a.v_base = v_pool_->as<uint16_t>() + head_offset;
      a.block_stride = block_stride_;
      a.scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
      k_.attention(a);
    }
  });

  q8_view aq_storage;
  const q8_view* aq = quantize_if(w.wo.quantized(), at(att_, qd), qd, aq_storage);
  matmul(pool_, k_, w.wo, at(att_, qd), qd, aq, r1_ - r0_, at(x_, e), e, true);
}

void cpu_backend::rope_and_store_kv(int layer) {
  const int64_t qd = c_.q_dim(), kvd = c_.kv_dim(), hd = c_.head_dim, bs = o_.block_size;
  const int32_t half = c_.rope_dims / 2;
  uint16_t* kp = k_pool_->as<uint16_t>() + layer * layer_stride_;
  uint16_t* vp = v_pool_->as<uint16_t>() + layer * layer_stride_;
  for_rows([&](int64_t r) {
    rope_rows(&q_[r * qd], c_.n_head, hd, c_.rope_dims, &cos_[r * half], &sin_[r * half]);
    rope_rows(&kx_[r * kvd], c_.n_head_kv, hd, c_.rope_dims, &cos_[r * half], &sin_[r * half]);
    const sequence_step& s = batch_->seqs[seq_of_row_[r]];
    const int64_t block = s.block_table[pos_[r] / bs], slot = pos_[r] % bs;
    for (int64_t h = 0; h < c_.n_head_kv; ++h) {
      const int64_t head = block * block_stride_ + h * bs * hd;
      uint16_t key[512];
      k_.floats_to_halves(&kx_[r * kvd + h * hd], key, hd);
      for (int64_t e = 0; e < hd; ++e) kp[head + e * bs + slot] = key[e];  // keys: [hd][bs]
      k_.floats_to_halves(&vx_[r * kvd + h * hd], vp + head + slot * hd, hd);  // values: [bs][hd]
    }
  });
}

void cpu_backend::ffn_block(int layer) {
  const layer_weights& w = layers_[layer];
  const int64_t e = c_.n_embd, ff = c_.n_ff;
  for_rows([&](int64_t r) { k_.rms_norm(&x_[r * e], w.ffn_norm, &h_[r * e], e, c_.rms_eps); });
  if (c_.is_moe()) {
    routed_tokens rt;
    moe_route(layer, rt);
    experts_->run(rt, at(tmp_, e), e);
    moe_add();
    return;
  }
  q8_view hq_storage;
  const q8_view* hq = quantize_if(w.gate.quantized() || w.up.quantized(), at(h_, e), e, hq_storage);
  const matmul_job gate_up[] = {{&w.gate, at(h_, e), e, hq, at(g_, ff), ff, false},
                                {&w.up, at(h_, e), e, hq, at(u_, ff), ff, false}};
  matmul(pool_, k_, gate_up, r1_ - r0_);
  for_rows([&](int64_t r) { k_.silu_mul(&g_[r * ff], &u_[r * ff], &g_[r * ff], ff); });
  q8_view gq_storage;
  const q8_view* gq = quantize_if(w.down.quantized(), at(g_, ff), ff, gq_storage);
  matmul(pool_, k_, w.down, at(g_, ff), ff, gq, r1_ - r0_, at(x_, e), e, true);
}

// The residual add of the experts' output, in tmp_.
void cpu_backend::moe_add() {
  const int64_t e = c_.n_embd;
  for_rows([&](int64_t r) {
    for (int64_t c = 0; c < e; ++c) x_[r * e + c] += tmp_[r * e + c];
  });
}

// Mixtral routing: softmax over all experts, the top k by probability (lower index first on
// ties), their weights renormalized to sum to one.
// The active rows' experts, from their normalized states in h_.
void cpu_backend::moe_route(int layer, routed_tokens& rt) {
  const layer_weights& w = layers_[layer];
  const int64_t e = c_.n_embd, n_exp = c_.n_expert, k = c_.n_expert_used;
  q8_view hq_storage;
  const q8_view* hq = quantize_if(w.router.quantized(), at(h_, e), e, hq_storage);
  matmul(pool_, k_, w.router, at(h_, e), e, hq, r1_ - r0_, at(router_, n_exp), n_exp);
  for_rows([&](int64_t r) {
    const float* logit = &router_[r * n_exp];
    const float top = *std::max_element(logit, logit + n_exp);
    int32_t* chosen = &chosen_[r * k];
    float* gate = &gates_[r * k];
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int32_t x = 0; x < n_exp; ++x) {
        if (std::find(chosen, chosen + j, x) != chosen + j) continue;
        if (best < 0 || logit[x] > logit[best]) best = x;
      }
      chosen[j] = best;
      gate[j] = std::exp(logit[best] - top);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += gate[j];
    for (int64_t j = 0; j < k; ++j) gate[j] /= sum;
  });
  int64_t* counts = &expert_tokens_[static_cast<size_t>(layer) * static_cast<size_t>(n_exp)];
  for (int64_t i = r0_ * k; i < r1_ * k; ++i) ++counts[chosen_[static_cast<size_t>(i)]];
  rt.layer = layer;
  rt.x = at(h_, e);
  rt.n_tokens = r1_ - r0_;
  rt.ld = e;
  rt.experts = at(chosen_, k);
  rt.gates = at(gates_, k);
  rt.k = static_cast<int32_t>(k);
}

void cpu_backend::output(const step_batch& b, step_result& result) {
  const int64_t e = c_.n_embd, v = c_.n_vocab;
  const int64_t n_out = static_cast<int64_t>(out_rows_.size());
  result.next.assign(b.seqs.size(), -1);
  result.logits.clear();
  result.logprobs.clear();
  if (n_out == 0) return;
  const bool any_logprobs = std::any_of(b.seqs.begin(), b.seqs.end(), [](const sequence_step& q) {
    return q.sample && q.sampling.logprobs >= 0;
  });
  if (any_logprobs) result.logprobs.resize(b.seqs.size());
  for (int64_t i = 0; i < n_out; ++i) {
    k_.rms_norm(&x_[out_rows_[i] * e], output_norm_, &h_[i * e], e, c_.rms_eps);
  }
  q8_view storage;
  const q8_view* hq = nullptr;
  if (output_->quantized()) {
    storage = q8_.quantize(pool_, k_, h_.data(), n_out, e, e);
    hq = &storage;
  }
  matmul(pool_, k_, *output_, h_.data(), e, hq, n_out, logits_.data(), v);
  out_of_seq_.assign(b.seqs.size(), -1);
  for (size_t s = 0, i = 0; s < b.seqs.size(); ++s) {
    if (b.seqs[s].sample || b.seqs[s].want_logits) out_of_seq_[s] = static_cast<int64_t>(i++);
  }
  pool_.parallel_for(static_cast<int64_t>(b.seqs.size()), 1, [&](int64_t begin, int64_t end) {
    thread_local sampler_scratch scratch;
    for (int64_t s = begin; s < end; ++s) {
      const sequence_step& q = b.seqs[s];
      if (!q.sample) continue;
      const std::span<const float> logits(&logits_[out_of_seq_[s] * v], static_cast<size_t>(v));
      const uint64_t draw = static_cast<uint64_t>(q.start_pos) + q.tokens.size();
      result.next[s] = sample(logits, q.sampling, draw, scratch, q.history, q.prompt_len);
      if (q.sampling.logprobs >= 0) result.logprobs[s] = logprob_of(logits, result.next[s], q.sampling.logprobs, scratch);
    }
  });
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    if (!b.seqs[s].want_logits) continue;
    const float* l = &logits_[out_of_seq_[s] * v];
    result.logits.insert(result.logits.end(), l, l + v);
  }
}

void cpu_backend::execute(const step_batch& b, step_result& result) {
  check(b);
  lay_out(b);
  if (n_rows_ == 0) {
    result.next.clear();
    result.logits.clear();
    result.logprobs.clear();
    return;
  }
  embed();
  const size_t split = overlap_split();
  if (split > 0) {
    run_layers_overlapped(split);
  } else {
    for (int layer = 0; layer < c_.n_layer; ++layer) {
      attention_block(layer);
      ffn_block(layer);
    }
  }
  use_rows(0, n_rows_, 0, tasks_.size());
  output(b, result);
  batch_ = nullptr;
}

// Where to split the step into two micro-batches (a sequence index), so that one's attention
// runs here while the other's experts run on their shards; 0: no split (experts in this
// process, overlap off, or a single sequence).
size_t cpu_backend::overlap_split() const {
  const size_t n = batch_->seqs.size();
  if (!o_.overlap || !experts_ || !experts_->overlaps() || n < 2) return 0;
  size_t best = 1;
  for (size_t s = 1; s < n; ++s) {
    if (std::abs(2 * first_row_[s] - n_rows_) < std::abs(2 * first_row_[best] - n_rows_)) best = s;
  }
  return best;
}

// Ping-pong over two micro-batches A and B: A's experts run on the shards while B's attention
// runs here, and the other way round, layer after layer.
void cpu_backend::run_layers_overlapped(size_t split) {
  const int64_t e = c_.n_embd;
  const auto lane = [&](int which) {
    if (which == 0) {
      use_rows(0, first_row_[split], 0, first_task_[split]);
    } else {
      use_rows(first_row_[split], n_rows_, first_task_[split], tasks_.size());
    }
  };
  routed_tokens rt[2];
  bool in_flight[2] = {false, false};
  const auto send = [&](int which, int layer) {
    lane(which);
    attention_block(layer);
    for_rows([&](int64_t r) { k_.rms_norm(&x_[r * e], layers_[layer].ffn_norm, &h_[r * e], e, c_.rms_eps); });
    moe_route(layer, rt[which]);
    experts_->start(rt[which], which);
    in_flight[which] = true;
  };
  const auto add = [&](int which) {
    lane(which);
    in_flight[which] = false;
    experts_->finish(rt[which], which, at(tmp_, e), e);
    moe_add();
  };
  try {
    send(0, 0);
    for (int layer = 0; layer < c_.n_layer; ++layer) {
      send(1, layer);
      add(0);
      if (layer + 1 < c_.n_layer) send(0, layer + 1);
      add(1);
    }
  } catch (...) {
    for (int which : {0, 1}) {
      if (in_flight[which]) experts_->abandon(which);
    }
    throw;
  }
}

void cpu_backend::copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) {
  for (auto [src, dst] : src_dst) {
    if (src < 0 || dst < 0 || src >= o_.kv_blocks || dst >= o_.kv_blocks) {
      throw std::invalid_argument(fmt::format("copy of block {} to {}: outside the pool", src, dst));
    }
    for (int layer = 0; layer < c_.n_layer; ++layer) {
      for (zeroed_pages* pool : {k_pool_.get(), v_pool_.get()}) {
        uint16_t* base = pool->as<uint16_t>() + layer * layer_stride_;
        std::memcpy(base + dst * block_stride_, base + src * block_stride_, block_stride_ * sizeof(uint16_t));
      }
    }
  }
}

}  // namespace

std::unique_ptr<backend> make_cpu_backend(std::shared_ptr<const model> m, const cpu_backend_options& o) {
  return std::make_unique<cpu_backend>(std::move(m), o);
}

}  // namespace tireless::cpu
