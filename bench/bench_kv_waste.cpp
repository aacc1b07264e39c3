// bench_kv_waste: KV memory allocated but unused, as a share of the pool's used blocks, under a
// mixed workload, sampled every step of a long run of the CAF-free step loop (batch_scheduler
// + plan_kv on a block_manager + the sim backend's cost model on a virtual clock).
//
//   bench_kv_waste [--minutes 60] [--seed 1] [--block-sizes 8,16,32] [--pool-tokens 65536]
//                  [--rate 0.38] [--documents 0.25] [--profile cpu-smollm2]
//
// Workload (seeded, the same for every block size): Poisson arrivals at --rate per virtual
// second; 75% chats (--documents 0.25; a shared 40-token system prompt + 20..600 tokens, answers of 10..400
// tokens), 25% long documents (1,000..6,000 tokens, answers of 32..512). Requests wait outside
// the engine while it holds max_step_seqs waiting ones (as admission's credits do).
//
// Each step, after the KV pool granted it, for every sequence holding blocks:
//   tail   = slots in its blocks beyond the positions it holds after the step (the last
//            block's internal fragmentation)
//   ahead  = blocks beyond those its positions need (reserved ahead)
// share = Σ (tail + ahead·block_size) / (used blocks · block_size). Used blocks are physical:
// a prefix block shared by several tables counts once (shared blocks are full, so they add
// nothing to the tail). Free blocks, cached-free ones and the watermark's are not "used".
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <random>

#include "gpu/sim/sim_backend.hpp"
#include "scheduler/batch_scheduler.hpp"

namespace {

using namespace tireless;

struct workload_options {
  double minutes = 60, rate = 0.38, documents = 0.25;
  uint64_t seed = 1;
  int pool_tokens = 65536;
  double watermark = 0.01;
  std::string profile = "cpu-smollm2";
};

struct arrival {
  double at = 0;
  sequence_spec spec;
};

std::vector<arrival> make_workload(const workload_options& o, int max_context) {
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(o.rate);
  std::uniform_real_distribution<double> u(0, 1);
  auto between = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<token_id> system_prompt;
  for (int i = 0; i < 40; ++i) system_prompt.push_back(2000 + i);
  std::vector<arrival> out;
  double t = 0;
  for (seq_id id = 1;; ++id) {
    t += gap(rng);
    if (t > o.minutes * 60) break;
    arrival a;
    a.at = t;
    a.spec.id = id;
    a.spec.arrival = id;
    const bool chat = u(rng) >= o.documents;
    int prompt = chat ? between(20, 600) : between(1000, 6000);
    a.spec.max_tokens = chat ? between(10, 400) : between(32, 512);
    if (chat) a.spec.prompt = system_prompt;
    for (int i = 0; i < prompt; ++i) a.spec.prompt.push_back(between(100, 40000));
    a.spec.max_tokens = std::min(a.spec.max_tokens, max_context - static_cast<int>(a.spec.prompt.size()));
    out.push_back(std::move(a));
  }
  return out;
}

struct waste_result {
  int block_size = 0, n_blocks = 0;
  int64_t steps = 0, finished = 0, preemptions = 0, requests = 0;
  double virtual_seconds = 0;
  double mean_share = 0, weighted_share = 0, max_share = 0, max_share_half_full = 0;
  double mean_used = 0, mean_holders = 0, mean_tail_per_seq = 0;
  int64_t ahead_blocks = 0;  // summed over all steps
};

waste_result run(const workload_options& o, int block_size) {
  sim::sim_profile profile = sim::named_profile(o.profile);
  profile.kv.block_size = block_size;
  profile.kv.n_blocks = o.pool_tokens / block_size;
  sim::sim_backend be(profile);
  const int32_t watermark = static_cast<int32_t>(o.watermark * profile.kv.n_blocks);
  block_manager blocks({profile.kv.n_blocks, block_size, true, watermark});
  const backend_limits lim = profile.limits;
  batch_scheduler sched({lim.max_step_tokens, lim.max_step_seqs, 3, lim.max_context, block_size});
  const std::vector<arrival> work = make_workload(o, lim.max_context);

  waste_result r;
  r.block_size = block_size;
  r.n_blocks = profile.kv.n_blocks;
  r.requests = static_cast<int64_t>(work.size());
  size_t next = 0;
  std::deque<const arrival*> outside;
  double now = 0, sum_share = 0, sum_unused = 0, sum_used = 0, sum_holders = 0, sum_tail = 0;
  step_result result;
  while (next < work.size() || !outside.empty() || sched.has_work()) {
    while (next < work.size() && work[next].at <= now) outside.push_back(&work[next++]);
    while (!outside.empty() && sched.counts().waiting < lim.max_step_seqs) {
      sched.add(outside.front()->spec);
      outside.pop_front();
    }
    if (!sched.has_work()) {
      now = work[next].at;
      continue;
    }
    const kv_request req = sched.propose();
    const kv_reply reply = plan_kv(blocks, req);
    const step_batch batch = sched.finalize(reply);
    r.preemptions += static_cast<int64_t>(reply.preempted.size());
    int64_t tail = 0, ahead = 0, holders = 0;
    for (size_t i = 0; i < req.entries.size(); ++i) {
      const kv_grant& g = reply.grants[i];
      if (!g.granted) continue;
      // An admission whose cached prefix is longer than its first chunk holds the prefix.
      const kv_entry& e = req.entries[i];
      const int32_t held = e.admit ? std::max(e.positions, g.cached_tokens) : e.positions;
      const int64_t have = static_cast<int64_t>(g.table.size());
      const int64_t need = blocks.blocks_for(held);
      ahead += have - need;
      tail += need * block_size - held;
      ++holders;
    }
    const double used = reply.stats.used;
    if (used > 0) {
      const double unused = static_cast<double>(tail + ahead * block_size);
      const double share = unused / (used * block_size);
      sum_share += share;
      sum_unused += unused;
      sum_used += used * block_size;
      r.max_share = std::max(r.max_share, share);
      if (used * 2 >= r.n_blocks) r.max_share_half_full = std::max(r.max_share_half_full, share);
      sum_holders += static_cast<double>(holders);
      sum_tail += static_cast<double>(tail);
      r.ahead_blocks += ahead;
      ++r.steps;
    }
    if (batch.seqs.empty()) {
      sched.commit(step_result{});
      // Only releases, or nothing fits until something finishes; with nothing running and
      // requests waiting, one does not fit an empty pool (a bug in the workload).
      const sequence_counts c = sched.counts();
      if (c.running == 0 && c.waiting > 0) throw std::logic_error("a request cannot be placed in an empty pool");
      continue;
    }
    be.execute(batch, result);
    now += be.last_step_seconds();
    for (const scheduler_event& e : sched.commit(result)) r.finished += e.what == scheduler_event::kind::finished;
  }
  r.virtual_seconds = now;
  r.mean_share = sum_share / static_cast<double>(r.steps);
  r.weighted_share = sum_unused / sum_used;
  r.mean_used = sum_used / block_size / static_cast<double>(r.steps);
  r.mean_holders = sum_holders / static_cast<double>(r.steps);
  r.mean_tail_per_seq = sum_tail / sum_holders;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"KV memory allocated but unused, under a mixed workload (sim backend, virtual time)"};
  workload_options o;
  std::vector<int> block_sizes{8, 16, 32};
  app.add_option("--minutes", o.minutes, "virtual minutes of arrivals")->capture_default_str();
  app.add_option("--rate", o.rate, "arrivals per virtual second")->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--documents", o.documents, "share of long documents (the rest are chats)")->capture_default_str();
  app.add_option("--pool-tokens", o.pool_tokens, "KV pool size in tokens, for every block size")->capture_default_str();
  app.add_option("--watermark", o.watermark)->capture_default_str();
  app.add_option("--profile", o.profile, "sim profile (step costs and limits)")->capture_default_str();
  app.add_option("--block-sizes", block_sizes)->delimiter(',');
  CLI11_PARSE(app, argc, argv);

