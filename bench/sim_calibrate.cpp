// sim_calibrate: fits the sim backend's step cost model to the real cpu backend on this
// machine, for the cpu-smollm2 profile (gpu/sim/sim_profile.cpp).
//
//   sim_calibrate [--model PATH] [--threads 2] [--reps 5] [--pool-blocks 2048]
//
// Runs a grid of steps (single prefill chunks of 32..512 tokens at positions 0..4096, batches
// of prefill chunks, decode batches of 1..256 sequences at contexts 16..4096, mixed steps),
// each sequence on its own KV blocks, all blocks written beforehand (unwritten pages would
// read as the shared zero page, faster than real memory). Every step is timed `reps` times,
// in a shuffled order each round. Fits by least squares on relative error, with non-negative
// coefficients, with one context coefficient for every query token (c_prefill_ctx unset) and
// with prefill's context apart, to the median and to the fastest of each step's repetitions.
// Sharing the machine only ever slows a step, so on a busy machine the fastest repetition is
// the steadier estimate of what the machine does; the profile takes that fit. Prints the fits,
// each point's error, the spread of the repetitions and the load average.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <string>

#include "gpu/cpu/cpu_backend.hpp"
#include "gpu/sim/sim_profile.hpp"
#include "model/model.hpp"
#include "tools/default_model.hpp"

namespace {

using namespace tireless;

struct chunk {
  int32_t tokens = 0;
  int32_t start = 0;
};

struct grid_point {
  std::string label;
  std::vector<chunk> chunks;
  std::vector<double> seconds;  // one per repetition
};

// A step whose sequences own consecutive, disjoint runs of blocks from block 0.
class step_builder {
 public:
  step_builder(const std::vector<chunk>& chunks, int32_t block_size, int32_t pool_blocks) {
    int32_t next_block = 0;
    tokens_.resize(chunks.size());
    tables_.resize(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      const chunk& c = chunks[i];
      for (int32_t t = 0; t < c.tokens; ++t) tokens_[i].push_back(1000 + (t * 7919 + static_cast<int32_t>(i) * 104729) % 30000);
      const int32_t blocks = (c.start + c.tokens + block_size - 1) / block_size;
      if (next_block + blocks > pool_blocks) throw std::runtime_error("grid point needs more KV blocks than the pool has");
      for (int32_t b = 0; b < blocks; ++b) tables_[i].push_back(next_block++);
      sequence_step s;
      s.seq_id = i;
      s.tokens = tokens_[i];
      s.start_pos = c.start;
      s.block_table = tables_[i];
      s.sample = true;  // a decode samples; so does a prompt's last chunk
      batch_.seqs.push_back(s);
    }
  }
  const step_batch& batch() const { return batch_; }

