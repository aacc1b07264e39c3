#pragma once
// Builds GGUF file images in memory for tests and fuzz seeds: valid ones, and ones corrupted
// one way at a time (another magic or version, overridden counts, raw value payloads, tensor
// infos with any type id, shape and offset).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "gpu/tensor_type.hpp"
#include "model/gguf_file.hpp"

namespace tireless::test_support {

struct gguf_tensor_spec {
  std::string name;
  uint32_t type_id = 0;                        // ggml id, also unsupported ones
  std::vector<uint64_t> dims;                  // written as given, also 0 or > 4 of them
  std::optional<uint64_t> offset;              // default: after the previous tensor, aligned
  std::optional<std::vector<std::byte>> data;  // default: the bytes the shape needs, a pattern
};

inline gguf_tensor_spec spec(std::string name, uint32_t type_id, std::vector<uint64_t> dims,
                             std::optional<uint64_t> offset = std::nullopt,
                             std::optional<std::vector<std::byte>> data = std::nullopt) {
  return {std::move(name), type_id, std::move(dims), offset, std::move(data)};
}

inline void put_bytes(std::vector<std::byte>& out, const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + n);
}

template <class T>
void put(std::vector<std::byte>& out, T v) {
  put_bytes(out, &v, sizeof v);
}

inline void put_string(std::vector<std::byte>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

// A value's payload, without its type id.
inline void put_value(std::vector<std::byte>& out, const gguf_value& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          put_string(out, x);
        } else if constexpr (std::is_same_v<T, gguf_array>) {
          put<uint32_t>(out, static_cast<uint32_t>(x.element_type));
          put<uint64_t>(out, x.values.size());
          for (const gguf_value& e : x.values) put_value(out, e);
        } else if constexpr (std::is_same_v<T, bool>) {
          put<uint8_t>(out, x ? 1 : 0);
        } else {
          put<T>(out, x);
        }
      },
      v);
}

inline gguf_array make_array(gguf_value_type element_type, std::vector<gguf_value> values) {
  return gguf_array{element_type, std::move(values)};
}

// Bytes a tensor of `dims` and ggml type `type_id` takes; 0 for unsupported types and shapes
// too large or malformed for a test.
inline size_t tensor_bytes(uint32_t type_id, const std::vector<uint64_t>& dims) {
  std::optional<tensor_type> t = tensor_type_from_id(type_id);
  if (!t || dims.empty()) return 0;
  uint64_t n = 1;
  for (uint64_t d : dims) {
    if (d == 0 || d > (uint64_t{1} << 24) || n * d > (uint64_t{1} << 24)) return 0;
    n *= d;
  }
  if (dims[0] % block_elements(*t) != 0) return 0;
  return n / block_elements(*t) * block_bytes(*t);
}

class gguf_image_builder {
 public:
  gguf_image_builder& magic(std::string m) { magic_ = std::move(m); return *this; }
  gguf_image_builder& version(uint32_t v) { version_ = v; return *this; }
  gguf_image_builder& kv_count(uint64_t n) { kv_count_ = n; return *this; }
  gguf_image_builder& tensor_count(uint64_t n) { tensor_count_ = n; return *this; }
  // The padding the builder uses, without writing general.alignment (which it follows when set).
  gguf_image_builder& pad_to(uint32_t a) { pad_to_ = a; return *this; }

  gguf_image_builder& add(std::string key, gguf_value v) {
    std::vector<std::byte> payload;
    put_value(payload, v);
    if (key == "general.alignment" && std::holds_alternative<uint32_t>(v)) {
      key_alignment_ = std::get<uint32_t>(v);
    }
    uint32_t type_id = static_cast<uint32_t>(type_of(v));
    return add_raw(std::move(key), type_id, std::move(payload));
  }

  gguf_image_builder& add_raw(std::string key, uint32_t type_id, std::vector<std::byte> payload) {
    kvs_.push_back({std::move(key), type_id, std::move(payload)});
    return *this;
  }

  gguf_image_builder& add_tensor(gguf_tensor_spec t) {
    tensors_.push_back(std::move(t));
    return *this;
  }

  // The data each tensor gets: its spec's, or a pattern that differs between tensors.
  std::vector<std::byte> tensor_data(size_t index) const {
    const gguf_tensor_spec& t = tensors_.at(index);
    if (t.data) return *t.data;
    std::vector<std::byte> d(tensor_bytes(t.type_id, t.dims));
    for (size_t i = 0; i < d.size(); ++i) d[i] = std::byte((i * 31 + index * 7 + 1) & 0xff);
    return d;
  }

  std::vector<std::byte> build() const {
    std::vector<std::byte> out;
    put_bytes(out, magic_.data(), magic_.size());
    put<uint32_t>(out, version_);
    put<uint64_t>(out, tensor_count_.value_or(tensors_.size()));
    put<uint64_t>(out, kv_count_.value_or(kvs_.size()));
    for (const kv& e : kvs_) {
      put_string(out, e.key);
      put<uint32_t>(out, e.type_id);
      put_bytes(out, e.payload.data(), e.payload.size());
    }
    const uint64_t align = pad_to_.value_or(key_alignment_.value_or(32));
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const gguf_tensor_spec& t = tensors_[i];
      uint64_t offset = t.offset.value_or((next + align - 1) / align * align);
      offsets.push_back(offset);
      next = offset + tensor_data(i).size();
      put_string(out, t.name);
      put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) put<uint64_t>(out, d);
      put<uint32_t>(out, t.type_id);
      put<uint64_t>(out, offset);
    }
    if (tensors_.empty()) return out;
    out.resize((out.size() + align - 1) / align * align);
    const size_t data_start = out.size();
    constexpr uint64_t max_placed = uint64_t{1} << 26;  // offsets beyond are left unbacked
    for (size_t i = 0; i < tensors_.size(); ++i) {
      std::vector<std::byte> d = tensor_data(i);
      if (offsets[i] > max_placed || d.empty()) continue;
      size_t at = data_start + static_cast<size_t>(offsets[i]);
      if (out.size() < at + d.size()) out.resize(at + d.size());
      std::memcpy(out.data() + at, d.data(), d.size());
    }
    return out;
  }

 private:
  struct kv {
    std::string key;
    uint32_t type_id;
    std::vector<std::byte> payload;
  };

  std::string magic_ = "GGUF";
  uint32_t version_ = 3;
  std::optional<uint64_t> kv_count_, tensor_count_;
  std::optional<uint32_t> pad_to_, key_alignment_;
  std::vector<kv> kvs_;
  std::vector<gguf_tensor_spec> tensors_;
};

}  // namespace tireless::test_support
