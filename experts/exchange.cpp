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
  void clear() {
    token_of_row.clear();
    slots.clear();
  }
};

// Transports that cannot send without waiting answer at once.
class answered final : public expert_transport::in_flight {
 public:
  explicit answered(std::vector<expert_transport::reply> r) : replies_(std::move(r)) {}
  std::vector<expert_transport::reply> wait() override { return std::move(replies_); }

 private:
  std::vector<expert_transport::reply> replies_;
};

}  // namespace

std::unique_ptr<expert_transport::in_flight> expert_transport::send(
    const std::vector<const owned<proto::ExpertRequest>*>& requests) {
  return std::make_unique<answered>(exchange(requests));
}

// One micro-batch's layer call, from start() to finish(); its buffers are kept from call to call.
struct expert_exchange::lane {
  cpu::routed_tokens rt;
  bool busy = false;
  bool overlapped = false;  // sent with start(): the caller went on meanwhile
  clock::time_point started;
  std::optional<clock::time_point> failed_at;
  int attempt = 0;
  double slowest_shard = 0;
  std::vector<char> done;  // per slot
  std::vector<float> slots;
  std::vector<int32_t> todo, todo_experts, row_of;
  // The dispatch in flight.
  std::vector<shard_part> parts;
  std::vector<std::optional<owned<proto::ExpertRequest>>> requests;
  std::vector<const owned<proto::ExpertRequest>*> sent;
  clock::time_point sent_at;
  std::unique_ptr<expert_transport::in_flight> call;
};

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
  for (int i = 0; i < 2; ++i) lanes_.push_back(std::make_unique<lane>());
  stats_.shards = n;
  stats_.per_shard_pairs.assign(static_cast<size_t>(n), 0);
  stats_.per_shard_seconds.assign(static_cast<size_t>(n), 0.0);
  stats_.per_expert_pairs.assign(static_cast<size_t>(placement_.layers()) * placement_.n_expert(), 0);
  stats_.per_layer_shard_pairs.assign(static_cast<size_t>(placement_.layers()) * n, 0);
  publish_shards();
}

expert_exchange::~expert_exchange() {
  for (auto& l : lanes_) {
    if (l->call) l->call->wait();  // the transport must not write into a lane that is gone
  }
}

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
  return stats_;
}

expert_placement expert_exchange::placement() const {
  std::lock_guard lock(mu_);
  return published_placement_;
}

void expert_exchange::request_rebalance(int32_t replicas_per_shard) {
  std::lock_guard lock(mu_);
  rebalance_request_ = replicas_per_shard;
}

// After the shards' states or the placement change (rare): not on every call.
void expert_exchange::publish_shards() {
  std::lock_guard lock(mu_);
  stats_.live = static_cast<int32_t>(std::count(live_.begin(), live_.end(), 1));
  stats_.fenced = static_cast<int32_t>(std::count(fenced_.begin(), fenced_.end(), 1));
  stats_.replicas = placement_.replicas();
  published_placement_ = placement_;
}

void expert_exchange::fail(int32_t shard) {
  live_[shard] = 0;
  {
    std::lock_guard lock(mu_);
    ++stats_.failures;
  }
  const auto now = clock::now();
  auto& f = failures_[shard];
  f.push_back(now);
  std::erase_if(f, [&](clock::time_point t) { return now - t > opt_.restart_window; });
  if (static_cast<int32_t>(f.size()) > opt_.max_restarts) fence(shard);
  publish_shards();
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
  publish_shards();
}

void expert_exchange::revive(int32_t shard, std::chrono::milliseconds wait) {
  last_try_[shard] = clock::now();
  if (fenced_[shard] || !transport_->revive(shard, wait)) return;
  // A restarted shard holds only what it started with: give it back its replicas.
  transport_->hold(shard, placement_.keys_of(shard));
  live_[shard] = 1;
  {
    std::lock_guard lock(mu_);
    ++stats_.revivals;
  }
  publish_shards();
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
  last_rebalance_calls_ = stats_.calls;
  {
    std::lock_guard lock(mu_);
    ++stats_.rebalances;
    std::fill(stats_.per_layer_shard_pairs.begin(), stats_.per_layer_shard_pairs.end(), 0);
  }
  std::fill(load_.begin(), load_.end(), 0);  // the running balance starts afresh on the new placement
  publish_shards();
}

// Rebalancing and revivals change the placement: only between layer calls, none in flight.
void expert_exchange::maintain(clock::time_point now) {
  if (std::any_of(lanes_.begin(), lanes_.end(), [](const auto& l) { return l->busy; })) return;
  int32_t want = -1;
  {
    std::lock_guard lock(mu_);
    std::swap(want, rebalance_request_);
  }
  if (want < 0 && opt_.rebalance_every > 0 && stats_.calls - last_rebalance_calls_ >= opt_.rebalance_every) {
    want = opt_.replicas_per_shard;
  }
  if (want >= 0) rebalance(want);
  // Shards down but not fenced get one quick try a second, so replicas do not carry them for ever.
  for (int32_t s = 0; s < transport_->shards(); ++s) {
    if (!live_[s] && !fenced_[s] && now - last_try_[s] > std::chrono::seconds(1)) revive(s, std::chrono::milliseconds(0));
  }
}

