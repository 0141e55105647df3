#include "daemon/policy.h"

#include <gtest/gtest.h>

#include <vector>

#include "error.h"

namespace {

using namespace emugpu::share;
using emugpu::kSmBins;
using emugpu::TimeNs;

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

// MPS: {busy, iteration, priority, demand, block hold time, demand histogram}.
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

TEST(SharePolicyMps, KernelsInTheirLastWaveLeaveSmsAsTheyDrain) {
  SharingConfig c = config(SharingPolicy::kMps);
  c.mps_overlap = 0;
  const Sharer small{1.0, 0, 0, 0.6, 40'000};  // no histogram: its mean stands for every kernel
  const auto against = [&](TimeNs hold_ns, TimeNs kernel_ns) {
    Sharer big{1.0, 0, 0, 0.95, hold_ns, {}};
    big.bins[kSmBins - 1] = {1.0, 0.95, hold_ns, kernel_ns};
    return compute_share(c, small, {big});
  };
  // Half the time the big kernel is ahead. In 4 waves it holds its SMs for
  // 3.5 of them: 0.95 x 0.875 of the GPU, leaving the small one 0.16875 of
  // its 0.6.
  EXPECT_NEAR(against(250'000, 1'000'000), 0.5 + 0.5 * (1 - 0.95 * 0.875) / 0.6, 1e-12);
  // One wave: half of it drained on average; many (durations unknown): all of it held.
  EXPECT_NEAR(against(1'000'000, 1'000'000), 0.5 + 0.5 * (1 - 0.95 * 0.5) / 0.6, 1e-12);
  EXPECT_NEAR(against(1'000'000, 0), 0.5 + 0.5 * (1 - 0.95) / 0.6, 1e-12);
  EXPECT_GT(against(1'000'000, 1'000'000), against(250'000, 1'000'000));
}

TEST(SharePolicyMps, AnIdleProcessOrOneWithoutHoldTimesCountsAsItShould) {
  const SharingConfig c = config(SharingPolicy::kMps);
  // Busy a quarter of the time: slowed only then.
  const double quarter = compute_share(c, {1.0, 0, 0, 1.0, 1000}, {{0.25, 0, 0, 1.0, 1000}});
  const double full = compute_share(c, {1.0, 0, 0, 1.0, 1000}, {{1.0, 0, 0, 1.0, 1000}});
  EXPECT_NEAR(1.0 - quarter, 0.25 * (1.0 - full), 1e-12);
  // No kernel durations reported (no histogram): even odds.
  EXPECT_NEAR(compute_share(c, {1.0, 0, 0, 1.0, 0}, {{1.0, 0, 0, 1.0, 0}}), full, 1e-12);
}

// A job whose kernels alternate between filling the GPU and holding little of it.
Sharer bimodal(double busy) {
  Sharer s{busy, 0, 0, 0.5, 1000, {}};
  s.bins[0] = {0.5, 0.05, 1000, 0};
  s.bins[kSmBins - 1] = {0.5, 0.95, 1000, 0};
  return s;
}

TEST(SharePolicyMps, KernelsMeetByClassNotByMean) {
  SharingConfig c = config(SharingPolicy::kMps);
  c.mps_overlap = 0.15;
  const Sharer job = bimodal(1.0);
  // By their means (0.5 each) the two would fit side by side...
  Sharer means = job;
  means.bins = {};
  EXPECT_DOUBLE_EQ(compute_share(c, means, {means}), 1.0);
  // ...but their GPU-filling kernels collide: half of this job's time is in
  // such kernels, and each meets the other's filling kernel (held 0.95 x 0.85)
  // a quarter of the time (half its kernels, even odds of holding the SMs).
  const double left = (1 - 0.95 * 0.85) / 0.95;
  const double filling = 0.75 + 0.25 * left;  // mean speed of a filling kernel
  EXPECT_NEAR(compute_share(c, job, {job}), 1.0 / (0.5 + 0.5 / filling), 1e-12);
  EXPECT_LT(compute_share(c, job, {job}), 0.9);
}

TEST(SharePolicyMps, EachClassIsSlowedByWhatItMeets) {
  const SharingConfig c = config(SharingPolicy::kMps);
  // Its kernels are small (0.2 of the SMs); the other's fill the GPU; both run 10 waves.
  Sharer small{1.0, 0, 0, 0.2, 100, {}};
  small.bins[0] = {1.0, 0.2, 100, 1000};
  Sharer big{1.0, 0, 0, 1.0, 900, {}};
  big.bins[kSmBins - 1] = {1.0, 1.0, 900, 9000};
  const double small_share = compute_share(c, small, {big});
  // Half the time the big kernel is ahead and leaves the 5% of SMs of its last half-wave.
  EXPECT_NEAR(small_share, 0.5 + 0.5 * (1 - 0.95) / 0.2, 1e-12);
  // The big one loses what the small kernels hold the half of the time they are ahead.
  EXPECT_NEAR(compute_share(c, big, {small}), 0.5 + 0.5 * (1 - 0.2 * 0.95), 1e-12);
  // An idle other slows neither.
  EXPECT_DOUBLE_EQ(compute_share(c, small, {Sharer{0.0, 0, 0, 1.0, 900, big.bins}}), 1.0);
}

TEST(SharePolicyMps, ManyOthersFallBackToTheirMeanHeld) {
  const SharingConfig c = config(SharingPolicy::kMps);
  const Sharer job = bimodal(0.5);
  // Others of 3 states each (a kernel of either class, or none), each in two
  // orders: exact up to 4 (6^4 = 1296), mean field for 5 (7776) and 12.
  // More others never speed it up.
  double last = 1.0;
  for (size_t n : {1u, 2u, 4u, 5u, 12u}) {
    const double share = compute_share(c, job, std::vector<Sharer>(n, job));
    EXPECT_GE(share, kMinShare);
    EXPECT_LT(share, 1.0);
    EXPECT_LE(share, last) << n << " others";
    last = share;
  }
}

// One class of kernels: demand, bandwidth drawn alone, no hold times (no drain).
Sharer drawing(double demand, double bandwidth) {
  Sharer s{1.0, 0, 0, demand, 0, {}};
  s.bins[emugpu::demand_bin(demand, bandwidth)] = {1.0, demand, 0, 0, bandwidth};
  return s;
}

TEST(SharePolicyMps, KernelsThatFitSideBySideStillShareTheMemoryBandwidth) {
  const SharingConfig c = config(SharingPolicy::kMps);
  // 40% of the SMs each: side by side. Drawing 20% of the bandwidth each: as alone.
  EXPECT_DOUBLE_EQ(compute_share(c, drawing(0.4, 0.2), {drawing(0.4, 0.2)}), 1.0);
  // Drawing 80% each: 160% together, so the memory serves each 1/1.6 of what it asks.
  EXPECT_NEAR(compute_share(c, drawing(0.4, 0.8), {drawing(0.4, 0.8)}), 1.0 / 1.6, 1e-12);
  // A bandwidth-bound kernel beside a compute-bound one: 0.8 + 0.1 fits.
  EXPECT_DOUBLE_EQ(compute_share(c, drawing(0.4, 0.8), {drawing(0.4, 0.1)}), 1.0);
  // The others' draws add up: two others at 50% leave a third 1/(0.5 x 3).
  EXPECT_NEAR(compute_share(c, drawing(0.3, 0.5), {drawing(0.3, 0.5), drawing(0.3, 0.5)}), 1.0 / 1.5, 1e-12);
}

TEST(SharePolicyMps, AKernelBehindDrawsBandwidthAtItsReducedSpeed) {
  const SharingConfig c = config(SharingPolicy::kMps);
  // 60% of the SMs and 80% of the bandwidth each. Behind, a kernel gets 0.4
  // of the SMs (2/3 of its speed) and draws 2/3 of its 80%; ahead, it runs
  // at full SMs beside the other's 2/3.
  const double sm = 0.4 / 0.6;
  const double behind = sm / (0.8 * sm + 0.8);
  const double ahead = 1.0 / (0.8 + 0.8 * sm);
  EXPECT_NEAR(compute_share(c, drawing(0.6, 0.8), {drawing(0.6, 0.8)}), 0.5 * behind + 0.5 * ahead, 1e-12);
  // Without bandwidth, only the SMs count.
  EXPECT_NEAR(compute_share(c, drawing(0.6, 0.0), {drawing(0.6, 0.0)}), 0.5 * sm + 0.5, 1e-12);
}

TEST(SharePolicyMps, KernelsOfSeveralOthersAreDispatchedInOneOrder) {
  const SharingConfig c = config(SharingPolicy::kMps);
  // Three jobs whose kernels fill the GPU: each kernel is first a third of
  // the time (then alone on the SMs) and waits otherwise, so the three
  // together do one job's work, as time slicing without its switches.
  const Sharer full = drawing(1.0, 0.0);
  EXPECT_NEAR(compute_share(c, full, {full, full}), 1.0 / 3, 1e-12);
  // 60% each: first, as alone; second, 0.4 of the SMs for its 0.6; third, none.
  const Sharer most = drawing(0.6, 0.0);
  EXPECT_NEAR(compute_share(c, most, {most, most}), (1.0 + 0.4 / 0.6 + 0.0) / 3, 1e-12);
}

TEST(SharePolicyMps, TheMeanFieldKeepsTheDispatchOrder) {
  const SharingConfig c = config(SharingPolicy::kMps);
  // Seven others (6^7 combinations and orders: mean field). Kernels that
  // fill the GPU: first an eighth of the time, as an exact order would give.
  const Sharer full = drawing(1.0, 0.0);
  EXPECT_NEAR(compute_share(c, full, std::vector<Sharer>(7, full)), 1.0 / 8, 1e-12);
  // 40% each: first and second run as alone, third on 0.2 of the SMs, none after.
  const Sharer some = drawing(0.4, 0.0);
  EXPECT_NEAR(compute_share(c, some, std::vector<Sharer>(7, some)), (1.0 + 1.0 + 0.5) / 8, 1e-12);
  // Others busy half of the time: 3.5 of them on average, between 3 and 4.
  Sharer half = full;
  half.busy = 0.5;
  EXPECT_NEAR(compute_share(c, full, std::vector<Sharer>(7, half)), 0.5 * (1.0 / 4) + 0.5 * (1.0 / 5), 1e-12);
}

TEST(SharePolicyMps, ParsedByName) {
  EXPECT_EQ(parse_sharing_policy("mps"), SharingPolicy::kMps);
  EXPECT_STREQ(sharing_policy_name(SharingPolicy::kMps), "mps");
}

}  // namespace
