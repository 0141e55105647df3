#include "cost_ledger.h"

#include <gtest/gtest.h>

#include <string>

#include "test_gpu.h"

namespace {

using emugpu::OpFamily;

TEST(CostLedger, SumsWhatTheModelChargedPerFamily) {
  const emugpu::GpuSpec gpu = emugpu::testing::test_gpu();
  const emugpu::CostModel model(gpu);
  emugpu::CostLedger ledger;
  const emugpu::OpCost gemm{2e12, 1e6, emugpu::DType::kFloat32, OpFamily::kMm};
  const emugpu::OpCost add{1e6, 1e9, emugpu::DType::kFloat32, OpFamily::kElementwise};
  const auto g = model.kernel_cost(gemm);
  const auto a = model.kernel_cost(add);
  EXPECT_TRUE(g.compute_bound);
  EXPECT_FALSE(a.compute_bound);
  ledger.record(gemm, g);
  ledger.record(gemm, g);
  ledger.record(add, a);
  const auto report = ledger.report();
  ASSERT_EQ(report.size(), 2u);
  const auto& first = report[0].time_ns >= report[1].time_ns ? report[0] : report[1];
  EXPECT_EQ(first.family, report[0].family);  // sorted, most time first
  for (const auto& f : report) {
    if (f.family == OpFamily::kMm) {
      EXPECT_EQ(f.kernels, 2);
      EXPECT_EQ(f.time_ns, 2 * g.duration);
      EXPECT_DOUBLE_EQ(f.flops, 4e12);
      EXPECT_EQ(f.compute_bound, 2);
      // At 70% compute efficiency, peak time is 70% of the charged (launch aside).
      EXPECT_NEAR(f.peak_compute_ns / (f.time_ns - 2 * model.params().launch_ns), 0.7, 1e-6);
    } else {
      EXPECT_EQ(f.family, OpFamily::kElementwise);
      EXPECT_EQ(f.kernels, 1);
      EXPECT_EQ(f.compute_bound, 0);
      EXPECT_NEAR(f.peak_memory_ns / (f.time_ns - model.params().launch_ns), 0.8, 1e-6);
    }
  }
  ledger.reset();
  EXPECT_TRUE(ledger.report().empty());
}

TEST(CostLedger, EveryFamilyHasAName) {
  for (int i = 0; i < emugpu::kOpFamilyCount; ++i) {
    const std::string name = emugpu::op_family_name(static_cast<OpFamily>(i));
    EXPECT_NE(name, "?") << i;
    EXPECT_FALSE(name.empty());
  }
}

}  // namespace
