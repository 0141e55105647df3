#include "regions.h"

#include <gtest/gtest.h>

#include <vector>

#include "error.h"

namespace {

using emugpu::RegionKind;
using emugpu::RegionOutcome;
using emugpu::Regions;
using emugpu::TimeNs;

TEST(Regions, OutsideARegionEstimatesStand) {
  Regions r;
  EXPECT_EQ(r.retime(123, 0, 0), 123);
}

TEST(Regions, TheFirstOccurrenceNeverSpendsTheWholeBudgetOnOneOp) {
  Regions r;
  r.open("k", RegionKind::kForward, 1000, 0, 0, true);
  EXPECT_EQ(r.retime(100, 0, 0), 100);
  EXPECT_EQ(r.retime(5000, 100, 0), 450);  // half of the 900 left
  EXPECT_EQ(r.pad_needed(550), 450);
}

TEST(Regions, ALearntRegionSpreadsItsBudgetOverItsOps) {
  Regions r;
  r.open("k", RegionKind::kForward, 1000, 0, 0, true);
  r.retime(100, 0, 0);
  r.retime(300, 100, 0);
  r.close(RegionOutcome::kCompleted, 1000, 600);
  r.open("k", RegionKind::kForward, 1000, 2000, 0, true);
  // budget 1000 over the expected 400 plus a 5% reserve (20)
  EXPECT_EQ(r.retime(100, 2000, 0), 238);
  // a gap of 162: the 600 left over 300 + 20
  EXPECT_EQ(r.retime(300, 2400, 0), 562);
  EXPECT_EQ(r.pad_needed(2962), 38);
}

// Learnt: 400 of estimates in a region of 1000. A quarter of the work done,
// the profiled GPU stands at start + 250 and still needs 750.
Regions learnt_region() {
  Regions r;
  r.open("k", RegionKind::kBackward, 1000, 0, 0, true);
  r.retime(100, 0, 0);
  r.retime(300, 100, 0);
  r.close(RegionOutcome::kCompleted, 1000, 600);
  return r;
}

TEST(Regions, AWaitTheProfiledGpuWouldStillBeInMovesTheEnd) {
  Regions r = learnt_region();
  r.open("k", RegionKind::kBackward, 1000, 2000, 0, true);
  EXPECT_EQ(r.retime(100, 2000, 0), 238);
  r.waited(2238, 2700);  // a collective's end: 2700 + 750 is 450 past 3000
  EXPECT_EQ(r.pad_needed(3000), 450);
  EXPECT_EQ(r.retime(300, 2700, 0), 703);  // 750 over 300 + 20
  EXPECT_EQ(r.pad_needed(3403), 47);
  r.close(RegionOutcome::kCompleted, 3450, 47);
  const auto rep = r.report();
  ASSERT_EQ(rep.size(), 1u);
  EXPECT_EQ(rep[0].waited, 450);
  EXPECT_EQ(rep[0].last_time, 1450);
  EXPECT_EQ(rep[0].host_bound, 0);  // the wait is not the host's lateness
}

TEST(Regions, AWaitThatEndsBeforeTheProfiledGpuGetsThereCostsNothing) {
  Regions r = learnt_region();
  r.open("k", RegionKind::kBackward, 1000, 2000, 0, true);
  r.retime(100, 2000, 0);
  r.waited(2238, 2249);  // the profiled GPU reaches this point at 2250
  EXPECT_EQ(r.pad_needed(3000), 0);
  r.waited(2238, 2251);
  EXPECT_EQ(r.pad_needed(3000), 1);
  r.waited(2300, 2200);  // not a wait: the stream is past it
  EXPECT_EQ(r.pad_needed(3000), 1);
}

TEST(Regions, TheFirstOccurrenceBudgetsAWaitFromWhereItsWorkStands) {
  Regions r;
  r.open("k", RegionKind::kForward, 1000, 0, 0, true);
  r.retime(100, 0, 0);
  r.waited(100, 600);  // 900 still ahead of 100: they start at 600
  EXPECT_EQ(r.pad_needed(600), 900);
  Regions fresh;  // a stream that never ran anything stands at 0, not before the region
  fresh.open("k", RegionKind::kForward, 1000, 5000, 0, true);
  fresh.waited(0, 5400);
  EXPECT_EQ(fresh.pad_needed(5400), 1000);
  Regions unbudgeted;
  unbudgeted.open("k", RegionKind::kForward, emugpu::kUnbudgeted, 0, 0, true);
  unbudgeted.waited(0, 600);
  EXPECT_EQ(unbudgeted.pad_needed(600), 0);
}

TEST(Regions, CancelledAndAbortedOccurrencesTeachNothing) {
  Regions r;
  r.open("k", RegionKind::kBackward, 1000, 0, 0, false);
  r.retime(500, 0, 0);
  r.close(RegionOutcome::kCancelled, 500, 0);
  r.open("k", RegionKind::kBackward, 1000, 0, 0, true);
  EXPECT_EQ(r.retime(100, 0, 0), 100);  // still nothing learnt
  r.close(RegionOutcome::kAborted, 100, 0);
  const auto rep = r.report();
  ASSERT_EQ(rep.size(), 1u);
  EXPECT_EQ(rep[0].cancelled, 1);
  EXPECT_EQ(rep[0].aborted, 1);
  EXPECT_EQ(rep[0].occurrences, 0);
}

TEST(Regions, OpeningTwiceIsAnInvariantViolation) {
  Regions r;
  r.open("a", RegionKind::kForward, 10, 0, 0, true);
  EXPECT_THROW(r.open("b", RegionKind::kForward, 10, 0, 0, true), emugpu::Error);
  EXPECT_THROW(Regions().open("c", RegionKind::kForward, -2, 0, 0, true), emugpu::Error);
}

TEST(Regions, ACostModelRegionKeepsItsOpsTimesAndRecordsItsLength) {
  Regions r;
  r.open("net@8:forward", RegionKind::kForward, emugpu::kUnbudgeted, 100, 0, true);
  EXPECT_EQ(r.retime(40, 100, 0), 40);  // never re-timed
  EXPECT_EQ(r.retime(25, 140, 0), 25);
  EXPECT_EQ(r.pad_needed(165), 0);                     // never padded
  r.close(emugpu::RegionOutcome::kCompleted, 200, 0);  // the host came late: a gap
  const auto report = r.report();
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].target, emugpu::kUnbudgeted);
  EXPECT_EQ(report[0].last_time, 100);
  EXPECT_EQ(report[0].estimated, 65);
  EXPECT_EQ(report[0].charged, 65);
  EXPECT_EQ(report[0].host_bound, 0);  // no target to overrun
  EXPECT_EQ(r.host_bound_total(), 0);
}

}  // namespace

namespace {

TEST(Regions, TheLastCompleteOccurrenceKeepsItsOpEstimatesForTheBatchCurve) {
  Regions r;
  EXPECT_EQ(r.last_estimates("k"), nullptr);
  r.open("k", RegionKind::kForward, emugpu::kUnbudgeted, 0, 0, true);
  r.retime(100, 0, 0);
  r.retime(300, 100, 0);
  EXPECT_EQ(r.last_estimates("k"), nullptr);  // not before it completes
  r.close(RegionOutcome::kCompleted, 400, 0);
  ASSERT_NE(r.last_estimates("k"), nullptr);
  EXPECT_EQ(*r.last_estimates("k"), (std::vector<TimeNs>{100, 300}));
  // An aborted occurrence leaves the last complete one's.
  r.open("k", RegionKind::kForward, emugpu::kUnbudgeted, 500, 0, true);
  r.retime(7, 500, 0);
  r.close(RegionOutcome::kAborted, 507, 0);
  EXPECT_EQ(*r.last_estimates("k"), (std::vector<TimeNs>{100, 300}));
}

}  // namespace
