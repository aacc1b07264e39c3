#include "model/model.hpp"

#include <fmt/format.h>

namespace tireless {

model::model(gguf_file f, model_config c, model_tensors t, tokenizer tok, chat_template chat)
    : file_(std::move(f)),
      config_(std::move(c)),
      tensors_(std::move(t)),
      tokenizer_(std::move(tok)),
      chat_(std::move(chat)) {}

std::shared_ptr<const model> model::load(const std::filesystem::path& path) {
  gguf_file f = gguf_file::open(path);
  model_config c = model_config::from_gguf(f);
  model_tensors t = model_tensors::from_gguf(f, c);
  tokenizer tok = tokenizer::from_gguf(f);
  if (tok.vocab_size() != c.n_vocab) {
    throw gguf_error(fmt::format("{}: the tokenizer has {} tokens but token_embd.weight has {} rows",
                                 path.string(), tok.vocab_size(), c.n_vocab));
  }
  chat_template chat = chat_template::from_gguf(f, tok);
  // The tensor pointers stay valid across the move: they point into the gguf_file's heap
  // state, which moves with it.
  return std::shared_ptr<const model>(
      new model(std::move(f), std::move(c), std::move(t), std::move(tok), std::move(chat)));
}

}  // namespace tireless
