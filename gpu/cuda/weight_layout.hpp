#pragma once
// How a weight matrix lies in device memory. No CUDA here: the upload's repacking is done and
// unit-tested on the host.
//
// The bits are the GGUF file's (no dequantization, no requantization): a matrix keeps its type
// and its bytes; only their order changes, so that the kernels read 16-byte aligned, coalesced
// vectors. A quantized matrix [rows][cols] (cols a multiple of 32, nb = cols / 32 blocks a row)
// becomes three arrays:
//   qs  [rows][nb][16] bytes (q4_0, q4_1: byte j holds element j in its low nibble and element
//       j + 16 in its high one, as in ggml) or [rows][nb][32] int8 (q8_0)
//   d   [rows][nb] fp16 block scales
//   m   [rows][nb] fp16 block minimums (q4_1 only)
// each starting 256-byte aligned. Float matrices (f32, f16, bf16) stay row-major as in the file.
// Several tensors of one type and width may share one matrix, one after another (Q, K and V;
// an FFN's gate and up), so that one product computes them all.

#include <cstddef>
#include <cstdint>

#include "gpu/tensor_type.hpp"

namespace tireless::cuda {

struct matrix_layout {
  tensor_type type = tensor_type::f32;
  int64_t rows = 0, cols = 0;
  int64_t qs_row_bytes = 0;          // quantized: bytes of a row's quants; float: of a row
  size_t d_offset = 0, m_offset = 0;  // quantized: where d and m start (m: q4_1 only)
  size_t bytes = 0;                   // the whole matrix, a multiple of 256
  int64_t blocks() const { return cols / 32; }
};

// Throws std::invalid_argument when a quantized type's cols are not a multiple of 32.
matrix_layout layout_of(tensor_type type, int64_t rows, int64_t cols);

// Writes `rows` rows of `src` (ggml layout, cols of the layout) as rows first_row ..
// first_row + rows - 1 of the matrix at `dst` (layout.bytes bytes).
void repack_rows(const matrix_layout& layout, const std::byte* src, int64_t rows, int64_t first_row, std::byte* dst);

// Element (r, c) of a repacked matrix, as the device kernels read it (for tests).
float element_at(const matrix_layout& layout, const std::byte* matrix, int64_t r, int64_t c);

}  // namespace tireless::cuda
