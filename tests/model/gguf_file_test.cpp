#include "model/gguf_file.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "tests/support/gguf_image_builder.hpp"

namespace tireless {
namespace {

using ::testing::HasSubstr;
using test_support::gguf_image_builder;
using test_support::spec;
using test_support::make_array;
using test_support::put;
using vt = gguf_value_type;

constexpr uint32_t f32_id = 0, f16_id = 1, q4_0_id = 2, q4_1_id = 3, q8_0_id = 8, bf16_id = 30;

gguf_image_builder small_model() {
  gguf_image_builder b;
  b.add("general.architecture", std::string("llama"))
      .add("llama.block_count", uint32_t{2})
      .add("llama.rope.freq_base", 10000.0f)
      .add("tokenizer.ggml.tokens",
           make_array(vt::string, {std::string("a"), std::string("b"), std::string("ab")}))
      .add_tensor(spec("token_embd.weight", q8_0_id, {64, 3}))
      .add_tensor(spec("blk.0.ffn_up.weight", q4_1_id, {64, 8}))
      .add_tensor(spec("blk.0.attn_norm.weight", f32_id, {64}))
      .add_tensor(spec("blk.0.attn_q.weight", q4_0_id, {32, 2, 2}))
      .add_tensor(spec("blk.0.attn_k.weight", f16_id, {16, 3}))
      .add_tensor(spec("output_norm.weight", bf16_id, {64, 1, 1, 1}));
  return b;
}

gguf_file parse(std::vector<std::byte> image) {
  return gguf_file::parse(std::move(image), "model.gguf");
}

// The message of the gguf_error parsing `image` throws.
std::string parse_error(std::vector<std::byte> image) {
  try {
    parse(std::move(image));
  } catch (const gguf_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "the image parsed without error";
  return "";
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const gguf_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no gguf_error was thrown";
  return "";
}

std::vector<std::byte> u64_bytes(uint64_t v) {
  std::vector<std::byte> out;
  put<uint64_t>(out, v);
  return out;
}

// ---- valid files -----------------------------------------------------------------------------

TEST(gguf_file, reads_every_metadata_value_type) {
  gguf_array nested = make_array(
      vt::array, {make_array(vt::u8, {uint8_t{1}, uint8_t{2}}), make_array(vt::u8, {})});
  gguf_image_builder b;
  b.add("u8", uint8_t{200}).add("i8", int8_t{-100}).add("u16", uint16_t{60000})
      .add("i16", int16_t{-30000}).add("u32", uint32_t{4000000000}).add("i32", int32_t{-7})
      .add("u64", uint64_t{1} << 40).add("i64", int64_t{-1} << 40).add("f32", 1.5f)
      .add("f64", 2.25).add("bool", true).add("string", std::string("héllo\0x", 8))
      .add("nested", nested);
  gguf_file f = parse(b.build());

  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.keys(), (std::vector<std::string>{"u8", "i8", "u16", "i16", "u32", "i32", "u64",
                                                "i64", "f32", "f64", "bool", "string", "nested"}));
  EXPECT_EQ(std::get<uint8_t>(*f.find("u8")), 200);
  EXPECT_EQ(std::get<int8_t>(*f.find("i8")), -100);
  EXPECT_EQ(std::get<uint16_t>(*f.find("u16")), 60000);
  EXPECT_EQ(std::get<int16_t>(*f.find("i16")), -30000);
  EXPECT_EQ(std::get<uint32_t>(*f.find("u32")), 4000000000u);
  EXPECT_EQ(std::get<int32_t>(*f.find("i32")), -7);
  EXPECT_EQ(std::get<uint64_t>(*f.find("u64")), uint64_t{1} << 40);
  EXPECT_EQ(std::get<int64_t>(*f.find("i64")), int64_t{-1} << 40);
  EXPECT_EQ(std::get<float>(*f.find("f32")), 1.5f);
  EXPECT_EQ(std::get<double>(*f.find("f64")), 2.25);
  EXPECT_TRUE(std::get<bool>(*f.find("bool")));
  EXPECT_EQ(std::get<std::string>(*f.find("string")), std::string("héllo\0x", 8));
  const auto& outer = std::get<gguf_array>(*f.find("nested"));
  ASSERT_EQ(outer.element_type, vt::array);
  ASSERT_EQ(outer.values.size(), 2u);
  const auto& inner = std::get<gguf_array>(outer.values[0]);
  EXPECT_EQ(inner.element_type, vt::u8);
  ASSERT_EQ(inner.values.size(), 2u);
  EXPECT_EQ(std::get<uint8_t>(inner.values[1]), 2);
  EXPECT_TRUE(std::get<gguf_array>(outer.values[1]).values.empty());
  EXPECT_EQ(f.find("absent"), nullptr);
  EXPECT_TRUE(f.tensors().empty());
}

TEST(gguf_file, reads_tensor_infos_and_points_into_the_image) {
  gguf_image_builder b = small_model();
  gguf_file f = parse(b.build());

  ASSERT_EQ(f.tensors().size(), 6u);
  EXPECT_EQ(f.alignment(), 32u);
  const gguf_tensor& embd = f.tensor("token_embd.weight");
  EXPECT_EQ(embd.type, tensor_type::q8_0);
  EXPECT_EQ(embd.shape, (std::vector<int64_t>{64, 3}));
  EXPECT_EQ(embd.n_elements(), 192);
  EXPECT_EQ(embd.n_rows(), 3);
  EXPECT_EQ(embd.n_bytes, 3u * 2 * 34);
  EXPECT_EQ(embd.offset, 0u);
  const gguf_tensor& q = f.tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.type, tensor_type::q4_0);
  EXPECT_EQ(q.n_rows(), 4);
  EXPECT_EQ(f.tensor("output_norm.weight").type, tensor_type::bf16);
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").type, tensor_type::f16);

