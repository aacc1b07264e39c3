#pragma once
// GPT-2-style byte-level BPE, built from a GGUF file's tokenizer.ggml.* metadata.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tireless {

class gguf_file;

using token_id = int32_t;

// What a GGUF file says about its vocabulary (tokenizer.ggml.*).
struct vocab_data {
  std::string model;                // tokenizer.ggml.model, must be "gpt2"
  std::string pre;                  // tokenizer.ggml.pre ("smollm", "default", ...)
  std::vector<std::string> tokens;  // pieces in GPT-2 byte-to-unicode form
  std::vector<int32_t> token_types; // 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte;
                                    // empty: all normal
  std::vector<std::string> merges;  // "left right", highest priority first
  std::optional<token_id> bos, eos, eot, pad;
};

// Immutable once built: its const functions may be called from several threads at once.
class tokenizer {
 public:
  // Throws std::runtime_error (naming the key) when the metadata is missing or inconsistent,
  // or when the model or pre-tokenizer is not supported.
  static tokenizer from_gguf(const gguf_file& file);
  static tokenizer from_vocab(vocab_data vocab);

  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;
  ~tokenizer();

  // Text to ids, as Hugging Face's tokenizer with the same vocabulary, merges and
  // pre-tokenizer would give them. With parse_special, control/user-defined token texts in
  // `text` (such as "<|im_start|>") become their ids (leftmost, then longest, match first);
  // without it they are tokenized as plain text. Bytes that are not valid UTF-8 are encoded
  // byte by byte, so decode(encode(s, false)) == s, except that a byte the vocabulary has no
  // token for is dropped (as Hugging Face does; SmolLM2 lacks e.g. 0x04, 0xC0, 0xF5..0xFF).
  std::vector<token_id> encode(std::string_view text, bool parse_special = true) const;
  // The same, appended to `out`, stopping once `out` holds more than `max_tokens` ids: the
  // work is bounded by the limit, not by the text. Returns false when it stopped early (then
  // out.size() > max_tokens and the text has more tokens than were appended).
  bool encode_into(std::vector<token_id>& out, std::string_view text, bool parse_special,
                   size_t max_tokens = SIZE_MAX) const;

  // The most bytes one token stands for (special tokens included): a text of n bytes has at
  // least n / max_token_bytes() tokens, apart from bytes the vocabulary has no token for.
  size_t max_token_bytes() const;

  // The bytes a token stands for (for special tokens: their text). May be part of a UTF-8
  // character.
  std::string_view token_bytes(token_id id) const;
  std::string decode(std::span<const token_id> ids) const;

  std::optional<token_id> find(std::string_view piece) const;  // exact piece (in GGUF form)
  int32_t vocab_size() const;
  bool is_special(token_id id) const;  // control or user-defined
  std::optional<token_id> bos() const;
  std::optional<token_id> eos() const;

 private:
  struct impl;
  explicit tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

// Turns a stream of token ids into valid UTF-8 that never ends in half a character: bytes of
// an incomplete character are held until the rest arrives (or flush()). Bytes that can never
// form a character become U+FFFD (one per maximal ill-formed subpart, as Rust's
// from_utf8_lossy does), so the concatenated output is the lossy UTF-8 of decode(ids).
class stream_decoder {
 public:
  explicit stream_decoder(const tokenizer& tok) : tok_(&tok) {}
  std::string push(token_id id);  // the complete characters now available
  std::string flush();            // whatever is held, invalid bytes replaced by U+FFFD
 private:
  const tokenizer* tok_;
  std::string pending_;
};

}  // namespace tireless
