#pragma once
// A weight matrix [rows][cols] laid out for the CPU matmul kernels.
//
// Quantized types are repacked into groups of 16 rows, so that one SIMD register holds a
// 4-byte chunk of each of 16 rows and an integer dot-product instruction advances 16 rows'
// sums at once (rows in lanes; no horizontal sums). A group is a run of cells, one per
// 32-column block; a cell holds, for its 16 rows:
//   qs  4-bit: [4][16][4] bytes: chunk c (0..3) of each row = bytes 4c..4c+3 of the row's
//       ggml block, whose low nibbles are elements 4c..4c+3 and high nibbles 16+4c..16+4c+3
//       q8_0:  [8][16][4] bytes: chunk c (0..7) = elements 4c..4c+3, stored as q + 128
//   d   [16] fp16 block scales
//   m   [16] fp16 block minimums (q4_1 only)
// Rows are padded to a multiple of 16 with zero blocks.
// Float types (f32, f16, bf16) are not copied: the matrix points at the file's rows.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gpu/tensor_type.hpp"

namespace tireless::cpu {

inline constexpr int64_t group_rows = 16;
inline constexpr int64_t block_cols = 32;

// Bytes of one cell (16 rows × one 32-column block) for a quantized type.
size_t cell_bytes(tensor_type t);
// Bytes of a cell's qs part.
size_t cell_qs_bytes(tensor_type t);

class packed_matrix {
 public:
  packed_matrix() = default;

  // `data` holds `rows` rows of `cols` elements of type `type` in ggml layout.
  // Quantized data is copied (repacked); float data must outlive the packed_matrix.
  static packed_matrix pack(tensor_type type, const std::byte* data, int64_t rows, int64_t cols);

  tensor_type type() const { return type_; }
  bool quantized() const { return is_quantized(type_); }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t blocks() const { return (cols_ + block_cols - 1) / block_cols; }
  int64_t groups() const { return (rows_ + group_rows - 1) / group_rows; }
  size_t group_bytes() const { return static_cast<size_t>(blocks()) * cell_bytes(type_); }

  const uint8_t* group(int64_t g) const { return packed_.get() + g * group_bytes(); }
  const std::byte* float_row(int64_t r) const { return float_data_ + r * float_row_bytes_; }
  size_t bytes() const;

  // Row r dequantized to floats, cols() values (for embedding lookup).
  void dequantize_row(int64_t r, float* out) const;

 private:
  struct free_aligned {
    void operator()(uint8_t* p) const;
  };
  tensor_type type_ = tensor_type::f32;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  std::unique_ptr<uint8_t[], free_aligned> packed_;
  const std::byte* float_data_ = nullptr;
  size_t float_row_bytes_ = 0;
};

}  // namespace tireless::cpu
