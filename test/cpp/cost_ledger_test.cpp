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
      EXPECT_EQ(f.ops, 2);
      EXPECT_EQ(f.kernels, 2);
      EXPECT_EQ(f.time_ns, 2 * g.duration);
      EXPECT_DOUBLE_EQ(f.flops, 4e12);
      EXPECT_EQ(f.compute_bound, 2);
      // No shape given: the FLOPs at the CUDA cores' sustained rate (launch aside).
      EXPECT_NEAR(f.peak_compute_ns / (f.time_ns - 2 * model.kernel_params().launch_ns),
                  model.kernel_params().simt_efficiency, 1e-6);
    } else {
      EXPECT_EQ(f.family, OpFamily::kElementwise);
      EXPECT_EQ(f.kernels, 1);
      EXPECT_EQ(f.compute_bound, 0);
      EXPECT_NEAR(f.peak_memory_ns / (f.time_ns - model.kernel_params().launch_ns),
                  model.kernel_params().memory_efficiency, 1e-6);
    }
  }
  ledger.reset();
  EXPECT_TRUE(ledger.report().empty());
}

TEST(CostLedger, CountsLaunchesAndKeepsATraceWhenAsked) {
  const emugpu::GpuSpec gpu = emugpu::testing::test_gpu();
  const emugpu::CostModel model(gpu);
  emugpu::CostLedger ledger;
  emugpu::OpCost backward{1e9, 1e6, emugpu::DType::kFloat32, OpFamily::kConvBackward};
  backward.kernels = 2;  // input and weight gradients
  ledger.record(backward, model.kernel_cost(backward), "aten::convolution_backward");
  ledger.start_trace(2);
  for (int i = 0; i < 3; ++i) ledger.record(backward, model.kernel_cost(backward), "aten::convolution_backward");
  const auto report = ledger.report();
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].ops, 4);
  EXPECT_EQ(report[0].kernels, 8);
  const auto trace = ledger.take_trace();
  ASSERT_EQ(trace.size(), 2u);  // the limit
  EXPECT_EQ(trace[0].name, "aten::convolution_backward");
  EXPECT_EQ(trace[0].cost.kernels, 2);
  EXPECT_EQ(trace[0].charged.duration, model.kernel(backward));
  ledger.record(backward, model.kernel_cost(backward));
  EXPECT_TRUE(ledger.take_trace().empty());  // taking it stopped it
}

TEST(CostLedger, EveryFamilyHasAName) {
  for (int i = 0; i < emugpu::kOpFamilyCount; ++i) {
    const std::string name = emugpu::op_family_name(static_cast<OpFamily>(i));
    EXPECT_NE(name, "?") << i;
    EXPECT_FALSE(name.empty());
  }
}

}  // namespace
