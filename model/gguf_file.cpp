#include "model/gguf_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <span>
#include <system_error>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/gguf_reader.hpp"

namespace tireless {

namespace {

constexpr uint32_t default_alignment = 32;
constexpr uint32_t max_dims = 4;
// The fewest bytes of a metadata entry (empty key, type, one-byte value) and of a tensor info
// (empty name, n_dims, one dimension, type, offset).
constexpr size_t min_kv_bytes = 8 + 4 + 1;
constexpr size_t min_tensor_info_bytes = 8 + 4 + 8 + 4 + 8;
constexpr std::string_view advice = "re-download or re-convert the model";
constexpr std::array supported_types = {tensor_type::f32,  tensor_type::f16,  tensor_type::bf16,
                                        tensor_type::q8_0, tensor_type::q4_0, tensor_type::q4_1};

std::string_view article(std::string_view noun) {
  return noun.find_first_of("aefio") == 0 ? "an" : "a";
}

// "a string", "an i32", "an array of u32".
std::string describe(const gguf_value& v) {
  if (const auto* a = std::get_if<gguf_array>(&v)) {
    return fmt::format("an array of {}", name(a->element_type));
  }
  std::string_view n = name(type_of(v));
  return fmt::format("{} {}", article(n), n);
}

std::string format_scalar(const gguf_value& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_arithmetic_v<T>) {
          return fmt::format("{}", x);
        } else {
          return "a non-scalar";
        }
      },
      v);
}

bool is_integer(gguf_value_type t) {
  using enum gguf_value_type;
  return t == u8 || t == i8 || t == u16 || t == i16 || t == u32 || t == i32 || t == u64 ||
         t == i64;
}

// The integer `v` holds as a `To`, or nullopt when it is not an integer or does not fit.
template <class To>
std::optional<To> fit_integer(const gguf_value& v) {
  return std::visit(
      [](const auto& x) -> std::optional<To> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if (std::in_range<To>(x)) return static_cast<To>(x);
        }
        return std::nullopt;
      },
      v);
}

// The float `v` holds (f32, or f64 within float range), or nullopt.
std::optional<float> fit_float(const gguf_value& v) {
  if (const auto* f = std::get_if<float>(&v)) return *f;
  if (const auto* d = std::get_if<double>(&v)) {
    if (std::isfinite(*d) && std::fabs(*d) > FLT_MAX) return std::nullopt;
    return static_cast<float>(*d);
  }
  return std::nullopt;
}

std::string supported_type_list() {
  std::string out;
  for (tensor_type t : supported_types) {
    if (!out.empty()) out += ", ";
    out += name(t);
  }
  return out;
}

std::string shape_string(std::span<const uint64_t> dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

}  // namespace

std::string_view name(gguf_value_type t) {
  switch (t) {
    case gguf_value_type::u8: return "u8";
    case gguf_value_type::i8: return "i8";
    case gguf_value_type::u16: return "u16";
    case gguf_value_type::i16: return "i16";
    case gguf_value_type::u32: return "u32";
    case gguf_value_type::i32: return "i32";
    case gguf_value_type::f32: return "f32";
    case gguf_value_type::boolean: return "bool";
    case gguf_value_type::string: return "string";
    case gguf_value_type::array: return "array";
    case gguf_value_type::u64: return "u64";
    case gguf_value_type::i64: return "i64";
    case gguf_value_type::f64: return "f64";
  }
  return "unknown";
}

gguf_value_type type_of(const gguf_value& v) {
  // In the order of gguf_value's alternatives.
  using enum gguf_value_type;
  constexpr std::array<gguf_value_type, std::variant_size_v<gguf_value>> types = {
      u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, boolean, string, array};
  return types[v.index()];
}

int64_t gguf_tensor::n_elements() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

int64_t gguf_tensor::n_rows() const {
  return shape.empty() || shape[0] == 0 ? 0 : n_elements() / shape[0];
}

struct gguf_file::impl {
  std::filesystem::path path;
  std::string display_name;
  std::vector<std::byte> image;   // parse(): owns the bytes
  void* mapping = nullptr;        // open(): the file's mapping
  size_t mapping_size = 0;
  std::span<const std::byte> bytes;

