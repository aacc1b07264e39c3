// The CUDA backend's keys: backend.kind = "cuda" or "auto", backend.cuda_devices, each problem
// named with its place.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "config/runtime_config.hpp"

namespace tireless {
namespace {

using ::testing::HasSubstr;

constexpr std::string_view tier = R"(
[[tiers]]
name = "only"
priority = 1
ttft_ms = 1000
tpot_ms = 100
)";

std::string problem(const std::string& backend) {
  try {
    parse_config("[backend]\n" + backend + "\n" + std::string(tier), "test.toml");
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

TEST(cuda_backend_config, kind_auto_and_device_ids_are_read) {
  const runtime_config c = parse_config("[backend]\nkind = \"auto\"\ncuda_devices = [1, 0]\n" + std::string(tier), "t");
  EXPECT_EQ(c.backend.kind, backend_kind::automatic);
  EXPECT_EQ(to_string(c.backend.kind), "auto");
  EXPECT_EQ(c.backend.cuda_devices, (std::vector<int32_t>{1, 0}));
  EXPECT_TRUE(parse_config(std::string(tier), "t").backend.cuda_devices.empty());  // [0] is the backend's default
}

TEST(cuda_backend_config, bad_device_lists_are_named_with_their_place) {
  EXPECT_THAT(problem("kind = \"cuda\"\ncuda_devices = [0, 0]"), HasSubstr("backend.cuda_devices[1]: 0 is listed twice"));
  EXPECT_THAT(problem("kind = \"cuda\"\ncuda_devices = [-1]"), HasSubstr("backend.cuda_devices[0]: -1 is out of range"));
  EXPECT_THAT(problem("kind = \"cuda\"\ncuda_devices = []"), HasSubstr("backend.cuda_devices"));
  EXPECT_THAT(problem("kind = \"cuda\"\ncuda_devices = [\"0\"]"), HasSubstr("expected an integer"));
  EXPECT_THAT(problem("kind = \"gpu\""), HasSubstr("\"cpu\", \"sim\", \"cuda\", \"auto\""));
  EXPECT_THAT(problem("kind = \"cuda\"\nexpert_shards = 2"), HasSubstr("applies to the cpu backend"));
}

TEST(cuda_backend_config, device_ids_with_a_cpu_backend_are_a_warning) {
  const runtime_config c = parse_config("[backend]\nkind = \"cpu\"\ncuda_devices = [0]\n" + std::string(tier), "t");
  bool warned = false;
  for (const std::string& w : c.warnings) warned = warned || w.find("cuda_devices") != std::string::npos;
  EXPECT_TRUE(warned);
}

}  // namespace
}  // namespace tireless
