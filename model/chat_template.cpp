#include "model/chat_template.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "model/gguf_file.hpp"
#include "model/unicode.hpp"

namespace tireless {

namespace {

constexpr std::string_view im_start = "<|im_start|>";
constexpr std::string_view im_end = "<|im_end|>";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
  return -1;
}

// A Jinja string literal's value (Python escapes: \n \t \r \\ \' \" \xHH \uHHHH \UHHHHHHHH);
// `body` is the text between the quotes.
std::string unescape(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char e = body[++i];
    const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits > 0 && i + digits < body.size()) {
      char32_t cp = 0;
      bool ok = true;
      for (size_t k = 1; ok && k <= digits; ++k) {
        const int v = hex_value(body[i + k]);
        ok = v >= 0;
        cp = cp * 16 + static_cast<char32_t>(v);
      }
      if (ok && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF)) {
        utf8_append(out, cp);
        i += digits;
        continue;
      }
    }
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': case '\'': case '"': out += e; break;
      default: out += '\\'; out += e; break;
    }
  }
  return out;
}

// The pieces of text a Jinja template can print verbatim: the text between its tags and the
// string literals inside its {{ }} and {% %} tags (comments skipped), in order.
std::vector<std::string> literal_texts(std::string_view jinja) {
  auto next_tag = [&](size_t pos) {
    for (size_t open = jinja.find('{', pos); open != std::string_view::npos;
         open = jinja.find('{', open + 1)) {
      if (open + 1 < jinja.size() && std::string_view("{%#").find(jinja[open + 1]) != std::string_view::npos) {
        return open;
      }
    }
    return jinja.size();
  };
  std::vector<std::string> texts;
  size_t pos = 0;
  while (pos < jinja.size()) {
    const size_t open = next_tag(pos);
    if (open > pos) texts.emplace_back(jinja.substr(pos, open - pos));
    if (open == jinja.size()) break;
    const char kind = jinja[open + 1];
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t i = open + 2;
    while (i < jinja.size() && jinja.compare(i, 2, close) != 0) {
      const char q = jinja[i];
      if (kind == '#' || (q != '\'' && q != '"')) {
        ++i;
        continue;
      }
      size_t j = i + 1;
      while (j < jinja.size() && jinja[j] != q) j += jinja[j] == '\\' ? 2 : 1;
      j = std::min(j, jinja.size());
      texts.push_back(unescape(jinja.substr(i + 1, j - i - 1)));
      i = j + 1;
    }
    pos = std::min(i + 2, jinja.size());
  }
  return texts;
}

// The system message a ChatML template writes itself: the text of the first literal
// "<|im_start|>system\n...<|im_end|>". Empty when the template has none.
std::string default_system_of(std::string_view jinja) {
  const std::string header = std::string(im_start) + "system\n";
  for (const std::string& text : literal_texts(jinja)) {
    const size_t start = text.find(header);
    if (start == std::string::npos) continue;
    const size_t begin = start + header.size();
    const size_t end = text.find(im_end, begin);
    if (end != std::string::npos) return text.substr(begin, end - begin);
  }
  return {};
}

}  // namespace

chat_template chat_template::chatml(std::string default_system, const tokenizer& tok) {
  chat_template t;
  t.default_system_ = std::move(default_system);
  const std::optional<token_id> end = tok.find(im_end), start = tok.find(im_start);
  if (!end || !start) {
    throw std::runtime_error(fmt::format("the chat template is ChatML but the vocabulary has no {} token",
                                         end ? im_start : im_end));
  }
  t.start_token_ = *start;
  t.end_token_ = *end;
  t.stop_tokens_.push_back(*end);
  for (std::optional<token_id> id : {tok.find("<|endoftext|>"), tok.eos()}) {
    if (id && std::find(t.stop_tokens_.begin(), t.stop_tokens_.end(), *id) == t.stop_tokens_.end()) {
      t.stop_tokens_.push_back(*id);
    }
  }
  return t;
}

chat_template chat_template::from_text(std::string_view jinja, const tokenizer& tok) {
  if (jinja.find(im_start) == std::string_view::npos || jinja.find(im_end) == std::string_view::npos) {
    throw std::runtime_error(
        "the chat template is not one tireless knows: it supports ChatML "
        "(<|im_start|>role\\n...<|im_end|>); serve the model with a ChatML template");
  }
  return chatml(default_system_of(jinja), tok);
}

chat_template chat_template::from_gguf(const gguf_file& file, const tokenizer& tok) {
  constexpr std::string_view key = "tokenizer.chat_template";
  const std::optional<std::string> jinja = file.find_string(key);
  if (!jinja) {
    throw std::runtime_error(fmt::format(
        "{} is missing from {}; tireless cannot format chat conversations for this model", key,
        file.path().string()));
  }
  try {
    return from_text(*jinja, tok);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("{} in {}: {}", key, file.path().string(), e.what()));
  }
}

namespace {

void check_role(const chat_message& m, size_t i) {
  if (m.role != "system" && m.role != "user" && m.role != "assistant") {
    throw std::invalid_argument(fmt::format(
        "message {} has role '{}'; the chat template accepts only system, user and assistant", i, m.role));
  }
}

}  // namespace

bool chat_template::encode(const std::vector<chat_message>& messages, bool add_generation_prompt,
                           const tokenizer& tok, std::vector<token_id>& out, size_t max_tokens) const {
  // apply()'s text is <|im_start|> role\n content <|im_end|> \n ...: between two control
  // tokens lies plain text, tokenized as one piece, as a tokenizer given the whole text does.
  auto turn = [&](std::string_view role, std::string_view content) {
    out.push_back(start_token_);
    std::string header;
    header.reserve(role.size() + 1 + content.size());
    header.append(role).append("\n").append(content);
    if (!tok.encode_into(out, header, false, max_tokens)) return false;
    out.push_back(end_token_);
    return tok.encode_into(out, "\n", false, max_tokens);
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    const chat_message& m = messages[i];
    check_role(m, i);
    if (i == 0 && m.role != "system" && !default_system_.empty() && !turn("system", default_system_)) return false;
    if (!turn(m.role, m.content)) return false;
  }
  if (add_generation_prompt) {
    out.push_back(start_token_);
    if (!tok.encode_into(out, "assistant\n", false, max_tokens)) return false;
  }
  return out.size() <= max_tokens;
}

std::string chat_template::apply(const std::vector<chat_message>& messages,
                                 bool add_generation_prompt) const {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const chat_message& m = messages[i];
    check_role(m, i);
    if (i == 0 && m.role != "system" && !default_system_.empty()) {
      out += fmt::format("{}system\n{}{}\n", im_start, default_system_, im_end);
    }
    out += fmt::format("{}{}\n{}{}\n", im_start, m.role, m.content, im_end);
  }
  if (add_generation_prompt) out += fmt::format("{}assistant\n", im_start);
  return out;
}

}  // namespace tireless
