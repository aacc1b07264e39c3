#include "experts/expert_service.hpp"

#include <chrono>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "gpu/cpu/half.hpp"
#include "gpu/cpu/isa_kernels.hpp"
#include "gpu/cpu/local_experts.hpp"
#include "gpu/cpu/thread_pool.hpp"
#include "model/model.hpp"

namespace tireless {

size_t activation_bytes(proto::Activations a) { return a == proto::Activations::F16 ? 2 : 4; }

void encode_activations(proto::Activations a, std::span<const float> v, capnp::Data::Builder out) {
  if (a == proto::Activations::F32) {
    std::memcpy(out.begin(), v.data(), v.size() * sizeof(float));
    return;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = cpu::fp32_to_fp16(v[i]);
    std::memcpy(out.begin() + 2 * i, &h, 2);
  }
}

void decode_activations(proto::Activations a, capnp::Data::Reader in, std::span<float> out) {
  if (in.size() != out.size() * activation_bytes(a)) {
    throw std::invalid_argument(fmt::format("activations of {} bytes where {} values were expected", in.size(), out.size()));
  }
  if (a == proto::Activations::F32) {
    std::memcpy(out.data(), in.begin(), in.size());
    return;
  }
  for (size_t i = 0; i < out.size(); ++i) out[i] = cpu::fp16_to_fp32(cpu::load_u16(in.begin() + 2 * i));
}

expert_service::expert_service(std::shared_ptr<const model> m, int threads, int64_t max_pairs, std::vector<int32_t> experts)
    : model_(std::move(m)), pool_(std::make_unique<cpu::thread_pool>(threads)), max_pairs_(max_pairs) {
  if (!model_->config().is_moe()) throw std::invalid_argument(model_->config().name + " is not a mixture of experts");
  const int32_t k = std::max(model_->config().n_expert_used, 1);
  experts_ = std::make_unique<cpu::local_experts>(model_, *pool_, cpu::best_kernels(), (max_pairs + k - 1) / k, std::move(experts));
}

expert_service::~expert_service() = default;

void expert_service::hold(const std::vector<int32_t>& keys) { experts_->hold(keys); }
std::vector<int32_t> expert_service::held() const { return experts_->held(); }

void expert_service::serve(proto::ExpertRequest::Reader r, proto::ExpertReply::Builder reply) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t width = model_->config().n_embd, rows = r.getRows();
  const auto rows_of = r.getSlotRow();
  const auto experts = r.getSlotExpert();
  const int64_t pairs = rows_of.size();
  if (r.getWidth() != width || rows < 0 || experts.size() != rows_of.size()) {
    throw std::invalid_argument(fmt::format("malformed expert request: width {} (this model's: {}), {} rows, {} pair rows, "
                                            "{} pair experts", r.getWidth(), width, rows, rows_of.size(), experts.size()));
  }
  if (pairs > max_pairs_) {
    throw std::invalid_argument(fmt::format("expert request of {} pairs; this shard takes at most {}", pairs, max_pairs_));
  }
  std::vector<int32_t> row(static_cast<size_t>(pairs)), expert(static_cast<size_t>(pairs));
  for (int64_t p = 0; p < pairs; ++p) {
    row[p] = rows_of[static_cast<unsigned>(p)];
    expert[p] = experts[static_cast<unsigned>(p)];
    if (row[p] < 0 || row[p] >= rows) throw std::invalid_argument(fmt::format("pair {} names row {} of {}", p, row[p], rows));
  }
  x_.resize(static_cast<size_t>(rows * width));
  decode_activations(r.getActivations(), r.getX(), x_);
  y_.resize(static_cast<size_t>(pairs * width));
  experts_->compute_pairs(r.getLayer(), x_.data(), width, pairs, row.data(), expert.data(), y_.data());
  auto y = reply.initY(static_cast<unsigned>(y_.size() * activation_bytes(r.getActivations())));
  encode_activations(r.getActivations(), y_, y);
  reply.setMicros(static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count()));
}

}  // namespace tireless
