// tireless-logits MODEL.gguf --tokens 1,2,3 --out FILE [--mode decode|prefill] [--chunk N]
//
// Writes float32 logits [n][n_vocab] for a token sequence: with --mode decode, the logits
// after every position, feeding one token per step; with --mode prefill, the last
// position's logits after prefilling the whole sequence in chunks of --chunk tokens.
// tests/reference/check_logits.py compares them with the numpy reference.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>

#include "gpu/cpu/cpu_backend.hpp"
#include "model/model.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Dump logits of a token sequence"};
  std::string model_path, out_path, mode = "decode", isa_name;
  std::vector<int32_t> tokens;
  int chunk = 512, threads = 2;
  app.add_option("model", model_path)->required();
  app.add_option("--tokens", tokens)->delimiter(',')->required();
  app.add_option("--out", out_path)->required();
  app.add_option("--mode", mode)->check(CLI::IsMember({"decode", "prefill"}));
  app.add_option("--chunk", chunk);
  app.add_option("--threads", threads);
  app.add_option("--isa", isa_name, "generic, avx2 or avx512");
  CLI11_PARSE(app, argc, argv);
  try {
    auto m = tireless::model::load(model_path);
    tireless::cpu::cpu_backend_options opt;
    opt.threads = threads;
    opt.max_context = static_cast<int32_t>(tokens.size()) + 16;
    opt.max_step_tokens = std::max(chunk, 1);
    for (auto i : {tireless::cpu::isa::generic, tireless::cpu::isa::avx2, tireless::cpu::isa::avx512}) {
      if (tireless::cpu::name(i) == isa_name) opt.kernels = i;
    }
    auto b = tireless::cpu::make_cpu_backend(m, opt);
    std::vector<int32_t> blocks(b->kv().n_blocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::vector<float> out;
    tireless::step_batch batch;
    batch.seqs.resize(1);
    tireless::step_result result;
    auto& s = batch.seqs[0];
    s.block_table = blocks;
    const size_t step = mode == "decode" ? 1 : static_cast<size_t>(chunk);
    for (size_t p = 0; p < tokens.size(); p += step) {
      const size_t n = std::min(step, tokens.size() - p);
      s.tokens = std::span<const int32_t>(tokens.data() + p, n);
      s.start_pos = static_cast<int32_t>(p);
      s.want_logits = mode == "decode" || p + n == tokens.size();
      b->execute(batch, result);
      out.insert(out.end(), result.logits.begin(), result.logits.end());
    }
    std::ofstream f(out_path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size() * sizeof(float)));
    std::printf("%zu x %d logits written\n", out.size() / m->config().n_vocab, m->config().n_vocab);
  } catch (const std::exception& e) {
    std::cerr << "tireless-logits: " << e.what() << "\n";
    return 1;
  }
}
