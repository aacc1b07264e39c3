#include "scheduler/autoscaler.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace tireless {
namespace {

autoscale_options queue_of_two() {
  autoscale_options o;
  o.min_replicas = 2;
  o.max_replicas = 10;
  o.metrics = {{autoscale_metric::kind::queue_depth, "premium", 2}};
  return o;
}

fleet_reading reading(int32_t serving, int32_t starting, double total) { return {serving, starting, {total}}; }

TEST(autoscaler, proposes_the_sum_over_the_target_outside_the_tolerance) {
  autoscaler a(queue_of_two());
  // 2 replicas, 4.3 queued: average 2.15, within 10% of 2: no change.
  EXPECT_EQ(a.desired(0, reading(2, 0, 4.3)), 2);
  // 12 queued: ceil(12 / 2) = 6, but at most 2 added a minute.
  EXPECT_EQ(a.last_proposal(), 2);
  EXPECT_EQ(a.desired(15, reading(2, 0, 12)), 4);
  EXPECT_EQ(a.last_proposal(), 6);
  // The two just added count against the step until the minute has passed.
  EXPECT_EQ(a.desired(30, reading(2, 2, 12)), 4);
  EXPECT_EQ(a.desired(76, reading(2, 2, 12)), 6);
  // Never above max.
  EXPECT_EQ(a.desired(200, reading(6, 0, 1000)), 8);
  EXPECT_EQ(a.last_proposal(), 10);
}

TEST(autoscaler, scales_down_only_after_the_whole_window_and_one_at_a_time) {
  autoscale_options o = queue_of_two();
  o.up_step = 10;
  autoscaler a(o);
  EXPECT_EQ(a.desired(0, reading(2, 0, 16)), 8);
  // The queue is gone, but the window remembers 8 for 300 s.
  double t = 15;
  for (; t < 300; t += 15) EXPECT_EQ(a.desired(t, reading(8, 0, 0)), 8) << t;
  // After the window: down by one per 120 s, to min 2.
  EXPECT_EQ(a.desired(315, reading(8, 0, 0)), 7);
  EXPECT_EQ(a.desired(330, reading(7, 0, 0)), 7);
  EXPECT_EQ(a.desired(436, reading(7, 0, 0)), 6);
}

TEST(autoscaler, takes_the_largest_proposal_of_several_metrics) {
  autoscale_options o = queue_of_two();
  o.up_step = 10;
  o.metrics.push_back({autoscale_metric::kind::refused_per_s, "", 0.5});
  autoscaler a(o);
  // No queue (early rejection keeps it short), but 3 refusals a second: ceil(3 / 0.5) = 6.
  fleet_reading r{2, 0, {0, 3}};
  EXPECT_EQ(a.desired(0, r), 6);
}

TEST(autoscaler, counts_starting_replicas_as_current_with_no_load) {
  autoscale_options o = queue_of_two();
  o.up_step = 10;
  autoscaler a(o);
  EXPECT_EQ(a.desired(0, reading(2, 0, 12)), 6);
  // Four still start; the queue is unchanged: the proposal is still 6, nothing more is added.
  EXPECT_EQ(a.desired(15, reading(2, 4, 12)), 6);
}

TEST(autoscaler, refuses_options_that_make_no_sense) {
  auto bad = [](auto edit) {
    autoscale_options o = queue_of_two();
    edit(o);
    EXPECT_THROW(autoscaler{o}, std::invalid_argument);
  };
  bad([](autoscale_options& o) { o.min_replicas = 0; });
  bad([](autoscale_options& o) { o.max_replicas = 1; });
  bad([](autoscale_options& o) { o.period_s = 0; });
  bad([](autoscale_options& o) { o.metrics.clear(); });
  bad([](autoscale_options& o) { o.metrics[0].target = 0; });
  bad([](autoscale_options& o) { o.tolerance = 1; });
  EXPECT_EQ(parse_autoscale_metric("waiting"), autoscale_metric::kind::waiting);
  EXPECT_THROW(parse_autoscale_metric("cpu"), std::invalid_argument);
}

}  // namespace
}  // namespace tireless
