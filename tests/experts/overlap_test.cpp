// Experts on shards served over Cap'n Proto RPC (in this process, on unix sockets): a step
// split into two micro-batches in ping-pong gives the single-process logits bit for bit.
#include <gtest/gtest.h>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <thread>

#include "experts/expert_service.hpp"
#include "experts/rpc.hpp"
#include "gpu/cpu/cpu_backend.hpp"
#include "model/model.hpp"

namespace tireless {
namespace {

std::string tiny_moe() { return std::string(std::getenv("TIRELESS_TEST_DATA")) + "/tiny-moe.gguf"; }

// A shard server on its own thread and kj loop, as tireless-shard runs one.
class shard_thread {
 public:
  shard_thread(std::shared_ptr<const model> m, std::vector<int32_t> experts, std::string path) : path_(std::move(path)) {
    std::mutex mu;
    std::condition_variable cv;
    bool ready = false;
    thread_ = std::thread([&, m, experts] {
      auto io = kj::setupAsyncIo();
      auto service = std::make_shared<expert_service>(m, 1, 256, experts);
      capnp::TwoPartyServer server(make_expert_shard_server(service));
      auto listener = io.provider->getNetwork().parseAddress("unix:" + path_).wait(io.waitScope)->listen();
      auto pf = kj::newPromiseAndCrossThreadFulfiller<void>();
      {
        std::lock_guard lock(mu);  // notified under the lock: the waiter destroys cv once it sees ready
        stop_ = kj::mv(pf.fulfiller);
        ready = true;
        cv.notify_one();
      }
      server.listen(*listener).exclusiveJoin(kj::mv(pf.promise)).wait(io.waitScope);
    });
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return ready; });
  }
  ~shard_thread() {
    stop_->fulfill();
    thread_.join();
    std::filesystem::remove(path_);
  }
  std::string address() const { return "unix:" + path_; }

 private:
  std::string path_;
  std::thread thread_;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_;
};

// Three sequences: prompts of 5, 7 and 3 tokens prefilled in one step, then 8 decode steps of
// all three; the logits of every step, in order.
std::vector<float> run_three(backend& b) {
  const int32_t per_seq = b.kv().n_blocks / 3;
  step_batch batch;
  batch.seqs.resize(3);
  std::vector<std::vector<token_id>> tokens(3);
  std::vector<std::vector<int32_t>> tables(3, std::vector<int32_t>(static_cast<size_t>(per_seq)));
  const int lens[] = {5, 7, 3};
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < lens[s] + 8; ++i) tokens[s].push_back(11 + (s * 53 + i * 37) % 240);
    auto& q = batch.seqs[s];
    q.seq_id = s;
    std::iota(tables[s].begin(), tables[s].end(), s * per_seq);
    q.block_table = tables[s];
    q.want_logits = true;
  }
  step_result result;
  std::vector<float> all;
  for (int step = 0; step <= 8; ++step) {
    for (int s = 0; s < 3; ++s) {
      auto& q = batch.seqs[s];
      q.start_pos = step == 0 ? 0 : lens[s] + step - 1;
      q.tokens = std::span<const token_id>(tokens[s].data() + q.start_pos, step == 0 ? lens[s] : 1);
    }
    b.execute(batch, result);
    all.insert(all.end(), result.logits.begin(), result.logits.end());
  }
  return all;
}

TEST(expert_overlap, two_micro_batches_in_ping_pong_give_the_single_process_logits_bit_for_bit) {
  if (!std::getenv("TIRELESS_TEST_DATA") || !std::filesystem::exists(tiny_moe())) GTEST_SKIP() << "no tiny-moe.gguf";
  auto lm = model::load(tiny_moe());
  ASSERT_TRUE(lm->config().is_moe());
  cpu::cpu_backend_options opt;
  opt.threads = 1;
  opt.max_context = 48;
  opt.kv_blocks = 3 * 3;
  opt.block_size = 16;
  auto local = cpu::make_cpu_backend(lm, opt);
  const std::vector<float> want = run_three(*local);
  const auto dir = std::filesystem::temp_directory_path() / ("tireless-overlap-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  shard_thread a(lm, {0, 2}, (dir / "a").string()), b(lm, {1, 3}, (dir / "b").string());
  for (bool overlap : {false, true}) {
    auto experts = make_rpc_expert_exchange(lm, {a.address(), b.address()}, std::chrono::seconds(5), {});
    cpu::cpu_backend_options o = opt;
    o.experts = experts.get();
    o.overlap = overlap;
    auto sharded = cpu::make_cpu_backend(lm, o);
    const std::vector<float> got = run_three(*sharded);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "overlap " << overlap;
    const expert_exchange_stats st = experts->stats();
    const int64_t layers = lm->config().n_layer, steps = 9;
    // with overlap, each layer of each step is two calls (one per micro-batch), all overlapped
    EXPECT_EQ(st.calls, steps * layers * (overlap ? 2 : 1));
    EXPECT_EQ(st.overlapped_calls, overlap ? st.calls : 0);
    int64_t pairs = 0;
    for (int64_t n : st.per_shard_pairs) pairs += n;
    EXPECT_EQ(pairs, (5 + 7 + 3 + 3 * 8) * lm->config().n_expert_used * layers);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tireless
