#include "model/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <unordered_map>

#include "model/gguf_file.hpp"
#include "model/pre_tokenizer.hpp"
#include "model/unicode.hpp"

namespace tireless {

namespace {

constexpr int32_t type_control = 3;
constexpr int32_t type_user_defined = 4;

// GPT-2's byte-to-unicode table: printable bytes stand for themselves, the others for
// U+0100 upwards, in byte order.
std::array<char32_t, 256> byte_to_unicode() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

// The bytes a piece in byte-to-unicode form stands for; nullopt when it is not in that form.
std::optional<std::string> piece_bytes(std::string_view piece,
                                       const std::unordered_map<char32_t, uint8_t>& to_byte) {
  std::string bytes;
  for (size_t pos = 0; pos < piece.size();) {
    const utf8_step s = utf8_decode(piece, pos);
    if (s.kind != utf8_step::valid) return std::nullopt;
    const auto it = to_byte.find(s.cp);
    if (it == to_byte.end()) return std::nullopt;
    bytes += static_cast<char>(it->second);
    pos += s.length;
  }
  return bytes;
}

uint64_t pair_key(token_id left, token_id right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
         static_cast<uint32_t>(right);
}

struct merge_rule {
  int32_t rank;
  token_id result;
};

struct special_token {
  std::string text;
  token_id id;
};

// Scratch space of one encode() call, reused from word to word.
struct bpe_workspace {
  struct symbol {
    token_id id;  // -1 once merged into its left neighbour
    int32_t prev, next;
  };
  struct candidate {
    int32_t rank;
    int32_t pos;  // of the left symbol
    token_id result;
  };
  std::vector<symbol> symbols;
  std::vector<candidate> heap;
  std::vector<std::string_view> words;
};

// Max-heap order that pops the lowest rank first, and of equal ranks the leftmost.
bool pops_later(const bpe_workspace::candidate& a, const bpe_workspace::candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

}  // namespace

struct tokenizer::impl {
  pre_tokenizer pre;
  std::vector<std::string> bytes;  // [vocab] what each token stands for
  std::vector<int32_t> types;      // [vocab]
  std::unordered_map<std::string, token_id> by_piece;
  std::array<token_id, 256> byte_token{};  // -1 where the vocabulary has no token for a byte
  std::unordered_map<uint64_t, merge_rule> merges;
  std::vector<special_token> specials;  // longest first
  std::array<bool, 256> special_starts{};
  std::optional<token_id> bos, eos;
  size_t max_token_bytes = 1;

  explicit impl(pre_tokenizer p) : pre(p) {}

  // Fills bytes, types, by_piece, specials and byte_token. types.size() == tokens.size().
  void load_tokens(const std::vector<std::string>& tokens, std::vector<int32_t> token_types) {
    const std::array<char32_t, 256> to_unicode = byte_to_unicode();
    std::unordered_map<char32_t, uint8_t> to_byte;
    for (int b = 0; b < 256; ++b) to_byte.emplace(to_unicode[b], static_cast<uint8_t>(b));

    types = std::move(token_types);
    bytes.resize(tokens.size());
    by_piece.reserve(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto id = static_cast<token_id>(i);
      const std::string& piece = tokens[i];
      by_piece.emplace(piece, id);
      const bool special = types[i] == type_control || types[i] == type_user_defined;
      std::optional<std::string> decoded;
      if (!special) decoded = piece_bytes(piece, to_byte);
      bytes[i] = decoded ? std::move(*decoded) : piece;  // specials and odd pieces: as written
      if (special && !piece.empty()) specials.push_back({piece, id});
      max_token_bytes = std::max(max_token_bytes, bytes[i].size());
    }
    std::stable_sort(specials.begin(), specials.end(),
                     [](const auto& a, const auto& b) { return a.text.size() > b.text.size(); });
    for (const special_token& s : specials) special_starts[static_cast<uint8_t>(s.text[0])] = true;

    for (int b = 0; b < 256; ++b) {
      std::string piece;
      utf8_append(piece, to_unicode[b]);
      const auto it = by_piece.find(piece);
      byte_token[b] = it == by_piece.end() ? -1 : it->second;
    }
  }

