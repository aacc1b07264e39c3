#include "model/pre_tokenizer.hpp"

#include <stdexcept>
#include <string>

#include "model/unicode.hpp"

namespace tireless {

namespace {

// A character of the text (or one byte of it that is not valid UTF-8).
struct unit {
  uint32_t offset;  // in bytes
  char_class cls;
  char ascii;  // the character when it is ASCII, else 0
};

std::vector<unit> units_of(std::string_view text) {
  std::vector<unit> units;
  units.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const utf8_step s = utf8_decode(text, pos);
    if (s.kind == utf8_step::valid) {
      units.push_back({static_cast<uint32_t>(pos), classify(s.cp),
                       s.cp < 0x80 ? static_cast<char>(s.cp) : '\0'});
      pos += s.length;
    } else {
      units.push_back({static_cast<uint32_t>(pos), char_class::other, '\0'});
      pos += 1;
    }
  }
  return units;
}

// The GPT-2 pattern, tried in order at each position of one piece [begin, end):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
class gpt2_matcher {
 public:
  explicit gpt2_matcher(const std::vector<unit>& units) : u_(units) {}

  // The end of the match starting at i (> i), for i < end.
  size_t match(size_t i, size_t end) const {
    if (size_t c = contraction(i, end)) return c;
    size_t k = i;
    if (u_[i].ascii == ' ' && i + 1 < end && u_[i + 1].cls != char_class::space) k = i + 1;
    const char_class cls = u_[k].cls;
    if (cls != char_class::space) return run_end(k, end, cls);
    const size_t r = run_end(i, end, char_class::space);
    if (r == end) return r;           // \s+(?!\S) at the end of the piece
    if (r - i >= 2) return r - 1;     // \s+(?!\S): leave the last space to the next word
    return r;                         // \s+
  }

 private:
  size_t contraction(size_t i, size_t end) const {
    if (u_[i].ascii != '\'' || i + 1 >= end) return 0;
    const char a = u_[i + 1].ascii;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 >= end) return 0;
    const char b = u_[i + 2].ascii;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
  }

  size_t run_end(size_t i, size_t end, char_class cls) const {
    while (i < end && u_[i].cls == cls) ++i;
    return i;
  }

  const std::vector<unit>& u_;
};

}  // namespace

pre_tokenizer pre_tokenizer::from_name(std::string_view name) {
  if (name == "smollm") return pre_tokenizer(true);
  if (name == "default" || name == "gpt2") return pre_tokenizer(false);
  throw std::runtime_error("tokenizer.ggml.pre is '" + std::string(name) +
                           "', which tireless does not support; supported values are "
                           "'smollm', 'default' and 'gpt2'");
}

void pre_tokenizer::split(std::string_view text, std::vector<std::string_view>& words) const {
  const std::vector<unit> units = units_of(text);
  const gpt2_matcher matcher(units);
  auto offset = [&](size_t i) { return i < units.size() ? units[i].offset : text.size(); };
  auto split_piece = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end;) {
      const size_t j = matcher.match(i, end);
      words.push_back(text.substr(offset(i), offset(j) - offset(i)));
      i = j;
    }
  };
  if (!split_digits_) {
    split_piece(0, units.size());
    return;
  }
  size_t begin = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    if (units[i].cls != char_class::number) continue;
    split_piece(begin, i);
    split_piece(i, i + 1);
    begin = i + 1;
  }
  split_piece(begin, units.size());
}

}  // namespace tireless
