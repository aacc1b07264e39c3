#pragma once
// The attention shard's side of expert parallelism: for each MoE layer, send every shard
// only the tokens routed to the experts it holds (one call per shard per layer per step),
// gather the outputs and combine them in slot order, so the result equals the single-process
// forward pass bit for bit (f32 activations). Replicas and failover: a pair goes to its
// expert's least-loaded live holder; a shard that fails is revived (restarted or reconnected)
// and the step's layer re-run, its pairs going to replicas meanwhile; a shard that keeps
// failing is fenced and its experts move. Per-expert counts drive the rebalancer.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpu/cpu/expert_ffn.hpp"
#include "protocol/owned.hpp"
#include "protocol/runtime.capnp.h"
#include "scheduler/expert_load.hpp"

namespace tireless {

class model;

// How requests reach the shards: actors in this process, or processes over Cap'n Proto RPC.
class expert_transport {
 public:
  using clock = std::chrono::steady_clock;
  struct reply {
    std::optional<owned<proto::ExpertReply>> msg;
    std::string error;    // why the shard did not answer (msg empty)
    clock::time_point at;  // when it came in
  };
  // Requests sent and not yet gathered.
  class in_flight {
   public:
    virtual ~in_flight() = default;
    virtual std::vector<reply> wait() = 0;  // once
  };
  virtual ~expert_transport() = default;
  virtual int32_t shards() const = 0;
  // Sends requests[i] to shard i where it is non-null, all at once, and returns without
  // waiting; the requests must outlive the returned call's wait(). Transports that cannot
  // send without waiting (the default) answer before they return.
  virtual std::unique_ptr<in_flight> send(const std::vector<const owned<proto::ExpertRequest>*>& requests);
  virtual bool sends_without_waiting() const { return false; }
  // Sends requests[i] to shard i where it is non-null, all at once, and waits for them all.
  virtual std::vector<reply> exchange(const std::vector<const owned<proto::ExpertRequest>*>& requests) = 0;
  // Brings a failed shard back (a fresh actor, or a new connection to a restarted process),
  // trying for at most `wait`. False when it is not back.
  virtual bool revive(int32_t shard, std::chrono::milliseconds wait) = 0;
  // Makes a shard hold more experts (keys: layer * n_expert + expert). Throws on failure.
  virtual void hold(int32_t shard, const std::vector<int32_t>& keys) = 0;
};

struct expert_exchange_options {
  proto::Activations activations = proto::Activations::F32;
  // A shard that fails more than max_restarts times within restart_window is fenced: its
  // experts move to live shards and it is not tried again.
  int32_t max_restarts = 5;
  std::chrono::milliseconds restart_window{60'000};
  std::chrono::milliseconds revive_wait{10'000};  // how long a step waits for a shard to come back
  // Every this many MoE layer calls, replicate hot experts (0: never); each shard takes up to
  // replicas_per_shard extra experts per layer.
  int64_t rebalance_every = 0;
  int32_t replicas_per_shard = 0;
};

struct expert_exchange_stats {
  int32_t shards = 0, live = 0, fenced = 0;
  int64_t calls = 0;                 // MoE layer calls (each one RPC per shard that has tokens)
  int64_t tokens = 0;                // token rows of those calls
  int64_t bytes_out = 0, bytes_in = 0;  // request and reply messages, serialized
  double dispatch_seconds = 0;       // from sending a layer call to its last reply, beyond the slowest shard's compute
  double shard_seconds = 0;          // the shards' compute time, summed
  double wait_seconds = 0;           // the caller blocked waiting for replies (what overlap hides)
  int64_t overlapped_calls = 0;      // calls sent with start() while the caller went on
  std::vector<double> per_shard_seconds;  // each shard's compute time: its busy share of a run's wall time
  int64_t failures = 0, revivals = 0, rebalances = 0, replicas = 0;
  double last_recovery_seconds = 0;  // from a failed call to the layer's completion
  std::vector<int64_t> per_shard_pairs;   // pairs each shard computed
  std::vector<int64_t> per_expert_pairs;  // [layer][expert]
  // [layer][shard], since the last rebalance: how evenly the shards share each layer's pairs.
  std::vector<int64_t> per_layer_shard_pairs;
  double shard_imbalance() const;  // max over mean per layer, averaged over layers that routed any
};

class expert_exchange final : public cpu::expert_ffn {
 public:
  expert_exchange(std::shared_ptr<const model> m, std::unique_ptr<expert_transport> t, expert_placement p,
                  expert_exchange_options o);
  ~expert_exchange() override;

  void run(const cpu::routed_tokens& tokens, float* out, int64_t ld_out) override;
  bool overlaps() const override;
  void start(const cpu::routed_tokens& tokens, int lane) override;
  void finish(const cpu::routed_tokens& tokens, int lane, float* out, int64_t ld_out) override;
  void abandon(int lane) override;

  // Any thread: a snapshot as of the last completed call.
  expert_exchange_stats stats() const;
  expert_placement placement() const;
  // Asks for hot experts to be replicated (from the counts so far) before the next call.
  void request_rebalance(int32_t replicas_per_shard);

 private:
  using clock = std::chrono::steady_clock;
  struct lane;
  void begin(lane& l, const cpu::routed_tokens& tokens, bool overlapped);
  void end(lane& l, float* out, int64_t ld_out);
  void maintain(clock::time_point now);
  bool dispatch(lane& l);
  void gather(lane& l);
  void fail(int32_t shard);
  void revive(int32_t shard, std::chrono::milliseconds wait);
  void fence(int32_t shard);
  void rebalance(int32_t replicas_per_shard);
  void publish_shards();

  // The calling (backend) thread's own state.
  std::shared_ptr<const model> model_;
  std::unique_ptr<expert_transport> transport_;
  expert_exchange_options opt_;
  int64_t width_;
  expert_placement placement_;
  std::vector<char> live_, fenced_;
  std::vector<std::vector<clock::time_point>> failures_;  // per shard, within the window
  std::vector<clock::time_point> last_try_;              // per shard: the last revival attempt
  int64_t last_rebalance_calls_ = 0;
  std::vector<int64_t> load_;  // [layer][shard]: pairs so far (assign_pairs' running load; each layer waits for its slowest shard)
  std::vector<std::unique_ptr<lane>> lanes_;  // micro-batches in flight (ping-pong: two)
  // Shared with other threads. stats_ is written by the calling thread under mu_, and read
  // by others under it.
  mutable std::mutex mu_;
  expert_exchange_stats stats_;
  expert_placement published_placement_;
  int32_t rebalance_request_ = -1;
};

}  // namespace tireless
