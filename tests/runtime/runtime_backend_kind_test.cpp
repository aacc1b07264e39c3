// backend.kind on the threaded runtime: "cuda" without a usable device refuses to start and
// says why and what to use instead (before the model is even opened); "auto" takes the GPU
// where there is one and the CPU otherwise, and serves either way.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gpu/cuda/cuda_backend.hpp"
#include "tireless/runtime.hpp"

namespace tireless {
namespace {

using ::testing::HasSubstr;

std::string tiny_dense() {
  const char* dir = std::getenv("TIRELESS_TEST_DATA");
  return std::string(dir ? dir : TIRELESS_BINARY_DIR "/test-data") + "/tiny-dense.gguf";
}

runtime_config config_of(const std::string& kind, const std::string& model) {
  return parse_config(R"(
[model]
path = ")" + model + R"("
[backend]
kind = ")" + kind + R"("
threads = 1
[kv]
blocks = 64
[admission]
default_max_tokens = 16
[[tiers]]
name = "only"
priority = 1
ttft_ms = 60000
tpot_ms = 60000
[[tenants]]
name = "user"
keys = ["sk-user"]
tier = "only"
)",
                      "runtime_backend_kind");
}

TEST(runtime_backend_kind, cuda_without_a_device_refuses_to_start_and_says_what_to_use) {
  if (cuda::cuda_available()) GTEST_SKIP() << "a CUDA device is here";
  try {
    runtime::start(config_of("cuda", "/nonexistent/model.gguf"));
    FAIL() << "the runtime started";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_THAT(m, HasSubstr("backend.kind = \"cuda\""));
    EXPECT_THAT(m, HasSubstr(cuda::cuda_built() ? "no usable CUDA device here" : "no CUDA backend"));
    EXPECT_THAT(m, HasSubstr("kind = \"cpu\""));
    EXPECT_THAT(m, ::testing::Not(HasSubstr("nonexistent"))) << "refused before the model is opened";
  }
}

TEST(runtime_backend_kind, auto_serves_on_the_gpu_where_there_is_one_else_on_the_cpu) {
  if (!std::filesystem::exists(tiny_dense())) GTEST_SKIP() << "no tiny-dense.gguf";
  auto rt = runtime::start(config_of("auto", tiny_dense()));
  EXPECT_THAT(rt->describe(), HasSubstr(cuda::cuda_available() ? "cuda (" : "cpu ("));
  request r;
  r.api_key = "sk-user";
  r.prompt_tokens = {1, 2, 3, 4};
  r.max_tokens = 3;
  const outcome o = rt->generate(std::move(r)).get();
  EXPECT_EQ(o.kind, outcome_kind::completed) << o.message;
  rt->shutdown(std::chrono::milliseconds(0));
}

}  // namespace
}  // namespace tireless
