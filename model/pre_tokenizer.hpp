#pragma once
// Splits text into the words BPE runs on, as Hugging Face's GPT-2 ByteLevel pre-tokenizer does
// (optionally after splitting every digit apart, as SmolLM2's "smollm" pre-tokenizer does).

#include <string_view>
#include <vector>

namespace tireless {

class pre_tokenizer {
 public:
  // `name` is tokenizer.ggml.pre: "smollm", or "default"/"gpt2". Throws std::runtime_error
  // naming the key and the supported values for any other.
  static pre_tokenizer from_name(std::string_view name);

  // Appends to `words` the pieces of `text`, in order; together they are exactly `text`.
  // Bytes that are not valid UTF-8 are each a unit of their own, classed as a symbol.
  void split(std::string_view text, std::vector<std::string_view>& words) const;

 private:
  explicit pre_tokenizer(bool split_digits) : split_digits_(split_digits) {}
  bool split_digits_;
};

}  // namespace tireless
