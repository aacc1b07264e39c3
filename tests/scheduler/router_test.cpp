#include "scheduler/router.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace tireless {
namespace {

TEST(router, picks_the_least_busy_replica_that_would_take_the_request_in_time) {
  router r;
  std::vector<replica_view> v(3);
  for (auto& x : v) x.ttft_target_s = 0.5;
  v[0] = {.predicted_ttft_s = 0.3, .ttft_target_s = 0.5, .outstanding = 4};
  v[1] = {.predicted_ttft_s = 0.2, .ttft_target_s = 0.5, .outstanding = 2};
  v[2] = {.would_refuse = true, .predicted_ttft_s = 0.1, .ttft_target_s = 0.5, .outstanding = 0};  // another may fit it
  EXPECT_EQ(r.pick(v, 0), 1);
  v[1].up = false;
  EXPECT_EQ(r.pick(v, 0), 0);
  v[1].up = true;
  // fewer outstanding wins while in time; a replica that would miss the target is passed over
  v[0].outstanding = 1;
  EXPECT_EQ(r.pick(v, 0), 0);
  v[0].predicted_ttft_s = 0.7;
  EXPECT_EQ(r.pick(v, 0), 1);
  // ties: the earlier predicted first token, then the lower index
  v[0] = v[1];
  v[0].predicted_ttft_s = 0.25;
  EXPECT_EQ(r.pick(v, 0), 1);
  v[0].predicted_ttft_s = 0.2;
  EXPECT_EQ(r.pick(v, 0), 0);
  // none in time: the earliest predicted first token among those that would take it
  v[0].predicted_ttft_s = 0.9;
  v[1].predicted_ttft_s = 0.8;
  v[1].outstanding = 9;
  EXPECT_EQ(r.pick(v, 0), 1);
}

TEST(router, when_every_replica_would_refuse_the_one_predicting_the_earliest_start_refuses_it) {
  router r;
  std::vector<replica_view> v(2);
  v[0] = {.would_refuse = true, .predicted_ttft_s = 9};
  v[1] = {.would_refuse = true, .predicted_ttft_s = 4};
  EXPECT_EQ(r.pick(v, 0), 1);
  v[0].up = v[1].up = false;
  EXPECT_FALSE(r.pick(v, 0).has_value());
}

TEST(router, a_prefix_returns_to_the_replica_that_served_it_while_that_costs_little) {
  router r({.affinity_prefix_tokens = 4, .affinity_entries = 2});
  const std::vector<int32_t> a{1, 2, 3, 4, 99}, a2{1, 2, 3, 4, 7, 8}, b{5, 6, 7, 8};
  EXPECT_EQ(r.prefix_hash(a), r.prefix_hash(a2));  // the same first 4 tokens
  EXPECT_NE(r.prefix_hash(a), r.prefix_hash(b));
  std::vector<replica_view> v(2);
  v[0].predicted_ttft_s = 0.3;
  v[1].predicted_ttft_s = 0.1;
  v[0].outstanding = 1;  // one more than the best: still its prefix's home
  r.served(r.prefix_hash(a), 0);
  EXPECT_EQ(r.pick(v, r.prefix_hash(a2), 0.25), 0);  // 0.2 s later, less than its prefix saves: the cached prefix
  EXPECT_EQ(r.pick(v, r.prefix_hash(a2), 0.1), 1);   // more than it saves
  EXPECT_EQ(r.affinity_hits(), 1);  // the second pick went elsewhere
  v[0].predicted_ttft_s = 0.5;
  EXPECT_EQ(r.pick(v, r.prefix_hash(a2), 0.25), 1);  // too much later
  v[0].predicted_ttft_s = 0.3;
  v[0].would_refuse = true;
  EXPECT_EQ(r.pick(v, r.prefix_hash(a2), 0.25), 1);  // never to a replica that would refuse
  v[0].would_refuse = false;
  v[0].outstanding = 2;
  EXPECT_EQ(r.pick(v, r.prefix_hash(a2), 0.25), 1);  // nor to one two requests busier
  v[0].outstanding = 1;
  // bounded memory: the least recently served prefix goes first
  r.served(r.prefix_hash(b), 0);
  r.served(r.prefix_hash(std::vector<int32_t>{9, 9, 9, 9}), 0);
  EXPECT_EQ(r.pick(v, r.prefix_hash(a), 0.25), 1);
  EXPECT_EQ(r.pick(v, r.prefix_hash(b), 0.25), 0);
  r.forget(0);
  EXPECT_EQ(r.pick(v, r.prefix_hash(b), 0.25), 1);
}

}  // namespace
}  // namespace tireless