// Sends the lane's pairs not yet done to the shards that hold their experts; false when every
// pair is done.
bool expert_exchange::dispatch(lane& l) {
  const cpu::routed_tokens& rt = l.rt;
  const int64_t n_slots = rt.n_tokens * rt.k;
  const int32_t n_shards = transport_->shards();
  std::vector<int32_t> shard_of;
  for (;; ++l.attempt) {
    l.todo.clear();
    l.todo_experts.clear();
    for (int64_t s = 0; s < n_slots; ++s) {
      if (l.done[s]) continue;
      l.todo.push_back(static_cast<int32_t>(s));
      l.todo_experts.push_back(rt.experts[s]);
    }
    if (l.todo.empty()) return false;
    if (l.attempt > 2 * n_shards + 2) throw std::runtime_error("expert shards keep failing: the layer cannot be computed");
    shard_of = assign_pairs(
        placement_, rt.layer, l.todo_experts, live_,
        std::span<int64_t>(load_).subspan(static_cast<size_t>(rt.layer) * n_shards, static_cast<size_t>(n_shards)));
    bool orphans = false;
    for (size_t i = 0; i < l.todo.size(); ++i) {
      if (shard_of[i] >= 0) continue;
      orphans = true;
      // No live shard holds this expert: wait for its home to come back, or fence it.
      const int32_t home = placement_.holders(rt.layer, l.todo_experts[i]).front();
      if (!live_[home] && !fenced_[home]) {
        revive(home, opt_.revive_wait);
        if (!live_[home]) fence(home);
      }
    }
    if (!orphans) break;
  }
  ++l.attempt;
  l.parts.resize(static_cast<size_t>(n_shards));
  l.requests.resize(static_cast<size_t>(n_shards));
  l.sent.assign(static_cast<size_t>(n_shards), nullptr);
  l.row_of.resize(static_cast<size_t>(rt.n_tokens));
  std::fill(l.row_of.begin(), l.row_of.end(), -1);
  for (auto& p : l.parts) p.clear();
  // Rows in token order per shard: row_of is reset per shard by the rows it took.
  for (int32_t s = 0; s < n_shards; ++s) {
    shard_part& part = l.parts[s];
    for (size_t i = 0; i < l.todo.size(); ++i) {
      if (shard_of[i] != s) continue;
      const int32_t t = l.todo[i] / rt.k;
      if (l.row_of[t] < 0) {
        l.row_of[t] = static_cast<int32_t>(part.token_of_row.size());
        part.token_of_row.push_back(t);
      }
      part.slots.push_back(l.todo[i]);
    }
    for (int32_t t : part.token_of_row) l.row_of[t] = -1;
  }
  const size_t row_bytes = activation_row_bytes(opt_.activations, static_cast<size_t>(width_));
  int64_t bytes = 0, rows_sent = 0;
  for (int32_t s = 0; s < n_shards; ++s) {
    const shard_part& part = l.parts[s];
    l.requests[s].reset();
    if (part.slots.empty()) continue;
    const auto rows = static_cast<int64_t>(part.token_of_row.size());
    auto& msg = l.requests[s].emplace(static_cast<unsigned>(16 + (rows * row_bytes + part.slots.size() * 8) / 8));
    auto b = msg.init();
    b.setLayer(rt.layer);
    b.setRows(static_cast<int32_t>(rows));
    b.setWidth(static_cast<int32_t>(width_));
    b.setActivations(opt_.activations);
    auto x = b.initX(static_cast<unsigned>(rows * row_bytes));
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = rt.x + part.token_of_row[r] * rt.ld;
      encode_activations(opt_.activations, std::span<const float>(row, static_cast<size_t>(width_)), static_cast<size_t>(width_),
                         x.slice(static_cast<size_t>(r) * row_bytes, static_cast<size_t>(r + 1) * row_bytes));
    }
    auto slot_row = b.initSlotRow(static_cast<unsigned>(part.slots.size()));
    auto slot_expert = b.initSlotExpert(static_cast<unsigned>(part.slots.size()));
    for (int64_t r = 0; r < rows; ++r) l.row_of[part.token_of_row[r]] = static_cast<int32_t>(r);
    for (size_t p = 0; p < part.slots.size(); ++p) {
      slot_row.set(static_cast<unsigned>(p), l.row_of[part.slots[p] / rt.k]);
      slot_expert.set(static_cast<unsigned>(p), rt.experts[part.slots[p]]);
    }
    for (int32_t t : part.token_of_row) l.row_of[t] = -1;
    l.sent[s] = &msg;
    bytes += static_cast<int64_t>(msg.size_bytes());
    rows_sent += rows;
  }
  {
    std::lock_guard lock(mu_);
    stats_.bytes_out += bytes;
    stats_.tokens += rows_sent;
  }
  l.sent_at = clock::now();
  l.call = transport_->send(l.sent);
  return true;
}

