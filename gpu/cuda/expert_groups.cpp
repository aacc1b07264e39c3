#include "gpu/cuda/expert_groups.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace tireless::cuda {

int32_t expert_group_plan::rank_of(int32_t expert) const {
  const auto it = std::upper_bound(first_expert.begin(), first_expert.end(), expert);
  if (expert < 0 || it == first_expert.begin() || it == first_expert.end()) {
    throw std::out_of_range(fmt::format("expert {} is in no rank", expert));
  }
  return static_cast<int32_t>(it - first_expert.begin()) - 1;
}

expert_group_plan plan_expert_groups(const expert_group_request& r) {
  std::vector<int32_t> devices = r.devices.empty() ? std::vector<int32_t>{0} : r.devices;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= r.devices_present) {
      throw std::invalid_argument(fmt::format("backend.cuda_devices: device {} does not exist here ({} CUDA device{}: "
                                              "ids 0..{}); list devices that nvidia-smi shows",
                                              devices[i], r.devices_present, r.devices_present == 1 ? "" : "s",
                                              r.devices_present - 1));
    }
    if (std::find(devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(i), devices[i]) !=
        devices.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw std::invalid_argument(fmt::format("backend.cuda_devices: device {} is listed twice", devices[i]));
    }
  }
  expert_group_plan p;
  if (devices.size() > 1 && r.n_expert == 0) {
    throw std::invalid_argument(fmt::format(
        "backend.cuda_devices lists {} devices for a dense model: the CUDA backend spreads only the experts of a "
        "mixture-of-experts model over GPUs (no tensor parallelism); list one device",
        devices.size()));
  }
  if (devices.size() > 1 && !r.nccl_built) {
    p.fallback = fmt::format("this build has no NCCL: the experts run on device {} with the rest, not on {} devices",
                             devices[0], devices.size());
    devices.erase(devices.begin() + 1, devices.end());
  }
  if (r.n_expert > 0 && static_cast<int64_t>(devices.size()) > r.n_expert) {
    throw std::invalid_argument(fmt::format("backend.cuda_devices lists {} devices for {} experts: each device needs at "
                                            "least one expert; list at most {}",
                                            devices.size(), r.n_expert, r.n_expert));
  }
  p.devices = devices;
  const auto ranks = static_cast<int32_t>(devices.size());
  // Contiguous ranges, the remainder one each to the first ranks (rank 0 also runs attention,
  // but the experts' weights dominate the memory of a large MoE: balance those).
  p.first_expert.assign(static_cast<size_t>(ranks) + 1, 0);
  for (int32_t k = 0; k < ranks; ++k) {
    const int32_t share = r.n_expert / ranks + (k < r.n_expert % ranks ? 1 : 0);
    p.first_expert[k + 1] = p.first_expert[k] + share;
  }
  p.max_pairs = r.max_step_tokens * std::max(r.n_expert_used, 1);
  p.pair_bytes = r.hidden * 4;
  return p;
}

int64_t exchange_counts::rows_in(int32_t rank) const {
  int64_t n = 0;
  for (int64_t v : recv[rank]) n += v;
  return n;
}

namespace {

exchange_counts empty_counts(int32_t ranks) {
  exchange_counts c;
  const std::vector<int64_t> zeros(static_cast<size_t>(ranks), 0);
  c.send.assign(static_cast<size_t>(ranks), zeros);
  c.send_at = c.recv = c.recv_at = c.send;
  return c;
}

// Offsets from counts, each buffer's rows in peer order.
void lay_out(exchange_counts& c) {
  const size_t ranks = c.send.size();
  for (size_t a = 0; a < ranks; ++a) {
    int64_t s = 0, v = 0;
    for (size_t b = 0; b < ranks; ++b) {
      c.recv[a][b] = c.send[b][a];
      c.send_at[a][b] = s;
      s += c.send[a][b];
      c.recv_at[a][b] = v;
      v += c.recv[a][b];
    }
  }
}

}  // namespace

exchange_counts dispatch_counts(const expert_group_plan& plan, std::span<const int32_t> offsets) {
  const int32_t ranks = plan.ranks();
  const size_t n_expert = static_cast<size_t>(plan.first_expert.back());
  if (offsets.size() != n_expert + 1) {
    throw std::invalid_argument(fmt::format("dispatch_counts: {} offsets for {} experts", offsets.size(), n_expert));
  }
  exchange_counts c = empty_counts(ranks);
  // Rank 0's rows are in place: its send buffer holds every pair, rank r's slice starting at
  // the first pair of its first expert.
  for (int32_t r = 1; r < ranks; ++r) {
    c.send[0][r] = offsets[plan.first_expert[r + 1]] - offsets[plan.first_expert[r]];
  }
  lay_out(c);
  for (int32_t r = 1; r < ranks; ++r) c.send_at[0][r] = offsets[plan.first_expert[r]];
  return c;
}

exchange_counts transpose(const exchange_counts& c) {
  exchange_counts t = empty_counts(static_cast<int32_t>(c.send.size()));
  for (size_t a = 0; a < c.send.size(); ++a) {
    for (size_t b = 0; b < c.send.size(); ++b) {
      t.send[a][b] = c.recv[a][b];
      t.send_at[a][b] = c.recv_at[a][b];
      t.recv[a][b] = c.send[a][b];
      t.recv_at[a][b] = c.send_at[a][b];
    }
  }
  return t;
}

}  // namespace tireless::cuda
