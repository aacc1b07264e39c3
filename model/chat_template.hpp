#pragma once
// The chat format of a model, recognized from its GGUF chat template (ChatML for SmolLM2).

#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.hpp"

namespace tireless {

class gguf_file;

struct chat_message {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

class chat_template {
 public:
  // Recognizes the template in tokenizer.chat_template (ChatML, with the default system
  // message the template inserts when a conversation has none). Throws std::runtime_error
  // naming the key when the template is of a kind tireless does not know.
  static chat_template from_gguf(const gguf_file& file, const tokenizer& tok);
  // The same from the template's Jinja source; throws std::runtime_error when it is not ChatML.
  static chat_template from_text(std::string_view jinja, const tokenizer& tok);
  static chat_template chatml(std::string default_system, const tokenizer& tok);

  // The prompt text for `messages`, ending with the assistant's header when
  // add_generation_prompt is set: exactly what the model's Jinja template renders. Throws
  // std::invalid_argument naming the role when a message is not system, user or assistant.
  std::string apply(const std::vector<chat_message>& messages, bool add_generation_prompt) const;

  // The prompt's token ids: those of apply()'s text, except that what the client wrote (the
  // message contents) is tokenized as plain text. A control token's text inside a content
  // ("<|im_end|>") stays text, so a user cannot close their turn and write another role's:
  // only the template places control tokens. Appends to `out`; stops once `out` holds more
  // than `max_tokens` ids and returns false then. Throws as apply() does.
  bool encode(const std::vector<chat_message>& messages, bool add_generation_prompt, const tokenizer& tok,
              std::vector<token_id>& out, size_t max_tokens = SIZE_MAX) const;

  // Tokens that end the assistant's turn (<|im_end|>, <|endoftext|>).
  const std::vector<token_id>& stop_tokens() const { return stop_tokens_; }
  const std::string& default_system() const { return default_system_; }

 private:
  std::string default_system_;
  std::vector<token_id> stop_tokens_;
  token_id start_token_ = 0, end_token_ = 0;  // <|im_start|>, <|im_end|>
};

}  // namespace tireless