  const uintptr_t base = reinterpret_cast<uintptr_t>(f.tensors()[0].data) - f.tensors()[0].offset;
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const gguf_tensor& t = f.tensors()[i];
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data), base + t.offset) << t.name;
    std::vector<std::byte> expected = b.tensor_data(i);
    ASSERT_EQ(t.n_bytes, expected.size()) << t.name;
    EXPECT_EQ(std::memcmp(t.data, expected.data(), t.n_bytes), 0) << t.name;
  }
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
}

TEST(gguf_file, honors_general_alignment) {
  gguf_image_builder b = small_model();
  b.add("general.alignment", uint32_t{256});
  gguf_file f = parse(b.build());
  EXPECT_EQ(f.alignment(), 256u);
  for (const gguf_tensor& t : f.tensors()) EXPECT_EQ(t.offset % 256, 0u) << t.name;
  EXPECT_EQ(std::memcmp(f.tensors()[1].data, b.tensor_data(1).data(), f.tensors()[1].n_bytes), 0);
}

TEST(gguf_file, reads_version_2) {
  gguf_file f = parse(small_model().version(2).build());
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.tensors().size(), 6u);
}

// ---- typed getters ---------------------------------------------------------------------------

TEST(gguf_file, integer_getters_accept_any_integer_type_that_fits) {
  gguf_image_builder b;
  b.add("a.u8", uint8_t{7}).add("a.i64", int64_t{123456}).add("a.u64", uint64_t{4294967295})
      .add("a.neg", int32_t{-1}).add("a.big", uint64_t{1} << 32).add("a.ints",
      make_array(vt::u8, {uint8_t{1}, uint8_t{255}})).add("a.wide",
      make_array(vt::i64, {int64_t{-5}, int64_t{1} << 31}));
  gguf_file f = parse(b.build());
  EXPECT_EQ(f.get_u32("a.u8"), 7u);
  EXPECT_EQ(f.get_u32("a.i64"), 123456u);
  EXPECT_EQ(f.get_u32("a.u64"), 4294967295u);
  EXPECT_EQ(f.get_i32_array("a.ints"), (std::vector<int32_t>{1, 255}));
  EXPECT_THAT(error_of([&] { f.get_u32("a.neg"); }),
              HasSubstr("key 'a.neg' in model.gguf is -1 (an i32), which does not fit an "
                        "unsigned 32-bit integer"));
  EXPECT_THAT(error_of([&] { f.get_u32("a.big"); }), HasSubstr("4294967296"));
  EXPECT_THAT(error_of([&] { f.get_i32_array("a.wide"); }),
              HasSubstr("key 'a.wide' in model.gguf has element 1 = 2147483648"));
}