  uint32_t version = 0;
  size_t alignment = default_alignment;
  std::vector<std::string> key_order;
  std::map<std::string, gguf_value, std::less<>> metadata;
  std::vector<gguf_tensor> tensors;
  std::map<std::string, size_t, std::less<>> tensor_index;

  impl() = default;
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  ~impl() {
    if (mapping != nullptr) ::munmap(mapping, mapping_size);
  }

  void parse();

  [[noreturn]] void fail(std::string_view problem) const {
    throw gguf_error(fmt::format("{}: {}", display_name, problem));
  }
  [[noreturn]] void fail_key(std::string_view key, std::string_view problem) const {
    throw gguf_error(fmt::format("key '{}' in {} {}", key, display_name, problem));
  }
  [[noreturn]] void wrong_type(std::string_view key, const gguf_value& v,
                               std::string_view expected) const {
    fail_key(key, fmt::format("is {}, expected {}", describe(v), expected));
  }
  const gguf_value& require(std::string_view key) const;
  const gguf_array& require_array(std::string_view key, std::string_view expected) const;

 private:
  std::pair<uint64_t, uint64_t> parse_header(gguf_reader& r);
  void parse_metadata(gguf_reader& r, uint64_t kv_count);
  void read_alignment();
  gguf_tensor read_tensor_info(gguf_reader& r, uint64_t index);
  void check_tensor(gguf_reader& r, gguf_tensor& t, std::span<const uint64_t> dims,
                    uint32_t type_id) const;
  void place_tensors(size_t data_start);
  void check_overlaps() const;
};

void gguf_file::impl::parse() {
  gguf_reader r(bytes, display_name);
  auto [tensor_count, kv_count] = parse_header(r);
  parse_metadata(r, kv_count);
  read_alignment();

  tensors.reserve(static_cast<size_t>(tensor_count));  // bounded by the file's size
  for (uint64_t i = 0; i < tensor_count; ++i) {
    tensors.push_back(read_tensor_info(r, i));
    const gguf_tensor& t = tensors.back();
    if (!tensor_index.try_emplace(t.name, tensors.size() - 1).second) {
      fail(fmt::format("tensor '{}' appears twice; the file is corrupt: {}", printable(t.name),
                       advice));
    }
  }
  // The data section starts at the next multiple of the alignment.
  size_t pos = r.position();
  size_t data_start = pos + (alignment - pos % alignment) % alignment;
  place_tensors(data_start);
  check_overlaps();
}

std::pair<uint64_t, uint64_t> gguf_file::impl::parse_header(gguf_reader& r) {
  if (bytes.size() < 4) {
    fail(fmt::format("is {} bytes long, too short to be a GGUF file; {}", bytes.size(), advice));
  }
  std::string_view magic(reinterpret_cast<const char*>(bytes.data()), 4);
  if (magic != "GGUF") {
    fail(fmt::format("is not a GGUF file: it starts with \"{}\" instead of \"GGUF\"; {}",
                     printable(magic), advice));
  }
  r.read_u32();
  version = r.read_u32();
  if (version != 2 && version != 3) {
    uint32_t swapped = __builtin_bswap32(version);
    if (swapped >= 1 && swapped <= 3) {
      fail("is a big-endian GGUF file; tireless reads little-endian files only: re-convert the "
           "model without --bigendian");
    }
    fail(fmt::format("has GGUF version {}; tireless reads versions 2 and 3: re-convert the model "
                     "with a current llama.cpp",
                     version));
  }
  uint64_t tensor_count = r.read_u64();
  uint64_t kv_count = r.read_u64();
  r.require_room(kv_count, min_kv_bytes, "kv_count");
  r.require_room(tensor_count, min_tensor_info_bytes, "tensor_count");
  return {tensor_count, kv_count};
}

