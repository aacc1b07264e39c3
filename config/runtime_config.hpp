#pragma once
// The runtime's configuration: one TOML file, read and validated once at start. Every size,
// limit and SLO of the runtime comes from here; main() hands each part its section.
// Plain values: no TOML types leave config/. config/tireless.toml documents every key.
//
// The defaults suit one small machine serving SmolLM2-135M on the CPU backend, and follow
// vLLM / Ray Serve conventions where those exist (block size 16, prefix caching on, a 1% KV
// watermark, one request = one sequence).

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tireless {

// Everything wrong with a configuration, one problem a line, each naming the file, the line
// and column, the key path ("tiers[1].ttft_ms"), what is wrong and what is allowed.
class config_error : public std::runtime_error {
 public:
  explicit config_error(std::vector<std::string> problems);
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

enum class log_level { trace, debug, info, warn, error, off };
// automatic ("auto"): cuda where a CUDA device can be used, else cpu.
enum class backend_kind { cpu, sim, cuda, automatic };
enum class admission_policy {
  fcfs,      // arrival order across tiers; bounded queues only
  priority,  // strict tier priority, arrival order inside a tier
  tireless,  // tier priority, fair shares between tenants, predicted-TTFT early rejection,
             // degradation ladders
  least_slack,  // a peer without admission control: every request admitted, deadlines by
                // tier, released and prefilled by least slack across tiers, nothing shed
};
enum class degrade_action { cap_max_tokens, cap_prompt_tokens, shed };

std::string_view to_string(log_level level);
std::string_view to_string(backend_kind kind);
std::string_view to_string(admission_policy policy);
std::string_view to_string(degrade_action action);

// Where scripts/fetch-model puts the real default model.
inline constexpr std::string_view default_model_path =
    "~/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf";

struct server_settings {
  // Cap'n Proto RPC: "host:port" or "unix:/path"; port 0 = any free port; "" = off (embedded).
  std::string listen = "127.0.0.1:7433";
  std::string http_listen;     // OpenAI-style HTTP gateway, "host:port"; "" = off
  std::string metrics_listen;  // Prometheus /metrics, "host:port"; "" = off
  tireless::log_level log_level = tireless::log_level::info;
  std::chrono::milliseconds shutdown_grace{10'000};  // running requests get this long to finish
  int32_t max_connections = 256;                     // client connections per listener (RPC, HTTP)
  int32_t max_connections_per_peer = 64;             // from one address (unix sockets: not limited)
  // A connection with no call for this long and no request of its own running is closed; when
  // the server is full, the longest-idle connection makes room for a new one.
  std::chrono::milliseconds idle_timeout{120'000};
  // A connection that sends nothing this long after connecting is closed.
  std::chrono::milliseconds handshake_timeout{10'000};
  // An HTTP connection idle this long between two requests is closed (keep-alive, as uvicorn's
  // --timeout-keep-alive). A proxy that keeps connections to the gateway open must let them go
  // sooner, or a request it writes onto one the gateway is closing fails (deploy/nginx).
  std::chrono::milliseconds http_keep_alive{5'000};
};

struct session_settings {
  // Tokens buffered for a client that reads slower than the model writes, before the engine is
  // asked to pause the sequence (64: a few seconds of a stream at typical speeds).
  int32_t stream_buffer_tokens = 64;
  // A request's deadline when its client gives none; a client may ask for less, never more.
  std::chrono::milliseconds request_timeout{300'000};
};

struct model_settings {
  std::filesystem::path path;  // "~/" expanded; relative to the config file's folder (load_config)
  std::string name = "smollm2";  // the model name clients ask for
};

struct backend_settings {
  backend_kind kind = backend_kind::cpu;
  int32_t threads = 0;                      // CPU threads; 0 = all cores
  // kind = "cuda" (or "auto" on a GPU): the CUDA devices, rank order; empty = [0]. Several: a
  // mixture-of-experts model's experts spread over them (NCCL).
  std::vector<int32_t> cuda_devices;
  std::string sim_profile = "cpu-smollm2";  // the sim backend's cost model (kind = sim)
  int32_t max_context = 0;                  // tokens per sequence; 0 = the model's
  bool real_time = true;                    // sim: steps take real time (false: a virtual clock)
  // MoE models: expert shard actors the experts are spread over (round robin); 0 = the
  // experts run inside the attention shard.
  int32_t expert_shards = 0;
  // Or: tireless-shard processes, one address each ("host:port", "unix:/path"); the experts
  // each holds come from its own command line.
  std::vector<std::string> expert_shard_addresses;
  // Activations on the wire: f32 (exact), f16 or int8 (a scale per row).
  enum class wire_activations { f32, f16, int8 } expert_activations = wire_activations::f32;
  // Shard processes only: split a step of several sequences into two micro-batches, one's
  // attention here while the other's experts run (ping-pong).
  bool expert_overlap = false;
  // Sim only ([backend.expert_parallel]): the expert-parallel group the simulated device is
  // one of; each key given overrides the profile's (h200-k2 has one, cpu-smollm2 none).
  struct expert_parallel_overrides {
    std::optional<int32_t> degree, moe_layers, hidden;
    std::optional<double> remote_copies, dispatch_bytes, combine_bytes, link_gbytes_per_s, link_latency_us,
        expert_share;
    std::optional<bool> overlap;
  } expert_parallel;
  int32_t expert_replicas_per_shard = 0;     // hot-expert replicas each shard may take, per layer
  int64_t expert_rebalance_every_steps = 0;  // how often replicas follow the load; 0: never
  std::chrono::milliseconds expert_call_timeout{30'000};  // one call to a shard process
  // A crashed shard is restarted (and its step re-run) at most this many times within
  // shard_restart_window; one more crash in the window and it stays down.
  int32_t max_shard_restarts = 5;
  std::chrono::milliseconds shard_restart_window{60'000};
};

// Faults injected on purpose, for tests, the load driver and soaks (scripts/soak). All off by
// default; a server with any of them on says so in its log.
struct fault_settings {
  double shard_crash_per_step = 0.0;  // a step crashes its shard after the backend ran it
  int64_t shard_crash_every_steps = 0;  // and every Nth step of a shard does (a schedule that does not move); 0: none
  double shard_slow_per_step = 0.0;   // a slow spell of the shard begins at a step
  std::chrono::milliseconds shard_slow{1'000};  // a slow spell's length (key shard_slow_ms)
  double shard_slow_factor = 4.0;     // a step in a slow spell takes this many times as long
  int64_t seed = 1;
  // Sim only ([[faults.expert_group]]): the expert-parallel group's conditions over time, in
  // seconds since start: devices down (their experts' load on the rest), a hot expert.
  struct expert_group_event {
    double at_s = 0, for_s = 0;  // for_s 0: to the end
    int32_t down = 0;
    double imbalance = 1.0;      // max/mean routed tokens per device
    double stall_ms = 0;         // once, at the first step from at_s (detection and re-run)
  };
  std::vector<expert_group_event> expert_group;
  bool any() const {
    return shard_crash_per_step > 0 || shard_crash_every_steps > 0 || shard_slow_per_step > 0 || !expert_group.empty();
  }
};

struct kv_settings {
  int32_t block_size = 16;  // tokens per block: 8, 16, 32 or 64
  int32_t blocks = 0;       // 0 = as many as memory_mb holds (CUDA without memory_mb: the device's)
  int64_t memory_mb = 256;  // MiB of KV, used when blocks = 0 (SmolLM2: ~11.6k tokens)
  bool memory_mb_given = false;  // memory_mb is in the file (not the default)
  bool prefix_caching = true;
  double watermark = 0.01;  // fraction of blocks kept free for running sequences to grow
};

struct engine_settings {
  int32_t max_step_tokens = 512;  // tokens per step (prefill chunks + one per decoding sequence)
  int32_t max_step_seqs = 64;     // sequences per step
  int32_t max_preemptions = 3;    // per request; after that it is preempted only as a last resort
  // 0 = the tightest tier's tpot (runtime_config::step_time_target()).
  std::chrono::milliseconds step_time_target{0};
};

struct admission_settings {
  admission_policy policy = admission_policy::tireless;
  int32_t max_prompt_tokens = 0;     // 0 = the context length minus 1
  int32_t default_max_tokens = 256;  // when a request gives none
  // Nothing waits longer in a queue: it is rejected with the reason and a retry hint.
  std::chrono::milliseconds max_queue_wait{60'000};
  // The moving-average window of the measured drain rates behind the TTFT prediction.
  std::chrono::milliseconds pressure_window{2'000};
};

// One rung of a tier's degradation ladder. Pressure is admission's load signal for the tier:
// the predicted time to first token as a fraction of the tier's ttft target (0 idle, 1 the
// target just met, above 1 missed).
struct degrade_step {
  double pressure = 0;
  degrade_action action = degrade_action::cap_max_tokens;
  int32_t limit = 0;  // tokens: the max_tokens cap or the longest prompt accepted; 0 for shed
};

// What a ladder applies at one pressure: every rung at or below it, cumulatively.
struct degradation {
  std::optional<int32_t> max_tokens;         // cap on a request's max_tokens
  std::optional<int32_t> max_prompt_tokens;  // longer prompts are refused, with a hint to split
  bool shed = false;                         // new requests of the tier are refused
  bool any() const { return max_tokens || max_prompt_tokens || shed; }
};

struct tier_settings {
  std::string name;
  int32_t priority = 0;               // higher is more important; unique
  std::chrono::milliseconds ttft{0};  // time-to-first-token target (key ttft_ms)
  std::chrono::milliseconds tpot{0};  // time-per-output-token target (key tpot_ms)
  int32_t queue_bound = 256;          // waiting requests; one more is rejected with retry_after
  bool sheddable = true;              // may be refused early when its TTFT target would be missed
  // An admitted, sheddable request not started by arrival + this is refused before any
  // prefill is spent on it (policy tireless; key start_within_ms; 0: twice ttft).
  std::chrono::milliseconds start_within{0};
  std::chrono::milliseconds start_bound() const { return start_within.count() > 0 ? start_within : 2 * ttft; }
  std::vector<degrade_step> degrade;  // pressures strictly increasing

  degradation degradation_at(double pressure) const;
};

struct tenant_settings {
  std::string name;
  std::vector<std::string> keys;    // API keys; unique across tenants
  std::string tier;                 // names a tier
  double weight = 1.0;              // fair share among the tier's tenants
  int32_t requests_per_minute = 0;  // 0 = unlimited
  // Prompt + max_tokens reserved at admission, refunded when a request ends early.
  int64_t tokens_per_minute = 0;  // 0 = unlimited
  int32_t max_concurrent = 0;     // requests in flight (queued or running); 0 = unlimited
};

struct metrics_settings {
  std::string prefix = "tireless";  // metric names start with it
  bool per_tenant = true;           // label counters by tenant (turn off with many tenants)
  // Histogram upper bounds, milliseconds.
  std::vector<double> ttft_buckets_ms{50,   100,  250,   500,   1000,  2000, 3000,
                                      5000, 8000, 10000, 15000, 30000, 60000};
  std::vector<double> tpot_buckets_ms{10, 25, 50, 75, 100, 150, 200, 300, 450, 600, 1000};
  std::vector<double> step_time_buckets_ms{5, 10, 25, 50, 100, 150, 250, 500, 1000, 2500};
};

struct runtime_config {
  std::string source;  // the file (or name) it was read from
  server_settings server;
  session_settings session;
  model_settings model;
  backend_settings backend;
  kv_settings kv;
  engine_settings engine;
  admission_settings admission;
  std::vector<tier_settings> tiers;  // at least one; highest priority first
  std::vector<tenant_settings> tenants;
  metrics_settings metrics;
  fault_settings faults;
  // Valid settings that have no effect (a sim_profile with kind = "cpu", ...), for the log.
  std::vector<std::string> warnings;

  const tier_settings* find_tier(std::string_view name) const;
  const tenant_settings* find_tenant(std::string_view name) const;
  // engine.step_time_target, or the tightest tier's tpot when that is 0.
  std::chrono::milliseconds step_time_target() const;
};

// Reads and validates a configuration file. Throws config_error listing every problem found
// (an unreadable file is one problem).
runtime_config load_config(const std::filesystem::path& file);

// The same for text already in memory; source_name names it in messages. Relative paths in
// it stay relative to the working directory.
runtime_config parse_config(std::string_view toml_text, std::string_view source_name);

// The keys of a [faults] table, as TOML text without the header ("shard_crash_per_step =
// 0.001"), checked as the config checks them: tireless-load --fault. Throws config_error.
fault_settings parse_faults(std::string_view toml_text, std::string_view source_name);

}  // namespace tireless