TEST(gguf_file, getters_name_the_key_and_its_actual_type) {
  gguf_image_builder b;
  b.add("llama.block_count", std::string("thirty")).add("f", 1.0f).add("flag", uint8_t{1})
      .add("list", make_array(vt::u32, {uint32_t{1}}));
  gguf_file f = parse(b.build());
  EXPECT_THAT(error_of([&] { f.get_u32("llama.block_count"); }),
              HasSubstr("key 'llama.block_count' in model.gguf is a string, expected an unsigned "
                        "integer"));
  EXPECT_THAT(error_of([&] { f.get_string("f"); }),
              HasSubstr("key 'f' in model.gguf is an f32, expected a string"));
  EXPECT_THAT(error_of([&] { f.get_bool("flag"); }),
              HasSubstr("key 'flag' in model.gguf is a u8, expected a bool"));
  EXPECT_THAT(error_of([&] { f.get_f32("list"); }),
              HasSubstr("key 'list' in model.gguf is an array of u32, expected a float"));
  EXPECT_THAT(error_of([&] { f.get_string_array("list"); }),
              HasSubstr("is an array of u32, expected an array of strings"));
  EXPECT_THAT(error_of([&] { f.get_f32_array("f"); }),
              HasSubstr("key 'f' in model.gguf is an f32, expected an array of floats"));
  EXPECT_THAT(error_of([&] { f.find_u32("llama.block_count"); }),
              HasSubstr("is a string, expected an unsigned integer"));
}

TEST(gguf_file, missing_keys_throw_from_get_and_are_empty_from_find) {
  gguf_file f = parse(small_model().build());
  EXPECT_THAT(error_of([&] { f.get_u32("llama.context_length"); }),
              HasSubstr("key 'llama.context_length' in model.gguf is missing"));
  EXPECT_THAT(error_of([&] { f.get_string_array("tokenizer.ggml.merges"); }),
              HasSubstr("key 'tokenizer.ggml.merges' in model.gguf is missing"));
  EXPECT_FALSE(f.find_u32("llama.context_length"));
  EXPECT_FALSE(f.find_f32("x"));
  EXPECT_FALSE(f.find_bool("x"));
  EXPECT_FALSE(f.find_string("x"));
  EXPECT_FALSE(f.has("x"));
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.find_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count"), 2u);
  EXPECT_EQ(f.find_f32("llama.rope.freq_base"), 10000.0f);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"a", "b", "ab"}));
  EXPECT_THAT(error_of([&] { f.tensor("output.weight"); }),
              HasSubstr("tensor 'output.weight' is missing from model.gguf"));
}

TEST(gguf_file, float_getters_accept_f64_that_fits) {
  gguf_image_builder b;
  b.add("d", 0.5).add("huge", 1e300).add("b", false)
      .add("scores", make_array(vt::f64, {1.0, -2.5}))
      .add("bad_scores", make_array(vt::f64, {1.0, 1e300}));
  gguf_file f = parse(b.build());
  EXPECT_EQ(f.get_f32("d"), 0.5f);
  EXPECT_EQ(f.find_bool("b"), false);
  EXPECT_EQ(f.get_f32_array("scores"), (std::vector<float>{1.0f, -2.5f}));
  EXPECT_THAT(error_of([&] { f.get_f32("huge"); }), HasSubstr("does not fit a 32-bit float"));
  EXPECT_THAT(error_of([&] { f.get_f32_array("bad_scores"); }), HasSubstr("element 1"));
}