void gguf_file::impl::parse_metadata(gguf_reader& r, uint64_t kv_count) {
  key_order.reserve(static_cast<size_t>(kv_count));  // bounded by the file's size
  for (uint64_t i = 0; i < kv_count; ++i) {
    r.set_context(fmt::format("metadata entry #{}", i));
    std::string key = r.read_string();
    r.set_context(fmt::format("key '{}'", printable(key)));
    gguf_value_type type = r.read_value_type();
    gguf_value value = r.read_value(type);
    if (!metadata.try_emplace(key, std::move(value)).second) {
      fail(fmt::format("key '{}' appears twice; the file is corrupt: {}", printable(key), advice));
    }
    key_order.push_back(std::move(key));
  }
}

void gguf_file::impl::read_alignment() {
  constexpr std::string_view key = "general.alignment";
  const gguf_value* v = nullptr;
  if (auto it = metadata.find(key); it != metadata.end()) v = &it->second;
  if (v == nullptr) return;
  const auto* a = std::get_if<uint32_t>(v);
  if (a == nullptr) {
    fail_key(key, fmt::format("is {}, expected a u32; the file is corrupt: {}", describe(*v),
                              advice));
  }
  if (!std::has_single_bit(*a)) {
    fail_key(key, fmt::format("is {}, which is not a power of two; the file is corrupt: {}", *a,
                              advice));
  }
  alignment = *a;
}

gguf_tensor gguf_file::impl::read_tensor_info(gguf_reader& r, uint64_t index) {
  r.set_context(fmt::format("tensor #{}", index));
  gguf_tensor t;
  t.name = r.read_string();
  r.set_context(fmt::format("tensor '{}'", printable(t.name)));
  uint32_t n_dims = r.read_u32();
  if (n_dims == 0 || n_dims > max_dims) {
    r.fail_corrupt(fmt::format("it has {} dimensions; GGUF tensors have 1 to {}", n_dims,
                               max_dims));
  }
  std::array<uint64_t, max_dims> dims{};
  for (uint32_t d = 0; d < n_dims; ++d) dims[d] = r.read_u64();
  uint32_t type_id = r.read_u32();
  t.offset = r.read_u64();
  check_tensor(r, t, std::span(dims.data(), n_dims), type_id);
  return t;
}

// Fills t.type, t.shape and t.n_bytes from what the file says, or throws.
void gguf_file::impl::check_tensor(gguf_reader& r, gguf_tensor& t, std::span<const uint64_t> dims,
                                   uint32_t type_id) const {
  std::string tname = printable(t.name);
  int64_t n_elements = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 0 || dims[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      r.fail_corrupt(fmt::format("dimension {} of shape {} is {}; dimensions must be from 1 to "
                                 "2^63-1",
                                 d, shape_string(dims), static_cast<int64_t>(dims[d])));
    }
    if (__builtin_mul_overflow(n_elements, static_cast<int64_t>(dims[d]), &n_elements)) {
      r.fail_corrupt(fmt::format("shape {} has more than 2^63-1 elements", shape_string(dims)));
    }
    t.shape.push_back(static_cast<int64_t>(dims[d]));
  }

  std::optional<tensor_type> type = tensor_type_from_id(type_id);
  if (!type) {
    fail(fmt::format("tensor '{}' has type {} (id {}), which tireless cannot run; supported: {}; "
                     "use a model file quantized to one of these",
                     tname, ggml_type_name(type_id), type_id, supported_type_list()));
  }
  t.type = *type;
  if (t.shape[0] % block_elements(t.type) != 0) {
    r.fail_corrupt(fmt::format("rows of {} elements are not a whole number of {} blocks of {}",
                               t.shape[0], name(t.type), block_elements(t.type)));
  }
  uint64_t blocks = static_cast<uint64_t>(n_elements / block_elements(t.type));
  uint64_t n_bytes = 0;
  if (__builtin_mul_overflow(blocks, block_bytes(t.type), &n_bytes) ||
      n_bytes > std::numeric_limits<size_t>::max()) {
    r.fail_corrupt(fmt::format("shape {} of {} takes more than 2^64 bytes", shape_string(dims),
                               name(t.type)));
  }
  t.n_bytes = static_cast<size_t>(n_bytes);
  if (t.offset % alignment != 0) {
    r.fail_corrupt(fmt::format("offset {} is not a multiple of the alignment {}", t.offset,
                               alignment));
  }
}