// Waits for the lane's call in flight and takes in its replies; a shard that failed is marked
// so, its pairs left undone for the next dispatch.
void expert_exchange::gather(lane& l) {
  const auto waiting = clock::now();
  std::vector<expert_transport::reply> replies = l.call->wait();
  l.call.reset();
  const auto now = clock::now();
  const int32_t n_shards = transport_->shards();
  const cpu::routed_tokens& rt = l.rt;
  std::vector<int32_t> failed;
  clock::time_point last = l.sent_at;
  double slowest = 0;
  {
    std::lock_guard lock(mu_);
    stats_.wait_seconds += std::chrono::duration<double>(now - waiting).count();
    for (int32_t s = 0; s < n_shards; ++s) {
      if (!l.sent[s]) continue;
      const shard_part& part = l.parts[s];
      auto& reply = replies[s];
      last = std::max(last, reply.at);
      const size_t pair_bytes = activation_row_bytes(opt_.activations, static_cast<size_t>(width_));
      if (!reply.msg || reply.msg->get().getY().size() != part.slots.size() * pair_bytes) {
        failed.push_back(s);  // no reply, or one of the wrong size: re-run its pairs elsewhere
        continue;
      }
      const auto r = reply.msg->get();
      const auto y = r.getY();
      stats_.bytes_in += static_cast<int64_t>(reply.msg->size_bytes());
      for (size_t p = 0; p < part.slots.size(); ++p) {
        const int32_t slot = part.slots[p];
        decode_activations(opt_.activations, y.slice(p * pair_bytes, (p + 1) * pair_bytes), static_cast<size_t>(width_),
                           std::span<float>(l.slots.data() + static_cast<int64_t>(slot) * width_, static_cast<size_t>(width_)));
        l.done[slot] = 1;
        ++stats_.per_expert_pairs[static_cast<size_t>(placement_.key(rt.layer, rt.experts[slot]))];
      }
      const auto pairs = static_cast<int64_t>(part.slots.size());
      stats_.per_shard_pairs[s] += pairs;
      stats_.per_layer_shard_pairs[static_cast<size_t>(rt.layer) * n_shards + s] += pairs;
      const double secs = r.getMicros() * 1e-6;
      stats_.shard_seconds += secs;
      stats_.per_shard_seconds[s] += secs;
      slowest = std::max(slowest, secs);
    }
    stats_.dispatch_seconds += std::max(0.0, std::chrono::duration<double>(last - l.sent_at).count() - slowest);
  }
  if (!failed.empty() && !l.failed_at) l.failed_at = now;
  for (int32_t s : failed) fail(s);
}

bool expert_exchange::overlaps() const { return transport_->sends_without_waiting(); }

void expert_exchange::begin(lane& l, const cpu::routed_tokens& rt, bool overlapped) {
  if (l.busy) throw std::logic_error("expert_exchange: a lane's call is still in flight");
  const auto now = clock::now();
  maintain(now);
  l.rt = rt;
  l.busy = true;
  l.overlapped = overlapped;
  l.started = now;
  l.failed_at.reset();
  l.attempt = 0;
  const int64_t n_slots = rt.n_tokens * rt.k;
  l.slots.resize(static_cast<size_t>(n_slots * width_));
  l.done.assign(static_cast<size_t>(n_slots), 0);
  try {
    dispatch(l);
  } catch (...) {
    l.busy = false;
    throw;
  }
}

void expert_exchange::end(lane& l, float* out, int64_t ld_out) {
  if (!l.busy) throw std::logic_error("expert_exchange: finish() of a lane that was not started");
  struct idle {
    lane& l;
    ~idle() { l.busy = false; }
  } done_with{l};
  while (l.call) {
    gather(l);
    dispatch(l);
  }
  cpu::combine_slots(l.rt, l.slots.data(), width_, out, ld_out);
  std::lock_guard lock(mu_);
  ++stats_.calls;
  if (l.overlapped) ++stats_.overlapped_calls;
  if (l.failed_at) stats_.last_recovery_seconds = std::chrono::duration<double>(clock::now() - *l.failed_at).count();
}

void expert_exchange::start(const cpu::routed_tokens& rt, int which) { begin(*lanes_.at(static_cast<size_t>(which)), rt, true); }

void expert_exchange::finish(const cpu::routed_tokens&, int which, float* out, int64_t ld_out) {
  end(*lanes_.at(static_cast<size_t>(which)), out, ld_out);
}

void expert_exchange::abandon(int which) {
  lane& l = *lanes_.at(static_cast<size_t>(which));
  if (l.call) l.call->wait();
  l.call.reset();
  l.busy = false;
}

void expert_exchange::run(const cpu::routed_tokens& rt, float* out, int64_t ld_out) {
  begin(*lanes_[0], rt, false);
  end(*lanes_[0], out, ld_out);
}

}  // namespace tireless
