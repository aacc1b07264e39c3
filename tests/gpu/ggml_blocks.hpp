#pragma once
// Test helpers: ggml's reference quantizers and dequantizers for the block formats, written
// from the format description, independent of the kernels under test.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/cpu/half.hpp"
#include "gpu/tensor_type.hpp"

namespace tireless::test {

inline void put_half(uint8_t* p, float v) {
  const uint16_t h = cpu::fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}
inline float get_half(const uint8_t* p) { return cpu::fp16_to_fp32(cpu::load_u16(p)); }

// Quantizes rows of floats into ggml blocks of `type` (q4_0, q4_1, q8_0, f16, f32, bf16).
inline std::vector<std::byte> quantize(tensor_type type, const std::vector<float>& x) {
  std::vector<std::byte> out(row_bytes(type, static_cast<int64_t>(x.size())));
  auto* o = reinterpret_cast<uint8_t*>(out.data());
  const size_t nb = x.size() / 32;
  for (size_t i = 0; i < x.size() && !is_quantized(type); ++i) {
    if (type == tensor_type::f32) std::memcpy(o + 4 * i, &x[i], 4);
    if (type == tensor_type::f16) put_half(o + 2 * i, x[i]);
    if (type == tensor_type::bf16) {
      uint32_t bits;
      std::memcpy(&bits, &x[i], 4);
      const uint16_t h = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
      std::memcpy(o + 2 * i, &h, 2);
    }
  }
  for (size_t b = 0; b < nb && is_quantized(type); ++b) {
    const float* v = &x[b * 32];
    uint8_t* blk = o + b * block_bytes(type);
    if (type == tensor_type::q8_0) {
      float amax = 0;
      for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(v[e]));
      const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
      put_half(blk, d);
      for (int e = 0; e < 32; ++e) blk[2 + e] = static_cast<uint8_t>(static_cast<int8_t>(std::round(v[e] * id)));
    } else if (type == tensor_type::q4_0) {
      float amax = 0, max = 0;
      for (int e = 0; e < 32; ++e)
        if (std::fabs(v[e]) > amax) amax = std::fabs(v[e]), max = v[e];
      const float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
      put_half(blk, d);
      for (int e = 0; e < 16; ++e) {
        const int lo = std::min(15, static_cast<int>(v[e] * id + 8.5f));
        const int hi = std::min(15, static_cast<int>(v[e + 16] * id + 8.5f));
        blk[2 + e] = static_cast<uint8_t>(lo | (hi << 4));
      }
    } else {
      float mn = v[0], mx = v[0];
      for (int e = 0; e < 32; ++e) mn = std::min(mn, v[e]), mx = std::max(mx, v[e]);
      const float d = (mx - mn) / 15.0f, id = d ? 1.0f / d : 0.0f;
      put_half(blk, d);
      put_half(blk + 2, mn);
      for (int e = 0; e < 16; ++e) {
        const int lo = std::min(15, static_cast<int>((v[e] - mn) * id + 0.5f));
        const int hi = std::min(15, static_cast<int>((v[e + 16] - mn) * id + 0.5f));
        blk[4 + e] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
  return out;
}

inline std::vector<float> dequantize(tensor_type type, const std::byte* data, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  const auto* p = reinterpret_cast<const uint8_t*>(data);
  for (int64_t i = 0; i < n && !is_quantized(type); ++i) {
    if (type == tensor_type::f32) std::memcpy(&out[i], p + 4 * i, 4);
    if (type == tensor_type::f16) out[i] = get_half(p + 2 * i);
    if (type == tensor_type::bf16) out[i] = cpu::bf16_to_fp32(cpu::load_u16(p + 2 * i));
  }
  for (int64_t b = 0; b < n / 32 && is_quantized(type); ++b) {
    const uint8_t* blk = p + b * block_bytes(type);
    float* o = &out[b * 32];
    const float d = get_half(blk);
    if (type == tensor_type::q8_0) {
      for (int e = 0; e < 32; ++e) o[e] = static_cast<int8_t>(blk[2 + e]) * d;
    } else if (type == tensor_type::q4_0) {
      for (int e = 0; e < 16; ++e) {
        o[e] = ((blk[2 + e] & 15) - 8) * d;
        o[e + 16] = ((blk[2 + e] >> 4) - 8) * d;
      }
    } else {
      const float m = get_half(blk + 2);
      for (int e = 0; e < 16; ++e) {
        o[e] = (blk[4 + e] & 15) * d + m;
        o[e + 16] = (blk[4 + e] >> 4) * d + m;
      }
    }
  }
  return out;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace tireless::test
