#include "model/tokenizer.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "model/gguf_file.hpp"
#include "model/pre_tokenizer.hpp"
#include "model/unicode.hpp"
#include "tiny_vocab.hpp"

namespace tireless {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::gpt2_char;
using testing::tiny_vocab;

std::vector<std::string> words(std::string_view text, std::string_view pre = "smollm") {
  std::vector<std::string_view> views;
  pre_tokenizer::from_name(pre).split(text, views);
  return {views.begin(), views.end()};
}

// The id of byte b in tiny_vocab, and of its first merged token.
token_id byte_id(char b) { return 3 + static_cast<uint8_t>(b); }
constexpr token_id first_merge = 3 + 256;

TEST(pre_tokenizer, gives_each_word_its_leading_space) {
  EXPECT_THAT(words("Hello world, it's me!"),
              ElementsAre("Hello", " world", ",", " it", "'s", " me", "!"));
}

TEST(pre_tokenizer, splits_lower_case_contractions_only) {
  EXPECT_THAT(words("I'll've"), ElementsAre("I", "'ll", "'ve"));
  EXPECT_THAT(words("I'LL"), ElementsAre("I", "'", "LL"));
  EXPECT_THAT(words("!'s"), ElementsAre("!'", "s"));
}

TEST(pre_tokenizer, leaves_the_last_space_of_a_run_to_the_next_word) {
  EXPECT_THAT(words("a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(words("a\n\nb"), ElementsAre("a", "\n", "\n", "b"));
  EXPECT_THAT(words("\t x"), ElementsAre("\t", " x"));
  EXPECT_THAT(words("x  "), ElementsAre("x", "  "));
  EXPECT_THAT(words(" "), ElementsAre(" "));
}

TEST(pre_tokenizer, smollm_splits_every_digit_and_default_does_not) {
  EXPECT_THAT(words("12345.67"), ElementsAre("1", "2", "3", "4", "5", ".", "6", "7"));
  EXPECT_THAT(words("12345.67", "default"), ElementsAre("12345", ".", "67"));
  EXPECT_THAT(words("a 12"), ElementsAre("a", " ", "1", "2"));
  EXPECT_THAT(words("a 12", "gpt2"), ElementsAre("a", " 12"));
  EXPECT_THAT(words("\u0660\u0661"), ElementsAre("\u0660", "\u0661"));  // Arabic-Indic digits
}

TEST(pre_tokenizer, classes_characters_by_unicode_category) {
  EXPECT_THAT(words("日本語 テスト café"), ElementsAre("日本語", " テスト", " café"));
  EXPECT_THAT(words("😀😀 x"), ElementsAre("😀😀", " x"));
  EXPECT_THAT(words("\u00a0x"), ElementsAre("\u00a0", "x"));  // no-break space is \s, not ' '
}

TEST(pre_tokenizer, makes_each_invalid_byte_a_symbol) {
  EXPECT_THAT(words("a\xff" "b"), ElementsAre("a", "\xff", "b"));
  EXPECT_THAT(words(" \x80\x80x"), ElementsAre(" \x80\x80", "x"));
  EXPECT_THAT(words("caf\xc3"), ElementsAre("caf", "\xc3"));
}

TEST(pre_tokenizer, refuses_an_unknown_name_naming_the_key) {
  try {
    pre_tokenizer::from_name("llama3");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tokenizer.ggml.pre is 'llama3'"));
    EXPECT_THAT(e.what(), HasSubstr("'smollm'"));
  }
}

TEST(tokenizer, merges_the_lowest_ranked_pair_first) {
  const auto bc_first = tokenizer::from_vocab(tiny_vocab({"b c", "a b"}));
  EXPECT_THAT(bc_first.encode("abc"), ElementsAre(byte_id('a'), first_merge));
  const auto ab_first = tokenizer::from_vocab(tiny_vocab({"a b", "b c"}));
  EXPECT_THAT(ab_first.encode("abc"), ElementsAre(first_merge, byte_id('c')));
}

TEST(tokenizer, merges_the_leftmost_pair_among_equals) {
  const auto tok = tokenizer::from_vocab(tiny_vocab({"a a"}));
  EXPECT_THAT(tok.encode("aaa"), ElementsAre(first_merge, byte_id('a')));
  EXPECT_THAT(tok.encode("aaaa"), ElementsAre(first_merge, first_merge));
}

TEST(tokenizer, merges_pieces_in_byte_to_unicode_form) {
  const std::string space = gpt2_char(' ');
  const auto tok = tokenizer::from_vocab(tiny_vocab({space + " w", space + "w o"}));
  EXPECT_THAT(tok.encode(" wo"), ElementsAre(first_merge + 1));
  EXPECT_EQ(tok.token_bytes(first_merge + 1), " wo");
  EXPECT_EQ(tok.find(space + "wo"), first_merge + 1);
}

TEST(tokenizer, never_merges_across_words) {
  const auto tok = tokenizer::from_vocab(tiny_vocab({"1 2", "a b"}));
  EXPECT_THAT(tok.encode("12"), ElementsAre(byte_id('1'), byte_id('2')));
  EXPECT_THAT(tok.encode("a!b"), ElementsAre(byte_id('a'), byte_id('!'), byte_id('b')));
  const auto gpt2 = tokenizer::from_vocab(tiny_vocab({"1 2"}, "default"));
  EXPECT_THAT(gpt2.encode("12"), ElementsAre(first_merge));
}

TEST(tokenizer, splits_special_tokens_out_of_the_text_when_asked) {
  const auto tok = tokenizer::from_vocab(tiny_vocab({}));
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const std::vector<token_id> ids = tok.encode(text);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(tok.decode(ids), text);

  const std::vector<token_id> plain = tok.encode(text, false);
  for (token_id id : plain) EXPECT_FALSE(tok.is_special(id)) << id;
  EXPECT_EQ(tok.decode(plain), text);
}

TEST(tokenizer, matches_the_longest_special_token_at_the_leftmost_place) {
  vocab_data v = tiny_vocab({});
  v.tokens.push_back("<|im");
  v.token_types.push_back(3);
  const auto tok = tokenizer::from_vocab(std::move(v));
  const token_id im = tok.vocab_size() - 1;
  EXPECT_THAT(tok.encode("<|im_end|>"), ElementsAre(2));
  EXPECT_THAT(tok.encode("<|imx"), ElementsAre(im, byte_id('x')));
  EXPECT_THAT(tok.encode("<<|im"), ElementsAre(byte_id('<'), im));
}

TEST(tokenizer, round_trips_any_byte_string) {
  const auto tok = tokenizer::from_vocab(tiny_vocab({"a b", "Ã ©", "ab c"}));
  std::mt19937 rng(42);
  for (int n = 0; n < 2000; ++n) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? "ab \n"[rng() % 4] : rng());
    ASSERT_EQ(tok.decode(tok.encode(s, false)), s) << ::testing::PrintToString(s);
  }
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, static_cast<char>(b));
    EXPECT_EQ(tok.decode(tok.encode(s, false)), s) << b;
  }
}

