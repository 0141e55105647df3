// The rule names `torch-emugpu explain` shows per op family.
#include "cost_rule.h"

#include <gtest/gtest.h>

namespace {

using emugpu::DType;
using emugpu::OpCost;
using emugpu::OpFamily;

emugpu::GpuSpec hopper() {
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

OpCost conv(double c, double groups, double r, bool channels_last, DType dtype = DType::kBFloat16) {
  OpCost o;
  o.family = OpFamily::kConv;
  o.dtype = dtype;
  o.conv = {32, c, 56, 56, c, r, r, 56, 56, groups, 1, channels_last};
  o.gemm_count = emugpu::conv_gemms(o.conv, true, false, false, o.gemms.data());
  return o;
}

TEST(CostRule, ConvolutionsAreNamedByTheirKindAndFilter) {
  const auto g = hopper();
  EXPECT_EQ(emugpu::cost_rule(conv(96, 96, 7, true), g).family, "conv depthwise 7x7");
  EXPECT_EQ(emugpu::cost_rule(conv(96, 96, 7, true), g).rule, "large-kernel depthwise rule");
  EXPECT_EQ(emugpu::cost_rule(conv(96, 96, 3, true), g).rule, "depthwise bandwidth rule");
  EXPECT_EQ(emugpu::cost_rule(conv(128, 32, 3, true), g).family, "conv grouped 3x3");
  EXPECT_EQ(emugpu::cost_rule(conv(64, 1, 3, true), g).rule, "implicit-GEMM tile rule");
  EXPECT_EQ(emugpu::cost_rule(conv(64, 1, 3, false), g).rule, "implicit-GEMM tile rule + NCHW transposes");
  EXPECT_EQ(emugpu::cost_rule(conv(3, 1, 7, false), g).rule, "implicit-GEMM tile rule, unaligned channels");
}

TEST(CostRule, MatmulsRnnsAndBandwidthFamilies) {
  const auto g = hopper();
  OpCost mm;
  mm.family = OpFamily::kMm;
  mm.dtype = DType::kBFloat16;
  mm.gemm_count = 1;
  mm.gemms[0] = {1, 8192, 768, 768};
  EXPECT_EQ(emugpu::cost_rule(mm, g).rule, "GEMM tile rule");
  mm.gemms[0].n = 50257;  // GPT-2's head
  EXPECT_EQ(emugpu::cost_rule(mm, g).rule, "unaligned GEMM rule");
  mm.gemms[0] = {1, 50257, 768, 8192};  // its weight gradient, through dY^T
  EXPECT_EQ(emugpu::cost_rule(mm, g).rule, "GEMM tile rule");
  mm.gemms[0].unaligned_ld = true;
  EXPECT_EQ(emugpu::cost_rule(mm, g).rule, "unaligned GEMM rule");
  OpCost lstm;
  lstm.family = OpFamily::kRnnBackward;
  lstm.rnn.mode = emugpu::RnnMode::kLstm;
  EXPECT_EQ(emugpu::cost_rule(lstm, g).family, "lstm");
  EXPECT_EQ(emugpu::cost_rule(lstm, g).rule, "cuDNN RNN wavefront rule");
  OpCost add;
  add.family = OpFamily::kElementwise;
  EXPECT_EQ(emugpu::cost_rule(add, g).family, "elementwise");
  EXPECT_EQ(emugpu::cost_rule(add, g).rule, "bandwidth rule");
}

TEST(CostRule, EvalBatchNormNamesItsOwnRule) {
  OpCost bn{0, 1e9, DType::kFloat32, OpFamily::kBatchNorm};
  bn.running_stats = true;
  EXPECT_EQ(emugpu::cost_rule(bn, hopper()).family, "batch norm (eval)");
  EXPECT_EQ(emugpu::cost_rule(bn, hopper()).rule, "eval-mode normalisation pass rule");
  bn.running_stats = false;
  EXPECT_EQ(emugpu::cost_rule(bn, hopper()).family, "batch norm");
}

}  // namespace
