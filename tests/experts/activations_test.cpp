// Activations on the wire: f32 exact, f16 and int8 within their rounding, bad sizes refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <capnp/message.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "experts/expert_service.hpp"

namespace tireless {
namespace {

std::vector<float> round_trip(proto::Activations a, const std::vector<float>& v, size_t width, size_t* bytes = nullptr) {
  capnp::MallocMessageBuilder mb;
  auto reply = mb.initRoot<proto::ExpertReply>();
  auto y = reply.initY(static_cast<unsigned>(v.size() / width * activation_row_bytes(a, width)));
  encode_activations(a, v, width, y);
  if (bytes) *bytes = y.size();
  std::vector<float> out(v.size());
  decode_activations(a, reply.asReader().getY(), width, out);
  return out;
}

TEST(activations, round_trip_within_each_formats_rounding) {
  const size_t width = 64;
  std::vector<float> v;
  for (size_t r = 0; r < 3; ++r) {
    for (size_t i = 0; i < width; ++i) v.push_back(std::sin(0.37f * i + r) * (r == 1 ? 100.0f : 0.01f));
  }
  std::fill(v.begin() + 2 * width, v.end(), 0.0f);  // a row of zeros: scale 0
  size_t bytes = 0;
  EXPECT_EQ(round_trip(proto::Activations::F32, v, width, &bytes), v);
  EXPECT_EQ(bytes, v.size() * 4);
  const auto h = round_trip(proto::Activations::F16, v, width, &bytes);
  EXPECT_EQ(bytes, v.size() * 2);
  const auto q = round_trip(proto::Activations::INT8, v, width, &bytes);
  EXPECT_EQ(bytes, 3 * (width + 4));
  for (size_t r = 0; r < 3; ++r) {
    float amax = 0;
    for (size_t i = 0; i < width; ++i) amax = std::max(amax, std::fabs(v[r * width + i]));
    for (size_t i = 0; i < width; ++i) {
      const float x = v[r * width + i];
      EXPECT_NEAR(h[r * width + i], x, std::fabs(x) / 1024 + 1e-7f);
      EXPECT_NEAR(q[r * width + i], x, amax / 127 / 2 * 1.001f + 1e-12f) << "row " << r << " value " << i;
    }
  }
}

TEST(activations, bytes_that_are_not_whole_rows_are_refused) {
  capnp::MallocMessageBuilder mb;
  auto reply = mb.initRoot<proto::ExpertReply>();
  reply.initY(70);
  std::vector<float> out(64);
  for (auto a : {proto::Activations::F32, proto::Activations::F16, proto::Activations::INT8}) {
    EXPECT_THAT([&] { decode_activations(a, reply.asReader().getY(), 64, out); },
                ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("rows of 64")));
  }
}

}  // namespace
}  // namespace tireless
