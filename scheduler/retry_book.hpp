#pragma once
// The reservations behind retry tokens. A refusal for load (admission's at arrival or when a
// queued request can no longer start in time; the engine's when an admitted one cannot) says
// when to come back and reserves that return: a token, unguessable, good once, for its tenant,
// from its due time until its window ends. Admission honours it: the client back in time is
// not shed again. Shared by admission and the engine (thread-safe); CAF-free.

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>

namespace tireless {

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
    entries_[t] = {tenant, priority, prompt_tokens, now_ns + static_cast<int64_t>(0.95 * hint_ns),
                   now_ns + hint_ns + std::max<int64_t>(3'000'000'000, hint_ns / 2)};
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
    entries_.erase(it);
    return true;
  }
  // The prompt tokens reserved by tiers of `priority` and above (the returns still to come),
  // for staggering hints.
  double reserved_tokens(int32_t priority, int64_t now_ns) {
    std::lock_guard lock(mu_);
    expire(now_ns);
    double n = 0;
    for (const auto& [t, e] : entries_) {
      if (e.priority >= priority) n += e.prompt_tokens;
    }
    return n;
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
  void expire(int64_t now_ns) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->second.expires_ns < now_ns ? entries_.erase(it) : std::next(it);
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
  uint64_t key_;
  uint64_t made_ = 0;
};

}  // namespace tireless
