#include "gpu/cpu/packed_matrix.hpp"

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <new>

#include "gpu/cpu/half.hpp"

namespace tireless::cpu {

namespace {

constexpr int64_t block = 32;

size_t qs_bytes_per_row(tensor_type t) { return t == tensor_type::q8_0 ? 64 : 32; }

// Position, inside a 64-column cell in kernel order, of element e (0..31) of block b (0..1).
int kernel_index(int b, int e) { return (e < 16 ? 0 : 32) + b * 16 + (e & 15); }

}  // namespace

size_t cell_bytes(tensor_type t) {
  switch (t) {
    case tensor_type::q4_0: return 4 * 32 + 4 * 2 * 2;
    case tensor_type::q4_1: return 4 * 32 + 4 * 2 * 2 * 2;
    case tensor_type::q8_0: return 4 * 64 + 4 * 2 * 2;
    default: return 0;
  }
}

void packed_matrix::free_aligned::operator()(uint8_t* p) const { std::free(p); }

size_t packed_matrix::bytes() const {
  return quantized() ? static_cast<size_t>(groups()) * group_bytes() : 0;
}

packed_matrix packed_matrix::pack(tensor_type type, const std::byte* data, int64_t rows,
                                  int64_t cols) {
  packed_matrix m;
  m.type_ = type;
  m.rows_ = rows;
  m.cols_ = cols;
  if (!is_quantized(type)) {
    m.float_data_ = data;
    m.float_row_bytes_ = row_bytes(type, cols);
    return m;
  }
  assert(cols % block == 0);
  const size_t total = static_cast<size_t>(m.groups()) * m.group_bytes();
  const size_t alloc = (total + 63) / 64 * 64;
  auto* raw = static_cast<uint8_t*>(std::aligned_alloc(64, alloc));
  if (!raw) throw std::bad_alloc();
  std::memset(raw, 0, alloc);
  m.packed_.reset(raw);

  const size_t in_row = row_bytes(type, cols);
  const size_t in_block = block_bytes(type);
  const size_t cell = cell_bytes(type);
  const size_t qs_row = qs_bytes_per_row(type);
  const int64_t n_blocks = cols / block;
  for (int64_t r = 0; r < rows; ++r) {
    const auto* src_row = reinterpret_cast<const uint8_t*>(data) + r * in_row;
    const int64_t g = r / group_rows, rr = r % group_rows;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* src = src_row + b * in_block;
      uint8_t* c = raw + g * m.group_bytes() + (b / 2) * cell;
      const int half = static_cast<int>(b % 2);
      uint8_t* qs = c + rr * qs_row;
      uint8_t* d = c + 4 * qs_row + (rr * 2 + half) * 2;
      switch (type) {
        case tensor_type::q4_0:
          std::memcpy(d, src, 2);
          std::memcpy(qs + half * 16, src + 2, 16);
          break;
        case tensor_type::q4_1:
          std::memcpy(d, src, 2);
          std::memcpy(d + 4 * 2 * 2, src + 2, 2);  // m follows the d array
          std::memcpy(qs + half * 16, src + 4, 16);
          break;
        case tensor_type::q8_0:
          std::memcpy(d, src, 2);
          for (int e = 0; e < 32; ++e) qs[kernel_index(half, e)] = src[2 + e];
          break;
        default: assert(false);
      }
    }
  }
  return m;
}

void packed_matrix::dequantize_row(int64_t r, float* out) const {
  if (!quantized()) {
    const std::byte* row = float_row(r);
    for (int64_t c = 0; c < cols_; ++c) {
      switch (type_) {
        case tensor_type::f32: std::memcpy(&out[c], row + c * 4, 4); break;
        case tensor_type::f16: out[c] = fp16_to_fp32(load_u16(row + c * 2)); break;
        case tensor_type::bf16: out[c] = bf16_to_fp32(load_u16(row + c * 2)); break;
        default: assert(false);
      }
    }
    return;
  }
  const int64_t g = r / group_rows, rr = r % group_rows;
  const size_t cell = cell_bytes(type_);
  const size_t qs_row = qs_bytes_per_row(type_);
  for (int64_t b = 0; b < cols_ / block; ++b) {
    const uint8_t* c = group(g) + (b / 2) * cell;
    const int half = static_cast<int>(b % 2);
    const uint8_t* qs = c + rr * qs_row;
    const uint8_t* dp = c + 4 * qs_row + (rr * 2 + half) * 2;
    const float d = fp16_to_fp32(load_u16(dp));
    float* o = out + b * block;
    switch (type_) {
      case tensor_type::q4_0:
        for (int e = 0; e < 16; ++e) {
          o[e] = (static_cast<int>(qs[half * 16 + e] & 15) - 8) * d;
          o[e + 16] = (static_cast<int>(qs[half * 16 + e] >> 4) - 8) * d;
        }
        break;
      case tensor_type::q4_1: {
        const float mn = fp16_to_fp32(load_u16(dp + 4 * 2 * 2));
        for (int e = 0; e < 16; ++e) {
          o[e] = (qs[half * 16 + e] & 15) * d + mn;
          o[e + 16] = (qs[half * 16 + e] >> 4) * d + mn;
        }
        break;
      }
      case tensor_type::q8_0:
        for (int e = 0; e < 32; ++e) o[e] = static_cast<int8_t>(qs[kernel_index(half, e)]) * d;
        break;
      default: assert(false);
    }
  }
}

}  // namespace tireless::cpu