// ---- corrupt headers and metadata ------------------------------------------------------------

TEST(gguf_file, rejects_bad_magic) {
  EXPECT_THAT(parse_error(small_model().magic("GGML").build()),
              HasSubstr("model.gguf: is not a GGUF file: it starts with \"GGML\""));
  EXPECT_THAT(parse_error({}), HasSubstr("model.gguf: is 0 bytes long, too short"));
}

TEST(gguf_file, rejects_unsupported_versions) {
  EXPECT_THAT(parse_error(small_model().version(1).build()),
              HasSubstr("model.gguf: has GGUF version 1; tireless reads versions 2 and 3"));
  EXPECT_THAT(parse_error(small_model().version(4).build()), HasSubstr("GGUF version 4"));
  EXPECT_THAT(parse_error(small_model().version(0x03000000).build()),
              HasSubstr("big-endian"));
}

TEST(gguf_file, rejects_counts_larger_than_the_file_could_hold) {
  EXPECT_THAT(parse_error(small_model().kv_count(uint64_t{1} << 40).build()),
              HasSubstr("the header: kv_count is 1099511627776, more than"));
  EXPECT_THAT(parse_error(small_model().tensor_count(std::numeric_limits<uint64_t>::max()).build()),
              HasSubstr("tensor_count is 18446744073709551615"));
  // One more entry than present: the reader runs into the tensor infos and fails there.
  EXPECT_THAT(parse_error(small_model().kv_count(5).build()), HasSubstr("model.gguf: "));
}

TEST(gguf_file, rejects_a_huge_string_length) {
  gguf_image_builder b = small_model();
  b.add_raw("general.name", static_cast<uint32_t>(vt::string), u64_bytes(uint64_t{1} << 60));
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("key 'general.name': string length 1152921504606846976 runs past the end "
                        "of the file"));
}

TEST(gguf_file, rejects_a_huge_key_length) {
  gguf_image_builder b;
  std::vector<std::byte> image = b.kv_count(1).build();
  std::vector<std::byte> len = u64_bytes(std::numeric_limits<uint64_t>::max());
  image.insert(image.end(), len.begin(), len.end());
  image.resize(image.size() + 16);
  EXPECT_THAT(parse_error(image), HasSubstr("metadata entry #0: string length"));
}

TEST(gguf_file, rejects_a_huge_array_count) {
  std::vector<std::byte> payload;
  put<uint32_t>(payload, static_cast<uint32_t>(vt::u32));
  put<uint64_t>(payload, uint64_t{1} << 62);
  gguf_image_builder b = small_model();
  b.add_raw("tokenizer.ggml.token_type", static_cast<uint32_t>(vt::array), payload);
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("key 'tokenizer.ggml.token_type': the array's element count is "
                        "4611686018427387904, more than the"));
}

TEST(gguf_file, rejects_an_unknown_value_type) {
  gguf_image_builder b = small_model();
  b.add_raw("weird", 13, u64_bytes(0));
  EXPECT_THAT(parse_error(b.build()), HasSubstr("key 'weird': unknown value type 13"));
  std::vector<std::byte> payload;
  put<uint32_t>(payload, 99);
  put<uint64_t>(payload, 0);
  gguf_image_builder c = small_model();
  c.add_raw("weird.array", static_cast<uint32_t>(vt::array), payload);
  EXPECT_THAT(parse_error(c.build()), HasSubstr("key 'weird.array': unknown value type 99"));
}

