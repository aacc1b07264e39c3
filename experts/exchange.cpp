#include "experts/exchange.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "experts/expert_service.hpp"
#include "model/model.hpp"

namespace tireless {

namespace {

// One shard's part of a layer call: the token rows it needs and its (row, expert) pairs.
struct shard_part {
  std::vector<int32_t> token_of_row;  // row -> token
  std::vector<int32_t> slots;         // pair -> slot (token * k + j)
};

}  // namespace

expert_exchange::expert_exchange(std::shared_ptr<const model> m, std::unique_ptr<expert_transport> t, expert_placement p,
                                 expert_exchange_options o)
    : model_(std::move(m)), transport_(std::move(t)), opt_(o), width_(model_->config().n_embd), placement_(std::move(p)) {
  const int32_t n = transport_->shards();
  if (placement_.shards() != n || placement_.n_expert() != model_->config().n_expert ||
      placement_.layers() != model_->config().n_layer) {
    throw std::invalid_argument(fmt::format("expert placement of {} shards, {} layers x {} experts does not fit {} shards of {}",
                                            placement_.shards(), placement_.layers(), placement_.n_expert(), n,
                                            model_->config().name));
  }
  live_.assign(static_cast<size_t>(n), 1);
  fenced_.assign(static_cast<size_t>(n), 0);
  failures_.resize(static_cast<size_t>(n));
  last_try_.assign(static_cast<size_t>(n), clock::now());
  load_.assign(static_cast<size_t>(placement_.layers()) * n, 0);
  stats_.shards = n;
  stats_.per_shard_pairs.assign(static_cast<size_t>(n), 0);
  stats_.per_expert_pairs.assign(static_cast<size_t>(placement_.layers()) * placement_.n_expert(), 0);
  stats_.per_layer_shard_pairs.assign(static_cast<size_t>(placement_.layers()) * n, 0);
  publish();
}

expert_exchange::~expert_exchange() = default;

double expert_exchange_stats::shard_imbalance() const {
  if (shards < 1) return 1.0;
  double sum = 0;
  int layers = 0;
  for (size_t from = 0; from + shards <= per_layer_shard_pairs.size(); from += static_cast<size_t>(shards)) {
    const auto first = per_layer_shard_pairs.begin() + static_cast<ptrdiff_t>(from);
    const int64_t total = std::accumulate(first, first + shards, int64_t{0});
    if (total == 0) continue;
    sum += static_cast<double>(*std::max_element(first, first + shards)) * shards / static_cast<double>(total);
    ++layers;
  }
  return layers > 0 ? sum / layers : 1.0;
}

expert_exchange_stats expert_exchange::stats() const {
  std::lock_guard lock(mu_);
  return published_;
}

expert_placement expert_exchange::placement() const {
  std::lock_guard lock(mu_);
  return published_placement_;
}

void expert_exchange::request_rebalance(int32_t replicas_per_shard) {
  std::lock_guard lock(mu_);
  rebalance_request_ = replicas_per_shard;
}

void expert_exchange::publish() {
  stats_.live = static_cast<int32_t>(std::count(live_.begin(), live_.end(), 1));
  stats_.fenced = static_cast<int32_t>(std::count(fenced_.begin(), fenced_.end(), 1));
  stats_.replicas = placement_.replicas();
  std::lock_guard lock(mu_);
  published_ = stats_;
  published_placement_ = placement_;
}

void expert_exchange::fail(int32_t shard) {
  live_[shard] = 0;
  ++stats_.failures;
  const auto now = clock::now();
  auto& f = failures_[shard];
  f.push_back(now);
  std::erase_if(f, [&](clock::time_point t) { return now - t > opt_.restart_window; });
  if (static_cast<int32_t>(f.size()) > opt_.max_restarts) fence(shard);
}

void expert_exchange::fence(int32_t shard) {
  if (fenced_[shard]) return;
  fenced_[shard] = 1;
  live_[shard] = 0;
  const std::vector<int32_t> moved = placement_.fence(shard, live_);
  std::map<int32_t, std::vector<int32_t>> by_holder;
  for (int32_t key : moved) {
    by_holder[placement_.holders(key / placement_.n_expert(), key % placement_.n_expert()).back()].push_back(key);
  }
  for (const auto& [holder, keys] : by_holder) transport_->hold(holder, keys);
}

void expert_exchange::revive(int32_t shard, std::chrono::milliseconds wait) {
  last_try_[shard] = clock::now();
  if (fenced_[shard] || !transport_->revive(shard, wait)) return;
  // A restarted shard holds only what it started with: give it back its replicas.
  transport_->hold(shard, placement_.keys_of(shard));
  live_[shard] = 1;
  ++stats_.revivals;
}

void expert_exchange::rebalance(int32_t replicas_per_shard) {
  expert_placement next = tireless::rebalance(placement_, stats_.per_expert_pairs, replicas_per_shard);
  for (int32_t s = 0; s < next.shards(); ++s) {
    if (fenced_[s]) next.fence(s, live_);
  }
  for (int32_t s = 0; s < next.shards(); ++s) {
    std::vector<int32_t> added;
    const std::vector<int32_t> before = placement_.keys_of(s);
    for (int32_t key : next.keys_of(s)) {
      if (!std::binary_search(before.begin(), before.end(), key)) added.push_back(key);
    }
    if (added.empty() || !live_[s]) continue;
    try {
      transport_->hold(s, added);
    } catch (const std::exception&) {
      fail(s);
      return;  // leave the placement as it was; the next rebalance tries again
    }
  }
  placement_ = std::move(next);
  ++stats_.rebalances;
  std::fill(stats_.per_layer_shard_pairs.begin(), stats_.per_layer_shard_pairs.end(), 0);
  std::fill(load_.begin(), load_.end(), 0);  // the running balance starts afresh on the new placement
}

void expert_exchange::run(const cpu::routed_tokens& rt, float* out, int64_t ld_out) {
  const auto start = clock::now();
  {
    int32_t want = -1;
    {
      std::lock_guard lock(mu_);
      std::swap(want, rebalance_request_);
    }
    if (want < 0 && opt_.rebalance_every > 0 && stats_.calls > 0 && stats_.calls % opt_.rebalance_every == 0) {
      want = opt_.replicas_per_shard;
    }
    if (want >= 0) rebalance(want);
  }
  // Shards down but not fenced get one quick try a second, so replicas do not carry them for ever.
  for (int32_t s = 0; s < transport_->shards(); ++s) {
    if (!live_[s] && !fenced_[s] && start - last_try_[s] > std::chrono::seconds(1)) revive(s, std::chrono::milliseconds(0));
  }
  const int64_t n_slots = rt.n_tokens * rt.k;
  slots_.resize(static_cast<size_t>(n_slots * width_));
  std::vector<char> done(static_cast<size_t>(n_slots), 0);
  std::optional<clock::time_point> failed_at;
  double slowest_shard = 0;
  const int32_t n_shards = transport_->shards();
  for (int attempt = 0;; ++attempt) {
    std::vector<int32_t> todo, todo_experts;
    for (int64_t s = 0; s < n_slots; ++s) {
      if (done[s]) continue;
      todo.push_back(static_cast<int32_t>(s));
      todo_experts.push_back(rt.experts[s]);
    }
    if (todo.empty()) break;
    if (attempt > 2 * n_shards + 2) throw std::runtime_error("expert shards keep failing: the layer cannot be computed");
    const std::vector<int32_t> shard_of = assign_pairs(
        placement_, rt.layer, todo_experts, live_,
        std::span<int64_t>(load_).subspan(static_cast<size_t>(rt.layer) * n_shards, static_cast<size_t>(n_shards)));
    bool orphans = false;
    for (size_t i = 0; i < todo.size(); ++i) {
      if (shard_of[i] >= 0) continue;
      orphans = true;
      // No live shard holds this expert: wait for its home to come back, or fence it.
      const int32_t home = placement_.holders(rt.layer, todo_experts[i]).front();
      if (!live_[home] && !fenced_[home]) {
        revive(home, opt_.revive_wait);
        if (!live_[home]) fence(home);
      }
    }
    if (orphans) continue;
    std::vector<shard_part> parts(static_cast<size_t>(n_shards));
    std::vector<int32_t> row_of(static_cast<size_t>(rt.n_tokens));
    for (int32_t s = 0; s < n_shards; ++s) {
      std::fill(row_of.begin(), row_of.end(), -1);
      for (size_t i = 0; i < todo.size(); ++i) {
        if (shard_of[i] != s) continue;
        const int32_t t = todo[i] / rt.k;
        if (row_of[t] < 0) {
          row_of[t] = static_cast<int32_t>(parts[s].token_of_row.size());
          parts[s].token_of_row.push_back(t);
        }
        parts[s].slots.push_back(todo[i]);
      }
    }
    std::vector<std::optional<owned<proto::ExpertRequest>>> requests(static_cast<size_t>(n_shards));
    std::vector<const owned<proto::ExpertRequest>*> send(static_cast<size_t>(n_shards), nullptr);
    const size_t abytes = activation_bytes(opt_.activations);
    for (int32_t s = 0; s < n_shards; ++s) {
      const shard_part& part = parts[s];
      if (part.slots.empty()) continue;
      const auto rows = static_cast<int64_t>(part.token_of_row.size());
      auto& msg = requests[s].emplace(static_cast<unsigned>(16 + (rows * width_ * abytes + part.slots.size() * 8) / 8));
      auto b = msg.init();
      b.setLayer(rt.layer);
      b.setRows(static_cast<int32_t>(rows));
      b.setWidth(static_cast<int32_t>(width_));
      b.setActivations(opt_.activations);
      std::vector<float> x(static_cast<size_t>(rows * width_));
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(rt.x + part.token_of_row[r] * rt.ld, width_, x.begin() + r * width_);
      }
      encode_activations(opt_.activations, x, b.initX(static_cast<unsigned>(x.size() * abytes)));
      auto slot_row = b.initSlotRow(static_cast<unsigned>(part.slots.size()));
      auto slot_expert = b.initSlotExpert(static_cast<unsigned>(part.slots.size()));
      std::fill(row_of.begin(), row_of.end(), -1);
      for (int64_t r = 0; r < rows; ++r) row_of[part.token_of_row[r]] = static_cast<int32_t>(r);
      for (size_t p = 0; p < part.slots.size(); ++p) {
        slot_row.set(static_cast<unsigned>(p), row_of[part.slots[p] / rt.k]);
        slot_expert.set(static_cast<unsigned>(p), rt.experts[part.slots[p]]);
      }
      send[s] = &msg;
      stats_.bytes_out += static_cast<int64_t>(msg.size_bytes());
      stats_.tokens += rows;
    }
    std::vector<expert_transport::reply> replies = transport_->exchange(send);
    for (int32_t s = 0; s < n_shards; ++s) {
      if (!send[s]) continue;
      const shard_part& part = parts[s];
      if (!replies[s].msg) {
        if (!failed_at) failed_at = clock::now();
        fail(s);
        continue;
      }
      const auto r = replies[s].msg->get();
      stats_.bytes_in += static_cast<int64_t>(replies[s].msg->size_bytes());
      std::vector<float> y(part.slots.size() * static_cast<size_t>(width_));
      try {
        decode_activations(opt_.activations, r.getY(), y);
      } catch (const std::invalid_argument&) {
        if (!failed_at) failed_at = clock::now();
        fail(s);  // a reply of the wrong size: treat the shard as failed, re-run its pairs
        continue;
      }
      for (size_t p = 0; p < part.slots.size(); ++p) {
        std::copy_n(y.begin() + static_cast<int64_t>(p) * width_, width_, slots_.begin() + part.slots[p] * width_);
        done[part.slots[p]] = 1;
        ++stats_.per_expert_pairs[static_cast<size_t>(placement_.key(rt.layer, rt.experts[part.slots[p]]))];
      }
      stats_.per_shard_pairs[s] += static_cast<int64_t>(part.slots.size());
      stats_.per_layer_shard_pairs[static_cast<size_t>(rt.layer) * n_shards + s] += static_cast<int64_t>(part.slots.size());
      const double secs = r.getMicros() * 1e-6;
      stats_.shard_seconds += secs;
      slowest_shard = std::max(slowest_shard, secs);
    }
  }
  cpu::combine_slots(rt, slots_.data(), width_, out, ld_out);
  const auto end = clock::now();
  ++stats_.calls;
  stats_.dispatch_seconds += std::max(0.0, std::chrono::duration<double>(end - start).count() - slowest_shard);
  if (failed_at) stats_.last_recovery_seconds = std::chrono::duration<double>(end - *failed_at).count();
  publish();
}

}  // namespace tireless
