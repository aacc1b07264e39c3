#pragma once
// A hand-made GPT-2 byte-level vocabulary for tokenizer tests: the 256 byte tokens, three
// ChatML control tokens, and whatever merges a test asks for.

#include <string>
#include <vector>

#include "model/tokenizer.hpp"

namespace tireless::testing {

// GPT-2's byte-to-unicode form of one byte, written out independently of tokenizer.cpp.
inline std::string gpt2_char(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    cp = 256;
    for (int x = 0; x < b; ++x) {
      const bool p = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
      if (!p) ++cp;
    }
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Ids: 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|> (control); 3 + b the byte b; then one
// token per merge, in order, for the merged pieces.
inline vocab_data tiny_vocab(const std::vector<std::string>& merges, std::string pre = "smollm",
                             const std::vector<int>& missing_bytes = {}) {
  vocab_data v;
  v.model = "gpt2";
  v.pre = std::move(pre);
  v.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  v.token_types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    bool missing = false;
    for (int m : missing_bytes) missing |= m == b;
    v.tokens.push_back(missing ? "<unused" + std::to_string(b) + ">" : gpt2_char(b));
    v.token_types.push_back(1);
  }
  for (const std::string& m : merges) {
    const size_t space = m.find(' ');
    v.tokens.push_back(m.substr(0, space) + m.substr(space + 1));
    v.token_types.push_back(1);
  }
  v.merges = merges;
  v.eos = 2;
  return v;
}

}  // namespace tireless::testing
