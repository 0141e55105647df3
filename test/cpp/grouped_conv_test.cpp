// Grouped convolutions as cuDNN runs them: grouped kernels of their own, which
// keep their pace with few channels per group (the H100 sweep's ResNeXt
// shapes), where an ungrouped convolution with unaligned channels falls back.
#include <gtest/gtest.h>

#include "cost_model.h"
#include "cost_rule.h"

namespace {

using emugpu::DType;
using emugpu::KernelParams;
using emugpu::OpCost;
using emugpu::OpFamily;

emugpu::GpuSpec gpu() {
  emugpu::GpuSpec g;
  g.name = "test";
  g.sm_count = 132;
  g.major = 9;
  g.fp32_flops = 60e12;
  g.tf32_flops = g.fp16_flops = g.bf16_flops = 500e12;
  g.memory_bandwidth = 3e12;
  g.pcie_generation = 5;
  g.pcie_width = 16;
  return g;
}

OpCost conv(double c, double groups) {
  OpCost o;
  o.family = OpFamily::kConv;
  o.dtype = DType::kBFloat16;
  o.conv = {64, c, 56, 56, c, 3, 3, 56, 56, groups, 1, true};
  o.gemm_count = emugpu::conv_gemms(o.conv, true, false, false, o.gemms.data());
  o.flops = emugpu::matmul_flops(o.gemms[0].batch, o.gemms[0].m, o.gemms[0].k, o.gemms[0].n);
  o.bytes = 2 * 64 * c * 56 * 56 * 2.0;
  return o;
}

TEST(GroupedConv, FewChannelsPerGroupTakeNoUnalignedPenalty) {
  const auto g = gpu();  // the model keeps a reference
  KernelParams slow;
  slow.unaligned_efficiency = 0.05;
  KernelParams fast = slow;
  fast.unaligned_efficiency = 1.0;
  const emugpu::CostModel with_penalty(g, {}, slow);
  const emugpu::CostModel without(g, {}, fast);
  // ResNeXt's first stage: 128 channels in 32 groups of 4 (bf16 wants 8).
  EXPECT_EQ(with_penalty.kernel(conv(128, 32)), without.kernel(conv(128, 32)));
  // An ungrouped convolution with 4 channels still falls back.
  EXPECT_GT(with_penalty.kernel(conv(4, 1)), 2 * without.kernel(conv(4, 1)));
}

TEST(GroupedConv, Fp32WeightGradientTakesAsLongOnNhwcAsOnNchw) {
  const auto g = gpu();
  const emugpu::CostModel m(g, {}, KernelParams{});
  auto wgrad = [](bool channels_last, DType dtype, double groups) {
    OpCost o;
    o.family = OpFamily::kConvBackward;
    o.dtype = dtype;
    o.conv = {64, 256, 28, 28, 256, 3, 3, 28, 28, groups, 1, channels_last};
    o.gemm_count = emugpu::conv_gemms(o.conv, false, false, true, o.gemms.data());
    o.flops = emugpu::matmul_flops(o.gemms[0].batch, o.gemms[0].m, o.gemms[0].k, o.gemms[0].n);
    o.bytes = 2 * 64 * 256 * 28 * 28 * 4.0;
    return o;
  };
  // 32-bit grouped: no NHWC gain.
  EXPECT_EQ(m.kernel(wgrad(true, DType::kTensorFloat32, 32)), m.kernel(wgrad(false, DType::kTensorFloat32, 32)));
  // 16-bit grouped and 32-bit ungrouped ones keep theirs.
  EXPECT_LT(m.kernel(wgrad(true, DType::kBFloat16, 32)), m.kernel(wgrad(false, DType::kBFloat16, 32)));
  EXPECT_LT(m.kernel(wgrad(true, DType::kTensorFloat32, 1)), m.kernel(wgrad(false, DType::kTensorFloat32, 1)));
  // The input gradient of a 32-bit grouped convolution keeps its NHWC gain.
  OpCost dgrad = wgrad(true, DType::kTensorFloat32, 32);
  dgrad.gemm_count = emugpu::conv_gemms(dgrad.conv, false, true, false, dgrad.gemms.data());
  OpCost dgrad_nchw = dgrad;
  dgrad_nchw.conv.channels_last = false;
  EXPECT_LT(m.kernel(dgrad), m.kernel(dgrad_nchw));
}

// A convolution of `per_group` channels per group, `groups` groups, NCHW TF32.
OpCost grouped(double per_group, double groups, bool forward) {
  OpCost o;
  o.family = forward ? OpFamily::kConv : OpFamily::kConvBackward;
  o.dtype = DType::kTensorFloat32;
  const double c = per_group * groups;
  o.conv = {64, c, 14, 14, c, 3, 3, 14, 14, groups, 1, false};
  o.gemm_count = emugpu::conv_gemms(o.conv, forward, !forward, false, o.gemms.data());
  o.flops = emugpu::matmul_flops(o.gemms[0].batch, o.gemms[0].m, o.gemms[0].k, o.gemms[0].n);
  o.bytes = 2 * 64 * c * 14 * 14 * 4.0;
  return o;
}

TEST(GroupedConv, UntileableChannelsPerGroupRunDirectKernelsOnCudaCores) {
  const auto g = gpu();
  const KernelParams p;
  const emugpu::CostModel m(g, {}, p);
  // RegNet's 24 channels per group fit no tensor-core tile (neither a power
  // of two nor a multiple of 32): cuDNN's direct kernel, one load per
  // multiply-add, at the large-filter depthwise rate (NCHW: its factor).
  for (const bool forward : {true, false}) {
    const OpCost regnet = grouped(24, 14, forward);
    const double direct_s = regnet.flops / (g.fp32_flops * p.depthwise_compute_efficiency * p.depthwise_nchw_factor);
    EXPECT_NEAR(static_cast<double>(m.kernel(regnet)), p.launch_ns + direct_s * 1e9, 0.01 * direct_s * 1e9);
    EXPECT_EQ(emugpu::cost_rule(regnet, g).rule, "direct grouped rule (no tensor-core tiling)");
  }
  // Per FLOP several times slower than 16 or 32 per group, which tile.
  const auto per_flop = [&](double per_group) {
    const OpCost o = grouped(per_group, 14, true);
    return static_cast<double>(m.kernel(o)) / o.flops;
  };
  EXPECT_GT(per_flop(24), 3 * per_flop(16));
  EXPECT_GT(per_flop(24), 3 * per_flop(32));
  EXPECT_GT(per_flop(24), 3 * per_flop(64));
  EXPECT_NE(emugpu::cost_rule(grouped(32, 14, true), g).rule, "direct grouped rule (no tensor-core tiling)");
  // channels_last drops the NCHW factor.
  OpCost nhwc = grouped(24, 14, true);
  nhwc.conv.channels_last = true;
  EXPECT_LT(m.kernel(nhwc), m.kernel(grouped(24, 14, true)));
  // Without tensor cores (fp32 on a Volta) every convolution runs on CUDA
  // cores already: the rule is not applied.
  emugpu::GpuSpec volta = g;
  volta.major = 7;
  const emugpu::CostModel v(volta, {}, p);
  OpCost fp32 = grouped(24, 14, true);
  fp32.dtype = DType::kFloat32;
  EXPECT_LT(static_cast<double>(v.kernel(fp32)), 0.5 * static_cast<double>(m.kernel(grouped(24, 14, true))));
}

}  // namespace