void gguf_file::impl::place_tensors(size_t data_start) {
  const size_t size = bytes.size();
  for (gguf_tensor& t : tensors) {
    if (data_start > size || t.offset > size - data_start ||
        t.n_bytes > size - data_start - t.offset) {
      fail(fmt::format("tensor '{}' ({} bytes at offset {} of the data section, which starts at "
                       "byte {}) runs past the end of the file ({} bytes); the file is truncated: "
                       "{}",
                       printable(t.name), t.n_bytes, t.offset, data_start, size, advice));
    }
    t.data = bytes.data() + data_start + t.offset;
  }
}

void gguf_file::impl::check_overlaps() const {
  std::vector<const gguf_tensor*> by_offset;
  by_offset.reserve(tensors.size());
  for (const gguf_tensor& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const gguf_tensor* a, const gguf_tensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const gguf_tensor& a = *by_offset[i - 1];
    const gguf_tensor& b = *by_offset[i];
    if (b.offset < a.offset + a.n_bytes) {
      fail(fmt::format("tensors '{}' (bytes {} to {} of the data section) and '{}' (from byte "
                       "{}) overlap; the file is corrupt: {}",
                       printable(a.name), a.offset, a.offset + a.n_bytes, printable(b.name),
                       b.offset, advice));
    }
  }
}

const gguf_value& gguf_file::impl::require(std::string_view key) const {
  auto it = metadata.find(key);
  if (it == metadata.end()) {
    fail_key(key, "is missing; re-convert the model with a current llama.cpp");
  }
  return it->second;
}

const gguf_array& gguf_file::impl::require_array(std::string_view key,
                                                 std::string_view expected) const {
  const gguf_value& v = require(key);
  const auto* a = std::get_if<gguf_array>(&v);
  if (a == nullptr) wrong_type(key, v, expected);
  return *a;
}

// ---- gguf_file ------------------------------------------------------------------------------

gguf_file::gguf_file(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
gguf_file::gguf_file(gguf_file&&) noexcept = default;
gguf_file& gguf_file::operator=(gguf_file&&) noexcept = default;
gguf_file::~gguf_file() = default;

gguf_file gguf_file::open(const std::filesystem::path& path) {
  auto p = std::make_unique<impl>();
  p->path = path;
  p->display_name = path.string();
  auto system_error = [&](std::string_view what) {
    std::string reason = std::error_code(errno, std::generic_category()).message();
    return gguf_error(fmt::format("cannot {} model file {}: {}", what, p->display_name, reason));
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw system_error("open");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    gguf_error e = system_error("inspect");
    ::close(fd);
    throw e;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw gguf_error(fmt::format("model file {} is not a regular file", p->display_name));
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      gguf_error e = system_error("map");
      ::close(fd);
      throw e;
    }
    p->mapping = m;
    p->mapping_size = size;
    p->bytes = std::span(static_cast<const std::byte*>(m), size);
  }
  ::close(fd);
  p->parse();
  return gguf_file(std::move(p));
}

gguf_file gguf_file::parse(std::vector<std::byte> image, std::string display_name) {
  auto p = std::make_unique<impl>();
  p->path = display_name;
  p->display_name = std::move(display_name);
  p->image = std::move(image);
  p->bytes = p->image;
  p->parse();
  return gguf_file(std::move(p));
}

const std::filesystem::path& gguf_file::path() const { return impl_->path; }
uint32_t gguf_file::version() const { return impl_->version; }
size_t gguf_file::alignment() const { return impl_->alignment; }
size_t gguf_file::mapped_bytes() const { return impl_->bytes.size(); }

void gguf_file::release_pages() const {
  if (impl_->mapping != nullptr) ::madvise(impl_->mapping, impl_->mapping_size, MADV_DONTNEED);
}

const gguf_value* gguf_file::find(std::string_view key) const {
  auto it = impl_->metadata.find(key);
  return it == impl_->metadata.end() ? nullptr : &it->second;
}

std::vector<std::string> gguf_file::keys() const { return impl_->key_order; }

std::string gguf_file::get_string(std::string_view key) const {
  const gguf_value& v = impl_->require(key);
  const auto* s = std::get_if<std::string>(&v);
  if (s == nullptr) impl_->wrong_type(key, v, "a string");
  return *s;
}