 private:
  std::vector<std::vector<token_id>> tokens_;
  std::vector<std::vector<int32_t>> tables_;
  step_batch batch_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::vector<grid_point> make_grid(int32_t block_size, int32_t pool_blocks) {
  std::vector<grid_point> grid;
  auto fits = [&](const std::vector<chunk>& cs) {
    int64_t blocks = 0;
    for (const chunk& c : cs) blocks += (c.start + c.tokens + block_size - 1) / block_size;
    return blocks <= pool_blocks;
  };
  for (int32_t n : {32, 128, 256, 512}) {
    for (int32_t start : {0, 512, 2048, 4096}) {
      if (n * start > 128 * 4096) continue;  // the longest steps would take most of the run
      if (fits({{n, start}})) grid.push_back({fmt::format("prefill {}@{}", n, start), {{n, start}}, {}});
    }
  }
  const std::vector<chunk> four(4, {128, 0}), eight(8, {64, 1024});
  if (fits(four)) grid.push_back({"prefill 4x128@0", four, {}});
  if (fits(eight)) grid.push_back({"prefill 8x64@1024", eight, {}});
  for (int32_t ctx : {16, 256, 1024, 2048, 4096}) {
    for (int32_t b : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
      std::vector<chunk> cs(b, {1, ctx});
      if (fits(cs)) grid.push_back({fmt::format("decode {}@{}", b, ctx), cs, {}});
    }
  }
  std::vector<chunk> mixed1(32, {1, 256});
  mixed1.push_back({256, 1024});
  if (fits(mixed1)) grid.push_back({"mixed 256@1024+32x1@256", mixed1, {}});
  std::vector<chunk> mixed2(128, {1, 16});
  mixed2.push_back({128, 0});
  if (fits(mixed2)) grid.push_back({"mixed 128@0+128x1@16", mixed2, {}});
  return grid;
}

// Weighted least squares, min Σ ((x_i·c − t_i) / t_i)², with c ≥ 0: coefficients that come
// out negative are pinned to zero one at a time, most negative first.
std::vector<double> fit(const std::vector<std::vector<double>>& x, const std::vector<double>& t) {
  const size_t k = x[0].size();
  std::vector<bool> free(k, true);
  for (;;) {
    std::vector<size_t> cols;
    for (size_t j = 0; j < k; ++j) if (free[j]) cols.push_back(j);
    const size_t m = cols.size();
    std::vector<double> scale(m, 0.0);
    for (size_t a = 0; a < m; ++a) {
      for (size_t i = 0; i < x.size(); ++i) scale[a] = std::max(scale[a], std::abs(x[i][cols[a]] / t[i]));
      if (scale[a] == 0.0) scale[a] = 1.0;
    }
    // Normal equations on rows x_i / t_i (columns scaled to at most 1) against 1.
    std::vector<std::vector<double>> a(m, std::vector<double>(m + 1, 0.0));
    for (size_t i = 0; i < x.size(); ++i) {
      for (size_t p = 0; p < m; ++p) {
        const double xp = x[i][cols[p]] / t[i] / scale[p];
        for (size_t q = 0; q < m; ++q) a[p][q] += xp * x[i][cols[q]] / t[i] / scale[q];
        a[p][m] += xp;
      }
    }
    for (size_t p = 0; p < m; ++p) {
      size_t pivot = p;
      for (size_t r = p + 1; r < m; ++r) if (std::abs(a[r][p]) > std::abs(a[pivot][p])) pivot = r;
      std::swap(a[p], a[pivot]);
      for (size_t r = 0; r < m; ++r) {
        if (r == p || a[p][p] == 0.0) continue;
        const double f = a[r][p] / a[p][p];
        for (size_t q = p; q <= m; ++q) a[r][q] -= f * a[p][q];
      }
    }
    std::vector<double> c(k, 0.0);
    size_t worst = k;
    for (size_t p = 0; p < m; ++p) {
      c[cols[p]] = a[p][p] == 0.0 ? 0.0 : a[p][m] / a[p][p] / scale[p];
      if (c[cols[p]] < 0.0 && (worst == k || c[cols[p]] < c[worst])) worst = cols[p];
    }
    if (worst == k) return c;
    free[worst] = false;
  }
}

std::vector<double> features(const sim::step_shape& s, bool split_context) {
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  if (split_context) return {1.0, d(s.prefill_tokens), d(s.decode_seqs), d(s.decode_context), d(s.prefill_context)};
  return {1.0, d(s.prefill_tokens), d(s.decode_seqs), d(s.decode_context + s.prefill_context)};
}

struct fit_report {
  std::vector<double> c;
  std::vector<double> predicted;
  double rms_rel = 0.0, max_rel = 0.0;
};

fit_report fit_model(const std::vector<grid_point>& grid, const std::vector<sim::step_shape>& shapes,
                     const std::vector<double>& t, bool split_context) {
  std::vector<std::vector<double>> x;
  for (const auto& s : shapes) x.push_back(features(s, split_context));
  fit_report r;
  r.c = fit(x, t);
  double sq = 0.0;
  for (size_t i = 0; i < grid.size(); ++i) {
    const double p = std::inner_product(x[i].begin(), x[i].end(), r.c.begin(), 0.0);
    r.predicted.push_back(p);
    const double e = (p - t[i]) / t[i];
    sq += e * e;
    r.max_rel = std::max(r.max_rel, std::abs(e));
  }
  r.rms_rel = std::sqrt(sq / static_cast<double>(grid.size()));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fit the sim backend's step cost model to the cpu backend on this machine"};
  std::string model_path = default_model_path();
  int threads = 2, reps = 5;
  int32_t pool_blocks = 2048;
  app.add_option("--model", model_path)->capture_default_str();
  app.add_option("--threads", threads)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--reps", reps)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--pool-blocks", pool_blocks, "KV blocks of 16 tokens written and used by the grid")
      ->check(CLI::Range(64, 1 << 20))->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const auto started = std::chrono::steady_clock::now();
  const std::string load_before = load_average();
  auto m = model::load(model_path);
  cpu::cpu_backend_options opt;
  opt.threads = threads;
  opt.block_size = 16;
  opt.kv_blocks = pool_blocks;
  opt.max_step_tokens = 512;
  opt.max_step_seqs = 256;
  opt.max_context = 8192;
  auto b = cpu::make_cpu_backend(m, opt);
  std::printf("calibrating on %s, model %s, KV pool %d blocks of 16 tokens, %d repetitions\n",
              b->describe().c_str(), m->config().name.c_str(), pool_blocks, reps);

