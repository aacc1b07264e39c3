#pragma once
// UTF-8 decoding that never fails, and the Unicode classes the GPT-2 pre-tokenizer needs.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tireless {

// One step of UTF-8 decoding at a position of a byte string.
struct utf8_step {
  enum kind_t : uint8_t {
    valid,       // `length` bytes form the code point `cp`
    invalid,     // the `length` bytes (>= 1) are a maximal ill-formed subpart (Unicode ch. 3)
    incomplete,  // the remaining `length` bytes start a valid character that is cut short
  };
  kind_t kind;
  uint8_t length;
  char32_t cp;
};

// Decodes at text[pos] (pos < text.size()). Follows Unicode's well-formed UTF-8 table: no
// overlongs, no surrogates, nothing above U+10FFFF.
utf8_step utf8_decode(std::string_view text, size_t pos);

// Appends `cp` (<= U+10FFFF) in UTF-8.
void utf8_append(std::string& out, char32_t cp);

// `text` made valid UTF-8: each maximal ill-formed subpart (and a character cut short at the
// end) becomes U+FFFD, as Rust's from_utf8_lossy and Python's errors="replace" do.
std::string utf8_sanitize(std::string_view text);

// The classes of GPT-2's pre-tokenizer regex: \p{L}, \p{N}, \s (Unicode White_Space) and the
// rest. Taken from ICU.
enum class char_class : uint8_t { letter, number, space, other };
char_class classify(char32_t cp);

}  // namespace tireless
