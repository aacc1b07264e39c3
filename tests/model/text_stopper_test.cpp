#include "model/text_stopper.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "model/gguf_file.hpp"
#include "model/unicode.hpp"
#include "tiny_vocab.hpp"

namespace tireless {
namespace {

using testing::gpt2_char;
using testing::tiny_vocab;

// tiny_vocab with a few multi-byte tokens. Ids: 2 <|im_end|>, 3 + b the byte b, then the
// merges in order.
const tokenizer& tok() {
  static const tokenizer t = tokenizer::from_vocab(tiny_vocab({
      "E N",                        // 259 "EN"
      "EN D",                       // 260 "END"
      "S T", "O P", "ST OP",        // 261 "ST", 262 "OP", 263 "STOP"
      "END STOP",                   // 264 "ENDSTOP"
      "D " + gpt2_char(0xC3),       // 265 "D\xC3": a stop string's end, then half of "é"
  }));
  return t;
}
constexpr token_id im_end = 2, en = 259, end_ = 260, endstop = 264, d_and_half_e = 265;

// One token per byte of `text`.
std::vector<token_id> bytes(std::string_view text) {
  std::vector<token_id> ids;
  for (char c : text) ids.push_back(3 + static_cast<uint8_t>(c));
  return ids;
}

struct run {
  std::vector<std::string> pieces;  // what each push showed
  bool stopped = false;
  std::string text() const {
    std::string all;
    for (const std::string& p : pieces) all += p;
    return all;
  }
};

// Pushes ids until the stopper says stop.
run push_all(text_stopper& s, const std::vector<token_id>& ids) {
  run r;
  for (token_id id : ids) {
    auto piece = s.push(id);
    r.pieces.push_back(piece.text);
    if (piece.stopped) {
      r.stopped = true;
      break;
    }
  }
  return r;
}

TEST(text_stopper, without_stops_shows_text_as_it_comes) {
  text_stopper s(tok(), {}, {});
  const run r = push_all(s, bytes("Hi there"));
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.pieces, (std::vector<std::string>{"H", "i", " ", "t", "h", "e", "r", "e"}));
  EXPECT_EQ(s.finish(), "");
}

TEST(text_stopper, cuts_before_a_stop_string_and_never_shows_it) {
  text_stopper s(tok(), {}, {"END"});
  run r = push_all(s, bytes("ab"));
  auto piece = s.push(end_);
  EXPECT_TRUE(piece.stopped);
  EXPECT_EQ(r.text() + piece.text, "ab");
  EXPECT_EQ(s.push(bytes("x")[0]).text, "");
  EXPECT_TRUE(s.push(bytes("x")[0]).stopped);
  EXPECT_EQ(s.finish(), "");
}

TEST(text_stopper, shows_the_part_of_a_token_before_a_stop_string) {
  text_stopper s(tok(), {}, {"STOP"});
  const run r = push_all(s, {bytes("a")[0], endstop});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text(), "aEND");
}

TEST(text_stopper, holds_back_what_might_begin_a_stop_string_then_releases_it) {
  text_stopper s(tok(), {}, {"ENDING"});
  EXPECT_EQ(s.push(bytes("x")[0]).text, "x");
  EXPECT_EQ(s.push(en).text, "");
  EXPECT_EQ(s.push(bytes("D")[0]).text, "");
  EXPECT_EQ(s.push(bytes("I")[0]).text, "");
  auto piece = s.push(bytes("T")[0]);  // "ENDIT" is not "ENDING"
  EXPECT_EQ(piece.text, "ENDIT");
  EXPECT_FALSE(piece.stopped);
}

TEST(text_stopper, releases_only_the_part_that_can_no_longer_begin_a_stop_string) {
  text_stopper s(tok(), {}, {"abc"});
  const run r = push_all(s, bytes("aab"));
  EXPECT_EQ(r.pieces, (std::vector<std::string>{"", "a", ""}));  // "a" might begin "abc"
  auto piece = s.push(bytes("c")[0]);
  EXPECT_TRUE(piece.stopped);
  EXPECT_EQ(r.text() + piece.text, "a");
}

TEST(text_stopper, finds_a_stop_string_split_across_many_tokens) {
  text_stopper s(tok(), {}, {"\n<|user|>"});
  const run r = push_all(s, bytes("Sure.\n<|user|> more"));
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.pieces.size(), std::string("Sure.\n<|user|>").size());
  EXPECT_EQ(r.text(), "Sure.");
}

TEST(text_stopper, stops_at_whichever_stop_string_comes_first) {
  {
    text_stopper s(tok(), {}, {"STOP", "END"});  // listed last, found first
    const run r = push_all(s, {bytes("a")[0], endstop});
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.text(), "a");
  }
  {
    text_stopper s(tok(), {}, {"###", "\n\n"});
    const run r = push_all(s, bytes("x\n#\n\n##"));
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.text(), "x\n#");
  }
  {
    text_stopper s(tok(), {}, {"BCD", "ABCDE"});  // the longer one is held back too
    const run r = push_all(s, bytes("ABCDE"));
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.pieces.size(), 4u);
    EXPECT_EQ(r.text(), "A");
  }
}

