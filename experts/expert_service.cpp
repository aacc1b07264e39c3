#include "experts/expert_service.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "gpu/cpu/half.hpp"
#include "gpu/cpu/isa_kernels.hpp"
#include "gpu/cpu/local_experts.hpp"
#include "gpu/cpu/thread_pool.hpp"
#include "model/model.hpp"

namespace tireless {

size_t activation_row_bytes(proto::Activations a, size_t width) {
  switch (a) {
    case proto::Activations::F16: return 2 * width;
    case proto::Activations::INT8: return width + sizeof(float);
    default: return 4 * width;
  }
}

void encode_activations(proto::Activations a, std::span<const float> v, size_t width, capnp::Data::Builder out) {
  uint8_t* o = out.begin();
  switch (a) {
    case proto::Activations::F16:
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = cpu::fp32_to_fp16(v[i]);
        std::memcpy(o + 2 * i, &h, 2);
      }
      return;
    case proto::Activations::INT8:
      for (size_t r = 0; r * width < v.size(); ++r, o += width + sizeof(float)) {
        const float* x = v.data() + r * width;
        float amax = 0.0f;
        for (size_t i = 0; i < width; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        std::memcpy(o, &scale, sizeof(float));
        for (size_t i = 0; i < width; ++i) {
          o[sizeof(float) + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lrintf(x[i] * inv)));
        }
      }
      return;
    default:
      std::memcpy(o, v.data(), v.size() * sizeof(float));
  }
}

void decode_activations(proto::Activations a, capnp::Data::Reader in, size_t width, std::span<float> out) {
  if (width == 0 || out.size() % width != 0 || in.size() != out.size() / width * activation_row_bytes(a, width)) {
    throw std::invalid_argument(fmt::format("activations of {} bytes where {} values in rows of {} were expected", in.size(),
                                            out.size(), width));
  }
  const uint8_t* p = in.begin();
  switch (a) {
    case proto::Activations::F16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = cpu::fp16_to_fp32(cpu::load_u16(p + 2 * i));
      return;
    case proto::Activations::INT8:
      for (size_t r = 0; r * width < out.size(); ++r, p += width + sizeof(float)) {
        float scale;
        std::memcpy(&scale, p, sizeof(float));
        for (size_t i = 0; i < width; ++i) out[r * width + i] = scale * static_cast<float>(static_cast<int8_t>(p[sizeof(float) + i]));
      }
      return;
    default:
      std::memcpy(out.data(), p, in.size());
  }
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
  decode_activations(r.getActivations(), r.getX(), static_cast<size_t>(width), x_);
  y_.resize(static_cast<size_t>(pairs * width));
  experts_->compute_pairs(r.getLayer(), x_.data(), width, pairs, row.data(), expert.data(), y_.data());
  auto y = reply.initY(static_cast<unsigned>(pairs * activation_row_bytes(r.getActivations(), static_cast<size_t>(width))));
  encode_activations(r.getActivations(), y_, static_cast<size_t>(width), y);
  reply.setMicros(static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count()));
}

}  // namespace tireless
