#pragma once
// A connection whose reads go through a buffer: Cap'n Proto reads a message as several small
// reads (segment table, then segments), each a system call on a bare socket; with a buffer,
// one read fetches whatever the client has sent (many small requests at once under load).

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "server/forwarding_stream.hpp"

namespace tireless {

class read_buffered_stream final : public forwarding_stream {
 public:
  explicit read_buffered_stream(kj::Own<kj::AsyncIoStream> inner, size_t buffer_bytes = 64 * 1024)
      : forwarding_stream(kj::mv(inner)), buffer_(kj::heapArray<kj::byte>(buffer_bytes)) {}

  // Bytes received from the peer so far.
  uint64_t bytes_read() const { return received_; }

  kj::Promise<size_t> tryRead(void* dst, size_t min_bytes, size_t max_bytes) override {
    auto* out = static_cast<kj::byte*>(dst);
    const size_t have = std::min(end_ - begin_, max_bytes);
    std::memcpy(out, buffer_.begin() + begin_, have);
    begin_ += have;
    if (have >= min_bytes) return have;
    begin_ = end_ = 0;
    // Large reads go straight to the caller; small ones fill the buffer first.
    if (max_bytes - have >= buffer_.size()) {
      return inner_->tryRead(out + have, min_bytes - have, max_bytes - have).then([this, have](size_t n) {
        received_ += n;
        return have + n;
      });
    }
    return inner_->tryRead(buffer_.begin(), min_bytes - have, buffer_.size())
        .then([this, out, have, max_bytes](size_t n) {
          received_ += n;
          end_ = n;
          const size_t take = std::min(n, max_bytes - have);
          std::memcpy(out + have, buffer_.begin(), take);
          begin_ = take;
          return have + take;
        });
  }

 private:
  kj::Array<kj::byte> buffer_;
  size_t begin_ = 0, end_ = 0;
  uint64_t received_ = 0;
};

}  // namespace tireless