uint32_t gguf_file::get_u32(std::string_view key) const {
  const gguf_value& v = impl_->require(key);
  if (!is_integer(type_of(v))) impl_->wrong_type(key, v, "an unsigned integer");
  std::optional<uint32_t> n = fit_integer<uint32_t>(v);
  if (!n) {
    impl_->fail_key(key, fmt::format("is {} ({}), which does not fit an unsigned 32-bit integer",
                                     format_scalar(v), describe(v)));
  }
  return *n;
}

float gguf_file::get_f32(std::string_view key) const {
  const gguf_value& v = impl_->require(key);
  std::optional<float> f = fit_float(v);
  if (!f) {
    if (std::holds_alternative<double>(v)) {
      impl_->fail_key(key, fmt::format("is {}, which does not fit a 32-bit float",
                                       format_scalar(v)));
    }
    impl_->wrong_type(key, v, "a float");
  }
  return *f;
}

bool gguf_file::get_bool(std::string_view key) const {
  const gguf_value& v = impl_->require(key);
  const auto* b = std::get_if<bool>(&v);
  if (b == nullptr) impl_->wrong_type(key, v, "a bool");
  return *b;
}

std::optional<uint32_t> gguf_file::find_u32(std::string_view key) const {
  return has(key) ? std::optional(get_u32(key)) : std::nullopt;
}

std::optional<float> gguf_file::find_f32(std::string_view key) const {
  return has(key) ? std::optional(get_f32(key)) : std::nullopt;
}

std::optional<bool> gguf_file::find_bool(std::string_view key) const {
  return has(key) ? std::optional(get_bool(key)) : std::nullopt;
}

std::optional<std::string> gguf_file::find_string(std::string_view key) const {
  return has(key) ? std::optional(get_string(key)) : std::nullopt;
}

std::vector<std::string> gguf_file::get_string_array(std::string_view key) const {
  const gguf_array& a = impl_->require_array(key, "an array of strings");
  if (a.element_type != gguf_value_type::string) {
    impl_->wrong_type(key, *find(key), "an array of strings");
  }
  std::vector<std::string> out;
  out.reserve(a.values.size());
  for (const gguf_value& v : a.values) out.push_back(std::get<std::string>(v));
  return out;
}

std::vector<int32_t> gguf_file::get_i32_array(std::string_view key) const {
  const gguf_array& a = impl_->require_array(key, "an array of integers");
  if (!is_integer(a.element_type)) impl_->wrong_type(key, *find(key), "an array of integers");
  std::vector<int32_t> out;
  out.reserve(a.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) {
    std::optional<int32_t> n = fit_integer<int32_t>(a.values[i]);
    if (!n) {
      impl_->fail_key(key, fmt::format("has element {} = {}, which does not fit a signed 32-bit "
                                       "integer",
                                       i, format_scalar(a.values[i])));
    }
    out.push_back(*n);
  }
  return out;
}

std::vector<float> gguf_file::get_f32_array(std::string_view key) const {
  const gguf_array& a = impl_->require_array(key, "an array of floats");
  if (a.element_type != gguf_value_type::f32 && a.element_type != gguf_value_type::f64) {
    impl_->wrong_type(key, *find(key), "an array of floats");
  }
  std::vector<float> out;
  out.reserve(a.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) {
    std::optional<float> f = fit_float(a.values[i]);
    if (!f) {
      impl_->fail_key(key, fmt::format("has element {} = {}, which does not fit a 32-bit float",
                                       i, format_scalar(a.values[i])));
    }
    out.push_back(*f);
  }
  return out;
}

const std::vector<gguf_tensor>& gguf_file::tensors() const { return impl_->tensors; }

const gguf_tensor* gguf_file::find_tensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

const gguf_tensor& gguf_file::tensor(std::string_view name) const {
  const gguf_tensor* t = find_tensor(name);
  if (t == nullptr) {
    throw gguf_error(fmt::format("tensor '{}' is missing from {}; the file may be incomplete or "
                                 "for another architecture: {}",
                                 name, impl_->display_name, advice));
  }
  return *t;
}

}  // namespace tireless
