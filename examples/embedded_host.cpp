// A host program that embeds tireless: it starts the runtime from the shipped configuration
// and serves a few chats at once with the real model, printing each answer as it streams.
//
//   build/examples/embedded_host [config/tireless.toml]
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tireless/runtime.hpp"

int main(int argc, char** argv) {
  const std::string config_path = argc > 1 ? argv[1] : "config/tireless.toml";
  std::unique_ptr<tireless::runtime> rt;
  try {
    rt = tireless::runtime::start(tireless::load_config(config_path));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embedded_host: %s\n", e.what());
    return 1;
  }
  std::printf("runtime: %s\n", rt->describe().c_str());

  const std::vector<std::pair<std::string, std::string>> chats = {
      {"sk-premium-demo", "Name three primary colors."},
      {"sk-standard-demo", "Write one sentence about the sea."},
      {"sk-free-alice-demo", "What is 2 + 2?"},
      {"sk-free-bob-demo", "Give me a short tip for learning to cook."},
  };
  std::mutex out;
  std::map<uint64_t, std::string> streamed;
  std::vector<std::future<tireless::outcome>> answers;
  for (const auto& [key, question] : chats) {
    tireless::request r;
    r.api_key = key;
    r.messages = {{"user", question}};
    r.max_tokens = 64;
    auto done = std::make_shared<std::promise<tireless::outcome>>();
    answers.push_back(done->get_future());
    rt->submit(
        r,
        [&](const tireless::token_event& e) {  // runs on a runtime thread: be quick
          std::lock_guard lock(out);
          streamed[e.request_id] += e.text;
        },
        [done](const tireless::outcome& o) { done->set_value(o); });
  }
  for (size_t i = 0; i < answers.size(); ++i) {
    const tireless::outcome o = answers[i].get();
    std::printf("\n[%s] %s\n-> %s\n   (%s/%s, %d prompt + %d generated tokens, first token %.0f ms, total %.0f ms)\n",
                chats[i].first.c_str(), chats[i].second.c_str(), o.text.c_str(),
                o.kind == tireless::outcome_kind::completed ? "completed" : "not completed", o.reason.c_str(),
                o.prompt_tokens, o.completion_tokens, o.time_to_first_token_ms, o.total_ms);
  }
  const tireless::runtime_stats s = rt->stats();
  std::printf("\n%lld steps, %d KV blocks free of %d\n", static_cast<long long>(s.steps), s.kv_blocks_free,
              s.kv_blocks_total);
  rt->shutdown(std::chrono::seconds(5));
  return 0;
}
