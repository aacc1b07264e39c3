// libFuzzer target: any byte string either parses as a GGUF image or throws a gguf_error; what
// parses can be read through every accessor, and every tensor's bytes lie inside the image.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/gguf_file.hpp"

namespace {

using tireless::gguf_error;
using tireless::gguf_file;

template <class F>
void ignore_gguf_error(F&& f) {
  try {
    f();
  } catch (const gguf_error&) {
  }
}

void read_everything(const gguf_file& f) {
  for (const std::string& key : f.keys()) {
    ignore_gguf_error([&] { f.get_u32(key); });
    ignore_gguf_error([&] { f.get_f32(key); });
    ignore_gguf_error([&] { f.get_bool(key); });
    ignore_gguf_error([&] { f.get_string(key); });
    ignore_gguf_error([&] { f.get_string_array(key); });
    ignore_gguf_error([&] { f.get_i32_array(key); });
    ignore_gguf_error([&] { f.get_f32_array(key); });
  }
  volatile uint8_t sink = 0;
  for (const tireless::gguf_tensor& t : f.tensors()) {
    uint8_t sum = 0;
    for (size_t i = 0; i < t.n_bytes; ++i) sum += static_cast<uint8_t>(t.data[i]);
    sink = sink + sum + static_cast<uint8_t>(t.n_rows());
    if (&f.tensor(t.name) != &t) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* begin = reinterpret_cast<const std::byte*>(data);
  std::vector<std::byte> image(begin, begin + size);
  try {
    read_everything(gguf_file::parse(std::move(image), "fuzz.gguf"));
  } catch (const gguf_error&) {
  }
  return 0;
}
