#include "gpu/cuda/nccl_exchange.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace tireless::cuda {

namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

}  // namespace

bool nccl_built() { return true; }

nccl_group::nccl_group(const std::vector<int32_t>& devices) : devices_(devices) {
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  std::vector<int> ids(devices.begin(), devices.end());
  // One call makes every rank's communicator (a single thread driving all of the group's GPUs).
  check_nccl(ncclCommInitAll(comms.data(), static_cast<int>(comms.size()), ids.data()), "ncclCommInitAll");
  for (ncclComm_t c : comms) comms_.push_back(c);
}

nccl_group::~nccl_group() {
  for (void* c : comms_) {
    if (c) ncclCommDestroy(static_cast<ncclComm_t>(c));
  }
}

void nccl_group::all_to_all(const exchange_counts& c, int64_t row_bytes, const std::vector<const void*>& send,
                            const std::vector<void*>& recv, const std::vector<void*>& streams) {
  const size_t n = comms_.size();
  if (c.send.size() != n || send.size() != n || recv.size() != n || streams.size() != n) {
    throw std::invalid_argument("nccl_group::all_to_all: one buffer and stream per rank");
  }
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  try {
    for (size_t a = 0; a < n; ++a) {
      auto* comm = static_cast<ncclComm_t>(comms_[a]);
      auto* s = static_cast<cudaStream_t>(streams[a]);
      for (size_t b = 0; b < n; ++b) {
        if (a == b) continue;  // a rank's own rows stay in place
        if (const int64_t rows = c.send[a][b]; rows > 0) {
          const auto* src = static_cast<const char*>(send[a]) + c.send_at[a][b] * row_bytes;
          check_nccl(ncclSend(src, static_cast<size_t>(rows * row_bytes), ncclInt8, static_cast<int>(b), comm, s), "ncclSend");
        }
        if (const int64_t rows = c.recv[a][b]; rows > 0) {
          auto* dst = static_cast<char*>(recv[a]) + c.recv_at[a][b] * row_bytes;
          check_nccl(ncclRecv(dst, static_cast<size_t>(rows * row_bytes), ncclInt8, static_cast<int>(b), comm, s), "ncclRecv");
        }
      }
    }
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
}

}  // namespace tireless::cuda
