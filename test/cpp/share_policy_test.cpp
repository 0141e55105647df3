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
  for (auto policy : {SharingPolicy::kTimeSlice, SharingPolicy::kFair, SharingPolicy::kFifo, SharingPolicy::kPriority,
                      SharingPolicy::kMps}) {
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

// MPS: {busy, iteration, priority, demand, block hold time}.
TEST(SharePolicyMps, KernelsThatFitSideBySideRunAsAlone) {
  const SharingConfig c = config(SharingPolicy::kMps);
  // Together they need fewer SMs than the GPU has.
  EXPECT_DOUBLE_EQ(compute_share(c, {1.0, 0, 0, 0.4, 1000}, {{1.0, 0, 0, 0.5, 1000}}), 1.0);
  EXPECT_DOUBLE_EQ(compute_share(c, {1.0, 0, 0, 0.3, 1000}, {{1.0, 0, 0, 0.3, 1000}, {1.0, 0, 0, 0.3, 1000}}), 1.0);
}

TEST(SharePolicyMps, IdenticalGpuBoundJobsGainOverTimeSlicing) {
  SharingConfig c = config(SharingPolicy::kMps);
  c.mps_overlap = 0.15;
  const Sharer job{1.0, 0, 0, 0.9, 1000};
  const double share = compute_share(c, job, {job});
  // Half the time its blocks hold the contested SMs and it runs as alone;
  // else it gets what the other's leave: 1 - 0.9 x 0.85 of the GPU, for a demand of 0.9.
  EXPECT_NEAR(share, 0.5 + 0.5 * (1 - 0.9 * 0.85) / 0.9, 1e-12);
  EXPECT_GT(share, 0.5);  // better than an equal split of the GPU
  EXPECT_GT(share, compute_share(config(SharingPolicy::kTimeSlice), job, {job}));
  // Without overlap, kernels that fill the GPU get no more than half of it each.
  c.mps_overlap = 0;
  EXPECT_NEAR(compute_share(c, {1.0, 0, 0, 1.0, 1000}, {{1.0, 0, 0, 1.0, 1000}}), 0.5, 1e-12);
}

TEST(SharePolicyMps, LongBlocksHoldMoreSmsThanShortOnes) {
  const SharingConfig c = config(SharingPolicy::kMps);
  const Sharer big{1.0, 0, 0, 0.95, 400'000};  // large convolutions' tiles
  const Sharer small{1.0, 0, 0, 0.6, 40'000};  // depthwise and elementwise blocks
  const double small_share = compute_share(c, small, {big});
  const double big_share = compute_share(c, big, {small});
  EXPECT_LT(small_share, 0.5);
  EXPECT_GT(big_share, 0.75);
  // The big job's blocks hold the contested SMs 10 times in 11.
  EXPECT_NEAR(small_share, 1.0 / 11 + 10.0 / 11 * (1 - 0.95 * 0.85) / 0.6, 1e-12);
}

TEST(SharePolicyMps, AnIdleProcessOrOneWithoutHoldTimesCountsAsItShould) {
  const SharingConfig c = config(SharingPolicy::kMps);
  // Busy a quarter of the time: slowed only then.
  const double quarter = compute_share(c, {1.0, 0, 0, 1.0, 1000}, {{0.25, 0, 0, 1.0, 1000}});
  const double full = compute_share(c, {1.0, 0, 0, 1.0, 1000}, {{1.0, 0, 0, 1.0, 1000}});
  EXPECT_NEAR(1.0 - quarter, 0.25 * (1.0 - full), 1e-12);
  // No hold times reported yet: even odds.
  EXPECT_NEAR(compute_share(c, {1.0, 0, 0, 1.0, 0}, {{1.0, 0, 0, 1.0, 0}}), full, 1e-12);
}

TEST(SharePolicyMps, ParsedByName) {
  EXPECT_EQ(parse_sharing_policy("mps"), SharingPolicy::kMps);
  EXPECT_STREQ(sharing_policy_name(SharingPolicy::kMps), "mps");
}

}  // namespace
