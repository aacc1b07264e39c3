#pragma once
// A client connection that can tell when its peer has gone, while nobody reads from it.
//
// An HTTP server reads a request, then writes the response; while a long generation runs it
// writes nothing and reads nothing, and a TCP peer's close (FIN) shows only on a read:
// whenWriteDisconnected() waits for POLLHUP, which a FIN alone does not raise. closed() reads
// ahead while a request runs, keeps what it read (a pipelined request) for the HTTP server's
// next read, and resolves at end of stream or on a reset.
//
// Preconditions: closed() is only awaited while the HTTP server is not reading (between the
// end of a request's body and the end of its response), and its promise is dropped before the
// server reads again. At most `max_ahead` bytes are read ahead; past that it stops watching.

#include <algorithm>
#include <cstring>
#include <string>

#include "server/forwarding_stream.hpp"

namespace tireless {

class watched_stream final : public forwarding_stream {
 public:
  explicit watched_stream(kj::Own<kj::AsyncIoStream> inner) : forwarding_stream(kj::mv(inner)) {}

  kj::Promise<void> closed() {
    if (eof_) return kj::READY_NOW;
    if (ahead_.size() >= max_ahead) return kj::NEVER_DONE;
    return inner_->tryRead(buffer_, 1, sizeof(buffer_))
        .then(
            [this](size_t n) -> kj::Promise<void> {
              if (n == 0) {
                eof_ = true;
                return kj::READY_NOW;
              }
              ahead_.append(reinterpret_cast<const char*>(buffer_), n);
              return closed();
            },
            [this](kj::Exception&&) -> kj::Promise<void> {
              eof_ = true;  // reset
              return kj::READY_NOW;
            });
  }

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    if (!ahead_.empty()) {
      const size_t n = std::min(ahead_.size(), max_bytes);
      std::memcpy(buffer, ahead_.data(), n);
      ahead_.erase(0, n);
      if (n >= min_bytes || eof_) return n;
      return inner_->tryRead(static_cast<kj::byte*>(buffer) + n, min_bytes - n, max_bytes - n)
          .then([n](size_t m) { return n + m; });
    }
    if (eof_) return size_t{0};
    return inner_->tryRead(buffer, min_bytes, max_bytes);
  }

 private:
  static constexpr size_t max_ahead = 64 * 1024;
  kj::byte buffer_[4096];
  std::string ahead_;
  bool eof_ = false;
};

}  // namespace tireless
