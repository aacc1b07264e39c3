// The decode matrix-vector product on the GPU: how close batch-1 decode's weight reads come to
// the device's memory bandwidth. A [rows][cols] matrix in each GGUF type (laid out for the
// device as the backend lays it out), y = W x repeated with x already quantized to 8 bits (the
// product alone); bytes of W read per second against --peak-gbs (4,800 GB/s: an H200's HBM3e).
// A matrix of 16384 x 16384 in q4_0 is 151 MB, far past the 50 MB L2: every pass reads HBM.
//
//   build/bench/cuda_matvec [--rows 16384] [--cols 16384] [--iters 200] [--peak-gbs 4800] [--tokens 1]
//
// Exit 77 where no CUDA device is present (scripts/gpu-check runs it on a lent GPU).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/weight_layout.hpp"

int main(int argc, char** argv) {
  using namespace tireless;
  int64_t rows = 16384, cols = 16384;
  int iters = 200, tokens = 1;
  double peak = 4800;
  CLI::App app{"tireless: the CUDA decode matvec's achieved memory bandwidth"};
  app.add_option("--rows", rows)->check(CLI::PositiveNumber);
  app.add_option("--cols", cols, "a multiple of 32")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters)->check(CLI::PositiveNumber);
  app.add_option("--tokens", tokens, "tokens per product (decode batch), 1..8")->check(CLI::Range(1, 8));
  app.add_option("--peak-gbs", peak, "the device's memory bandwidth, GB/s")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  std::string why;
  if (!cuda::device_available(&why)) {
    std::printf("cuda_matvec: skipped: %s\n", why.c_str());
    return 77;
  }
  std::mt19937 g(1);
  std::vector<float> x(static_cast<size_t>(cols * tokens));
  for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(g);
  cuda::device_buffer dx(x.size() * 4), dy(static_cast<size_t>(rows * tokens) * 4);
  dx.upload(x.data(), dx.size());
  cuda::device_buffer q(static_cast<size_t>(cols * tokens)), d(static_cast<size_t>(cols / 32 * tokens * 4)),
      s(static_cast<size_t>(cols / 32 * tokens * 4));
  const cuda::q8_rows xq{q.as<int8_t>(), d.as<float>(), s.as<float>(), cols / 32};
  cuda::quantize_q8(dx.as<float>(), cols, tokens, cols, nullptr, xq);
  std::printf("%-6s %10s %12s %10s %8s   (%d token%s a product)\n", "type", "MB", "us/product", "GB/s", "of peak", tokens,
              tokens == 1 ? "" : "s");
  for (tensor_type t : {tensor_type::q4_0, tensor_type::q4_1, tensor_type::q8_0, tensor_type::f16}) {
    const cuda::matrix_layout l = cuda::layout_of(t, rows, cols);
    std::vector<uint8_t> w(l.bytes);
    for (auto& b : w) b = static_cast<uint8_t>(g() & 0x3f);  // small fp16 scales: no inf/nan
    cuda::device_buffer dw(l.bytes);
    dw.upload(w.data(), l.bytes);
    const cuda::device_matrix m = cuda::view_of(l, dw.data());
    const cuda::product_scratch none{};
    for (int i = 0; i < 10; ++i) cuda::matmul(m, dx.as<float>(), cols, &xq, tokens, dy.as<float>(), rows, false, none);
    cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) cuda::matmul(m, dx.as<float>(), cols, &xq, tokens, dy.as<float>(), rows, false, none);
    cuda::synchronize();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    const double bytes = static_cast<double>(row_bytes(t, cols)) * static_cast<double>(rows);
    const double gbs = bytes / sec / 1e9;
    std::printf("%-6s %10.1f %12.1f %10.0f %7.1f%%\n", std::string(name(t)).c_str(), bytes / 1e6, sec * 1e6, gbs,
                100 * gbs / peak);
  }
  return 0;
}
