// bench_block_manager: the KV block accounting's cost per sequence and per step
// (pool of 16-token blocks).
//
//   sequence_lifecycle/shared:0  admit a 512-token prompt with no cached prefix, commit it,
//                                decode 64 tokens (grow + commit each), release. Steady state:
//                                the pool is full of cached blocks, so every block evicts one
//   sequence_lifecycle/shared:1  the same, every prompt finding 31 of its 32 blocks cached
//   step_grow/256                one decode step of 256 running sequences: grow() each by one
//   step_grow_commit/256         the same plus commit() of the new token
#include <benchmark/benchmark.h>

#include <numeric>
#include <vector>

#include "scheduler/block_manager.hpp"

namespace {

using namespace tireless;

constexpr int32_t block_size = 16;
constexpr int32_t prompt_tokens = 512;
constexpr int32_t decode_tokens = 64;

std::vector<token_id> tokens_of(int32_t n, token_id first) {
  std::vector<token_id> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

void sequence_lifecycle(benchmark::State& state) {
  const bool shared = state.range(0) != 0;
  block_manager m({.n_blocks = 1 << 14, .block_size = block_size});
  auto tokens = tokens_of(prompt_tokens + decode_tokens, 1000);
  const auto prompt = std::span<const token_id>(tokens).first(prompt_tokens);
  seq_id seq = 0;
  int64_t cached = 0;
  for (auto _ : state) {
    ++seq;
    if (!shared) tokens[0] = static_cast<token_id>(seq);  // changes every block's key
    cached += m.admit(seq, prompt, prompt_tokens).value_or(-1);
    m.commit(seq, tokens, prompt_tokens);
    for (int32_t n = prompt_tokens + 1; n <= prompt_tokens + decode_tokens; ++n) {
      m.grow(seq, n);
      m.commit(seq, tokens, n);
    }
    m.release(seq);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["cached_tokens_per_seq"] =
      static_cast<double>(cached) / static_cast<double>(state.iterations());
  state.counters["evictions_per_seq"] =
      static_cast<double>(m.stats().evictions) / static_cast<double>(state.iterations());
}

// One decode step of n running sequences, each growing by one position (a new block every
// block_size steps), optionally committing the new token.
void step(benchmark::State& state, bool with_commit) {
  const auto n_seqs = static_cast<int32_t>(state.range(0));
  constexpr int32_t max_positions = 2048;
  block_manager m({.n_blocks = n_seqs * max_positions / block_size, .block_size = block_size});
  std::vector<std::vector<token_id>> tokens(n_seqs);
  auto start = [&] {
    for (int32_t i = 0; i < n_seqs; ++i) {
      if (m.has(i)) m.release(i);
      tokens[i] = tokens_of(max_positions, i * max_positions);
      m.admit(i, std::span<const token_id>(tokens[i]).first(128), 128);
      m.commit(i, tokens[i], 128);
    }
  };
  start();
  int32_t n = 128;
  for (auto _ : state) {
    if (n == max_positions) {
      state.PauseTiming();
      start();
      n = 128;
      state.ResumeTiming();
    }
    ++n;
    for (int32_t i = 0; i < n_seqs; ++i) {
      benchmark::DoNotOptimize(m.grow(i, n));
      if (with_commit) m.commit(i, tokens[i], n);
    }
  }
  state.SetItemsProcessed(state.iterations() * n_seqs);
}

void step_grow(benchmark::State& state) { step(state, false); }
void step_grow_commit(benchmark::State& state) { step(state, true); }

}  // namespace

BENCHMARK(sequence_lifecycle)->ArgName("shared")->Arg(0)->Arg(1);
BENCHMARK(step_grow)->Arg(256);
BENCHMARK(step_grow_commit)->Arg(256);
BENCHMARK_MAIN();
