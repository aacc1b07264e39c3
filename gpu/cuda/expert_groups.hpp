#pragma once
// The experts of a mixture-of-experts model spread over the GPUs of one process: which rank
// holds which experts, how big the exchange buffers are, in which order the NCCL communicators
// are set up, and when it all falls back to one GPU. No CUDA or NCCL here: unit-tested on any
// machine; gpu/cuda/nccl_exchange.cpp does what this decides.
//
// One expert group = the GPUs that share a layer's experts; one NCCL communicator per rank of
// the group (ncclCommInitAll over the group's devices in rank order, in one call, as one thread
// drives every GPU of the process). Rank 0 runs attention, the router and the combine; each
// rank, rank 0 included, runs the experts of one contiguous range, so that a step's pairs
// sorted by expert are also sorted by rank: rank r's pairs are one slice of them. Per MoE layer:
//   dispatch  rank 0 → rank r: the normalized hidden states of rank r's pairs, f32 [n][hidden]
//   combine   rank r → rank 0: those pairs' expert outputs, f32 [n][hidden]
// both an all-to-all of ncclSend/ncclRecv pairs in one NCCL group (with attention on rank 0
// only, the other ranks send each other nothing).

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tireless::cuda {

struct expert_group_request {
  std::vector<int32_t> devices;   // wanted, rank order (backend.cuda_devices); empty: {0}
  int32_t devices_present = 0;    // what the driver reports
  bool nccl_built = false;        // the build found NCCL
  int32_t n_expert = 0, n_expert_used = 0;  // 0 experts: a dense model
  int64_t max_step_tokens = 0, hidden = 0;
};

struct expert_group_plan {
  std::vector<int32_t> devices;       // rank r on devices[r]; one entry: no exchange
  std::vector<int32_t> first_expert;  // [ranks + 1]: rank r holds [first_expert[r], first_expert[r + 1])
  int64_t max_pairs = 0;              // pairs of a step: max_step_tokens x n_expert_used
  int64_t pair_bytes = 0;             // one pair's row in either direction, f32 [hidden]
  std::string fallback;               // why fewer devices than asked are used ("" when none)

  int32_t ranks() const { return static_cast<int32_t>(devices.size()); }
  bool exchanges() const { return devices.size() > 1; }
  int32_t rank_of(int32_t expert) const;
  // Bytes of one rank's dispatch (or combine) buffer: every pair of a step may go to one rank.
  int64_t buffer_bytes() const { return max_pairs * pair_bytes; }
};

// Throws std::invalid_argument with what to change: a device id twice, an id the driver does
// not have, several devices for a dense model (tensor parallelism is not built), more ranks than
// experts. Without NCCL, several devices fall back to the first one (plan.fallback says so).
expert_group_plan plan_expert_groups(const expert_group_request& r);

// What each rank sends to and receives from each other rank in one all-to-all, in rows (pairs):
// send[src][dst] rows, laid out in src's send buffer at send_at[src][dst] and in dst's receive
// buffer at recv_at[dst][src] (a rank's own rows are not sent: it reads them in place).
struct exchange_counts {
  std::vector<std::vector<int64_t>> send, send_at, recv, recv_at;  // [rank][peer]
  int64_t rows_in(int32_t rank) const;                              // received by rank
};

// The dispatch of one MoE layer from the step's pairs sorted by expert: expert_offsets[e] is
// the first pair of expert e ([n_expert + 1]). Rank 0 sends rank r its slice; the combine is the
// same exchange reversed (transpose()).
exchange_counts dispatch_counts(const expert_group_plan& plan, std::span<const int32_t> expert_offsets);
exchange_counts transpose(const exchange_counts& c);

}  // namespace tireless::cuda