TEST(tokenizer, drops_a_byte_the_vocabulary_has_no_token_for) {
  const auto tok = tokenizer::from_vocab(tiny_vocab({"a b"}, "smollm", {0x04}));
  EXPECT_THAT(tok.encode("a\x04" "b"), ElementsAre(byte_id('a'), byte_id('b')));
  EXPECT_THAT(tok.encode("!\x04!"), ElementsAre(byte_id('!'), byte_id('!')));
}

TEST(tokenizer, stops_encoding_just_past_a_limit) {
  const auto tok = tokenizer::from_vocab(tiny_vocab({"a b"}));
  std::vector<token_id> out;
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "ab ";
  EXPECT_FALSE(tok.encode_into(out, text, false, 10));
  EXPECT_GT(out.size(), 10u);
  EXPECT_LE(out.size(), 14u);  // one word past the limit at most
  out.clear();
  EXPECT_TRUE(tok.encode_into(out, "ab ab", false, 10));
  EXPECT_EQ(out, tok.encode("ab ab", false));
}

TEST(tokenizer, knows_the_longest_token) {
  // "<|endoftext|>" (13 bytes) is the longest piece of the tiny vocabulary.
  EXPECT_EQ(tokenizer::from_vocab(tiny_vocab({"a b"})).max_token_bytes(), 13u);
}

TEST(tokenizer, answers_lookups) {
  const auto tok = tokenizer::from_vocab(tiny_vocab({"a b"}));
  EXPECT_EQ(tok.vocab_size(), 3 + 256 + 1);
  EXPECT_EQ(tok.find("<|im_end|>"), 2);
  EXPECT_EQ(tok.find("nope"), std::nullopt);
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_FALSE(tok.is_special(byte_id('a')));
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_EQ(tok.bos(), std::nullopt);
  EXPECT_EQ(tok.token_bytes(byte_id('\n')), "\n");
  EXPECT_EQ(tok.token_bytes(1), "<|im_start|>");
  EXPECT_THROW(tok.token_bytes(-1), std::out_of_range);
  EXPECT_THROW(tok.token_bytes(tok.vocab_size()), std::out_of_range);
}

