#pragma once
// tireless, embedded: start a runtime from a configuration, submit requests, get tokens and
// exactly one outcome per request. No CAF types here; callbacks run on the runtime's threads
// and must return quickly (hand work to your own threads if it is slow).
//
//   auto rt = tireless::runtime::start(tireless::load_config("config/tireless.toml"));
//   tireless::request r;
//   r.api_key = "sk-premium-demo";
//   r.messages = {{"user", "Name three primary colors."}};
//   tireless::outcome o = rt->generate(r).get();

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "config/runtime_config.hpp"
#include "tireless/outcome.hpp"

namespace tireless {

struct message {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct sampling_options {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: all tokens
  float top_p = 1.0f;        // (0, 1]
  uint64_t seed = 0;
  float min_p = 0.0f;        // [0, 1]: drop tokens less likely than min_p x the most likely one's
  // OpenAI's, over the generated tokens: logit -= presence (once seen) + frequency x count.
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;  // [-2, 2]
  // vLLM's and llama.cpp's, over prompt and generated tokens: a seen token's logit is divided
  // by it (multiplied when negative); 1: off.
  float repetition_penalty = 1.0f;
  // -1: none; n in [0, max_top_logprobs]: each token's log-probability and the n most likely
  // tokens' at its position (token_event::logprobs, outcome::logprobs).
  int32_t logprobs = -1;
};

inline constexpr int32_t max_top_logprobs = 20;  // OpenAI's limit

struct request {
  std::string api_key;                 // a tenant's key; ignored when the config has no tenants
  std::vector<message> messages;       // a chat, formatted with the model's template; or
  std::string prompt;                  // raw text; or
  std::vector<int32_t> prompt_tokens;  // token ids (the only form the sim backend takes)
  // Raw prompt only: control token texts in it ("<|im_start|>") become control tokens.
  // Otherwise every text a client sends, message contents always, is tokenized as plain text.
  bool parse_special = false;
  sampling_options sampling;
  int32_t max_tokens = 0;              // 0: the configured default
  std::vector<std::string> stop;       // stop sequences (not included in the text)
  std::chrono::milliseconds timeout{0};  // from submission; 0: none
  int32_t token_window = 0;            // tokens sent ahead of the consumer; 0: no flow control
  // With a window: false, a token counts as taken once on_token returns; true, only when the
  // host calls runtime::acknowledge (a server acknowledges what its client has received).
  bool manual_ack = false;
  // A retry of a request refused for load: the retry_token of that refusal's outcome. Back at
  // or after its retry_after_ms, it holds the room reserved for it (it is not shed).
  uint64_t retry_token = 0;
};

struct token_event {
  uint64_t request_id = 0;
  std::string text;             // complete UTF-8 characters only
  std::vector<int32_t> tokens;
  std::vector<token_logprob> logprobs;  // one per token when the request asked for them
};

struct runtime_stats {
  int32_t running = 0, waiting_in_engine = 0, queued_in_admission = 0, live_requests = 0;
  int32_t kv_blocks_total = 0, kv_blocks_free = 0, kv_blocks_cached_free = 0, kv_blocks_used = 0;
  int64_t prefix_hit_blocks = 0, prefix_miss_blocks = 0, evictions = 0;
  int64_t steps = 0, shard_restarts = 0;
  // Every step's work so far: prompt tokens prefilled, tokens decoded, seconds; and how many
  // steps took at most each of the config's metrics.step_time_buckets_ms (sorted; the last
  // entry counts the longer ones).
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double step_seconds = 0;
  std::vector<int64_t> step_time_counts;
  int64_t completed = 0, rejected = 0, cancelled = 0, failed = 0;
  // Of the rejected: admitted, then refused before starting (they could no longer start within
  // their tier's bound, start_within_ms). Rare when admission predicts well.
  int64_t late_refusals = 0;
  // Requests waiting in admission, per tier (name, count), highest priority first.
  std::vector<std::pair<std::string, int32_t>> queued_by_tier;
  // Admitted requests with a timeout that have not ended: admission holds their sessions to
  // tell them when it passes (0 once every request ended).
  int32_t timed_sessions = 0;
  // The largest mailbox each actor saw, sampled by the actor itself.
  int64_t max_mailbox_engine = 0, max_mailbox_admission = 0, max_mailbox_kv_manager = 0;
  // Requests inside the runtime at most (the door): what bounds every actor's mailbox.
  int64_t door_capacity = 0;
  // Why nothing can be served ("" while it can): the model shard crashed more often than
  // backend.max_shard_restarts allows. Every request then fails at once; restart the process.
  std::string backend_problem;
  // MoE experts on expert shards (backend.expert_shards or expert_shard_addresses); shards == 0
  // otherwise. Totals since start.
  struct experts_stats {
    int32_t shards = 0, live = 0, fenced = 0;
    int64_t calls = 0, tokens = 0, bytes_out = 0, bytes_in = 0;
    int64_t failures = 0, revivals = 0, rebalances = 0, replicas = 0;
    double dispatch_seconds = 0, last_recovery_seconds = 0;
    double shard_imbalance = 1;  // max/mean pairs per shard, per layer, since the last rebalance
    std::vector<int64_t> pairs_per_shard;
    std::vector<int64_t> pairs_per_expert;  // summed over layers
  } experts;
};

class runtime {
 public:
  // Loads the model, creates the backend and starts the actors. Throws std::runtime_error
  // with a message that says what is wrong (model file, config) and what to do.
  static std::unique_ptr<runtime> start(const runtime_config& config);
  ~runtime();  // shutdown(config grace), if not done yet
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  using token_callback = std::function<void(const token_event&)>;
  using outcome_callback = std::function<void(const outcome&)>;

  // Every submitted request gets exactly one on_outcome call (maybe before submit returns,
  // for an immediate refusal). Returns the request's id.
  uint64_t submit(request r, token_callback on_token, outcome_callback on_outcome);
  std::future<outcome> generate(request r);
  // Ends a request early (outcome: cancelled, client). false if it already ended.
  bool cancel(uint64_t request_id);
  // For requests with manual_ack: the consumer has taken n more tokens (opens the window).
  void acknowledge(uint64_t request_id, int32_t n);

  runtime_stats stats();  // blocks until the actors answered
  // The same without blocking: `done` runs on a runtime thread with the answer.
  void stats_async(std::function<void(const runtime_stats&)> done);
  std::string describe() const;
  // The longest prompt a request may have: tokens, and bytes of text (more bytes cannot fit
  // in that many tokens; such a text is refused, prompt_too_long, before any tokenizing;
  // 0: this backend takes token ids only).
  struct prompt_limit {
    int32_t tokens = 0;
    size_t text_bytes = 0;
  };
  prompt_limit max_prompt() const;
  // Stops accepting; lets requests finish for up to `grace`; cancels the rest (each gets
  // its outcome); stops the actors.
  void shutdown(std::chrono::milliseconds grace);

 private:
  struct impl;
  explicit runtime(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace tireless
