#include "scheduler/prefix_index.hpp"

namespace tireless {

prefix_index::prefix_index(int32_t block_size, int64_t capacity_blocks)
    : block_size_(block_size), capacity_(block_size > 0 ? capacity_blocks : 0) {}

int32_t prefix_index::cached_tokens(std::span<const token_id> prompt) const {
  if (capacity_ <= 0 || prompt.size() < 2) return 0;
  const size_t reusable = (prompt.size() - 1) / static_cast<size_t>(block_size_);
  uint64_t key = 0;
  size_t found = 0;
  for (; found < reusable; ++found) {
    key = default_block_hash(key, prompt.subspan(found * block_size_, static_cast<size_t>(block_size_)));
    if (!where_.count(key)) break;
  }
  return static_cast<int32_t>(found) * block_size_;
}

void prefix_index::record(std::span<const token_id> prompt) {
  if (capacity_ <= 0) return;
  const size_t full = prompt.size() / static_cast<size_t>(block_size_);
  uint64_t key = 0;
  for (size_t b = 0; b < full; ++b) {
    key = default_block_hash(key, prompt.subspan(b * block_size_, static_cast<size_t>(block_size_)));
    auto it = where_.find(key);
    if (it != where_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      continue;
    }
    order_.push_front(key);
    where_.emplace(key, order_.begin());
    if (static_cast<int64_t>(order_.size()) > capacity_) {
      where_.erase(order_.back());
      order_.pop_back();
    }
  }
}

}  // namespace tireless