  // Fills merges from "left right" entries, highest priority first. Needs by_piece.
  void load_merges(const std::vector<std::string>& entries) {
    merges.reserve(entries.size());
    for (size_t rank = 0; rank < entries.size(); ++rank) {
      const std::string& merge = entries[rank];
      const size_t space = merge.find(' ', 1);
      auto bad = [&](std::string_view why) {
        return std::runtime_error(
            fmt::format("tokenizer.ggml.merges[{}] ('{}') {}", rank, merge, why));
      };
      if (space == std::string::npos) throw bad("is not of the form 'left right'");
      const std::string left = merge.substr(0, space), right = merge.substr(space + 1);
      const auto l = by_piece.find(left), r = by_piece.find(right);
      const auto m = by_piece.find(left + right);
      if (l == by_piece.end() || r == by_piece.end() || m == by_piece.end()) {
        throw bad("names a piece that is not in tokenizer.ggml.tokens");
      }
      merges.emplace(pair_key(l->second, r->second),
                     merge_rule{static_cast<int32_t>(rank), m->second});
    }
  }

  const merge_rule* find_merge(token_id left, token_id right) const {
    const auto it = merges.find(pair_key(left, right));
    return it == merges.end() ? nullptr : &it->second;
  }

  // The longest special token that starts at text[pos].
  const special_token* special_at(std::string_view text, size_t pos) const {
    if (!special_starts[static_cast<uint8_t>(text[pos])]) return nullptr;
    for (const special_token& s : specials) {
      if (text.compare(pos, s.text.size(), s.text) == 0) return &s;
    }
    return nullptr;
  }

  // false when it stopped because out.size() > max_tokens.
  bool encode_plain(std::string_view text, bpe_workspace& ws, std::vector<token_id>& out,
                    size_t max_tokens = SIZE_MAX) const {
    ws.words.clear();
    pre.split(text, ws.words);
    for (std::string_view word : ws.words) {
      if (out.size() > max_tokens) return false;
      bpe(word, ws, out);
    }
    return out.size() <= max_tokens;
  }

  // Byte-level BPE of one word, merging the lowest-ranked adjacent pair first (leftmost on
  // ties), exactly as Hugging Face's BPE model does. Bytes without a token are dropped.
  void bpe(std::string_view word, bpe_workspace& ws, std::vector<token_id>& out) const {
    auto& syms = ws.symbols;
    syms.clear();
    for (char c : word) {
      const token_id id = byte_token[static_cast<uint8_t>(c)];
      if (id < 0) continue;
      const auto n = static_cast<int32_t>(syms.size());
      syms.push_back({id, n - 1, n + 1});
    }
    if (syms.empty()) return;
    syms.back().next = -1;

    auto& heap = ws.heap;
    heap.clear();
    auto push = [&](int32_t left) {
      const int32_t right = syms[left].next;
      if (const merge_rule* m = find_merge(syms[left].id, syms[right].id)) {
        heap.push_back({m->rank, left, m->result});
        std::push_heap(heap.begin(), heap.end(), pops_later);
      }
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);

    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), pops_later);
      const bpe_workspace::candidate top = heap.back();
      heap.pop_back();
      auto& left = syms[top.pos];
      if (left.id < 0 || left.next < 0) continue;
      auto& right = syms[left.next];
      const merge_rule* m = find_merge(left.id, right.id);
      if (m == nullptr || m->result != top.result) continue;  // stale candidate
      left.id = top.result;
      left.next = right.next;
      right.id = -1;
      if (left.next >= 0) syms[left.next].prev = top.pos;
      if (left.prev >= 0) push(left.prev);
      if (left.next >= 0) push(top.pos);
    }
    for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
  }
};

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

namespace {

void check_id(const std::optional<token_id>& id, std::string_view key, size_t n_tokens) {
  if (id && (*id < 0 || static_cast<size_t>(*id) >= n_tokens)) {
    throw std::runtime_error(fmt::format(
        "{} is {} but the vocabulary has {} tokens; the model file is inconsistent", key, *id,
        n_tokens));
  }
}

}  // namespace