TEST(gguf_file, rejects_arrays_nested_too_deep) {
  gguf_value v = make_array(vt::u8, {});
  for (int i = 0; i < 20; ++i) v = make_array(vt::array, {v});
  gguf_image_builder b;
  b.add("deep", v);
  EXPECT_THAT(parse_error(b.build()), HasSubstr("key 'deep': arrays nested more than"));
}

TEST(gguf_file, rejects_duplicate_keys) {
  gguf_image_builder b = small_model();
  b.add("llama.block_count", uint32_t{3});
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("model.gguf: key 'llama.block_count' appears twice"));
}

TEST(gguf_file, rejects_a_bad_general_alignment) {
  gguf_image_builder b = small_model();
  b.add("general.alignment", uint32_t{48}).pad_to(32);
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("key 'general.alignment' in model.gguf is 48, which is not a power of two"));
  gguf_image_builder z = small_model();
  z.add("general.alignment", uint32_t{0}).pad_to(32);
  EXPECT_THAT(parse_error(z.build()), HasSubstr("is 0, which is not a power of two"));
  gguf_image_builder s = small_model();
  s.add("general.alignment", std::string("32"));
  EXPECT_THAT(parse_error(s.build()),
              HasSubstr("key 'general.alignment' in model.gguf is a string, expected a u32"));
}

// ---- corrupt tensor infos --------------------------------------------------------------------

TEST(gguf_file, rejects_more_than_four_dimensions) {
  gguf_image_builder b = small_model();
  b.add_tensor(spec("blk.1.big", f32_id, {2, 2, 2, 2, 2}));
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("tensor 'blk.1.big': it has 5 dimensions; GGUF tensors have 1 to 4"));
  gguf_image_builder z = small_model();
  z.add_tensor(spec("scalar", f32_id, {}));
  EXPECT_THAT(parse_error(z.build()), HasSubstr("tensor 'scalar': it has 0 dimensions"));
}

TEST(gguf_file, rejects_zero_and_negative_dimensions) {
  gguf_image_builder b = small_model();
  b.add_tensor(spec("blk.1.zero", f32_id, {64, 0}));
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("tensor 'blk.1.zero': dimension 1 of shape [64, 0] is 0"));
  gguf_image_builder n = small_model();
  n.add_tensor(spec("blk.1.neg", f32_id, {std::numeric_limits<uint64_t>::max(), 1}));
  EXPECT_THAT(parse_error(n.build()), HasSubstr("tensor 'blk.1.neg': dimension 0 of shape"));
  EXPECT_THAT(parse_error(n.build()), HasSubstr("is -1"));
}

TEST(gguf_file, rejects_element_count_overflow) {
  gguf_image_builder b = small_model();
  b.add_tensor(spec("blk.1.huge", f32_id, {uint64_t{1} << 32, uint64_t{1} << 32}));
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("tensor 'blk.1.huge': shape [4294967296, 4294967296] has more than "
                        "2^63-1 elements"));
  // Fits int64 elements but not size_t bytes.
  gguf_image_builder c = small_model();
  c.add_tensor(spec("blk.1.wide", f32_id, {uint64_t{1} << 62}));
  EXPECT_THAT(parse_error(c.build()), HasSubstr("tensor 'blk.1.wide': shape"));
  EXPECT_THAT(parse_error(c.build()), HasSubstr("more than 2^64 bytes"));
}

TEST(gguf_file, rejects_rows_that_are_not_whole_blocks) {
  gguf_image_builder b = small_model();
  b.add_tensor(spec("blk.1.ffn_down.weight", q4_1_id, {48, 2}));
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("tensor 'blk.1.ffn_down.weight': rows of 48 elements are not a whole "
                        "number of q4_1 blocks of 32"));
}