TEST(text_stopper, a_stop_token_ends_without_showing_its_text) {
  text_stopper s(tok(), {im_end}, {});
  run r = push_all(s, bytes("Hi"));
  auto piece = s.push(im_end);
  EXPECT_TRUE(piece.stopped);
  EXPECT_EQ(r.text() + piece.text, "Hi");
  EXPECT_TRUE(s.push(bytes("x")[0]).stopped);
  EXPECT_EQ(s.finish(), "");
}

TEST(text_stopper, a_stop_token_releases_text_held_for_a_stop_string) {
  text_stopper s(tok(), {im_end}, {"END"});
  EXPECT_EQ(s.push(bytes("a")[0]).text, "a");
  EXPECT_EQ(s.push(en).text, "");
  auto piece = s.push(im_end);
  EXPECT_TRUE(piece.stopped);
  EXPECT_EQ(piece.text, "EN");
}

TEST(text_stopper, finish_releases_held_text_at_max_tokens) {
  text_stopper s(tok(), {}, {"END"});
  const run r = push_all(s, {bytes("o")[0], bytes("k")[0], en});
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.text(), "ok");
  EXPECT_EQ(s.finish(), "EN");
  EXPECT_EQ(s.finish(), "");
}

TEST(text_stopper, never_shows_half_a_character) {
  const std::string text = "é€😀 x😀é";
  text_stopper s(tok(), {}, {});
  const run r = push_all(s, bytes(text));
  for (const std::string& p : r.pieces) EXPECT_EQ(utf8_sanitize(p), p) << "a half character was shown";
  EXPECT_EQ(r.pieces[0], "");
  EXPECT_EQ(r.pieces[1], "é");
  EXPECT_EQ(r.text(), text);
}

TEST(text_stopper, finish_replaces_a_character_cut_off_by_max_tokens) {
  text_stopper s(tok(), {}, {});
  EXPECT_EQ(s.push(bytes("a")[0]).text, "a");
  EXPECT_EQ(s.push(3 + 0xE2).text, "");  // the first of "€"'s three bytes
  EXPECT_EQ(s.finish(), "\uFFFD");
}

TEST(text_stopper, holds_back_a_multi_byte_stop_string_and_releases_whole_characters) {
  text_stopper s(tok(), {}, {"é!"});
  const run r = push_all(s, bytes("aé?é!"));
  EXPECT_TRUE(r.stopped);
  for (const std::string& p : r.pieces) EXPECT_EQ(utf8_sanitize(p), p);
  EXPECT_EQ(r.text(), "aé?");
}

TEST(text_stopper, shows_nothing_of_a_character_begun_in_the_stopping_token) {
  // "EN" then "D\xC3": the stop string ends where half of a "é" begins. Neither the half
  // nor its replacement is shown, not even by finish().
  text_stopper s(tok(), {}, {"END"});
  const run r = push_all(s, {bytes("a")[0], en, d_and_half_e, 3 + 0xA9});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text(), "a");
  EXPECT_EQ(s.finish(), "");
}

// The stopper against the plain definition, on random byte-per-token texts of one- to
// four-byte characters with random stop strings: the text shown, plus finish() when no stop
// came, is the text before the first stop string, in whole characters.
TEST(text_stopper, agrees_with_cutting_at_the_first_stop_string) {
  const std::vector<std::string> alphabet = {"a", "b", "\n", "é", "€", "😀"};
  std::mt19937 rng(5);
  auto random_text = [&](size_t chars) {
    std::string s;
    for (size_t i = 0; i < chars; ++i) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    const std::string text = random_text(1 + rng() % 30);
    std::vector<std::string> stops;
    for (size_t i = rng() % 4; i > 0; --i) stops.push_back(random_text(1 + rng() % 4));
    size_t cut = std::string::npos;
    for (const std::string& st : stops) cut = std::min(cut, text.find(st));
    const std::string want = text.substr(0, cut);

    text_stopper s(tok(), {}, stops);
    const run r = push_all(s, bytes(text));
    ASSERT_EQ(r.stopped, cut != std::string::npos) << text;
    std::string shown = r.text();
    if (!r.stopped) shown += s.finish();
    for (const std::string& p : r.pieces) ASSERT_EQ(utf8_sanitize(p), p) << text;
    ASSERT_EQ(shown, want) << "text " << text << ", " << stops.size() << " stop strings";
  }
}

std::filesystem::path smollm2_path() {
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : "") / ".cache/tireless/models" /
         "SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(text_stopper_smollm2, cuts_real_tokens_at_stop_strings_and_the_end_token) {
  if (!std::filesystem::exists(smollm2_path())) GTEST_SKIP() << smollm2_path() << " is absent";
  const gguf_file file = gguf_file::open(smollm2_path());
  const tokenizer real = tokenizer::from_gguf(file);
  const token_id eos = *real.eos();
  {
    text_stopper s(real, {eos}, {"\nUser:"});
    const run r = push_all(s, real.encode("The answer is 42 😀.\nUser: and then?", false));
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.text(), "The answer is 42 😀.");
    for (const std::string& p : r.pieces) EXPECT_EQ(utf8_sanitize(p), p);
  }
  {
    text_stopper s(real, {eos}, {"\nUser:"});
    std::vector<token_id> ids = real.encode("Fine.\nUse", false);
    ids.push_back(eos);
    const run r = push_all(s, ids);
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.text(), "Fine.\nUse");  // held back for "\nUser:", released by the end token
  }
}

}  // namespace
}  // namespace tireless
