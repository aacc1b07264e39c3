#pragma once
// A model file opened for serving: its configuration, tensors, tokenizer and chat format.

#include <filesystem>
#include <memory>

#include "model/chat_template.hpp"
#include "model/gguf_file.hpp"
#include "model/model_config.hpp"
#include "model/model_tensors.hpp"
#include "model/tokenizer.hpp"

namespace tireless {

class model {
 public:
  // Opens and checks everything; throws gguf_error / std::runtime_error with a message that
  // names the file and what is wrong with it.
  static std::shared_ptr<const model> load(const std::filesystem::path& path);

  const gguf_file& file() const { return file_; }
  const model_config& config() const { return config_; }
  const model_tensors& tensors() const { return tensors_; }
  const tokenizer& tok() const { return tokenizer_; }
  const chat_template& chat() const { return chat_; }

 private:
  model(gguf_file f, model_config c, model_tensors t, tokenizer tok, chat_template chat);
  gguf_file file_;
  model_config config_;
  model_tensors tensors_;
  tokenizer tokenizer_;
  chat_template chat_;
};

}  // namespace tireless
