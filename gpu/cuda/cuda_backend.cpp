#include "gpu/cuda/cuda_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "gpu/cuda/cuda_backend_impl.hpp"
#include "gpu/cuda/nccl_exchange.hpp"
#include "model/model.hpp"

namespace tireless::cuda {

bool cuda_built() { return true; }

bool cuda_available(std::string* why) { return device_available(why); }

namespace {

// A slice of the workspace, as the plan laid it out (workspace_of); empty slices: nullptr.
template <class T>
T* slice_of(const device_buffer& b, const workspace_slice& s) {
  if (s.at < 0 || s.end() > static_cast<int64_t>(b.size())) throw std::logic_error("cuda_backend: a workspace slice past its end");
  return s.bytes > 0 ? reinterpret_cast<T*>(static_cast<char*>(b.data()) + s.at) : nullptr;
}

// A typed slice of one device allocation, the next after `at` (a peer rank's buffers).
template <class T>
T* carve(device_buffer& b, size_t& at, int64_t count) {
  at = (at + 255) / 256 * 256;
  T* p = reinterpret_cast<T*>(static_cast<char*>(b.data()) + at);
  at += static_cast<size_t>(count) * sizeof(T);
  if (at > b.size()) throw std::logic_error("cuda_backend: workspace carved past its end");
  return p;
}

// A q8_space of `rows` rows of up to `widest` values, the next after `at`.
q8_space carve_q8(device_buffer& b, size_t& at, int64_t rows, int64_t widest) {
  const int64_t blocks = (widest + 31) / 32;
  q8_space q;
  q.q = carve<int8_t>(b, at, rows * blocks * 32);
  q.d = carve<float>(b, at, rows * blocks);
  q.s = carve<float>(b, at, rows * blocks);
  return q;
}

int default_threads(int asked) {
  return asked > 0 ? asked : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

}  // namespace

cuda_backend::cuda_backend(std::shared_ptr<const model> m, const cuda_backend_options& o)
    : model_(std::move(m)), c_(model_->config()), o_(o), sampling_(default_threads(o.sampling_threads)) {
  if (o_.max_context <= 0) o_.max_context = c_.n_ctx_train;
  if (o_.block_size < 8 || o_.block_size > 256 || o_.block_size % 8 != 0) {
    throw std::invalid_argument(fmt::format("kv block size {}: the CUDA backend needs a multiple of 8 up to 256 (8, 16, 32, 64)",
                                            o_.block_size));
  }
  if (o_.max_step_tokens <= 0 || o_.max_step_seqs <= 0) {
    throw std::invalid_argument("max_step_tokens and max_step_seqs must be positive");
  }
  if (c_.head_dim % 8 != 0 || c_.head_dim > 256) {
    throw std::invalid_argument(fmt::format("head size {} is not supported by the CUDA backend (a multiple of 8, at most 256)",
                                            c_.head_dim));
  }
  if (c_.is_moe() && (c_.n_expert > 1024 || c_.n_expert_used > 16)) {
    throw std::invalid_argument(fmt::format("{} experts, {} a token: the CUDA backend routes at most 1024 experts, 16 a token",
                                            c_.n_expert, c_.n_expert_used));
  }
  std::string why;
  if (!device_available(&why)) {
    throw std::runtime_error(fmt::format("backend.kind = \"cuda\": no usable CUDA device here ({}); use kind = \"cpu\" or "
                                         "\"auto\", or run on a machine with an NVIDIA GPU and its driver",
                                         why));
  }
  expert_group_request gr;
  gr.devices = o_.devices;
  gr.devices_present = device_count();
  gr.nccl_built = nccl_built();
  gr.n_expert = c_.n_expert;
  gr.n_expert_used = c_.n_expert_used;
  gr.max_step_tokens = o_.max_step_tokens;
  gr.hidden = c_.n_embd;
  group_ = plan_expert_groups(gr);
  set_device(group_.devices[0]);
  device_ = info_of(group_.devices[0]);
  stream_ = std::make_unique<stream>();
  blas_ = std::make_unique<blas>(stream_->handle());

  // kv_blocks 0: the plan gives the pool what weights, workspace and reserve leave of the
  // device's free memory; more blocks than fit are refused, saying how many do.
  memory_request& r = request_;
  r.device_bytes = device_.free_bytes;
  const int32_t local_experts = c_.is_moe() ? group_.first_expert[1] - group_.first_expert[0] : 0;
  r.weight_bytes = weight_bytes(*model_, true, 0, local_experts);
  r.kv_bytes_per_token = int64_t{c_.n_layer} * c_.kv_dim() * 2 * 2;
  r.block_size = o_.block_size;
  r.max_step_tokens = o_.max_step_tokens;
  r.max_step_seqs = o_.max_step_seqs;
  r.max_context = o_.max_context;
  r.hidden = c_.n_embd, r.ffn = c_.n_ff, r.vocab = c_.n_vocab, r.q_dim = c_.q_dim(), r.kv_dim = c_.kv_dim();
  r.n_head = c_.n_head, r.n_head_kv = c_.n_head_kv, r.n_layer = c_.n_layer;
  r.multiprocessors = device_.multiprocessors;
  r.n_expert = c_.n_expert, r.n_expert_used = c_.n_expert_used;
  r.kv_blocks = std::max(o_.kv_blocks, 0);
  plan_ = plan_memory(r);
  layout_ = workspace_of(r);

  w_ = upload_dense_weights(*model_);
  if (c_.is_moe()) experts_ = upload_experts(*model_, 0, local_experts);

  kv_.n_layer = c_.n_layer;
  kv_.n_blocks = plan_.kv_blocks;
  kv_.block_size = o_.block_size;
  kv_.n_head_kv = c_.n_head_kv;
  kv_.head_dim = c_.head_dim;
  const size_t pool = static_cast<size_t>(kv_.layer_stride()) * c_.n_layer * sizeof(uint16_t);
  k_pool_ = device_buffer(pool);
  v_pool_ = device_buffer(pool);
  k_pool_.zero();  // finite everywhere, also in slots attention never reads
  v_pool_.zero();
  kv_.k = k_pool_.as<uint16_t>();
  kv_.v = v_pool_.as<uint16_t>();
  kv_block_bytes_ = kv_.block_stride() * c_.n_layer * 2 * static_cast<int64_t>(sizeof(uint16_t));

  ashape_.n_head = c_.n_head;
  ashape_.n_head_kv = c_.n_head_kv;
  ashape_.head_dim = c_.head_dim;
  ashape_.rope_dims = c_.rope_dims;
  ashape_.rope_base = c_.rope_base;
  ashape_.scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
  sshape_.block_size = o_.block_size;
  sshape_.n_head_kv = c_.n_head_kv;
  sshape_.group = c_.n_head / c_.n_head_kv;
  qkv_ld_ = c_.q_dim() + 2 * c_.kv_dim();
  buckets_ = graph_buckets(std::min(o_.max_step_seqs, o_.max_step_tokens));
  allocate_workspace();
  if (group_.exchanges()) set_up_expert_group();
  synchronize();
  // The weights are in device memory now; the file's pages can go.
  model_->file().release_pages();
}

cuda_backend::~cuda_backend() {
  try {
    set_device(group_.devices.empty() ? 0 : group_.devices[0]);
    if (stream_) stream_->synchronize();
  } catch (...) {
  }
}

// The one workspace allocation, carved as the plan laid it out: what the plan set aside is
// what is allocated.
void cuda_backend::allocate_workspace() {
  const workspace_layout& l = layout_;
  if (l.total != plan_.activations) throw std::logic_error("cuda_backend: the workspace differs from the memory plan's");
  work_ = device_buffer(static_cast<size_t>(l.total));
  x_ = slice_of<float>(work_, l.x);
  h_ = slice_of<float>(work_, l.h);
  qkv_ = slice_of<float>(work_, l.qkv);
  att_ = slice_of<float>(work_, l.att);
  logits_ = slice_of<float>(work_, l.logits);
  partial_ = slice_of<float>(work_, l.partial);
  moe_.ffn_in = slice_of<float>(work_, l.ffn_in);
  moe_.act = slice_of<float>(work_, l.ffn_act);
  q8_.q = slice_of<int8_t>(work_, l.q8_q);
  q8_.d = slice_of<float>(work_, l.q8_d);
  q8_.s = slice_of<float>(work_, l.q8_s);
  moe_.q8 = q8_;
  scratch_.cublas = blas_.get();
  scratch_.halves = slice_of<uint16_t>(work_, l.halves);
  scratch_.halves_bytes = static_cast<size_t>(l.halves.bytes);
  argmax_ = slice_of<int32_t>(work_, l.argmax);
  words_ = slice_of<int32_t>(work_, l.inputs);
  if (c_.is_moe()) {
    router_ = slice_of<float>(work_, l.router);
    gates_ = slice_of<float>(work_, l.gates);
    chosen_ = slice_of<int32_t>(work_, l.chosen);
    pair_row_ = slice_of<int32_t>(work_, l.pair_row);
    slot_pair_ = slice_of<int32_t>(work_, l.slot_pair);
    offsets_ = slice_of<int32_t>(work_, l.offsets);
    moe_.x = slice_of<float>(work_, l.pairs_in);
    moe_.y = slice_of<float>(work_, l.pairs_out);
    moe_.offsets = offsets_;
    counts_ = slice_of<unsigned long long>(work_, l.counts);
  }
  work_.zero();
  const int64_t seqs = std::min(o_.max_step_seqs, o_.max_step_tokens);
  words_host_ = pinned_buffer(static_cast<size_t>(l.inputs.bytes));
  words_sent_ = std::make_unique<event>();
  argmax_host_ = pinned_buffer(static_cast<size_t>(seqs) * 4);
  logits_host_ = pinned_buffer(static_cast<size_t>(seqs) * c_.n_vocab * 4);
  if (c_.is_moe()) offsets_host_ = pinned_buffer(static_cast<size_t>(c_.n_expert + 1) * 4);
}

// Ranks 1.. of the expert group: their experts and buffers on their devices, then the
// communicators (rank order, one call).
void cuda_backend::set_up_expert_group() {
  const int64_t pairs = group_.max_pairs, e = c_.n_embd, ff = c_.n_ff;
  const int64_t widest = std::max(e, ff);
  for (int32_t r = 1; r < group_.ranks(); ++r) {
    peer_rank p;
    p.device = group_.devices[r];
    p.first_expert = group_.first_expert[r];
    p.n_experts = group_.first_expert[r + 1] - p.first_expert;
    set_device(p.device);
    p.s = std::make_unique<stream>();
    p.experts = upload_experts(*model_, p.first_expert, p.n_experts);
    const int64_t bytes = 16 * 256 + (pairs * e * 2 + pairs * 3 * ff) * 4 + pairs * ((widest + 31) / 32) * 40 +
                          (p.n_experts + 1) * 4;
    p.memory = device_buffer(static_cast<size_t>(bytes));
    size_t at = 0;
    p.space.x = carve<float>(p.memory, at, pairs * e);
    p.space.y = carve<float>(p.memory, at, pairs * e);
    p.space.ffn_in = carve<float>(p.memory, at, pairs * 2 * ff);
    p.space.act = carve<float>(p.memory, at, pairs * ff);
    p.space.q8 = carve_q8(p.memory, at, pairs, widest);
    p.space.offsets = carve<int32_t>(p.memory, at, p.n_experts + 1);
    p.offsets_host = pinned_buffer(static_cast<size_t>(c_.n_layer) * (p.n_experts + 1) * 4);
    p.offsets_sent.resize(static_cast<size_t>(c_.n_layer));  // events of this device
    synchronize();
    peers_.push_back(std::move(p));
  }
  set_device(group_.devices[0]);
  nccl_ = std::make_unique<nccl_group>(group_.devices);
}

std::string cuda_backend::describe() const {
  std::string experts;
  if (group_.exchanges()) {
    experts = fmt::format(", experts over {} GPUs (NCCL)", group_.ranks());
  } else if (!group_.fallback.empty()) {
    experts = ", " + group_.fallback;
  }
  return fmt::format("cuda ({} (device {}), {}; graphs {}{})", device_.name, group_.devices[0], plan_.describe(),
                     o_.graphs ? "on" : "off", experts);
}

// A prior, before anything was measured: the weights' bytes streamed at ~3 TB/s and ~12
// launches a layer of a few microseconds for a step; products at ~100 dense TFLOP/s for
// prefill, ~30 for decode rows; the KV cache read at ~3 TB/s.
step_cost_prior cuda_backend::cost_prior() const {
  const double macs = c_.n_layer * (double(c_.n_embd) * c_.q_dim() * 2 + double(c_.n_embd) * c_.kv_dim() * 2 +
                                    double(c_.n_embd) * c_.n_ff * 3 * std::max(1, c_.n_expert_used)) +
                      double(c_.n_embd) * c_.n_vocab;
  const double c0 = double(plan_.weights) / 3e12 + c_.n_layer * 12 * 3e-6;
  const double kv_per_thousand = 1000.0 * c_.n_layer * c_.kv_dim() * 4 / 3e12;
  return {c0, 2 * macs / 100e12, 2 * macs / 30e12, kv_per_thousand};
}

void cuda_backend::check(const step_batch& b) const {
  if (static_cast<int64_t>(b.seqs.size()) > o_.max_step_seqs) {
    throw std::invalid_argument(fmt::format("step has {} sequences, the limit is {}", b.seqs.size(), o_.max_step_seqs));
  }
  if (b.n_tokens() > o_.max_step_tokens) {
    throw std::invalid_argument(fmt::format("step has {} tokens, the limit is {}", b.n_tokens(), o_.max_step_tokens));
  }
  for (const sequence_step& s : b.seqs) {
    const int64_t end = s.start_pos + static_cast<int64_t>(s.tokens.size());
    if (s.tokens.empty() || s.start_pos < 0 || end > o_.max_context) {
      throw std::invalid_argument(fmt::format("sequence {}: positions {}..{} are outside 0..{}", s.seq_id, s.start_pos,
                                              end - 1, o_.max_context - 1));
    }
    const int64_t blocks = (end + o_.block_size - 1) / o_.block_size;
    if (static_cast<int64_t>(s.block_table.size()) < blocks) {
      throw std::invalid_argument(fmt::format("sequence {}: {} blocks needed, block table has {}", s.seq_id, blocks,
                                              s.block_table.size()));
    }
    for (int64_t i = 0; i < blocks; ++i) {
      if (s.block_table[i] < 0 || s.block_table[i] >= kv_.n_blocks) {
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

step_view cuda_backend::view_of_step(const step_inputs& in) const {
  step_view v;
  v.words = words_;
  v.tokens = words_ + in.tokens_at;
  v.pos = words_ + in.pos_at;
  v.row_seq = words_ + in.row_seq_at;
  v.seq_start = words_ + in.seq_start_at;
  v.seq_len = words_ + in.seq_len_at;
  v.seq_row = words_ + in.seq_row_at;
  v.items = words_ + in.items_at;
  v.outs = words_ + in.outs_at;
  v.table = words_ + in.table_at;
  v.rows = in.rows;
  v.seqs = in.seqs;
  v.items_n = in.items;
  v.outs_n = in.outs;
  return v;
}

void cuda_backend::execute(const step_batch& b, step_result& result) {
  check(b);
  result.next.clear();
  result.logits.clear();
  result.logprobs.clear();
  if (b.seqs.empty()) return;
  set_device(group_.devices[0]);
  const bool graphed = o_.graphs && !group_.exchanges();
  const int32_t bucket = graphed ? graph_bucket_for(b, buckets_) : -1;
  const step_inputs in = pack_step(b, sshape_, bucket > 0 ? bucket : 0);
  if (static_cast<int64_t>(in.words.size()) * 4 > layout_.inputs.bytes) {
    throw std::logic_error("cuda_backend: a step's inputs outgrew max_step_words");
  }
  words_sent_->synchronize();
  std::memcpy(words_host_.data(), in.words.data(), in.words.size() * 4);
  copy_to_device_async(words_, words_host_.data(), in.words.size() * 4, stream_->handle());
  words_sent_->record(stream_->handle());
  const step_view st = view_of_step(in);
  rows_ = in.rows;
  outs_ = in.outs;
  if (bucket > 0) {
    // A graph's shape is its bucket's: its grid has the splits of the longest context there
    // may be, and each item uses only the splits its own context needs (read on the device).
    const int32_t splits = checked_splits(attention_splits(in.items, o_.max_context, device_.multiprocessors), in);
    std::unique_ptr<graph>& g = graphs_[bucket];
    if (!g) g = std::make_unique<graph>();
    if (g->ready()) {
      g->launch(stream_->handle());
    } else if (!warmed_.count(bucket) || uncapturable_.count(bucket)) {
      forward(st, splits);  // first time: run as launched (lazy initializations happen here)
      warmed_.insert(bucket);
    } else {
      bool captured = false;
      try {
        g->begin_capture(stream_->handle());
        try {
          forward(st, splits);
        } catch (...) {
          try {
            g->end_capture(stream_->handle());
          } catch (...) {
          }
          throw;
        }
        g->end_capture(stream_->handle());
        captured = true;
      } catch (const std::runtime_error&) {
        // CUDA refused the capture (a launch it cannot record): this bucket runs as launched.
        clear_last_error();
        g.reset();
        uncapturable_.insert(bucket);
      }
      if (captured) {
        g->launch(stream_->handle());
      } else {
        forward(st, splits);
      }
    }
  } else {
    int32_t longest = 0;
    for (const sequence_step& s : b.seqs) longest = std::max(longest, s.start_pos + static_cast<int32_t>(s.tokens.size()));
    forward(st, checked_splits(attention_splits(in.items, longest, device_.multiprocessors), in));
  }
  results(b, in, result);
}

int32_t cuda_backend::checked_splits(int32_t splits, const step_inputs& in) const {
  if (splits > 1 && attention_partial_floats(in.items, splits, c_.head_dim) * 4 > layout_.partial.bytes) {
    throw std::logic_error("cuda_backend: split attention outgrew its partial-results buffer");
  }
  return splits;
}

void cuda_backend::results(const step_batch& b, const step_inputs& in, step_result& result) {
  void* s = stream_->handle();
  const size_t v = static_cast<size_t>(c_.n_vocab);
  copy_to_host_async(argmax_host_.data(), argmax_, static_cast<size_t>(in.outs) * 4, s);
  // Logits come down only for the rows that need them: asked for, or sampled on the host.
  const auto on_host = [](const sequence_step& q) {
    return q.sample && ((q.sampling.temperature > 0.0f && q.sampling.top_k != 1) || q.sampling.penalized() ||
                        q.sampling.logprobs >= 0);
  };
  std::vector<char> needs(b.seqs.size(), 0);
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const int32_t out = in.out_of_seq[i];
    if (out < 0 || !(b.seqs[i].want_logits || on_host(b.seqs[i]))) continue;
    needs[i] = 1;
    copy_to_host_async(logits_host_.as<float>() + out * v, logits_ + out * v, v * 4, s);
  }
  stream_->synchronize();
  result.next.assign(b.seqs.size(), -1);
  const bool any_logprobs = std::any_of(b.seqs.begin(), b.seqs.end(), [](const sequence_step& q) {
    return q.sample && q.sampling.logprobs >= 0;
  });
  if (any_logprobs) result.logprobs.resize(b.seqs.size());
  const int32_t* greedy = argmax_host_.as<int32_t>();
  const float* logits = logits_host_.as<float>();
  const bool host_sampling = std::any_of(b.seqs.begin(), b.seqs.end(), on_host);
  auto choose = [&](int64_t begin, int64_t end) {
    thread_local sampler_scratch scratch;
    for (int64_t i = begin; i < end; ++i) {
      const sequence_step& q = b.seqs[i];
      if (!q.sample) continue;
      const int32_t out = in.out_of_seq[i];
      if (!on_host(q)) {
        result.next[i] = greedy[out];
        continue;
      }
      const std::span<const float> row(logits + out * v, v);
      const uint64_t draw = static_cast<uint64_t>(q.start_pos) + q.tokens.size();
      result.next[i] = sample(row, q.sampling, draw, scratch, q.history, q.prompt_len);
      if (q.sampling.logprobs >= 0) result.logprobs[i] = logprob_of(row, result.next[i], q.sampling.logprobs, scratch);
    }
  };
  // Greedy steps need no workers: the device chose.
  if (host_sampling) {
    sampling_.parallel_for(static_cast<int64_t>(b.seqs.size()), 1, choose);
  } else {
    choose(0, static_cast<int64_t>(b.seqs.size()));
  }
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    if (!b.seqs[i].want_logits) continue;
    const float* l = logits + in.out_of_seq[i] * v;
    result.logits.insert(result.logits.end(), l, l + v);
  }
}

void cuda_backend::copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) {
  if (src_dst.empty()) return;
  std::vector<int32_t> pairs;
  for (auto [src, dst] : src_dst) {
    if (src < 0 || dst < 0 || src >= kv_.n_blocks || dst >= kv_.n_blocks) {
      throw std::invalid_argument(fmt::format("copy of block {} to {}: outside the pool", src, dst));
    }
    pairs.push_back(src);
    pairs.push_back(dst);
  }
  set_device(group_.devices[0]);
  // Through the step-inputs buffers, which no step uses meanwhile (the engine calls execute and
  // copy_blocks from one thread; each returns synchronized). In order, as the CPU copies.
  const size_t room = words_host_.size() / 4 / 2 * 2;
  for (size_t at = 0; at < pairs.size();) {
    const size_t n = std::min(pairs.size() - at, room);
    words_sent_->synchronize();
    std::memcpy(words_host_.data(), pairs.data() + at, n * 4);
    copy_to_device_async(words_, words_host_.data(), n * 4, stream_->handle());
    words_sent_->record(stream_->handle());
    copy_kv_blocks(kv_, words_, static_cast<int32_t>(n / 2), stream_->handle());
    stream_->synchronize();
    at += n;
  }
}

std::vector<int64_t> cuda_backend::expert_tokens() const {
  if (!c_.is_moe()) return {};
  const size_t n = static_cast<size_t>(c_.n_layer) * static_cast<size_t>(c_.n_expert);
  std::vector<unsigned long long> counts(n);
  set_device(group_.devices[0]);
  stream_->synchronize();
  copy_to_host(counts.data(), counts_, n * sizeof(unsigned long long));
  return std::vector<int64_t>(counts.begin(), counts.end());
}

std::unique_ptr<backend> make_cuda_backend(std::shared_ptr<const model> m, const cuda_backend_options& o) {
  return std::make_unique<cuda_backend>(std::move(m), o);
}

}  // namespace tireless::cuda
