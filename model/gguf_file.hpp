#pragma once
// A GGUF (version 2 and 3) file, memory-mapped: its metadata and its tensors' descriptions and
// bytes. Every problem with the file (truncated, corrupt, unsupported, a missing or mistyped
// key) is a gguf_error whose message names the file and the key or tensor at fault.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gpu/tensor_type.hpp"

namespace tireless {

class gguf_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// GGUF metadata value types, numbered as in the format.
enum class gguf_value_type : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

std::string_view name(gguf_value_type t);

struct gguf_array;

using gguf_value = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, uint64_t,
                                int64_t, float, double, bool, std::string, gguf_array>;

struct gguf_array {
  gguf_value_type element_type = gguf_value_type::u8;
  std::vector<gguf_value> values;
};

// The GGUF type a value was stored as.
gguf_value_type type_of(const gguf_value& v);

struct gguf_tensor {
  std::string name;
  tensor_type type = tensor_type::f32;
  std::vector<int64_t> shape;  // ggml order: shape[0] is the row length (contiguous)
  uint64_t offset = 0;         // from the start of the data section
  size_t n_bytes = 0;
  const std::byte* data = nullptr;  // into the mapping, valid while the gguf_file lives

  int64_t n_elements() const;
  int64_t n_rows() const;  // n_elements() / shape[0]
};

class gguf_file {
 public:
  // Opens and validates the whole file: header, metadata, tensor infos, and that every
  // tensor's bytes lie inside the file. Throws gguf_error.
  static gguf_file open(const std::filesystem::path& path);

  gguf_file(gguf_file&&) noexcept;
  gguf_file& operator=(gguf_file&&) noexcept;
  ~gguf_file();

  const std::filesystem::path& path() const;
  uint32_t version() const;
  size_t alignment() const;

  // Metadata. find() returns nullptr for a missing key; the get_* accessors throw a gguf_error
  // naming the key when it is missing or of another type. Integer getters accept any integer
  // type whose value fits.
  const gguf_value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  std::vector<std::string> keys() const;
  std::string get_string(std::string_view key) const;
  uint32_t get_u32(std::string_view key) const;
  float get_f32(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::optional<uint32_t> find_u32(std::string_view key) const;
  std::optional<float> find_f32(std::string_view key) const;
  std::optional<bool> find_bool(std::string_view key) const;
  std::optional<std::string> find_string(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int32_t> get_i32_array(std::string_view key) const;
  std::vector<float> get_f32_array(std::string_view key) const;

  // Tensors, in file order. tensor() throws a gguf_error naming the tensor when it is absent.
  const std::vector<gguf_tensor>& tensors() const;
  const gguf_tensor* find_tensor(std::string_view name) const;
  const gguf_tensor& tensor(std::string_view name) const;

  // Bytes of the whole mapping (for RSS accounting and tests).
  size_t mapped_bytes() const;

  // Lets the OS drop the file's pages from this process's memory (they come back from the
  // file when read again): for after the weights were copied into another layout.
  void release_pages() const;

  // Parses a file image held in memory (the fuzz target's entry point); same checks as open().
  static gguf_file parse(std::vector<std::byte> image, std::string display_name);

 private:
  struct impl;
  explicit gguf_file(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace tireless
