#pragma once
// A weight matrix [rows][cols] laid out for the CPU matmul kernels.
//
// Quantized types are repacked into groups of 4 interleaved rows. A group is a run of
// cells, one per 64 columns (a pair of 32-element blocks); a cell holds, for its 4 rows:
//   qs   4-bit: [4][32] bytes, block 0's 16 bytes then block 1's (ggml's nibble order kept)
//        q8_0:  [4][64] int8, in kernel order (block 0 elements 0-15, block 1 0-15,
//               block 0 16-31, block 1 16-31)
//   d    [4][2] fp16 block scales
//   m    [4][2] fp16 block minimums (q4_1 only)
// Columns are padded to a multiple of 64 and rows to a multiple of 4 with zero blocks.
// Float types (f32, f16, bf16) are not copied: the matrix points at the file's rows.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gpu/tensor_type.hpp"

namespace tireless::cpu {

inline constexpr int64_t group_rows = 4;
inline constexpr int64_t pair_cols = 64;

// Bytes of one cell for a quantized type.
size_t cell_bytes(tensor_type t);

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
  int64_t pairs() const { return (cols_ + pair_cols - 1) / pair_cols; }
  int64_t groups() const { return (rows_ + group_rows - 1) / group_rows; }
  size_t group_bytes() const { return static_cast<size_t>(pairs()) * cell_bytes(type_); }

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