TEST(gguf_file, rejects_unsupported_tensor_types_by_name) {
  gguf_image_builder b = small_model();
  b.add_tensor(
      spec("blk.0.ffn_down.weight", 12, {256, 2}, std::nullopt, std::vector<std::byte>(288)));
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("model.gguf: tensor 'blk.0.ffn_down.weight' has type q4_K (id 12), which "
                        "tireless cannot run; supported: f32, f16, bf16, q8_0, q4_0, q4_1"));
  gguf_image_builder u = small_model();
  u.add_tensor(spec("t", 1000, {32}, std::nullopt, std::vector<std::byte>(32)));
  EXPECT_THAT(parse_error(u.build()), HasSubstr("tensor 't' has type unknown (id 1000)"));
}

TEST(gguf_file, rejects_duplicate_tensor_names) {
  gguf_image_builder b = small_model();
  b.add_tensor(spec("blk.0.ffn_up.weight", f32_id, {8}));
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("model.gguf: tensor 'blk.0.ffn_up.weight' appears twice"));
}

TEST(gguf_file, rejects_misaligned_offsets) {
  gguf_image_builder b = small_model();
  b.add_tensor(spec("blk.1.attn_norm.weight", f32_id, {8}, uint64_t{4096 + 4}));
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("tensor 'blk.1.attn_norm.weight': offset 4100 is not a multiple of the "
                        "alignment 32"));
}

TEST(gguf_file, rejects_overlapping_tensors) {
  gguf_image_builder b = small_model();
  b.add_tensor(spec("blk.1.attn_norm.weight", f32_id, {64}, uint64_t{32}));  // inside token_embd
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("tensors 'token_embd.weight' (bytes 0 to 204 of the data section) and "
                        "'blk.1.attn_norm.weight' (from byte 32) overlap"));
}

TEST(gguf_file, rejects_tensors_past_the_end_of_the_file) {
  gguf_image_builder b = small_model();
  b.add_tensor(spec("output.weight", f32_id, {64}, uint64_t{1} << 40));
  EXPECT_THAT(parse_error(b.build()),
              HasSubstr("tensor 'output.weight' (256 bytes at offset 1099511627776 of the data "
                        "section"));
  EXPECT_THAT(parse_error(b.build()), HasSubstr("runs past the end of the file"));

  std::vector<std::byte> image = small_model().build();
  image.pop_back();
  EXPECT_THAT(parse_error(image),
              HasSubstr("tensor 'output_norm.weight' (128 bytes at offset"));
}

TEST(gguf_file, rejects_every_truncation) {
  const std::vector<std::byte> image = small_model().build();
  for (size_t n = 0; n < image.size(); ++n) {
    std::vector<std::byte> cut(image.begin(), image.begin() + static_cast<ptrdiff_t>(n));
    EXPECT_THROW(parse(std::move(cut)), gguf_error) << "truncated to " << n << " bytes";
  }
}

TEST(gguf_file, survives_random_corruption) {
  gguf_image_builder b = small_model();
  b.add("general.languages", make_array(vt::string, {std::string("en")}))
      .add("scores", make_array(vt::f32, {1.0f, 2.0f}))
      .add("nested", make_array(vt::array, {make_array(vt::i16, {int16_t{3}})}));
  const std::vector<std::byte> image = b.build();
  std::mt19937 rng(12345);
  int parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::vector<std::byte> m = image;
    int n_flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n_flips; ++k) {
      size_t at = rng() % m.size();
      m[at] = (rng() % 2) ? std::byte(rng() & 0xff) : std::byte(0xff);
    }
    try {
      parse(std::move(m));
      ++parsed;
    } catch (const gguf_error&) {
    }
  }
  EXPECT_GT(parsed, 0);  // flips inside tensor data leave the file valid
}

// ---- files on disk ---------------------------------------------------------------------------

std::filesystem::path write_temp(const std::string& name, const std::vector<std::byte>& bytes) {
  std::filesystem::path p = std::filesystem::path(::testing::TempDir()) / name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return p;
}

