#include "gpu/cpu/packed_matrix.hpp"

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <new>

#include "gpu/cpu/half.hpp"

namespace tireless::cpu {

size_t cell_qs_bytes(tensor_type t) { return t == tensor_type::q8_0 ? 16 * 32 : 16 * 16; }

size_t cell_bytes(tensor_type t) {
  switch (t) {
    case tensor_type::q4_0: return cell_qs_bytes(t) + 16 * 2;
    case tensor_type::q4_1: return cell_qs_bytes(t) + 2 * 16 * 2;
    case tensor_type::q8_0: return cell_qs_bytes(t) + 16 * 2;
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
  assert(cols % block_cols == 0);
  const size_t total = static_cast<size_t>(m.groups()) * m.group_bytes();
  const size_t alloc = (total + 63) / 64 * 64;
  auto* raw = static_cast<uint8_t*>(std::aligned_alloc(64, alloc));
  if (!raw) throw std::bad_alloc();
  std::memset(raw, 0, alloc);
  m.packed_.reset(raw);

  const size_t in_row = row_bytes(type, cols);
  const size_t in_block = block_bytes(type);
  const size_t cell = cell_bytes(type);
  const size_t qs_bytes = cell_qs_bytes(type);
  for (int64_t r = 0; r < rows; ++r) {
    const auto* src_row = reinterpret_cast<const uint8_t*>(data) + r * in_row;
    const int64_t g = r / group_rows, lane = r % group_rows;
    for (int64_t b = 0; b < m.blocks(); ++b) {
      const uint8_t* src = src_row + b * in_block;
      uint8_t* c = raw + g * m.group_bytes() + b * cell;
      std::memcpy(c + qs_bytes + lane * 2, src, 2);  // d
      if (type == tensor_type::q8_0) {
        for (int chunk = 0; chunk < 8; ++chunk) {
          for (int e = 0; e < 4; ++e) c[(chunk * 16 + lane) * 4 + e] = src[2 + chunk * 4 + e] ^ 0x80;
        }
        continue;
      }
      const uint8_t* qs = src + (type == tensor_type::q4_1 ? 4 : 2);
      if (type == tensor_type::q4_1) std::memcpy(c + qs_bytes + 32 + lane * 2, src + 2, 2);  // m
      for (int chunk = 0; chunk < 4; ++chunk) std::memcpy(c + (chunk * 16 + lane) * 4, qs + chunk * 4, 4);
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
  const int64_t g = r / group_rows, lane = r % group_rows;
  const size_t cell = cell_bytes(type_), qs_bytes = cell_qs_bytes(type_);
  for (int64_t b = 0; b < blocks(); ++b) {
    const uint8_t* c = group(g) + b * cell;
    const float d = fp16_to_fp32(load_u16(c + qs_bytes + lane * 2));
    float* o = out + b * block_cols;
    if (type_ == tensor_type::q8_0) {
      for (int e = 0; e < 32; ++e) {
        o[e] = static_cast<int8_t>(c[((e / 4) * 16 + lane) * 4 + e % 4] ^ 0x80) * d;
      }
      continue;
    }
    const float mn = type_ == tensor_type::q4_1 ? fp16_to_fp32(load_u16(c + qs_bytes + 32 + lane * 2)) : 0.0f;
    const int offset = type_ == tensor_type::q4_0 ? 8 : 0;
    for (int e = 0; e < 16; ++e) {
      const uint8_t byte = c[((e / 4) * 16 + lane) * 4 + e % 4];
      o[e] = ((byte & 15) - offset) * d + mn;
      o[e + 16] = ((byte >> 4) - offset) * d + mn;
    }
  }
}

}  // namespace tireless::cpu
