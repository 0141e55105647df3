// 1x1 stride-1 convolutions on NCHW tensors as cuDNN's tensor-core path runs
// them: no layout transforms, one GEMM per image over its P*Q pixels (the
// H100 sweep's 1x1 passes: one kernel each, and a second one that adds up
// the weight gradient's per-image partial sums).
#include <gtest/gtest.h>

#include "cost_model.h"
#include "cost_rule.h"

namespace {

using emugpu::DType;
using emugpu::KernelParams;
using emugpu::OpCost;
using emugpu::OpFamily;

emugpu::GpuSpec gpu(int major = 9) {
  emugpu::GpuSpec g;
  g.name = "test";
  g.sm_count = 132;
  g.major = major;
  g.fp32_flops = 60e12;
  g.tf32_flops = g.fp16_flops = g.bf16_flops = 500e12;
  g.memory_bandwidth = 3e12;
  g.pcie_generation = 5;
  g.pcie_width = 16;
  return g;
}

enum class Pass { kForward, kInputGrad, kWeightGrad };

// The H100 sweep's (and ResNet-50's) 1024 -> 256 channels, batch 64.
OpCost pointwise(Pass pass, double hw, bool channels_last, DType dtype = DType::kBFloat16) {
  OpCost o;
  o.family = pass == Pass::kForward ? OpFamily::kConv : OpFamily::kConvBackward;
  o.dtype = dtype;
  o.conv = {64, 1024, hw, hw, 256, 1, 1, hw, hw, 1, 1, channels_last};
  o.gemm_count = emugpu::conv_gemms(o.conv, pass == Pass::kForward, pass == Pass::kInputGrad, pass == Pass::kWeightGrad,
                                    o.gemms.data());
  o.flops = emugpu::matmul_flops(o.gemms[0].batch, o.gemms[0].m, o.gemms[0].k, o.gemms[0].n);
  const double element = dtype == DType::kBFloat16 ? 2 : 4;
  o.bytes = (64 * (1024 + 256) * hw * hw + 1024 * 256) * element;
  return o;
}

// The same work as a (batched) matmul: `batch` products of m x k by k x n.
OpCost matmul(const OpCost& conv, double batch, double m, double n, double k) {
  OpCost o;
  o.family = OpFamily::kBmm;
  o.dtype = conv.dtype;
  o.flops = conv.flops;
  o.bytes = conv.bytes;
  o.gemm_count = 1;
  o.gemms[0] = {batch, m, n, k};
  return o;
}

TEST(NchwPointwiseConv, ForwardAndInputGradientRunOneGemmPerImage) {
  const auto g = gpu();
  // Defaults: conv_tensor_efficiency 1, so a convolution's GEMM is timed as cuBLAS's.
  const emugpu::CostModel m(g, {}, KernelParams{});
  for (const double hw : {7.0, 14.0}) {
    const double pixels = hw * hw;
    // NCHW: 64 GEMMs over one image's pixels each; NHWC: one over all of them.
    EXPECT_EQ(m.kernel(pointwise(Pass::kForward, hw, false)),
              m.kernel(matmul(pointwise(Pass::kForward, hw, false), 64, pixels, 256, 1024)));
    EXPECT_EQ(m.kernel(pointwise(Pass::kInputGrad, hw, false)),
              m.kernel(matmul(pointwise(Pass::kInputGrad, hw, false), 64, pixels, 1024, 256)));
    EXPECT_EQ(m.kernel(pointwise(Pass::kForward, hw, true)),
              m.kernel(matmul(pointwise(Pass::kForward, hw, true), 1, 64 * pixels, 256, 1024)));
    // Each image's 49 or 196 rows leave its last tile part-empty: the NCHW
    // pass takes longer than the NHWC one, which has no transforms either.
    EXPECT_GT(static_cast<double>(m.kernel(pointwise(Pass::kForward, hw, false))),
              1.1 * static_cast<double>(m.kernel(pointwise(Pass::kForward, hw, true))));
  }
  EXPECT_EQ(emugpu::cost_rule(pointwise(Pass::kForward, 7, false), g).rule, "per-image GEMM rule (NCHW 1x1)");
  EXPECT_EQ(emugpu::cost_rule(pointwise(Pass::kForward, 7, true), g).rule, "implicit-GEMM tile rule");
}

TEST(NchwPointwiseConv, WeightGradientAddsUpPerImagePartialSums) {
  const auto g = gpu();
  const KernelParams p;
  const emugpu::CostModel m(g, {}, p);
  // 64 images' 256 x 1024 FP32 partials (67 MB), read back after the GEMM
  // by the kernel that sums them: at least that much longer than the NHWC
  // weight gradient, a single GEMM reduced over all 64 x 196 pixels.
  const double read_back_ns = 64 * 256 * 1024 * 4.0 / (g.memory_bandwidth * p.memory_efficiency) * 1e9;
  // TF32 and bf16 alike: the partials are FP32 whatever the operands.
  for (const DType dtype : {DType::kTensorFloat32, DType::kBFloat16}) {
    const double nchw = static_cast<double>(m.kernel(pointwise(Pass::kWeightGrad, 14, false, dtype)));
    const double nhwc = static_cast<double>(m.kernel(pointwise(Pass::kWeightGrad, 14, true, dtype)));
    EXPECT_GT(nchw, nhwc + read_back_ns);
  }
}

TEST(NchwPointwiseConv, OnePixelPlanesAndCudaCoresKeepOneGemm) {
  const auto g = gpu();  // the model keeps a reference
  const emugpu::CostModel m(g, {}, KernelParams{});
  // Squeeze-excitation's 1x1 convolutions on pooled 1x1 maps: NCHW and NHWC
  // are the same matrix, timed alike in every pass.
  for (const Pass pass : {Pass::kForward, Pass::kInputGrad, Pass::kWeightGrad}) {
    EXPECT_EQ(m.kernel(pointwise(pass, 1, false)), m.kernel(pointwise(pass, 1, true)));
  }
  // fp32 on a GPU without TF32 (Volta) runs on CUDA cores, where cuDNN's
  // NCHW implicit-GEMM kernels tile over N*P*Q: the rule is not applied.
  const auto volta = gpu(7);
  const emugpu::CostModel v(volta, {}, KernelParams{});
  for (const Pass pass : {Pass::kForward, Pass::kInputGrad, Pass::kWeightGrad}) {
    EXPECT_EQ(v.kernel(pointwise(pass, 7, false, DType::kFloat32)),
              v.kernel(pointwise(pass, 7, true, DType::kFloat32)));
  }
  EXPECT_EQ(emugpu::cost_rule(pointwise(Pass::kForward, 7, false, DType::kFloat32), volta).rule,
            "implicit-GEMM tile rule");
}

}  // namespace
