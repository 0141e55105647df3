#include "batch_curve.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "error.h"

namespace {

using emugpu::BatchCostCurve;
using emugpu::CurveMethod;
using emugpu::MeasuredPoint;

TEST(BatchCurve, LaunchFloorsDoNotGrowWithTheBatch) {
  // Two ops under the 10 us floor, one of 110 us: 30 us fixed, 100 us that scale.
  const BatchCostCurve c = emugpu::cost_curve({4'000, 6'000, 110'000}, 10'000, 64);
  EXPECT_DOUBLE_EQ(c.fixed_ns, 20'000);
  EXPECT_DOUBLE_EQ(c.variable_ns, 100'000);
  EXPECT_DOUBLE_EQ(c.at(64), 120'000);
  EXPECT_DOUBLE_EQ(c.at(128), 220'000);
  EXPECT_DOUBLE_EQ(c.at(32), 70'000);
  EXPECT_THROW(emugpu::cost_curve({1}, 0, 0), emugpu::Error);
}

TEST(BatchCurve, ThroughTwoPassesThroughBothPoints) {
  for (const auto& [t0, t1] : {std::pair{4.45, 8.78}, std::pair{1.0, 3.0}, std::pair{2.0, 2.5}}) {
    EXPECT_NEAR(emugpu::through_two(3.3, t0, 9.4, t1, 3.3), t0, 1e-9);
    EXPECT_NEAR(emugpu::through_two(3.3, t0, 9.4, t1, 9.4), t1, 1e-9);
  }
}

TEST(BatchCurve, ALaunchBoundSmallBatchBendsBelowTheStraightLine) {
  // Measured: flat from 32 to 64 (the host's floor), then in step with the cost model.
  const BatchCostCurve c{1'300'000, 2'000'000, 32};  // 3.3 ms at 32, 5.3 at 64, 9.3 at 128
  const std::vector<MeasuredPoint> pts{{32, 4.45e-3}, {128, 8.78e-3}};
  const auto t = emugpu::curve_target(pts, 64, c);
  EXPECT_EQ(t.method, CurveMethod::kInterpolated);
  EXPECT_EQ(t.below, 32);
  EXPECT_EQ(t.above, 128);
  const double straight = 4.45e-3 + (8.78e-3 - 4.45e-3) * (64 - 32) / (128.0 - 32);
  EXPECT_LT(t.seconds, straight);
  EXPECT_GT(t.seconds, 4.45e-3);  // never below the smaller batch's time
}

TEST(BatchCurve, WithoutAFloorTimeIsLinearInTheCostModelsTime) {
  // The smaller batch is relatively faster than the cost model says: no floor.
  const BatchCostCurve c{0, 1'000'000, 1};
  const std::vector<MeasuredPoint> pts{{10, 1.0}, {20, 3.0}};
  const auto t = emugpu::curve_target(pts, 15, c);
  EXPECT_NEAR(t.seconds, 2.0, 1e-12);
}

TEST(BatchCurve, ExactPointsAreTheMeasurement) {
  const std::vector<MeasuredPoint> pts{{32, 0.01}, {64, 0.015}, {128, 0.027}};
  const auto t = emugpu::curve_target(pts, 64, BatchCostCurve{5e6, 1e7, 64});
  EXPECT_EQ(t.method, CurveMethod::kExact);
  EXPECT_DOUBLE_EQ(t.seconds, 0.015);
  EXPECT_EQ(t.below, 64);
}

TEST(BatchCurve, BeyondTheTableTheNearestPairsCurveContinues) {
  const BatchCostCurve c{1e6, 4e6, 64};
  const std::vector<MeasuredPoint> pts{{32, 0.004}, {64, 0.006}, {128, 0.011}};
  const auto big = emugpu::curve_target(pts, 256, c);
  EXPECT_EQ(big.method, CurveMethod::kExtrapolated);
  EXPECT_EQ(big.below, 64);
  EXPECT_EQ(big.above, 128);
  EXPECT_NEAR(big.seconds, emugpu::through_two(c.at(64), 0.006, c.at(128), 0.011, c.at(256)), 1e-15);
  EXPECT_GT(big.seconds, 0.011);
  const auto small = emugpu::curve_target(pts, 8, c);
  EXPECT_EQ(small.below, 32);
  EXPECT_EQ(small.above, 64);
  EXPECT_LT(small.seconds, 0.004);
  EXPECT_GE(small.seconds, 0.1 * 0.004);
}

TEST(BatchCurve, OnePointScalesWithTheCostModel) {
  const BatchCostCurve c{1e6, 1e6, 10};  // 2 ms at 10, 3 ms at 20
  const auto t = emugpu::curve_target({{10, 0.004}}, 20, c);
  EXPECT_EQ(t.method, CurveMethod::kScaled);
  EXPECT_NEAR(t.seconds, 0.006, 1e-15);
}

TEST(BatchCurve, BadPointsAreRefused) {
  const BatchCostCurve c{1e6, 1e6, 10};
  EXPECT_THROW(emugpu::curve_target({}, 4, c), emugpu::Error);
  EXPECT_THROW(emugpu::curve_target({{10, 1.0}, {10, 2.0}}, 4, c), emugpu::Error);
  EXPECT_THROW(emugpu::curve_target({{10, 1.0}}, 0, c), emugpu::Error);
}

}  // namespace
