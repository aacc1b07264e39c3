#pragma once
// The RPC connections of tireless-serve: accepts them, gives each its own view of the
// Inference service (so the server knows what every connection is doing), and keeps a few
// idle or hostile clients from locking everyone else out:
//  - a connection that sends nothing within handshake_timeout of connecting is closed;
//  - one with no call for idle_timeout (since it connected, or since its last call) and no
//    request of its own running is closed: a client trickling bytes that never make a call
//    is closed too;
//  - when the server (or one peer address) is at its connection limit, the longest-idle
//    connection (of that peer) makes room; when none is idle, the newcomer is served by a
//    refusing bootstrap whose every generate() ends in rejected(overloaded) with a retry hint
//    and a message naming the limit, and is closed shortly after.
// Loop thread only.

#include <capnp/message.h>
#include <kj/async-io.h>
#include <kj/timer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "server/inference_service.hpp"

namespace tireless {

struct connection_limits {
  int32_t max_connections = 256;
  int32_t max_per_peer = 64;
  kj::Duration idle_timeout = 120 * kj::SECONDS;
  kj::Duration handshake_timeout = 10 * kj::SECONDS;
  int32_t max_refusing = 16;           // refused connections served at once; more are closed at once
  kj::Duration refusal_linger = 500 * kj::MILLISECONDS;  // after a refused connection's last call
  int64_t retry_after_ms = 1000;       // the hint given with a refusal
  capnp::ReaderOptions reader;         // per-message limits of the transport
};

struct connection_counts {
  int64_t accepted = 0, refused = 0, dropped = 0;   // refused: served a refusal; dropped: closed at once
  int64_t closed_handshake = 0, closed_idle = 0, evicted = 0;
};

class connection_manager {
 public:
  connection_manager(kj::Timer& timer, inference_service& service, connection_limits limits);
  ~connection_manager();

  // Accepts connections from `listener` until the promise is dropped.
  kj::Promise<void> listen(kj::ConnectionReceiver& listener);
  // Takes one connection (what listen() does with each).
  void accept(kj::Own<kj::AsyncIoStream> stream);

  int32_t open() const { return open_count_; }  // served connections (refused ones not counted)
  const connection_counts& counts() const { return counts_; }

 private:
  struct connection;
  void close(uint64_t id, const char* why);
  // The idle connection (of `peer`, or of anyone when empty) that has waited longest; 0: none.
  uint64_t longest_idle(const std::string* peer) const;
  kj::Promise<void> sweep();

  kj::Timer& timer_;
  inference_service& service_;
  connection_limits limits_;
  std::map<uint64_t, kj::Own<connection>> connections_;
  std::map<std::string, int32_t> per_peer_;
  int32_t open_count_ = 0, refusing_count_ = 0;
  uint64_t next_id_ = 1;
  connection_counts counts_;
  kj::TaskSet tasks_;
  kj::Promise<void> sweeping_ = nullptr;
};

}  // namespace tireless