  std::printf("workload: seed %llu, %.0f virtual minutes of arrivals at %.2f/s, %.0f%% chats / %.0f%% documents; "
              "profile %s; pool %d tokens, watermark %.0f%%\n",
              static_cast<unsigned long long>(o.seed), o.minutes, o.rate, 100 * (1 - o.documents), 100 * o.documents,
              o.profile.c_str(), o.pool_tokens,
              o.watermark * 100);
  std::printf("%5s %7s %7s %9s %6s %6s | %9s %9s %9s %9s | %8s %8s %9s %8s\n", "block", "blocks", "steps",
              "virt. s", "done", "preem", "mean", "weighted", "max", "max>=50%", "used", "seqs", "tail/seq",
              "ahead");
  for (int bs : block_sizes) {
    const waste_result r = run(o, bs);
    std::printf("%5d %7d %7lld %9.0f %6lld %6lld | %8.2f%% %8.2f%% %8.2f%% %8.2f%% | %7.1f%% %8.1f %9.2f %8lld\n",
                r.block_size, r.n_blocks, static_cast<long long>(r.steps), r.virtual_seconds,
                static_cast<long long>(r.finished), static_cast<long long>(r.preemptions), 100 * r.mean_share,
                100 * r.weighted_share, 100 * r.max_share, 100 * r.max_share_half_full,
                100 * r.mean_used / r.n_blocks, r.mean_holders, r.mean_tail_per_seq,
                static_cast<long long>(r.ahead_blocks));
    std::fflush(stdout);
  }
  std::printf("mean: of the per-step shares; weighted: unused slots / used slots over all steps; max>=50%%: the "
              "largest share at a step with at least half the pool used; used: mean share of the pool used; "
              "seqs: sequences holding blocks, mean; tail/seq: unused slots in a sequence's last block, mean; "
              "ahead: blocks held beyond need, all steps\n");
}
