// libFuzzer target: the tokenizer and the chat template on any text. With SmolLM2's vocabulary
// when the model file is in place (TIRELESS_FUZZ_MODEL, or ~/.cache/tireless/models/...), else
// the tiny test model's (TIRELESS_TEST_DATA/tiny-dense.gguf). For every input:
//  - plain text decodes back to itself, less the bytes the vocabulary has no token for;
//  - tokenizing with a limit gives a prefix of the whole, stopping just past the limit;
//  - control tokens parsed or not, the ids decode to the same text;
//  - a chat built from the text (messages split at 0x1e) has control tokens exactly where the
//    template puts them, and equals the rendered text's tokens when no content holds a '<';
//  - the streaming decoder gives valid UTF-8.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/chat_template.hpp"
#include "model/gguf_file.hpp"
#include "model/tokenizer.hpp"
#include "model/unicode.hpp"

namespace {

using namespace tireless;

struct fixture {
  gguf_file file;
  tokenizer tok;
  chat_template chat;
  std::array<bool, 256> has_token{};
  token_id start = 0, end = 0;

  explicit fixture(gguf_file f)
      : file(std::move(f)), tok(tokenizer::from_gguf(file)), chat(chat_template::from_gguf(file, tok)) {
    for (int b = 0; b < 256; ++b) has_token[b] = !tok.encode(std::string(1, static_cast<char>(b)), false).empty();
    start = *tok.find("<|im_start|>");
    end = *tok.find("<|im_end|>");
  }
};

std::filesystem::path model_path() {
  if (const char* p = std::getenv("TIRELESS_FUZZ_MODEL"); p && *p) return p;
  const char* home = std::getenv("HOME");
  std::filesystem::path real = std::filesystem::path(home ? home : "") /
                               ".cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (std::filesystem::exists(real)) return real;
  const char* data = std::getenv("TIRELESS_TEST_DATA");
  return std::filesystem::path(data ? data : "build/test-data") / "tiny-dense.gguf";
}

const fixture& the_fixture() {
  static const auto f = std::make_unique<fixture>(gguf_file::open(model_path()));
  return *f;
}

bool valid_utf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const utf8_step st = utf8_decode(s, pos);
    if (st.kind != utf8_step::valid) return false;
    pos += st.length;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fixture& f = the_fixture();
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  std::string kept;
  for (char c : text) {
    if (f.has_token[static_cast<uint8_t>(c)]) kept += c;
  }
  const std::vector<token_id> ids = f.tok.encode(text, false);
  if (f.tok.decode(ids) != kept) __builtin_trap();
  if (f.tok.decode(f.tok.encode(text, true)) != kept) __builtin_trap();

  for (size_t limit : {size_t{0}, size_t{3}, ids.size()}) {
    std::vector<token_id> part;
    const bool whole = f.tok.encode_into(part, text, false, limit);
    if (whole != (ids.size() <= limit)) __builtin_trap();
    if (whole ? part != ids : part.size() <= limit) __builtin_trap();
    if (part.size() > ids.size() || !std::equal(part.begin(), part.end(), ids.begin())) __builtin_trap();
  }

  // A chat: the text split at 0x1e into messages of alternating roles.
  static constexpr std::string_view roles[] = {"user", "assistant", "system"};
  std::vector<chat_message> chat;
  bool any_angle = false;
  size_t from = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != '\x1e') continue;
    chat.push_back({std::string(roles[chat.size() % 3]), std::string(text.substr(from, i - from))});
    any_angle |= chat.back().content.find('<') != std::string::npos;
    from = i + 1;
  }
  std::vector<token_id> prompt;
  if (!f.chat.encode(chat, true, f.tok, prompt)) __builtin_trap();
  const size_t turns = chat.size() + (chat.front().role != "system" && !f.chat.default_system().empty());
  if (static_cast<size_t>(std::count(prompt.begin(), prompt.end(), f.start)) != turns + 1) __builtin_trap();
  if (static_cast<size_t>(std::count(prompt.begin(), prompt.end(), f.end)) != turns) __builtin_trap();
  if (!any_angle && prompt != f.tok.encode(f.chat.apply(chat, true), true)) __builtin_trap();

  stream_decoder d(f.tok);
  std::string streamed;
  for (token_id id : ids) streamed += d.push(id);
  streamed += d.flush();
  if (!valid_utf8(streamed)) __builtin_trap();
  return 0;
}