std::string error_of(vocab_data v) {
  try {
    tokenizer::from_vocab(std::move(v));
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(tokenizer, names_the_key_of_a_bad_vocabulary) {
  vocab_data v = tiny_vocab({});
  v.model = "llama";
  EXPECT_THAT(error_of(v), HasSubstr("tokenizer.ggml.model is 'llama'"));
  EXPECT_THAT(error_of(tiny_vocab({}, "falcon")), HasSubstr("tokenizer.ggml.pre"));
  v = tiny_vocab({"a b"});
  v.merges.push_back("ab");
  EXPECT_THAT(error_of(v), HasSubstr("tokenizer.ggml.merges[1] ('ab')"));
  v.merges.back() = "q zz";
  EXPECT_THAT(error_of(v), HasSubstr("not in tokenizer.ggml.tokens"));
  v = tiny_vocab({});
  v.token_types.pop_back();
  EXPECT_THAT(error_of(v), HasSubstr("tokenizer.ggml.token_type"));
  v = tiny_vocab({});
  v.bos = 100000;
  EXPECT_THAT(error_of(v), HasSubstr("tokenizer.ggml.bos_token_id"));
}

std::vector<std::string> stream(const tokenizer& tok, std::string_view bytes) {
  stream_decoder d(tok);
  std::vector<std::string> out;
  for (char b : bytes) out.push_back(d.push(byte_id(b)));
  out.push_back(d.flush());
  return out;
}

TEST(stream_decoder, holds_a_character_until_its_last_byte_arrives) {
  const auto tok = tokenizer::from_vocab(tiny_vocab({}));
  EXPECT_THAT(stream(tok, "😀"), ElementsAre("", "", "", "😀", ""));
  EXPECT_THAT(stream(tok, "aé"), ElementsAre("a", "", "é", ""));
}

TEST(stream_decoder, replaces_bytes_that_cannot_form_a_character) {
  const auto tok = tokenizer::from_vocab(tiny_vocab({}));
  EXPECT_THAT(stream(tok, "\xff" "a"), ElementsAre("\uFFFD", "a", ""));
  EXPECT_THAT(stream(tok, "\xe2\x82" "A"), ElementsAre("", "", "\uFFFDA", ""));
  EXPECT_THAT(stream(tok, "x\xf0\x9f"), ElementsAre("x", "", "", "\uFFFD"));
}

TEST(stream_decoder, streams_the_lossy_utf8_of_the_whole_decode) {
  const auto tok = tokenizer::from_vocab(tiny_vocab({}));
  std::mt19937 rng(7);
  const std::string alphabet = "a \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\x80\xff";
  for (int n = 0; n < 500; ++n) {
    std::vector<token_id> ids(rng() % 12);
    for (token_id& id : ids) id = byte_id(alphabet[rng() % alphabet.size()]);
    stream_decoder d(tok);
    std::string streamed;
    for (token_id id : ids) streamed += d.push(id);
    streamed += d.flush();
    ASSERT_EQ(streamed, utf8_sanitize(tok.decode(ids)));
  }
}

// The real model, when scripts/fetch-model has put it in place.
std::filesystem::path smollm2_path() {
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : "") / ".cache/tireless/models" /
         "SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(tokenizer_smollm2, gives_hugging_face_ids) {
  if (!std::filesystem::exists(smollm2_path())) GTEST_SKIP() << smollm2_path() << " is absent";
  const gguf_file file = gguf_file::open(smollm2_path());
  const tokenizer tok = tokenizer::from_gguf(file);
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_THAT(tok.encode("Hello world"), ElementsAre(19556, 905));
  EXPECT_THAT(tok.encode("I'll pay $12345.67"),
              ElementsAre(57, 3060, 2290, 1885, 33, 34, 35, 36, 37, 30, 38, 39));
  EXPECT_THAT(tok.encode("<|im_start|>user\nHi<|im_end|>\n"), ElementsAre(1, 4093, 198, 26843, 2, 198));
  EXPECT_THAT(tok.encode("😀"), ElementsAre(10813, 242, 218));

  stream_decoder d(tok);
  EXPECT_EQ(d.push(10813), "");
  EXPECT_EQ(d.push(242), "");
  EXPECT_EQ(d.push(218), "😀");
}

}  // namespace
}  // namespace tireless
