#include "cost_model.h"

#include <gtest/gtest.h>

#include "error.h"

namespace {

emugpu::GpuSpec gpu() {
  emugpu::GpuSpec g;
  g.name = "test";
  g.fp32_flops = 10e12;
  g.fp16_flops = 100e12;
  g.memory_bandwidth = 1e12;
  g.pcie_generation = 3;
  g.pcie_width = 16;
  return g;
}

TEST(CostModel, ComputeBoundOpScalesWithFlops) {
  const auto g = gpu();
  emugpu::CostModel m(g, {1.0, 1.0, 0, 0, 0.5});
  EXPECT_EQ(m.kernel({1e12, 1e6, emugpu::DType::kFloat32}), 100'000'000);  // 0.1 s
  EXPECT_EQ(m.kernel({1e12, 1e6, emugpu::DType::kFloat16}), 10'000'000);
}

TEST(CostModel, MemoryBoundOpScalesWithBytes) {
  const auto g = gpu();
  emugpu::CostModel m(g, {1.0, 1.0, 0, 0, 0.5});
  EXPECT_EQ(m.kernel({1e3, 1e9, emugpu::DType::kFloat32}), 1'000'000);  // 1 ms
}

TEST(CostModel, LaunchLatencyIsAFloor) {
  const auto g = gpu();
  emugpu::CostModel m(g);
  EXPECT_EQ(m.kernel({0, 0, emugpu::DType::kFloat32}), m.params().launch_ns);
}

TEST(CostModel, PageableCopiesAreSlowerThanPinned) {
  const auto g = gpu();
  emugpu::CostModel m(g);
  EXPECT_GT(m.transfer(64 << 20, false), m.transfer(64 << 20, true));
  // PCIe 3.0 x16 at 80%: about 12.6 GB/s, so 64 MiB pinned takes ~5.3 ms.
  EXPECT_NEAR(m.transfer(64 << 20, true) / 1e6, 5.3, 0.2);
}

TEST(CostModel, RejectsEfficienciesOutsideTheUnitInterval) {
  const auto g = gpu();
  EXPECT_THROW(emugpu::CostModel(g, {0.0, 1.0}), emugpu::Error);
  EXPECT_THROW(emugpu::CostModel(g, {1.0, 1.5}), emugpu::Error);
}

}  // namespace

namespace {

TEST(RegionCalibrator, FirstOccurrenceIsPaddedThenOpsAreScaledToTheTarget) {
  emugpu::RegionCalibrator r;
  EXPECT_EQ(r.begin("fwd", 1000, 0, 0), 0);
  EXPECT_EQ(r.apply(100), 100);  // no history yet: unscaled
  EXPECT_EQ(r.apply(300), 300);
  EXPECT_EQ(r.end(400), 600);  // ops finished at 400; the region must last 1000
  r.begin("fwd", 1000, 5000, 5000);
  EXPECT_EQ(r.apply(100), 250);  // scaled by 1000 / 400
  EXPECT_EQ(r.apply(300), 750);
  EXPECT_EQ(r.end(6000), 0);
  const auto rep = r.report();
  ASSERT_EQ(rep.size(), 1u);
  EXPECT_EQ(rep[0].occurrences, 2);
  EXPECT_EQ(rep[0].charged, 1000);
  EXPECT_DOUBLE_EQ(rep[0].scale, 2.5);
}

TEST(RegionCalibrator, HostGapsAreLeftRoomForNextTime) {
  emugpu::RegionCalibrator r;
  r.begin("bwd", 1000, 0, 0);
  r.apply(500);
  EXPECT_EQ(r.end(800), 200);  // 500 of work plus 300 idle: 200 short
  r.begin("bwd", 1000, 2000, 2000);
  EXPECT_EQ(r.apply(500), 700);  // (1000 - 300 gaps) / 500
  EXPECT_EQ(r.end(3000), 0);     // 700 of work plus the same 300 idle
  EXPECT_EQ(r.report()[0].gaps, 300);
}

TEST(RegionCalibrator, BeginEndsThePreviousRegionAndOutsideOpsAreUnscaled) {
  emugpu::RegionCalibrator r;
  EXPECT_EQ(r.apply(42), 42);
  r.begin("fwd", 500, 0, 0);
  r.apply(100);
  EXPECT_EQ(r.begin("bwd", 800, 100, 100), 400);
  EXPECT_TRUE(r.active());
  EXPECT_EQ(r.end(500), 800);  // bwd began after the 400 pad, at 500, and did no work
  EXPECT_FALSE(r.active());
  EXPECT_EQ(r.end(0), 0);
  EXPECT_THROW(r.begin("x", -1, 0, 0), emugpu::Error);
}

TEST(CostModel, MeasuredTransferRatesReplaceTheLink) {
  const auto g = gpu();
  emugpu::CostModel m(g);
  const auto link = m.transfer(1e9, false);
  m.set_measured_transfer(1000, 2e9, 4e9);
  EXPECT_EQ(m.transfer(1e9, false), 1000 + 500'000'000);
  EXPECT_EQ(m.transfer(1e9, true), 1000 + 250'000'000);
  m.set_measured_transfer(0, 0, 0);
  EXPECT_EQ(m.transfer(1e9, false), link);
  EXPECT_THROW(m.set_measured_transfer(0, -1, 0), emugpu::Error);
}

}  // namespace

namespace {

TEST(RegionCalibrator, RegionsThatEndAtSyncsAreSettledThere) {
  emugpu::RegionCalibrator r;
  r.begin("fwd", 100, 0, 0);
  EXPECT_EQ(r.settle(50), 0);  // forward regions run on through syncs
  EXPECT_TRUE(r.active());
  r.begin("bwd", 300, 50, 50, /*ends_at_sync=*/true);
  r.apply(100);
  EXPECT_EQ(r.settle(200), 200);  // started at 100 (after the fwd pad), must end at 400
  EXPECT_FALSE(r.active());
}

}  // namespace
