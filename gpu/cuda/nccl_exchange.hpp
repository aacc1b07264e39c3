#pragma once
// NCCL between the GPUs of one process, behind a small host API with no CUDA or NCCL types:
// one communicator per rank of an expert group, made in one ncclCommInitAll over the group's
// devices in rank order (the order expert_groups.hpp plans), and an all-to-all of rows as
// ncclSend/ncclRecv pairs in one NCCL group, each rank's calls on its own stream. Built with
// NCCL where CMake finds it (TIRELESS_HAVE_NCCL); without, constructing a group throws.

#include <cstdint>
#include <vector>

#include "gpu/cuda/expert_groups.hpp"

namespace tireless::cuda {

bool nccl_built();

class nccl_group {
 public:
  // Throws std::runtime_error with NCCL's message (or: this build has no NCCL).
  explicit nccl_group(const std::vector<int32_t>& devices);
  ~nccl_group();
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;
  int32_t ranks() const { return static_cast<int32_t>(comms_.size()); }

  // Rank a sends c.send[a][b] rows of row_bytes from send[a] + c.send_at[a][b] rows to rank b,
  // which receives them at recv[b] + c.recv_at[b][a] rows; rank r's transfers are enqueued on
  // streams[r] (cudaStream_t as void*). Returns once enqueued; a rank's later work on its
  // stream sees the rows.
  void all_to_all(const exchange_counts& c, int64_t row_bytes, const std::vector<const void*>& send,
                  const std::vector<void*>& recv, const std::vector<void*>& streams);

 private:
  std::vector<void*> comms_;  // ncclComm_t per rank
  std::vector<int32_t> devices_;
};

}  // namespace tireless::cuda
