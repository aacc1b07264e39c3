#include "gpu/cuda/weight_layout.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

#include "gpu/cpu/half.hpp"

namespace tireless::cuda {

namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

size_t element_bytes(tensor_type t) { return t == tensor_type::f32 ? 4 : 2; }

// Bytes of the quants of one block, and where they start in a ggml block.
size_t block_qs_bytes(tensor_type t) { return t == tensor_type::q8_0 ? 32 : 16; }
size_t block_qs_offset(tensor_type t) { return t == tensor_type::q4_1 ? 4 : 2; }

}  // namespace

matrix_layout layout_of(tensor_type type, int64_t rows, int64_t cols) {
  if (rows < 0 || cols <= 0) throw std::invalid_argument("a weight matrix needs rows >= 0 and cols > 0");
  matrix_layout l;
  l.type = type;
  l.rows = rows;
  l.cols = cols;
  if (!is_quantized(type)) {
    l.qs_row_bytes = cols * static_cast<int64_t>(element_bytes(type));
    l.bytes = align256(static_cast<size_t>(rows * l.qs_row_bytes));
    return l;
  }
  if (cols % 32 != 0) {
    throw std::invalid_argument(std::string(name(type)) + " matrix of " + std::to_string(cols) +
                                " columns: a multiple of 32 is needed");
  }
  const int64_t nb = cols / 32;
  l.qs_row_bytes = nb * static_cast<int64_t>(block_qs_bytes(type));
  l.d_offset = align256(static_cast<size_t>(rows * l.qs_row_bytes));
  const size_t scales = static_cast<size_t>(rows * nb) * 2;
  l.m_offset = align256(l.d_offset + scales);
  l.bytes = type == tensor_type::q4_1 ? align256(l.m_offset + scales) : l.m_offset;
  return l;
}

void repack_rows(const matrix_layout& l, const std::byte* src, int64_t rows, int64_t first_row, std::byte* dst) {
  if (first_row < 0 || first_row + rows > l.rows) throw std::out_of_range("repack_rows: rows outside the matrix");
  const size_t in_row = row_bytes(l.type, l.cols);
  if (!is_quantized(l.type)) {
    std::memcpy(dst + first_row * l.qs_row_bytes, src, static_cast<size_t>(rows) * in_row);
    return;
  }
  const int64_t nb = l.blocks();
  const size_t in_block = block_bytes(l.type), qs = block_qs_bytes(l.type), qs_at = block_qs_offset(l.type);
  for (int64_t r = 0; r < rows; ++r) {
    const std::byte* row = src + r * in_row;
    const int64_t out_r = first_row + r;
    for (int64_t b = 0; b < nb; ++b) {
      const std::byte* blk = row + b * in_block;
      std::memcpy(dst + out_r * l.qs_row_bytes + b * static_cast<int64_t>(qs), blk + qs_at, qs);
      std::memcpy(dst + l.d_offset + static_cast<size_t>(out_r * nb + b) * 2, blk, 2);
      if (l.type == tensor_type::q4_1) std::memcpy(dst + l.m_offset + static_cast<size_t>(out_r * nb + b) * 2, blk + 2, 2);
    }
  }
}

float element_at(const matrix_layout& l, const std::byte* matrix, int64_t r, int64_t c) {
  const auto* p = reinterpret_cast<const uint8_t*>(matrix);
  switch (l.type) {
    case tensor_type::f32: {
      float v;
      std::memcpy(&v, p + r * l.qs_row_bytes + c * 4, 4);
      return v;
    }
    case tensor_type::f16: return cpu::fp16_to_fp32(cpu::load_u16(p + r * l.qs_row_bytes + c * 2));
    case tensor_type::bf16: return cpu::bf16_to_fp32(cpu::load_u16(p + r * l.qs_row_bytes + c * 2));
    default: break;
  }
  const int64_t nb = l.blocks(), b = c / 32, e = c % 32;
  const float d = cpu::fp16_to_fp32(cpu::load_u16(p + l.d_offset + static_cast<size_t>(r * nb + b) * 2));
  const uint8_t* q = p + r * l.qs_row_bytes + b * static_cast<int64_t>(block_qs_bytes(l.type));
  if (l.type == tensor_type::q8_0) return static_cast<float>(static_cast<int8_t>(q[e])) * d;
  const int nibble = e < 16 ? (q[e] & 15) : (q[e - 16] >> 4);
  if (l.type == tensor_type::q4_0) return static_cast<float>(nibble - 8) * d;
  const float m = cpu::fp16_to_fp32(cpu::load_u16(p + l.m_offset + static_cast<size_t>(r * nb + b) * 2));
  return static_cast<float>(nibble) * d + m;
}

}  // namespace tireless::cuda
