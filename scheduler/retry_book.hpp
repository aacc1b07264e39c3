#pragma once
// The reservations behind retry tokens. A refusal for load (admission's at arrival or when a
// queued request can no longer start in time; the engine's when an admitted one cannot) says
// when to come back and reserves that return: a token, unguessable, good once, for its tenant,
// from its due time until its window ends. Admission honours it: the client back in time is
// not shed again. Shared by admission and the engine (thread-safe); CAF-free.
//
// Under overload a refusal is the common case (a thousand a second on one H200 with short
// requests, each reservation held for seconds): every operation is logarithmic in the
// reservations held, or constant (the work reserved is kept summed by priority).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tireless {

// When a refused client should come back, and the token of the reservation for that return
// (0: none).
struct retry_promise {
  int64_t retry_after_ms = 0;
  uint64_t retry_token = 0;
};

class retry_book {
 public:
  retry_book() : key_((uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()) {}

  // A client told to come back in `hint_ns` may come back from 95% of it (timers are not
  // exact) until its window ends: at least 3 s past it, or half the hint when that is longer
  // (clients add jitter, and the refusal and the retry each cross a server that may be busy).
  uint64_t reserve(const std::string& tenant, int32_t priority, int32_t prompt_tokens, int64_t now_ns, int64_t hint_ns) {
    std::lock_guard lock(mu_);
    expire(now_ns);
    uint64_t t = 0;
    while (t == 0 || entries_.count(t)) t = mix(key_ ^ ++made_);
    const int64_t expires = now_ns + hint_ns + std::max<int64_t>(3'000'000'000, hint_ns / 2);
    entries_[t] = {tenant, priority, prompt_tokens, now_ns + static_cast<int64_t>(0.95 * hint_ns), expires};
    by_expiry_.emplace(expires, t);
    reserved_work& sum = reserved_[priority];
    sum.prompt_tokens += prompt_tokens;
    ++sum.requests;
    return t;
  }
  // Whether `token` is good now for `tenant`; take() also uses it up.
  bool held(uint64_t token, const std::string& tenant, int64_t now_ns) const {
    std::lock_guard lock(mu_);
    return find(token, tenant, now_ns) != entries_.end();
  }
  bool take(uint64_t token, const std::string& tenant, int64_t now_ns) {
    std::lock_guard lock(mu_);
    auto it = find(token, tenant, now_ns);
    if (it == entries_.end()) return false;
    erase(it);
    return true;
  }
  // The returns still to come of tiers of `priority` and above, for staggering hints: their
  // prompt tokens (what they cost where prefill is the bottleneck) and how many (where the
  // batch's seats are: each takes one for as long as a request takes).
  struct reserved_work {
    double prompt_tokens = 0;
    double requests = 0;
  };
  reserved_work reserved(int32_t priority, int64_t now_ns) {
    std::lock_guard lock(mu_);
    expire(now_ns);
    reserved_work r;
    for (auto it = reserved_.begin(); it != reserved_.end() && it->first >= priority; ++it) {
      r.prompt_tokens += it->second.prompt_tokens;
      r.requests += it->second.requests;
    }
    return r;
  }

 private:
  struct entry {
    std::string tenant;
    int32_t priority = 0, prompt_tokens = 0;
    int64_t due_ns = 0, expires_ns = 0;
  };
  using map = std::unordered_map<uint64_t, entry>;
  map::const_iterator find(uint64_t token, const std::string& tenant, int64_t now_ns) const {
    auto it = token == 0 ? entries_.end() : entries_.find(token);
    if (it == entries_.end() || it->second.tenant != tenant || now_ns < it->second.due_ns ||
        now_ns > it->second.expires_ns) {
      return entries_.end();
    }
    return it;
  }
  void erase(map::const_iterator it) {
    auto sum = reserved_.find(it->second.priority);
    sum->second.prompt_tokens -= it->second.prompt_tokens;
    if (--sum->second.requests == 0) reserved_.erase(sum);
    entries_.erase(it);
  }
  // Reservations past their window, in the order they expire (one taken already is skipped).
  void expire(int64_t now_ns) {
    while (!by_expiry_.empty() && by_expiry_.top().first < now_ns) {
      const uint64_t token = by_expiry_.top().second;
      by_expiry_.pop();
      if (auto it = entries_.find(token); it != entries_.end()) erase(it);
    }
  }
  static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }

  mutable std::mutex mu_;
  map entries_;
  using expiry = std::pair<int64_t, uint64_t>;  // when, token
  std::priority_queue<expiry, std::vector<expiry>, std::greater<>> by_expiry_;
  std::map<int32_t, reserved_work, std::greater<>> reserved_;  // by priority, highest first (sums of integers)
  uint64_t key_;
  uint64_t made_ = 0;
};

}  // namespace tireless
