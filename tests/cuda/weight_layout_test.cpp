// The weights' device layout (gpu/cuda/weight_layout.hpp), on the host: a repacked matrix holds
// exactly the file's values, at the offsets the kernels read, for every type.
#include "gpu/cuda/weight_layout.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/gpu/ggml_blocks.hpp"

namespace tireless::cuda {
namespace {

class weight_layout_typed : public ::testing::TestWithParam<tensor_type> {};

TEST_P(weight_layout_typed, a_repacked_matrix_holds_the_files_values) {
  const tensor_type t = GetParam();
  const int64_t rows = 7, cols = 96;  // three blocks a row
  const auto values = test::random_floats(rows * cols, 3);
  std::vector<std::byte> file;
  for (int64_t r = 0; r < rows; ++r) {
    const auto q = test::quantize(t, std::vector<float>(values.begin() + r * cols, values.begin() + (r + 1) * cols));
    file.insert(file.end(), q.begin(), q.end());
  }
  const matrix_layout l = layout_of(t, rows, cols);
  EXPECT_EQ(l.bytes % 256, 0u);
  EXPECT_EQ(l.qs_row_bytes % 16, 0) << "a row's quants start 16-byte aligned";
  std::vector<std::byte> dev(l.bytes);
  repack_rows(l, file.data(), rows, 0, dev.data());
  for (int64_t r = 0; r < rows; ++r) {
    const auto want = test::dequantize(t, file.data() + r * row_bytes(t, cols), cols);
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(element_at(l, dev.data(), r, c), want[c]) << name(t) << " row " << r << " col " << c;
    }
  }
  if (is_quantized(t)) {
    EXPECT_EQ(l.d_offset % 256, 0u);
    EXPECT_EQ(l.m_offset % 256, 0u);
    EXPECT_GE(l.d_offset, static_cast<size_t>(rows * l.qs_row_bytes));
    // The quants of block 1 of row 2 are the file's, in the file's order (element j in the low
    // nibble of byte j, j + 16 in its high nibble, for the 4-bit types).
    const size_t qs_bytes = t == tensor_type::q8_0 ? 32 : 16, qs_at = t == tensor_type::q4_1 ? 4 : 2;
    const std::byte* src = file.data() + 2 * row_bytes(t, cols) + block_bytes(t) + qs_at;
    EXPECT_EQ(std::memcmp(dev.data() + 2 * l.qs_row_bytes + qs_bytes, src, qs_bytes), 0);
  }
}

TEST_P(weight_layout_typed, tensors_fused_into_one_matrix_keep_their_rows_in_order) {
  const tensor_type t = GetParam();
  const int64_t cols = 64;
  std::vector<std::vector<std::byte>> parts;
  std::vector<std::vector<float>> values;
  const int64_t part_rows[] = {3, 1, 2};
  for (int i = 0; i < 3; ++i) {
    std::vector<std::byte> bytes;
    values.push_back(test::random_floats(part_rows[i] * cols, 10 + i));
    for (int64_t r = 0; r < part_rows[i]; ++r) {
      const auto q = test::quantize(t, std::vector<float>(values[i].begin() + r * cols, values[i].begin() + (r + 1) * cols));
      bytes.insert(bytes.end(), q.begin(), q.end());
    }
    parts.push_back(bytes);
  }
  const matrix_layout l = layout_of(t, 6, cols);
  std::vector<std::byte> dev(l.bytes);
  int64_t at = 0;
  for (int i = 0; i < 3; ++i) {
    repack_rows(l, parts[i].data(), part_rows[i], at, dev.data());
    at += part_rows[i];
  }
  at = 0;
  for (int i = 0; i < 3; ++i) {
    for (int64_t r = 0; r < part_rows[i]; ++r, ++at) {
      const auto want = test::dequantize(t, parts[i].data() + r * row_bytes(t, cols), cols);
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(element_at(l, dev.data(), at, c), want[c]) << i << " " << r;
    }
  }
  EXPECT_THROW(repack_rows(l, parts[0].data(), 3, 4, dev.data()), std::out_of_range);
}

INSTANTIATE_TEST_SUITE_P(types, weight_layout_typed,
                         ::testing::Values(tensor_type::q4_0, tensor_type::q4_1, tensor_type::q8_0, tensor_type::f16,
                                           tensor_type::bf16, tensor_type::f32),
                         [](const auto& info) { return std::string(name(info.param)); });

TEST(weight_layout, a_quantized_width_that_is_not_whole_blocks_is_refused_with_its_numbers) {
  try {
    layout_of(tensor_type::q4_1, 4, 100);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("100 columns"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(layout_of(tensor_type::f16, 4, 100));
}

TEST(weight_layout, quantized_types_keep_their_size) {
  // SmolLM2's FFN matrix in Q4_1: the file's bytes, plus at most the alignment of three arrays.
  const matrix_layout l = layout_of(tensor_type::q4_1, 1536, 576);
  EXPECT_GE(l.bytes, row_bytes(tensor_type::q4_1, 576) * 1536);
  EXPECT_LE(l.bytes, row_bytes(tensor_type::q4_1, 576) * 1536 + 3 * 256);
}

}  // namespace
}  // namespace tireless::cuda
