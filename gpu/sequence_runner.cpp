#include "gpu/sequence_runner.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

namespace tireless {

namespace {

struct live_sequence {
  std::vector<int32_t> blocks;
  std::vector<token_id> tokens;  // prompt, then generated
  size_t prompt_size = 0;
  int32_t done_positions = 0;    // positions already in the KV cache
  bool finished = false;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::vector<generation_output> sequence_runner::run(const std::vector<generation_request>& reqs,
                                                    const token_callback& on_token) {
  const kv_geometry kv = backend_.kv();
  const backend_limits lim = backend_.limits();
  std::vector<live_sequence> seqs(reqs.size());
  std::vector<generation_output> out(reqs.size());
  int32_t next_block = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& r = reqs[i];
    if (r.prompt.empty()) throw std::invalid_argument(fmt::format("request {} has an empty prompt", i));
    const int64_t positions = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
    if (positions > lim.max_context) {
      throw std::invalid_argument(fmt::format("request {} needs {} positions; the context holds {}",
                                              i, positions, lim.max_context));
    }
    const int32_t n_blocks = static_cast<int32_t>((positions + kv.block_size - 1) / kv.block_size);
    if (next_block + n_blocks > kv.n_blocks) {
      throw std::invalid_argument(fmt::format("the requests need more than the pool's {} KV blocks", kv.n_blocks));
    }
    seqs[i].blocks.resize(n_blocks);
    std::iota(seqs[i].blocks.begin(), seqs[i].blocks.end(), next_block);
    next_block += n_blocks;
    seqs[i].tokens = r.prompt;
    seqs[i].prompt_size = r.prompt.size();
  }

  step_batch batch;
  step_result result;
  std::vector<size_t> owner;
  auto finish_token = [&](size_t i, token_id t) {
    live_sequence& s = seqs[i];
    const auto& r = reqs[i];
    s.tokens.push_back(t);
    out[i].tokens.push_back(t);
    const bool stop_token = std::find(r.stop_tokens.begin(), r.stop_tokens.end(), t) != r.stop_tokens.end();
    const bool keep_going = on_token ? on_token(i, t) : true;
    if (stop_token || !keep_going) out[i].stopped = true;
    if (out[i].stopped || static_cast<int32_t>(out[i].tokens.size()) >= r.max_tokens) s.finished = true;
  };
  auto run_step = [&](double& seconds, int64_t& counter) {
    const auto t0 = std::chrono::steady_clock::now();
    backend_.execute(batch, result);
    seconds += seconds_since(t0);
    counter += batch.n_tokens();
    ++stats_.steps;
    size_t logit_row = 0;
    for (size_t j = 0; j < batch.seqs.size(); ++j) {
      const sequence_step& st = batch.seqs[j];
      live_sequence& s = seqs[owner[j]];
      s.done_positions = st.start_pos + static_cast<int32_t>(st.tokens.size());
      if (st.want_logits) {
        const float* l = result.logits.data() + logit_row++ * backend_.n_vocab();
        out[owner[j]].logits.emplace_back(l, l + backend_.n_vocab());
      }
      if (st.sample) finish_token(owner[j], result.next[j]);
    }
  };

  // Prefill: chunks of prompts packed into steps of at most max_step_tokens.
  for (;;) {
    batch.seqs.clear();
    owner.clear();
    int64_t budget = lim.max_step_tokens;
    for (size_t i = 0; i < seqs.size() && budget > 0 && static_cast<int32_t>(batch.seqs.size()) < lim.max_step_seqs; ++i) {
      live_sequence& s = seqs[i];
      const int64_t left = static_cast<int64_t>(s.prompt_size) - s.done_positions;
      if (left <= 0) continue;
      const int64_t n = std::min(left, budget);
      sequence_step st;
      st.seq_id = i;
      st.tokens = std::span<const token_id>(s.tokens.data() + s.done_positions, static_cast<size_t>(n));
      st.start_pos = s.done_positions;
      st.block_table = s.blocks;
      st.sample = n == left;  // the last chunk gives the first generated token
      st.sampling = reqs[i].sampling;
      st.want_logits = st.sample && reqs[i].keep_logits;
      if (st.sampling.penalized()) {
        st.history = std::span<const token_id>(s.tokens.data(), static_cast<size_t>(s.done_positions + n));
        st.prompt_len = static_cast<int32_t>(s.prompt_size);
      }
      batch.seqs.push_back(st);
      owner.push_back(i);
      budget -= n;
    }
    if (batch.seqs.empty()) break;
    run_step(stats_.prefill_seconds, stats_.prefill_tokens);
  }
  // Decode: one token for every unfinished sequence per step.
  for (;;) {
    batch.seqs.clear();
    owner.clear();
    for (size_t i = 0; i < seqs.size() && static_cast<int32_t>(batch.seqs.size()) < lim.max_step_seqs; ++i) {
      live_sequence& s = seqs[i];
      if (s.finished) continue;
      sequence_step st;
      st.seq_id = i;
      st.tokens = std::span<const token_id>(&s.tokens.back(), 1);
      st.start_pos = s.done_positions;
      st.block_table = s.blocks;
      st.sample = true;
      st.sampling = reqs[i].sampling;
      st.want_logits = reqs[i].keep_logits;
      if (st.sampling.penalized()) {
        st.history = s.tokens;
        st.prompt_len = static_cast<int32_t>(s.prompt_size);
      }
      batch.seqs.push_back(st);
      owner.push_back(i);
    }
    if (batch.seqs.empty()) break;
    run_step(stats_.decode_seconds, stats_.decode_tokens);
  }
  return out;
}

}  // namespace tireless
