#include "model/unicode.hpp"

#include <unicode/uchar.h>

namespace tireless {

namespace {

// Bytes a well-formed sequence that starts with `lead` needs in all, 0 for an impossible lead.
int sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// The allowed range of the byte right after `lead` (Unicode table 3-7); later ones are 80..BF.
bool second_byte_ok(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

}  // namespace

utf8_step utf8_decode(std::string_view text, size_t pos) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  const int n = sequence_length(lead);
  if (n == 1) return {utf8_step::valid, 1, lead};
  if (n == 0) return {utf8_step::invalid, 1, 0};
  char32_t cp = lead & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    if (pos + k >= text.size()) {
      return {utf8_step::incomplete, static_cast<uint8_t>(k), 0};
    }
    const auto b = static_cast<uint8_t>(text[pos + k]);
    const bool ok = k == 1 ? second_byte_ok(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {utf8_step::invalid, static_cast<uint8_t>(k), 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {utf8_step::valid, static_cast<uint8_t>(n), cp};
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_sanitize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const utf8_step s = utf8_decode(text, pos);
    if (s.kind == utf8_step::valid) {
      out.append(text.substr(pos, s.length));
    } else {
      utf8_append(out, U'\uFFFD');
    }
    pos += s.length;
  }
  return out;
}

char_class classify(char32_t cp) {
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return char_class::letter;
    if (cp >= '0' && cp <= '9') return char_class::number;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return char_class::space;
    return char_class::other;
  }
  const auto c = static_cast<UChar32>(cp);
  const uint32_t category = U_MASK(u_charType(c));
  if (category & U_GC_L_MASK) return char_class::letter;
  if (category & U_GC_N_MASK) return char_class::number;
  if (u_isUWhiteSpace(c)) return char_class::space;
  return char_class::other;
}

}  // namespace tireless
