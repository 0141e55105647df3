#include "daemon/policy.h"

#include <gtest/gtest.h>

#include <vector>

#include "error.h"

namespace {

using namespace emugpu::share;

SharingConfig config(SharingPolicy policy) {
  SharingConfig c;
  c.policy = policy;
  return c;
}

TEST(SharePolicy, AProcessAloneHasTheWholeGpu) {
  for (auto policy :
       {SharingPolicy::kTimeSlice, SharingPolicy::kFair, SharingPolicy::kFifo, SharingPolicy::kPriority}) {
    EXPECT_DOUBLE_EQ(compute_share(config(policy), {1.0, 1000, 0}, {}), 1.0) << sharing_policy_name(policy);
    // Others that never have work change nothing.
    EXPECT_DOUBLE_EQ(compute_share(config(policy), {1.0, 1000, 0}, {{0.0, 5000, 9}}), 1.0);
  }
}

TEST(SharePolicy, TimeSlicingSplitsBusyProcessesEquallyLessContextSwitches) {
  const SharingConfig c = config(SharingPolicy::kTimeSlice);
  const double switching = 2000.0 / 2200.0;  // a 2 ms slice, a 200 us switch
  EXPECT_NEAR(compute_share(c, {1.0, 0, 0}, {{1.0, 0, 0}}), switching / 2, 1e-12);
  EXPECT_NEAR(compute_share(c, {1.0, 0, 0}, {{1.0, 0, 0}, {1.0, 0, 0}}), switching / 3, 1e-12);
  // Iteration lengths do not matter to the driver's slices.
  EXPECT_NEAR(compute_share(c, {1.0, 10, 0}, {{1.0, 100000, 0}}), switching / 2, 1e-12);
}

TEST(SharePolicy, WorkFillsTheGapsAnotherProcessLeaves) {
  // The other process has work half the time: half the time this one runs
  // alone, half the time it gets half.
  const double share = compute_share(config(SharingPolicy::kFair), {1.0, 0, 0}, {{0.5, 0, 0}});
  EXPECT_NEAR(share, 0.5 * 1.0 + 0.5 * 0.5, 1e-12);
  // Two others, each busy 40% of the time, independently.
  const double two = compute_share(config(SharingPolicy::kFair), {1.0, 0, 0}, {{0.4, 0, 0}, {0.4, 0, 0}});
  EXPECT_NEAR(two, 0.36 * 1.0 + 0.48 / 2 + 0.16 / 3, 1e-12);
}

TEST(SharePolicy, FifoGivesEachProcessItsIterationsShareOfARound) {
  const SharingConfig c = config(SharingPolicy::kFifo);
  EXPECT_NEAR(compute_share(c, {1.0, 100, 0}, {{1.0, 100, 0}}), 0.5, 1e-12);
  // One iteration each in turn: 300 of every 400 ns go to the longer iterations.
  EXPECT_NEAR(compute_share(c, {1.0, 300, 0}, {{1.0, 100, 0}}), 0.75, 1e-12);
  EXPECT_NEAR(compute_share(c, {1.0, 100, 0}, {{1.0, 300, 0}}), 0.25, 1e-12);
}

TEST(SharePolicy, AHigherPriorityTakesTheGpu) {
  const SharingConfig c = config(SharingPolicy::kPriority);
  EXPECT_DOUBLE_EQ(compute_share(c, {1.0, 0, 0}, {{1.0, 0, 5}}), kMinShare);  // starved, yet progressing
  EXPECT_DOUBLE_EQ(compute_share(c, {1.0, 0, 5}, {{1.0, 0, 0}}), 1.0);
  // Free when the higher one has no work.
  EXPECT_NEAR(compute_share(c, {1.0, 0, 0}, {{0.25, 0, 5}}), 0.75, 1e-12);
  // Equal priorities time-slice.
  EXPECT_NEAR(compute_share(c, {1.0, 0, 3}, {{1.0, 0, 3}}), (2000.0 / 2200.0) / 2, 1e-12);
}

TEST(SharePolicy, NoneLeavesEveryProcessTheWholeGpu) {
  EXPECT_DOUBLE_EQ(compute_share(config(SharingPolicy::kNone), {1.0, 0, 0}, {{1.0, 0, 0}, {1.0, 0, 0}}), 1.0);
}

TEST(SharePolicy, ManySharersUseTheMeanFieldAndStayWithinBounds) {
  std::vector<Sharer> many(40, Sharer{1.0, 100, 0});
  const double share = compute_share(config(SharingPolicy::kFair), {1.0, 100, 0}, many);
  EXPECT_NEAR(share, 1.0 / 41, 1e-12);
  std::vector<Sharer> more(200, Sharer{1.0, 100, 0});
  EXPECT_DOUBLE_EQ(compute_share(config(SharingPolicy::kFair), {1.0, 100, 0}, more), kMinShare);
  // Out-of-range fractions are clamped, never a share above the GPU.
  EXPECT_DOUBLE_EQ(compute_share(config(SharingPolicy::kFair), {1.0, 0, 0}, {{-3.0, 0, 0}}), 1.0);
}

TEST(SharePolicy, NamesRoundTripAndUnknownOnesListTheValid) {
  for (auto policy : {SharingPolicy::kNone, SharingPolicy::kTimeSlice, SharingPolicy::kFair, SharingPolicy::kFifo,
                      SharingPolicy::kPriority}) {
    EXPECT_EQ(parse_sharing_policy(sharing_policy_name(policy)), policy);
  }
  try {
    parse_sharing_policy("round-robin");
    FAIL() << "expected an error";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("time-slice, fair, fifo"), std::string::npos) << e.what();
  }
}

}  // namespace