TEST(gguf_file, opens_and_maps_a_file) {
  gguf_image_builder b = small_model();
  std::vector<std::byte> image = b.build();
  std::filesystem::path p = write_temp("tireless_gguf_test_small.gguf", image);
  gguf_file f = gguf_file::open(p);
  EXPECT_EQ(f.path(), p);
  EXPECT_EQ(f.mapped_bytes(), image.size());
  const gguf_tensor& t = f.tensor("blk.0.ffn_up.weight");
  EXPECT_EQ(std::memcmp(t.data, b.tensor_data(1).data(), t.n_bytes), 0);

  gguf_file moved = std::move(f);
  EXPECT_EQ(moved.tensor("blk.0.ffn_up.weight").data, t.data);
  std::filesystem::remove(p);
}

TEST(gguf_file, open_errors_name_the_file) {
  EXPECT_THAT(error_of([] { gguf_file::open("/nonexistent/dir/model.gguf"); }),
              HasSubstr("cannot open model file /nonexistent/dir/model.gguf: No such file"));
  EXPECT_THAT(error_of([] { gguf_file::open(::testing::TempDir()); }),
              HasSubstr("is not a regular file"));
  std::filesystem::path empty = write_temp("tireless_gguf_test_empty.gguf", {});
  EXPECT_THAT(error_of([&] { gguf_file::open(empty); }),
              HasSubstr(empty.string() + ": is 0 bytes long, too short to be a GGUF file"));
  std::vector<std::byte> image = small_model().build();
  image.resize(image.size() / 2);
  std::filesystem::path cut = write_temp("tireless_gguf_test_cut.gguf", image);
  EXPECT_THAT(error_of([&] { gguf_file::open(cut); }), HasSubstr(cut.string() + ": "));
  std::filesystem::remove(empty);
  std::filesystem::remove(cut);
}

// ---- the real model --------------------------------------------------------------------------

uint64_t fnv1a(const std::byte* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 0x100000001b3ull;
  return h;
}

TEST(gguf_file, reads_the_real_smollm2_model) {
  const char* home = std::getenv("HOME");
  std::filesystem::path p = std::filesystem::path(home ? home : "") /
                            ".cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(p)) GTEST_SKIP() << p << " is absent (scripts/fetch-model)";

  gguf_file f = gguf_file::open(p);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.mapped_bytes(), 98362432u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count"), 30u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 576u);
  EXPECT_EQ(f.get_f32("llama.rope.freq_base"), 100000.0f);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");

  const gguf_tensor& embd = f.tensor("token_embd.weight");
  EXPECT_EQ(embd.type, tensor_type::q8_0);
  EXPECT_EQ(embd.shape, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(embd.offset, 0u);
  const gguf_tensor& up = f.tensor("blk.0.ffn_up.weight");
  EXPECT_EQ(up.type, tensor_type::q4_1);
  EXPECT_EQ(up.shape, (std::vector<int64_t>{576, 1536}));

  std::vector<std::string> tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(tokens[0], "<|endoftext|>");
  EXPECT_EQ(tokens.back(), "ectable");
  std::vector<std::string> merges = f.get_string_array("tokenizer.ggml.merges");
  ASSERT_EQ(merges.size(), 48900u);
  EXPECT_EQ(merges[0], "\xc4\xa0 t");
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type").size(), 49152u);

  // Offsets, sizes and FNV-1a hashes as the Python gguf package reports them.
  EXPECT_EQ(up.offset, 31189248u);
  EXPECT_EQ(up.n_bytes, 552960u);
  EXPECT_EQ(fnv1a(up.data, up.n_bytes), 0x773f4a5fe1561daeull);
  const gguf_tensor& norm = f.tensor("output_norm.weight");
  EXPECT_EQ(norm.offset, 96574464u);
  EXPECT_EQ(norm.n_bytes, 2304u);
  EXPECT_EQ(fnv1a(norm.data, norm.n_bytes), 0xea814bed6299e304ull);
  EXPECT_EQ(f.tensors().back().name, "output_norm.weight");
}

}  // namespace
}  // namespace tireless
