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

TEST(CostModel, PageableCopiesAddTheHostStagingCopyToTheLink) {
  const auto g = gpu();
  emugpu::CostModelParams p;
  p.host_staging_rate = 10e9;
  emugpu::CostModel m(g, p);
  // 1 GB: 1e9 / 12.6e9 s over the link, plus 0.1 s of staging.
  const double link_s = 1e9 / g.pcie_bandwidth();
  EXPECT_NEAR(m.transfer(1e9, true) / 1e9, link_s, 1e-4);
  EXPECT_NEAR(m.transfer(1e9, false) / 1e9, link_s + 0.1, 1e-4);
  p.host_staging_rate = 0;
  EXPECT_THROW(emugpu::CostModel(g, p), emugpu::Error);
}

TEST(CostModel, RejectsEfficienciesOutsideTheUnitInterval) {
  const auto g = gpu();
  EXPECT_THROW(emugpu::CostModel(g, {0.0, 1.0}), emugpu::Error);
  EXPECT_THROW(emugpu::CostModel(g, {1.0, 1.5}), emugpu::Error);
}

}  // namespace

namespace {

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
