#pragma once
// A bounds-checked cursor over a GGUF file image (internal to gguf_file). Reads the format's
// little-endian scalars, strings and metadata values; when the image runs out, or holds a
// length or count that cannot fit in what remains, it throws a gguf_error naming the file,
// what was being read (the context) and the byte offset. No allocation is sized by a count
// from the file before that count is checked against the bytes remaining.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "model/gguf_file.hpp"

namespace tireless {

class gguf_reader {
 public:
  // Nested arrays deeper than this are rejected (no real model nests at all).
  static constexpr int max_array_depth = 8;

  gguf_reader(std::span<const std::byte> image, std::string_view file_name);

  // What is being read, for messages: "the header", "key 'general.name'", "tensor #3".
  void set_context(std::string context) { context_ = std::move(context); }

  size_t position() const { return pos_; }
  size_t remaining() const { return image_.size() - pos_; }

  uint32_t read_u32();
  uint64_t read_u64();
  std::string read_string();
  gguf_value_type read_value_type();
  gguf_value read_value(gguf_value_type type) { return read_value(type, 0); }

  // Throws unless `count` items of at least `min_item_bytes` each fit in the bytes remaining;
  // `what` names the count ("kv_count").
  void require_room(uint64_t count, size_t min_item_bytes, std::string_view what) const;

  // Throws "<file>: <context>: <problem> (at byte N); the file is truncated or corrupt ...".
  [[noreturn]] void fail_corrupt(std::string_view problem) const;

 private:
  gguf_value read_value(gguf_value_type type, int depth);
  gguf_value read_array(int depth);
  template <class T>
  T read_scalar();
  void need(uint64_t n, std::string_view what) const;

  std::span<const std::byte> image_;
  std::string_view file_name_;
  std::string context_ = "the header";
  size_t pos_ = 0;
};

// `s` fit for an error message: non-printable bytes as \xNN, cut after 80 bytes.
std::string printable(std::string_view s);

// The fewest bytes one value of `type` takes in a file (an empty string or array).
size_t min_encoded_bytes(gguf_value_type type);

}  // namespace tireless