tokenizer tokenizer::from_vocab(vocab_data vocab) {
  if (vocab.model != "gpt2") {
    throw std::runtime_error(fmt::format(
        "tokenizer.ggml.model is '{}'; tireless supports only 'gpt2' (byte-level BPE)",
        vocab.model));
  }
  auto p = std::make_unique<impl>(pre_tokenizer::from_name(vocab.pre));
  const size_t n = vocab.tokens.size();
  if (n == 0) throw std::runtime_error("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    throw std::runtime_error("tokenizer.ggml.tokens has more entries than token ids can number");
  }
  if (vocab.token_types.empty()) vocab.token_types.assign(n, 1);
  if (vocab.token_types.size() != n) {
    throw std::runtime_error(fmt::format(
        "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
        vocab.token_types.size(), n));
  }
  check_id(vocab.bos, "tokenizer.ggml.bos_token_id", n);
  check_id(vocab.eos, "tokenizer.ggml.eos_token_id", n);

  p->load_tokens(vocab.tokens, std::move(vocab.token_types));
  p->load_merges(vocab.merges);
  p->bos = vocab.bos;
  p->eos = vocab.eos;
  return tokenizer(std::move(p));
}

tokenizer tokenizer::from_gguf(const gguf_file& file) {
  auto require = [&](std::string_view key) {
    if (!file.has(key)) {
      throw std::runtime_error(fmt::format("{} is missing from {}; the tokenizer cannot be built",
                                           key, file.path().string()));
    }
  };
  vocab_data v;
  require("tokenizer.ggml.model");
  v.model = file.get_string("tokenizer.ggml.model");
  v.pre = file.find_string("tokenizer.ggml.pre").value_or("default");
  require("tokenizer.ggml.tokens");
  v.tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (file.has("tokenizer.ggml.token_type")) {
    v.token_types = file.get_i32_array("tokenizer.ggml.token_type");
  }
  require("tokenizer.ggml.merges");
  v.merges = file.get_string_array("tokenizer.ggml.merges");
  auto id = [&](std::string_view key) -> std::optional<token_id> {
    const std::optional<uint32_t> value = file.find_u32(key);
    if (!value) return std::nullopt;
    return static_cast<token_id>(std::min<uint32_t>(*value, INT32_MAX));
  };
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.eot = id("tokenizer.ggml.eot_token_id");
  v.pad = id("tokenizer.ggml.padding_token_id");
  try {
    return from_vocab(std::move(v));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("{}: {}", file.path().string(), e.what()));
  }
}

std::vector<token_id> tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<token_id> out;
  out.reserve(text.size() / 3 + 1);
  encode_into(out, text, parse_special);
  return out;
}

bool tokenizer::encode_into(std::vector<token_id>& out, std::string_view text, bool parse_special,
                            size_t max_tokens) const {
  bpe_workspace ws;
  if (!parse_special || impl_->specials.empty()) return impl_->encode_plain(text, ws, out, max_tokens);
  size_t start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const special_token* s = impl_->special_at(text, pos);
    if (s == nullptr) {
      ++pos;
      continue;
    }
    if (!impl_->encode_plain(text.substr(start, pos - start), ws, out, max_tokens)) return false;
    out.push_back(s->id);
    pos += s->text.size();
    start = pos;
  }
  return impl_->encode_plain(text.substr(start), ws, out, max_tokens);
}

size_t tokenizer::max_token_bytes() const { return impl_->max_token_bytes; }

std::string_view tokenizer::token_bytes(token_id id) const {
  if (id < 0 || id >= vocab_size()) {
    throw std::out_of_range(fmt::format("token id {} is outside the vocabulary (0..{})", id,
                                        vocab_size() - 1));
  }
  return impl_->bytes[id];
}

std::string tokenizer::decode(std::span<const token_id> ids) const {
  std::string text;
  for (token_id id : ids) text += token_bytes(id);
  return text;
}

std::optional<token_id> tokenizer::find(std::string_view piece) const {
  const auto it = impl_->by_piece.find(std::string(piece));
  if (it == impl_->by_piece.end()) return std::nullopt;
  return it->second;
}

int32_t tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->bytes.size()); }

bool tokenizer::is_special(token_id id) const {
  if (id < 0 || id >= vocab_size()) return false;
  return impl_->types[id] == type_control || impl_->types[id] == type_user_defined;
}

std::optional<token_id> tokenizer::bos() const { return impl_->bos; }
std::optional<token_id> tokenizer::eos() const { return impl_->eos; }

std::string stream_decoder::push(token_id id) {
  pending_ += tok_->token_bytes(id);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const utf8_step s = utf8_decode(pending_, pos);
    if (s.kind == utf8_step::incomplete) break;
    if (s.kind == utf8_step::valid) {
      out.append(pending_, pos, s.length);
    } else {
      utf8_append(out, U'\uFFFD');
    }
    pos += s.length;
  }
  pending_.erase(0, pos);
  return out;
}

std::string stream_decoder::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace tireless
