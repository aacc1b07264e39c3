// The decode matrix-vector product on the GPU: how close batch-1 decode's weight reads come to
// the device's memory bandwidth. A [rows][cols] matrix in each GGUF type, y = W x repeated;
// bytes of W read per second against --peak-gbs (4,800 GB/s: an H200's HBM3e).
//
//   build/bench/cuda_matvec [--rows 16384] [--cols 16384] [--iters 200] [--peak-gbs 4800]
//
// Exit 77 where no CUDA device is present (scripts/gpu-check runs it on a lent GPU).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "gpu/cuda/ops.hpp"

int main(int argc, char** argv) {
  using namespace tireless;
  int64_t rows = 16384, cols = 16384;
  int iters = 200;
  double peak = 4800;
  CLI::App app{"tireless: the CUDA decode matvec's achieved memory bandwidth"};
  app.add_option("--rows", rows)->check(CLI::PositiveNumber);
  app.add_option("--cols", cols, "a multiple of 32, at most 24,576")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters)->check(CLI::PositiveNumber);
  app.add_option("--peak-gbs", peak, "the device's memory bandwidth, GB/s")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  std::string why;
  if (!cuda::device_available(&why)) {
    std::printf("cuda_matvec: skipped: %s\n", why.c_str());
    return 77;
  }
  std::mt19937 g(1);
  std::vector<float> x(static_cast<size_t>(cols));
  for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(g);
  cuda::device_buffer dx(x.size() * 4), dy(static_cast<size_t>(rows) * 4);
  dx.upload(x.data(), dx.size());
  std::printf("%-6s %10s %12s %10s %8s\n", "type", "MB", "us/product", "GB/s", "of peak");
  for (tensor_type t : {tensor_type::q4_0, tensor_type::q4_1, tensor_type::q8_0, tensor_type::f16}) {
    const size_t bytes = row_bytes(t, cols) * static_cast<size_t>(rows);
    std::vector<uint8_t> w(bytes);
    for (auto& b : w) b = static_cast<uint8_t>(g() & 0x3f);  // small fp16 scales: no inf/nan
    cuda::device_buffer dw(bytes);
    dw.upload(w.data(), bytes);
    for (int i = 0; i < 10; ++i) cuda::matvec(t, dw.data(), rows, cols, dx.as<float>(), dy.as<float>());
    cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) cuda::matvec(t, dw.data(), rows, cols, dx.as<float>(), dy.as<float>());
    cuda::synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    const double gbs = static_cast<double>(bytes) / s / 1e9;
    std::printf("%-6s %10.1f %12.1f %10.0f %7.1f%%\n", std::string(name(t)).c_str(), bytes / 1e6, s * 1e6, gbs,
                100 * gbs / peak);
  }
  return 0;
}
