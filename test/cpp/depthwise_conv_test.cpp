// Depthwise convolutions as cuDNN runs them: bandwidth-bound direct kernels
// on CUDA cores, compute-bound with large filters, and a slow generic weight
// gradient beyond 5x5 (kernel_params.h cites the H100 trace behind each rate).
#include <gtest/gtest.h>

#include "cost_model.h"

namespace {

using emugpu::DType;
using emugpu::KernelParams;
using emugpu::OpCost;
using emugpu::OpFamily;

emugpu::GpuSpec gpu() {
  emugpu::GpuSpec g;
  g.name = "test";
  g.sm_count = 80;
  g.major = 9;
  g.fp32_flops = 10e12;
  g.tf32_flops = g.fp16_flops = g.bf16_flops = 100e12;
  g.memory_bandwidth = 1e12;
  g.pcie_generation = 4;
  g.pcie_width = 16;
  return g;
}

KernelParams params() {
  KernelParams p;
  p.launch_ns = 1'000;
  p.depthwise_efficiency = 0.1;
  p.depthwise_compute_efficiency = 0.05;
  p.depthwise_nchw_factor = 0.5;
  p.depthwise_wgrad_efficiency = 0.005;
  p.depthwise_wgrad_nchw_efficiency = 0.02;
  return p;
}

// A depthwise convolution pass over 64 images of C x 56 x 56 with an r x r filter (NHWC unless told).
OpCost depthwise(double r, bool forward, bool input_grad, bool weight_grad, DType dtype = DType::kFloat32,
                 bool channels_last = true) {
  OpCost c;
  c.family = forward ? OpFamily::kConv : OpFamily::kConvBackward;
  c.dtype = dtype;
  c.conv = {64, 96, 56, 56, 96, r, r, 56, 56, 96, 1, channels_last};
  c.gemm_count = emugpu::conv_gemms(c.conv, forward, input_grad, weight_grad, c.gemms.data());
  for (int i = 0; i < c.gemm_count; ++i) {
    const auto& g = c.gemms[static_cast<size_t>(i)];
    c.flops += emugpu::matmul_flops(g.batch, g.m, g.k, g.n);
  }
  c.bytes = 2 * 64 * 96 * 56 * 56 * 4.0;  // input and output, fp32
  return c;
}

TEST(DepthwiseConv, SmallFiltersAreBandwidthBound) {
  const auto g = gpu();  // the model keeps a reference
  const emugpu::CostModel m(g, {}, params());
  const OpCost c = depthwise(3, true, false, false);
  EXPECT_NEAR(static_cast<double>(m.kernel(c)), 1'000 + c.bytes / 1e12 / 0.1 * 1e9, 2);
  EXPECT_FALSE(m.kernel_cost(c).compute_bound);
}

TEST(DepthwiseConv, LargeFiltersAreComputeBoundOnCudaCoresWhateverTheDtype) {
  const auto g = gpu();  // the model keeps a reference
  const emugpu::CostModel m(g, {}, params());
  const OpCost fp32 = depthwise(7, true, false, false);
  // 2 * 64 * 96 * 56^2 * 49 FLOPs at 5% of the FP32 peak, above the bytes' time.
  const double expected = 1'000 + fp32.flops / (10e12 * 0.05) * 1e9;
  EXPECT_NEAR(static_cast<double>(m.kernel(fp32)), expected, 2);
  EXPECT_TRUE(m.kernel_cost(fp32).compute_bound);
  // TF32 allowed: no tensor cores for one channel per group.
  EXPECT_EQ(m.kernel(depthwise(7, true, false, false, DType::kTensorFloat32)), m.kernel(fp32));
  // NCHW tensors: half the rate.
  const OpCost nchw = depthwise(7, true, false, false, DType::kFloat32, false);
  EXPECT_NEAR(static_cast<double>(m.kernel(nchw)), 1'000 + fp32.flops / (10e12 * 0.05 * 0.5) * 1e9, 2);
}

TEST(DepthwiseConv, SixteenBitNhwcKernelsStayBandwidthBound) {
  const auto g = gpu();
  const emugpu::CostModel m(g, {}, params());
  for (const bool forward : {true, false}) {
    OpCost bf16 = depthwise(7, forward, false, !forward, DType::kBFloat16);
    bf16.bytes /= 2;
    EXPECT_NEAR(static_cast<double>(m.kernel(bf16)), 1'000 + bf16.bytes / 1e12 / 0.1 * 1e9, 2);
  }
  // Beyond 7x7 they are not: a 31x31 filter is compute-bound as a 32-bit one is.
  OpCost large = depthwise(31, true, false, false, DType::kBFloat16);
  EXPECT_GT(static_cast<double>(m.kernel(large)), 1'000 + large.flops / (10e12 * 0.05) * 1e9 - 2);
}

TEST(DepthwiseConv, LargeFilterWeightGradientAddsItsGenericKernelsTime) {
  const auto g = gpu();  // the model keeps a reference
  const emugpu::CostModel m(g, {}, params());
  const OpCost dgrad = depthwise(7, false, true, false);
  const OpCost both = depthwise(7, false, true, true);
  const OpCost wgrad = depthwise(7, false, false, true);
  const double wgrad_s = wgrad.flops / (10e12 * 0.005);
  EXPECT_NEAR(static_cast<double>(m.kernel(both) - m.kernel(dgrad)), wgrad_s * 1e9, 1e3);
  // Far slower than the forward, as cuDNN's are (the trace: 13x).
  EXPECT_GT(m.kernel(wgrad), 5 * m.kernel(depthwise(7, true, false, false)));
  // On NCHW tensors cuDNN's generic kernel is faster than its NHWC implicit GEMM.
  const OpCost nchw = depthwise(7, false, false, true, DType::kFloat32, false);
  // (its bytes' time first: the generic kernels run after the data is read)
  EXPECT_NEAR(static_cast<double>(m.kernel(nchw)),
              1'000 + (nchw.bytes / 1e12 / 0.1 + nchw.flops / (10e12 * 0.02)) * 1e9, 1e3);
}

TEST(DepthwiseConv, FiveByFiveWeightGradientKeepsTheSpecialisedKernels) {
  const auto g = gpu();  // the model keeps a reference
  const emugpu::CostModel m(g, {}, params());
  const OpCost wgrad = depthwise(5, false, false, true);
  // At most the compute-bound direct rate: not the generic kernels' 10x slower one.
  EXPECT_LE(static_cast<double>(m.kernel(wgrad)),
            1'000 + std::max(wgrad.flops / (10e12 * 0.05), wgrad.bytes / 1e12 / 0.1) * 1e9 + 2);
}

}  // namespace
