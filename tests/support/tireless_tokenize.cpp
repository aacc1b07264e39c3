// tireless-tokenize MODEL.gguf [--no-special] [--bench]
//
// Reads records from stdin, each a decimal byte count, a newline and that many bytes of text,
// and prints one line per record: "1" or "0" (whether decode(encode(text)) == text), then the
// ids. With --bench it reads all of stdin as one text and prints how fast it encodes.
// tests/reference/tokenizer_reference.py drives it to compare tireless with Hugging Face.

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "model/gguf_file.hpp"
#include "model/tokenizer.hpp"

namespace {

bool read_record(std::istream& in, std::string& text) {
  size_t n = 0;
  if (!(in >> n)) return false;
  in.get();  // the newline after the count
  text.resize(n);
  return static_cast<bool>(in.read(text.data(), static_cast<std::streamsize>(n)));
}

void bench(const tireless::tokenizer& tok, const std::string& text, bool parse_special) {
  using clock = std::chrono::steady_clock;
  size_t n_tokens = 0;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = clock::now();
    n_tokens = tok.encode(text, parse_special).size();
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::printf("%zu bytes -> %zu tokens; best of 5: %.2f ms (%.1f MB/s)\n", text.size(), n_tokens,
              best * 1e3, text.size() / best / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokenizes text with a GGUF model's tokenizer"};
  std::string model;
  bool no_special = false, bench_mode = false;
  app.add_option("model", model, "GGUF model file")->required();
  app.add_flag("--no-special", no_special, "tokenize special-token texts as plain text");
  app.add_flag("--bench", bench_mode, "time encoding stdin as one text");
  CLI11_PARSE(app, argc, argv);

  try {
    const tireless::gguf_file file = tireless::gguf_file::open(model);
    const tireless::tokenizer tok = tireless::tokenizer::from_gguf(file);
    std::ios::sync_with_stdio(false);
    if (bench_mode) {
      const std::string text(std::istreambuf_iterator<char>(std::cin), {});
      bench(tok, text, !no_special);
      return 0;
    }
    std::string text, line;
    while (read_record(std::cin, text)) {
      const std::vector<tireless::token_id> ids = tok.encode(text, !no_special);
      line = tok.decode(ids) == text ? "1" : "0";
      for (tireless::token_id id : ids) line += ' ' + std::to_string(id);
      line += '\n';
      std::cout << line;
    }
    std::cout.flush();
  } catch (const std::exception& e) {
    std::cerr << "tireless-tokenize: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
