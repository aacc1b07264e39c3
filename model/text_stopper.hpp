#pragma once
// Turns generated tokens into the text a client should see: complete UTF-8 characters, cut
// at the first stop token or stop string (neither of which is shown), holding back text that
// might still turn out to begin a stop string.

#include <string>
#include <vector>

#include "model/tokenizer.hpp"

namespace tireless {

class text_stopper {
 public:
  text_stopper(const tokenizer& tok, std::vector<token_id> stop_tokens,
               std::vector<std::string> stop_strings);

  struct piece {
    std::string text;      // safe to show now
    bool stopped = false;  // a stop token or string was reached: generation is over
  };
  piece push(token_id id);
  // The text still held back, for when generation ends for another reason (max_tokens).
  std::string finish();

 private:
  stream_decoder decoder_;
  std::vector<token_id> stop_tokens_;
  std::vector<std::string> stop_strings_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace tireless