  // Write every block once, 32 blocks (512 positions) per step.
  step_result result;
  for (int32_t first = 0; first + 32 <= pool_blocks; first += 32) {
    std::vector<token_id> tokens(512, 1000);
    std::vector<int32_t> table(32);
    std::iota(table.begin(), table.end(), first);
    step_batch fill;
    fill.seqs.push_back({0, tokens, 0, table, false, {}, false});
    b->execute(fill, result);
  }
  const double fill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("wrote the KV pool in %.1f s\n", fill_seconds);

  std::vector<grid_point> grid = make_grid(opt.block_size, pool_blocks);
  std::vector<step_builder> steps;
  steps.reserve(grid.size());  // the batches point into each builder
  std::vector<sim::step_shape> shapes;
  for (const grid_point& g : grid) {
    steps.emplace_back(g.chunks, opt.block_size, pool_blocks);
    shapes.push_back(sim::shape_of(steps.back().batch()));
  }
  std::vector<size_t> order(grid.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(42);
  for (int r = -1; r < reps; ++r) {  // round -1 warms up and is not recorded
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      const auto t0 = std::chrono::steady_clock::now();
      b->execute(steps[i].batch(), result);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r >= 0) grid[i].seconds.push_back(s);
    }
  }

  std::vector<double> med, best, spread;
  for (const grid_point& g : grid) {
    med.push_back(median(g.seconds));
    best.push_back(*std::min_element(g.seconds.begin(), g.seconds.end()));
    const auto [lo, hi] = std::minmax_element(g.seconds.begin(), g.seconds.end());
    spread.push_back((*hi - *lo) / med.back());
  }
  const fit_report one = fit_model(grid, shapes, med, false);
  const fit_report two = fit_model(grid, shapes, med, true);
  const fit_report two_min = fit_model(grid, shapes, best, true);

  std::printf("\n%-26s %5s %5s %7s %8s | %9s %9s %9s %7s %7s\n", "step", "pre", "dec", "dec_ctx", "pre_ctx",
              "median_ms", "min_ms", "fit_ms", "err", "spread");
  for (size_t i = 0; i < grid.size(); ++i) {
    const sim::step_shape& s = shapes[i];
    std::printf("%-26s %5lld %5lld %7lld %8lld | %9.2f %9.2f %9.2f %+6.1f%% %6.1f%%\n", grid[i].label.c_str(),
                static_cast<long long>(s.prefill_tokens), static_cast<long long>(s.decode_seqs),
                static_cast<long long>(s.decode_context), static_cast<long long>(s.prefill_context), med[i] * 1e3,
                best[i] * 1e3, two_min.predicted[i] * 1e3, 100.0 * (two_min.predicted[i] - best[i]) / best[i],
                100.0 * spread[i]);
  }
  std::printf("(fit_ms and err: the fit to the fastest repetitions, against min_ms)\n");
  std::printf("\nrepetition spread (max-min)/median per step: median %.1f%%, worst %.1f%%\n",
              100.0 * median(spread), 100.0 * *std::max_element(spread.begin(), spread.end()));
  auto print_fit = [](const char* name, const fit_report& f) {
    std::printf("%s\n  c0 %.4g s, c_prefill %.4g s, c_decode %.4g s, c_context %.4g s", name, f.c[0], f.c[1], f.c[2],
                f.c[3]);
    if (f.c.size() > 4) std::printf(", c_prefill_ctx %.4g s", f.c[4]);
    std::printf("\n  relative error: rms %.1f%%, worst %.1f%%\n", 100.0 * f.rms_rel, 100.0 * f.max_rel);
  };
  std::printf("\n");
  print_fit("fit A to the medians, one context coefficient:", one);
  print_fit("fit A to the fastest repetitions, one context coefficient:", fit_model(grid, shapes, best, false));
  print_fit("fit B to the medians, prefill context apart:", two);
  print_fit("fit B to the fastest repetitions, prefill context apart (the profile's):", two_min);
  std::printf("\nload average before %s, after %s; %.0f s in all\n", load_before.c_str(), load_average().c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  std::printf("\nfor gpu/sim/sim_profile.cpp (fit B to the fastest repetitions):\n");
  std::printf("  p.cost.c0 = %.4g;\n  p.cost.c_prefill = %.4g;\n  p.cost.c_decode = %.4g;\n", two_min.c[0],
              two_min.c[1], two_min.c[2]);
  std::printf("  p.cost.c_context = %.4g;\n  p.cost.c_prefill_ctx = %.4g;\n", two_min.c[3], two_min.c[4]);
}
