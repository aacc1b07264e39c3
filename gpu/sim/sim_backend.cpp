#include "gpu/sim/sim_backend.hpp"

#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace tireless::sim {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

sim_backend::sim_backend(sim_profile profile) : profile_(std::move(profile)) { validate(profile_); }

std::string sim_backend::describe() const {
  return fmt::format("sim (profile {}, {} KV blocks of {} tokens)", profile_.name, profile_.kv.n_blocks,
                     profile_.kv.block_size);
}

token_id sim_backend::token_for(uint64_t seq_id, int64_t position, uint64_t seed) const {
  const uint64_t h = mix(mix(mix(seq_id) ^ static_cast<uint64_t>(position)) ^ seed);
  const auto range = static_cast<uint64_t>(profile_.end_sampled_token - profile_.first_sampled_token);
  return profile_.first_sampled_token + static_cast<token_id>(h % range);
}

void sim_backend::check(const step_batch& b) const {
  const backend_limits& l = profile_.limits;
  const int32_t block_size = profile_.kv.block_size;
  if (static_cast<int64_t>(b.seqs.size()) > l.max_step_seqs) {
    throw std::invalid_argument(fmt::format("step has {} sequences, the limit is {}", b.seqs.size(), l.max_step_seqs));
  }
  if (b.n_tokens() > l.max_step_tokens) {
    throw std::invalid_argument(fmt::format("step has {} tokens, the limit is {}", b.n_tokens(), l.max_step_tokens));
  }
  for (const sequence_step& s : b.seqs) {
    const int64_t end = s.start_pos + static_cast<int64_t>(s.tokens.size());
    if (s.tokens.empty() || s.start_pos < 0 || end > l.max_context) {
      throw std::invalid_argument(fmt::format("sequence {}: positions {}..{} are outside 0..{}", s.seq_id,
                                              s.start_pos, end - 1, l.max_context - 1));
    }
    const int64_t blocks = (end + block_size - 1) / block_size;
    if (static_cast<int64_t>(s.block_table.size()) < blocks) {
      throw std::invalid_argument(fmt::format("sequence {}: {} blocks needed, block table has {}", s.seq_id,
                                              blocks, s.block_table.size()));
    }
    for (int64_t i = 0; i < blocks; ++i) {
      if (s.block_table[i] < 0 || s.block_table[i] >= profile_.kv.n_blocks) {
        throw std::invalid_argument(
            fmt::format("sequence {}: block {} is outside the pool", s.seq_id, s.block_table[i]));
      }
    }
    for (token_id t : s.tokens) {
      if (t < 0 || t >= profile_.n_vocab) {
        throw std::invalid_argument(fmt::format("sequence {}: token {} is outside the vocabulary", s.seq_id, t));
      }
    }
  }
}

// The log-probabilities of the sim's logits (1 at the token it chose, 0 elsewhere), in closed
// form: the sim has no model, so this is what its want_logits rows say, not a real distribution.
token_logprob sim_backend::one_hot_logprob(token_id t, int32_t top) const {
  const double log_total = std::log(std::exp(1.0) + static_cast<double>(profile_.n_vocab - 1));
  token_logprob out;
  out.token = t;
  out.logprob = static_cast<float>(1.0 - log_total);
  const int32_t n = std::min(top, profile_.n_vocab);
  if (n > 0) out.top.emplace_back(t, out.logprob);
  for (token_id other = 0; static_cast<int32_t>(out.top.size()) < n; ++other) {
    if (other != t) out.top.emplace_back(other, static_cast<float>(-log_total));
  }
  return out;
}

void sim_backend::execute(const step_batch& b, step_result& result) {
  const auto began = std::chrono::steady_clock::now();
  check(b);
  last_shape_ = shape_of(b);
  last_step_seconds_ = step_seconds(profile_, last_shape_, condition());
  for (size_t i = 0; i < events_.size(); ++i) {
    if (stalled_[i] || now_ < events_[i].at_s || last_step_seconds_ == 0.0) continue;
    stalled_[i] = 1;
    last_step_seconds_ += events_[i].stall_s;
  }
  virtual_seconds_ += last_step_seconds_;

  result.next.assign(b.seqs.size(), -1);
  result.logits.clear();
  result.logprobs.clear();
  const auto v = static_cast<size_t>(profile_.n_vocab);
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const sequence_step& s = b.seqs[i];
    if (!s.sample && !s.want_logits) continue;
    const token_id t = token_for(s.seq_id, s.start_pos + static_cast<int64_t>(s.tokens.size()), s.sampling.seed);
    if (s.sample) result.next[i] = t;
    if (s.sample && s.sampling.logprobs >= 0) {
      if (result.logprobs.empty()) result.logprobs.resize(b.seqs.size());
      result.logprobs[i] = one_hot_logprob(t, s.sampling.logprobs);
    }
    if (s.want_logits) {
      result.logits.resize(result.logits.size() + v, 0.0f);
      result.logits[result.logits.size() - v + static_cast<size_t>(t)] = 1.0f;
    }
  }

  if (real_time_ && last_step_seconds_ > 0.0) {
    std::this_thread::sleep_until(began + std::chrono::duration<double>(last_step_seconds_));
  }
}

void sim_backend::set_expert_events(std::vector<expert_event> events) {
  for (size_t i = 0; i < events.size(); ++i) {
    const expert_event& e = events[i];
    if (!profile_.ep.on()) {
      throw std::invalid_argument(fmt::format("expert event {}: sim profile '{}' has no expert-parallel group "
                                              "(set [backend.expert_parallel] degree > 1)", i, profile_.name));
    }
    if (e.down < 0 || e.down >= profile_.ep.degree || !(e.imbalance >= 1.0) || e.at_s < 0 || e.for_s < 0 || e.stall_s < 0) {
      throw std::invalid_argument(fmt::format("expert event {}: down = {} of {} devices, imbalance = {}, at {} s for {} s, "
                                              "stall {} s: at least one device must stay up, imbalance >= 1, times >= 0",
                                              i, e.down, profile_.ep.degree, e.imbalance, e.at_s, e.for_s, e.stall_s));
    }
  }
  events_ = std::move(events);
  stalled_.assign(events_.size(), 0);
}

expert_condition sim_backend::condition() const { return condition_at(events_, profile_.ep.degree, now_); }

void sim_backend::copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) {
  const int32_t n = profile_.kv.n_blocks;
  for (auto [src, dst] : src_dst) {
    if (src < 0 || dst < 0 || src >= n || dst >= n) {
      throw std::invalid_argument(fmt::format("copy of block {} to {}: outside the pool", src, dst));
    }
  }
}

std::unique_ptr<backend> make_sim_backend(const sim_profile& profile) {
  return std::make_unique<sim_backend>(profile);
}

}  // namespace tireless::sim
