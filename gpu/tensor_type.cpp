#include "gpu/tensor_type.hpp"

#include <array>
#include <cassert>

namespace tireless {

namespace {

// ggml's type names by id (ggml.c type_traits), ids 4 and 5 were removed formats.
constexpr std::array<std::string_view, 42> ggml_names = {
    "f32",     "f16",   "q4_0",   "q4_1",    "q4_2",    "q4_3",  "q5_0",  "q5_1",   "q8_0",
    "q8_1",    "q2_K",  "q3_K",   "q4_K",    "q5_K",    "q6_K",  "q8_K",  "iq2_xxs", "iq2_xs",
    "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s",   "iq2_s",   "iq4_xs", "i8",   "i16",    "i32",
    "i64",     "f64",   "iq1_m",  "bf16",    "q4_0_4_4", "q4_0_4_8", "q4_0_8_8", "tq1_0",
    "tq2_0",   "iq4_nl_4_4", "iq4_nl_4_8", "iq4_nl_8_8", "mxfp4", "nvfp4", "unknown"};

}  // namespace

std::optional<tensor_type> tensor_type_from_id(uint32_t id) {
  switch (id) {
    case 0: return tensor_type::f32;
    case 1: return tensor_type::f16;
    case 2: return tensor_type::q4_0;
    case 3: return tensor_type::q4_1;
    case 8: return tensor_type::q8_0;
    case 30: return tensor_type::bf16;
    default: return std::nullopt;
  }
}

std::string_view ggml_type_name(uint32_t id) {
  return id < ggml_names.size() - 1 ? ggml_names[id] : ggml_names.back();
}

std::string_view name(tensor_type t) { return ggml_type_name(static_cast<uint32_t>(t)); }

int64_t block_elements(tensor_type t) { return is_quantized(t) ? 32 : 1; }

size_t block_bytes(tensor_type t) {
  switch (t) {
    case tensor_type::f32: return 4;
    case tensor_type::f16: return 2;
    case tensor_type::bf16: return 2;
    case tensor_type::q4_0: return 2 + 16;
    case tensor_type::q4_1: return 2 + 2 + 16;
    case tensor_type::q8_0: return 2 + 32;
  }
  assert(false && "unhandled tensor_type");
  return 0;
}

size_t row_bytes(tensor_type t, int64_t n) {
  assert(n % block_elements(t) == 0);
  return static_cast<size_t>(n / block_elements(t)) * block_bytes(t);
}

bool is_quantized(tensor_type t) {
  return t == tensor_type::q4_0 || t == tensor_type::q4_1 || t == tensor_type::q8_0;
}

}  // namespace tireless
