#include "model/gguf_reader.hpp"

#include <bit>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace tireless {

static_assert(std::endian::native == std::endian::little,
              "GGUF files are little-endian; tireless reads them on little-endian hosts only");

size_t min_encoded_bytes(gguf_value_type type) {
  switch (type) {
    case gguf_value_type::u8:
    case gguf_value_type::i8:
    case gguf_value_type::boolean: return 1;
    case gguf_value_type::u16:
    case gguf_value_type::i16: return 2;
    case gguf_value_type::u32:
    case gguf_value_type::i32:
    case gguf_value_type::f32: return 4;
    case gguf_value_type::u64:
    case gguf_value_type::i64:
    case gguf_value_type::f64: return 8;
    case gguf_value_type::string: return 8;   // u64 length
    case gguf_value_type::array: return 12;   // u32 element type + u64 count
  }
  return 1;
}

std::string printable(std::string_view s) {
  constexpr size_t max_shown = 80;
  std::string out;
  for (unsigned char c : s.substr(0, max_shown)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > max_shown) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

gguf_reader::gguf_reader(std::span<const std::byte> image, std::string_view file_name)
    : image_(image), file_name_(file_name) {}

void gguf_reader::fail_corrupt(std::string_view problem) const {
  throw gguf_error(fmt::format(
      "{}: {}: {} (at byte {}); the file is truncated or corrupt: re-download or re-convert "
      "the model",
      file_name_, context_, problem, pos_));
}

void gguf_reader::need(uint64_t n, std::string_view what) const {
  if (n > remaining()) {
    fail_corrupt(fmt::format("{} needs {} bytes but only {} remain before the end of the file",
                             what, n, remaining()));
  }
}

void gguf_reader::require_room(uint64_t count, size_t min_item_bytes,
                               std::string_view what) const {
  if (count > remaining() / min_item_bytes) {
    fail_corrupt(fmt::format(
        "{} is {}, more than the {} bytes left in the file could hold ({} bytes each at least)",
        what, count, remaining(), min_item_bytes));
  }
}

template <class T>
T gguf_reader::read_scalar() {
  need(sizeof(T), "a value");
  T v;
  std::memcpy(&v, image_.data() + pos_, sizeof(T));
  pos_ += sizeof(T);
  return v;
}

uint32_t gguf_reader::read_u32() { return read_scalar<uint32_t>(); }
uint64_t gguf_reader::read_u64() { return read_scalar<uint64_t>(); }

std::string gguf_reader::read_string() {
  uint64_t n = read_u64();
  if (n > remaining()) {
    pos_ -= sizeof(uint64_t);
    fail_corrupt(fmt::format("string length {} runs past the end of the file ({} bytes remain)",
                             n, remaining() - sizeof(uint64_t)));
  }
  std::string s(reinterpret_cast<const char*>(image_.data() + pos_), static_cast<size_t>(n));
  pos_ += static_cast<size_t>(n);
  return s;
}

gguf_value_type gguf_reader::read_value_type() {
  uint32_t t = read_u32();
  if (t > static_cast<uint32_t>(gguf_value_type::f64)) {
    pos_ -= sizeof(uint32_t);
    fail_corrupt(fmt::format("unknown value type {} (GGUF defines 0 to 12)", t));
  }
  return static_cast<gguf_value_type>(t);
}

gguf_value gguf_reader::read_value(gguf_value_type type, int depth) {
  switch (type) {
    case gguf_value_type::u8: return read_scalar<uint8_t>();
    case gguf_value_type::i8: return read_scalar<int8_t>();
    case gguf_value_type::u16: return read_scalar<uint16_t>();
    case gguf_value_type::i16: return read_scalar<int16_t>();
    case gguf_value_type::u32: return read_scalar<uint32_t>();
    case gguf_value_type::i32: return read_scalar<int32_t>();
    case gguf_value_type::u64: return read_scalar<uint64_t>();
    case gguf_value_type::i64: return read_scalar<int64_t>();
    case gguf_value_type::f32: return read_scalar<float>();
    case gguf_value_type::f64: return read_scalar<double>();
    case gguf_value_type::boolean: return read_scalar<uint8_t>() != 0;
    case gguf_value_type::string: return read_string();
    case gguf_value_type::array: return read_array(depth + 1);
  }
  fail_corrupt(fmt::format("unknown value type {}", static_cast<uint32_t>(type)));
}

gguf_value gguf_reader::read_array(int depth) {
  if (depth > max_array_depth) {
    fail_corrupt(fmt::format("arrays nested more than {} deep", max_array_depth));
  }
  gguf_array array;
  array.element_type = read_value_type();
  uint64_t count = read_u64();
  require_room(count, min_encoded_bytes(array.element_type), "the array's element count");
  array.values.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    array.values.push_back(read_value(array.element_type, depth));
  }
  return array;
}

}  // namespace tireless
