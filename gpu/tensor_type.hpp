#pragma once
// Element types of weight tensors, numbered as in GGUF/ggml so a file's type ids map directly.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tireless {

enum class tensor_type : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q8_0 = 8,
  bf16 = 30,
};

// The type with ggml id `id`, or nullopt when tireless does not support it.
std::optional<tensor_type> tensor_type_from_id(uint32_t id);

// The ggml name of a type id ("q4_K", "iq2_xs", ...), also for types tireless cannot run;
// "unknown" for ids ggml never defined.
std::string_view ggml_type_name(uint32_t id);

std::string_view name(tensor_type t);

// Elements per block: 32 for the block-quantized types, 1 for the float types.
int64_t block_elements(tensor_type t);

// Bytes per block.
size_t block_bytes(tensor_type t);

// Bytes of a row of `n` elements; n must be a multiple of block_elements(t).
size_t row_bytes(tensor_type t, int64_t n);

bool is_quantized(tensor_type t);

}  // namespace tireless
