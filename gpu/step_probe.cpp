#include "gpu/step_probe.hpp"

#include <algorithm>
#include <chrono>

namespace tireless {
namespace {

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double seconds_of(backend& b, const step_batch& batch) {
  step_result result;
  const auto start = std::chrono::steady_clock::now();
  b.execute(batch, result);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

step_cost_prior probe_step_cost(backend& b, int32_t seqs) {
  const step_cost_prior prior = b.cost_prior();
  const kv_geometry kv = b.kv();
  const backend_limits lim = b.limits();
  constexpr int32_t prefills = 3, decodes = 5;  // the first decode step is a warm-up
  const int32_t prompt = std::min({64, lim.max_step_tokens, lim.max_context - 1});
  if (prompt < 1 || kv.block_size < 1) return prior;
  // Sequence 0 takes the prompt's blocks (its prefills overwrite the same positions). The
  // decoding sequences decode from position `context` on (a chat's length, less where the pool is
  // small) over the fresh pool's zeroed keys and values: a step costs the same whatever they hold.
  const int32_t prompt_blocks = (prompt + kv.block_size - 1) / kv.block_size;
  const int32_t n = std::min({seqs, lim.max_step_seqs, lim.max_step_tokens});
  if (n < 2) return prior;
  const int32_t blocks_each = (kv.n_blocks - prompt_blocks) / n;
  const int32_t context = std::min(128, std::min(blocks_each * kv.block_size, lim.max_context) - decodes);
  if (context < 1) return prior;
  const int32_t per_seq = (context + decodes + kv.block_size - 1) / kv.block_size;
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(n) + 1);
  for (int32_t k = 0; k < prompt_blocks; ++k) tables[0].push_back(k);
  for (int32_t s = 1; s <= n; ++s) {
    for (int32_t k = 0; k < per_seq; ++k) tables[static_cast<size_t>(s)].push_back(prompt_blocks + (s - 1) * per_seq + k);
  }
  // Any tokens of the vocabulary: a step costs the same whatever they are.
  const std::vector<token_id> tokens(static_cast<size_t>(prompt), std::min<token_id>(1, b.n_vocab() - 1));
  auto step_of = [&](int32_t s, int32_t start, int32_t count) {
    sequence_step q;
    q.seq_id = static_cast<uint64_t>(s) + 1;
    q.tokens = std::span<const token_id>(tokens.data(), static_cast<size_t>(count));
    q.start_pos = start;
    q.block_table = tables[static_cast<size_t>(s)];
    q.sample = true;
    return q;
  };
  std::vector<double> prefill;
  for (int32_t i = 0; i < prefills; ++i) {
    step_batch batch;
    batch.seqs.push_back(step_of(0, 0, prompt));
    prefill.push_back(seconds_of(b, batch));
  }
  std::vector<double> decode;
  for (int32_t d = 0; d < decodes; ++d) {
    step_batch batch;
    for (int32_t s = 1; s <= n; ++s) batch.seqs.push_back(step_of(s, context + d, 1));
    const double t = seconds_of(b, batch);
    if (d > 0) decode.push_back(t);
  }
  auto scale = [](double actual, double predicted) {
    return predicted > 0 ? std::clamp(actual / predicted, 0.01, 100.0) : 1.0;
  };
  step_cost_prior p = prior;
  const double fixed = scale(median(prefill), prior.c0 + prompt * prior.per_prefill_token);
  p.c0 *= fixed;
  p.per_prefill_token *= fixed;
  // The decode steps' ratio as a whole (their share of the fixed cost left in: a difference of
  // two noisy times could read as nothing).
  const double positions = n * (context + decodes / 2.0 + 1) / 1000.0;
  const double per_decode =
      scale(median(decode), prior.c0 + n * prior.per_decode_seq + positions * prior.per_thousand_context);
  p.per_decode_seq *= per_decode;
  p.per_thousand_context *= per_decode;
  return p;
}

}  // namespace tireless
