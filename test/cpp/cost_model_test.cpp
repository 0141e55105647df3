#include "cost_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "cost_rule.h"
#include "error.h"

namespace {

using emugpu::DType;
using emugpu::GemmShape;
using emugpu::KernelParams;
using emugpu::OpCost;
using emugpu::OpFamily;

emugpu::GpuSpec gpu() {
  emugpu::GpuSpec g;
  g.name = "test";
  g.sm_count = 80;
  g.major = 7;
  g.fp32_flops = 10e12;
  g.fp16_flops = 100e12;
  g.memory_bandwidth = 1e12;
  g.pcie_generation = 3;
  g.pcie_width = 16;
  return g;
}

// Ideal kernels: every efficiency 1, no launch cost, no pipeline fill.
KernelParams ideal() {
  KernelParams p;
  p.simt_efficiency = p.tensor_efficiency = p.memory_efficiency = 1;
  p.gather_efficiency = p.depthwise_efficiency = 1;
  p.launch_ns = 500;
  p.gemm_k_half = 0;
  return p;
}

OpCost gemm(double m, double n, double k, DType dtype = DType::kFloat32) {
  OpCost c{2 * m * n * k, 4 * (m * k + k * n + m * n), dtype, OpFamily::kMm};
  c.gemm_count = 1;
  c.gemms[0] = {1, m, n, k};
  return c;
}

TEST(CostModel, LargeGemmRunsAtTheSustainedRate) {
  const auto g = gpu();
  // 8192^2 outputs in 128x128 tiles: 4096 tiles, 51.2 waves of 80; with no
  // pipeline fill to pay, five slices of K fill exactly 256 waves.
  const emugpu::CostModel m(g, {}, ideal());
  const double flops = 2.0 * 8192 * 8192 * 4096;
  EXPECT_NEAR(m.kernel(gemm(8192, 8192, 4096)), 500 + flops / 10e12 * 1e9, 1e3);
  EXPECT_TRUE(m.kernel_cost(gemm(8192, 8192, 4096)).compute_bound);
  // Tensor cores on Volta: FP16 at its own peak.
  EXPECT_NEAR(m.kernel(gemm(8192, 8192, 4096, DType::kFloat16)), 500 + flops / 100e12 * 1e9, 1e3);
}

TEST(CostModel, ALastPartialWaveCostsAWholeOneWhenTheReductionIsTooShortToSplit) {
  const auto g = gpu();
  const emugpu::CostModel m(g, {}, ideal());
  // 80 tiles fill one wave; 81 need two, and K = 256 cannot be split.
  const auto one = m.kernel(gemm(128 * 80, 128, 256));
  const auto two = m.kernel(gemm(128 * 81, 128, 256));
  EXPECT_NEAR(static_cast<double>(two - 500) / static_cast<double>(one - 500), 2.0, 0.05);
}

TEST(CostModel, ALongReductionIsSplitSoThatALastPartialWaveCostsLittle) {
  const auto g = gpu();
  KernelParams p = ideal();
  p.gemm_k_half = 32;  // a slice pays its own pipeline fill
  const emugpu::CostModel m(g, {}, p);
  const auto one = m.kernel(gemm(128 * 80, 128, 8192));
  const auto over = m.kernel(gemm(128 * 81, 128, 8192));
  EXPECT_LT(static_cast<double>(over - 500) / static_cast<double>(one - 500), 1.15);
}

TEST(CostModel, AWeightGradientsFewOutputTilesSplitItsLongReduction) {
  const auto g = gpu();  // 80 SMs
  KernelParams p = ideal();
  p.gemm_k_half = 32;
  const emugpu::CostModel m(g, {}, p);
  // A 1024x768 weight gradient over 8192 tokens: 48 tiles of 128x128 for 80
  // SMs (one slice each would leave 40% of them idle), yet near the
  // sustained rate.
  const OpCost wgrad = gemm(1024, 768, 8192);
  const double achieved = wgrad.flops / (static_cast<double>(m.kernel(wgrad) - 500) * 1e-9);
  EXPECT_GT(achieved, 0.85 * 10e12);
}

TEST(CostModel, UnalignedSixteenBitGemmsKeepHalfTheRateUnalignedTf32Keeps) {
  auto g = gpu();
  g.major = 8;  // Ampere: TF32 and BF16 on tensor cores
  g.tf32_flops = 100e12;
  g.bf16_flops = 200e12;
  KernelParams p = ideal();
  p.unaligned_efficiency = 0.4;
  const emugpu::CostModel m(g, {}, p);
  auto slowdown = [&](DType dtype) {
    return static_cast<double>(m.kernel(gemm(8192, 8191, 4096, dtype)) - 500) /
           static_cast<double>(m.kernel(gemm(8192, 8192, 4096, dtype)) - 500);
  };
  EXPECT_NEAR(slowdown(DType::kTensorFloat32), 1 / 0.4, 0.05);
  EXPECT_NEAR(slowdown(DType::kBFloat16), 1 / 0.2, 0.1);
  EXPECT_NEAR(slowdown(DType::kFloat32), 1.0, 0.01);  // CUDA cores: no vectorised tensor-core loads to lose
}

TEST(CostModel, AnUnalignedLeadingDimensionSlowsAnAlignedShape) {
  auto g = gpu();
  g.major = 8;
  g.bf16_flops = 200e12;
  KernelParams p = ideal();
  p.unaligned_efficiency = 0.4;
  const emugpu::CostModel m(g, {}, p);
  // GPT-2 head's weight gradient: 50257 x 768 over 8192 tokens, aligned m,
  // n and k sizes aside from m, but dY^T's leading dimension is 50257.
  OpCost aligned = gemm(50257, 768, 8192, DType::kBFloat16);
  OpCost transposed = aligned;
  transposed.gemms[0].unaligned_ld = true;
  const double slowdown =
      static_cast<double>(m.kernel(transposed) - 500) / static_cast<double>(m.kernel(aligned) - 500);
  EXPECT_NEAR(slowdown, 1 / 0.2, 0.1);
  // CUDA cores lose nothing.
  transposed.dtype = aligned.dtype = DType::kFloat32;
  EXPECT_EQ(m.kernel(transposed), m.kernel(aligned));
}

TEST(CostModel, TensorCoreConvolutionsOnNchwPayLayoutTransformsAndTheirOwnEfficiency) {
  auto g = gpu();
  g.major = 8;
  g.bf16_flops = 200e12;
  KernelParams p = ideal();
  p.conv_tensor_efficiency = 0.5;
  const emugpu::CostModel m(g, {}, p);
  auto conv = [](double r, double stride, bool channels_last, DType dtype) {
    OpCost c{0, 0, dtype, OpFamily::kConv};
    c.conv = {64, 128, 28, 28, 128, r, r, 28 / stride, 28 / stride, 1, stride, channels_last};
    c.gemm_count = emugpu::conv_gemms(c.conv, true, false, false, c.gemms.data());
    c.flops = 2 * c.gemms[0].m * c.gemms[0].n * c.gemms[0].k;
    return c;
  };
  const OpCost nchw = conv(3, 1, false, DType::kBFloat16);
  const OpCost nhwc = conv(3, 1, true, DType::kBFloat16);
  // Both activations (64x128x28x28 in and out, 2 bytes) read and written
  // once more: 25.7 MB at 1 TB/s, and three more kernels.
  const double transform_ns = 2 * 2 * 64 * 128 * 28 * 28 * 2 / 1e12 * 1e9;
  EXPECT_NEAR(static_cast<double>(m.kernel(nchw) - m.kernel(nhwc)), transform_ns + 3 * 500, 1e3);
  // A 1x1 stride-1 convolution on NCHW runs as per-image GEMMs
  // (nchw_pointwise_conv_test.cpp): no transforms, no more kernels.
  EXPECT_EQ(m.kernel_cost(conv(1, 1, false, DType::kBFloat16)).launches,
            m.kernel_cost(conv(1, 1, true, DType::kBFloat16)).launches);
  // cuDNN's implicit GEMM at half the rate of a GEMM of the same shape.
  OpCost same = nhwc;
  same.family = OpFamily::kMm;
  EXPECT_NEAR(static_cast<double>(m.kernel(nhwc) - 500) / static_cast<double>(m.kernel(same) - 500), 2.0, 0.01);
  // On CUDA cores (FP32 without TF32) neither applies.
  EXPECT_EQ(m.kernel(conv(3, 1, false, DType::kFloat32)), m.kernel(conv(3, 1, true, DType::kFloat32)));
}

TEST(CostModel, SmallProblemsRunBelowPeak) {
  const auto g = gpu();
  const emugpu::CostModel m(g, {}, ideal());
  // A 256x256 output fills 4 of 80 SMs with 128x128 tiles: smaller tiles and
  // split-K recover part of it, never all of it.
  const OpCost small = gemm(256, 256, 256);
  const double achieved = small.flops / (static_cast<double>(m.kernel(small) - 500) * 1e-9);
  EXPECT_LT(achieved, 0.6 * 10e12);
  EXPECT_GT(achieved, 0.05 * 10e12);
}

TEST(CostModel, ShortReductionsPayThePipelineFill) {
  const auto g = gpu();
  KernelParams p = ideal();
  p.gemm_k_half = 32;
  const emugpu::CostModel m(g, {}, p);
  const emugpu::CostModel fast(g, {}, ideal());
  // k = 32: the main loop as long as the fill, so twice the ideal time.
  EXPECT_NEAR(static_cast<double>(m.kernel(gemm(8192, 8192, 32)) - 500) /
                  static_cast<double>(fast.kernel(gemm(8192, 8192, 32)) - 500),
              2.0, 0.01);
}

TEST(CostModel, MemoryBoundOpScalesWithBytesAndLaunches) {
  const auto g = gpu();
  KernelParams p = ideal();
  p.memory_efficiency = 0.5;
  const emugpu::CostModel m(g, {}, p);
  OpCost add{1e3, 1e9, DType::kFloat32, OpFamily::kElementwise};
  EXPECT_EQ(m.kernel(add), 500 + 2'000'000);  // 1 GB at 0.5 TB/s
  add.kernels = 3;
  EXPECT_EQ(m.kernel(add), 1500 + 2'000'000);
  EXPECT_FALSE(m.kernel_cost(add).compute_bound);
}

TEST(CostModel, GathersAndDepthwiseConvolutionsHaveTheirOwnBandwidth) {
  const auto g = gpu();
  KernelParams p = ideal();
  p.gather_efficiency = 0.25;
  p.depthwise_efficiency = 0.1;
  const emugpu::CostModel m(g, {}, p);
  EXPECT_EQ(m.kernel({0, 1e9, DType::kFloat32, OpFamily::kGather}), 500 + 4'000'000);
  OpCost dw{1e6, 1e9, DType::kFloat32, OpFamily::kConv};
  dw.conv = {32, 64, 56, 56, 64, 3, 3, 56, 56, 64, 1};  // groups == channels
  EXPECT_EQ(m.kernel(dw), 500 + 10'000'000);
}

TEST(CostModel, BatchNormsWithFewChannelsLeaveSmsIdle) {
  const auto g = gpu();  // 80 SMs
  KernelParams p = ideal();
  p.batch_norm_efficiency = 0.5;
  p.batch_norm_channels_per_sm = 1;
  const emugpu::CostModel m(g, {}, p);
  OpCost bn{0, 1e9, DType::kFloat32, OpFamily::kBatchNorm};
  EXPECT_EQ(m.kernel(bn), 500 + 2'000'000);  // channels unknown: the family's bandwidth alone
  bn.channels = 80;                          // half rate at one channel per SM
  EXPECT_EQ(m.kernel(bn), 500 + 4'000'000);
  bn.channels = 720;
  EXPECT_EQ(m.kernel(bn), 500 + 2'222'222);
  bn.channels = 80;
  bn.backward = true;  // (80 + 240) / 80
  EXPECT_EQ(m.kernel(bn), 500 + 8'000'000);
  // A layer norm is not limited by channels.
  OpCost ln{0, 1e9, DType::kFloat32, OpFamily::kNorm};
  ln.channels = 80;
  p.norm_efficiency = 0.5;
  EXPECT_EQ(emugpu::CostModel(g, {}, p).kernel(ln), 500 + 2'000'000);
}

TEST(CostModel, SixteenBitBatchNormsTakeTheirOwnFactorsOverFloat32) {
  const auto g = gpu();
  KernelParams p = ideal();
  p.batch_norm_efficiency = 0.5;
  p.batch_norm_16bit_forward = 1.5;
  p.batch_norm_16bit_backward = 1.25;
  const emugpu::CostModel m(g, {}, p);
  // estimate() charges a 16-bit batch norm the float32 bytes; these factors come on top.
  OpCost bn{0, 1e9, DType::kBFloat16, OpFamily::kBatchNorm};
  EXPECT_EQ(m.kernel(bn), 500 + 3'000'000);
  bn.backward = true;
  EXPECT_EQ(m.kernel(bn), 500 + 2'500'000);
  bn.dtype = DType::kFloat32;
  EXPECT_EQ(m.kernel(bn), 500 + 2'000'000);
  // Half inputs with float32 weights go to cuDNN, which the factors do not describe.
  bn.dtype = DType::kFloat16;
  bn.cudnn = true;
  EXPECT_EQ(m.kernel(bn), 500 + 2'000'000);
  bn.cudnn = false;
  EXPECT_EQ(m.kernel(bn), 500 + 2'500'000);
  // Layer norms keep their family's rate.
  OpCost ln{0, 1e9, DType::kBFloat16, OpFamily::kNorm};
  p.norm_efficiency = 0.5;
  EXPECT_EQ(emugpu::CostModel(g, {}, p).kernel(ln), 500 + 2'000'000);
}

TEST(CostModel, EvalBatchNormIsOnePassAtItsOwnRateWithoutChannelLimits) {
  const auto g = gpu();
  KernelParams p = ideal();
  p.batch_norm_efficiency = 0.5;
  p.batch_norm_channels_per_sm = 1;
  p.batch_norm_16bit_forward = 1.5;
  p.batch_norm_eval_efficiency = 0.8;
  p.batch_norm_eval_16bit = 0.75;
  p.batch_norm_eval_plane = 100;
  const emugpu::CostModel m(g, {}, p);
  OpCost bn{0, 1e9, DType::kFloat32, OpFamily::kBatchNorm};
  bn.running_stats = true;
  bn.channels = 80;  // no per-channel reduction: few channels cost nothing
  EXPECT_EQ(m.kernel(bn), 500 + 1'250'000);
  // Planes smaller than a block's threads: plane / (plane + 100) of the rate.
  bn.plane = 100;
  EXPECT_EQ(m.kernel(bn), 500 + 2'500'000);
  bn.plane = 0;
  // 16-bit: a rate of elements, 0.75 of float32's time for half the bytes;
  // the training forward's 16-bit factor does not apply.
  bn.dtype = DType::kBFloat16;
  EXPECT_EQ(m.kernel(bn), 500 + 1'875'000);
  bn.cudnn = true;
  EXPECT_EQ(m.kernel(bn), 500 + 1'875'000);
  // Training mode keeps the reduction rule.
  bn.running_stats = false;
  bn.dtype = DType::kFloat32;
  EXPECT_EQ(m.kernel(bn), 500 + 4'000'000);
}

TEST(CostModel, ColumnReductionsOfNarrowRowsRunBelowTheBandwidth) {
  const auto g = gpu();
  KernelParams p = ideal();
  p.reduction_efficiency = 0.8;
  p.column_reduction_half_bytes = 4000;
  const emugpu::CostModel m(g, {}, p);
  OpCost sum{0, 1e9, DType::kFloat32, OpFamily::kReduction};
  const emugpu::TimeNs row_sum = m.kernel(sum);  // along rows: the plain bandwidth share
  EXPECT_EQ(row_sum, 500 + 1'250'000);
  // A bias gradient of 1000 fp32 columns (4000 bytes a row): half the
  // rate; of 9000, 0.9 of it.
  sum.columns = 1000;
  EXPECT_EQ(m.kernel(sum), 500 + 2'500'000);
  sum.columns = 9000;
  EXPECT_NEAR(static_cast<double>(m.kernel(sum)), 500 + 1.25e6 / 0.9, 2);
  // 16-bit rows of the same columns are half as wide: a third of the rate.
  sum.columns = 1000;
  sum.dtype = DType::kBFloat16;
  EXPECT_EQ(m.kernel(sum), 500 + 3'750'000);
  EXPECT_EQ(emugpu::cost_rule(sum, g).rule, "column reduction rule");
  // Other families ignore it.
  OpCost add{0, 1e9, DType::kFloat32, OpFamily::kElementwise};
  const emugpu::TimeNs plain = m.kernel(add);
  add.columns = 1000;
  EXPECT_EQ(m.kernel(add), plain);
}

TEST(CostModel, StridedElementwiseKernelsRunAtARateOfElements) {
  const auto g = gpu();  // 80 SMs
  KernelParams p = ideal();
  p.strided_elements_per_sm_ns = 2.5;  // 200 elements per ns on the GPU
  const emugpu::CostModel m(g, {}, p);
  // 1e8 16-bit elements read and written: 0.4 GB, 0.4 ms at the bandwidth.
  OpCost copy{0, 4e8, DType::kBFloat16, OpFamily::kCopy};
  copy.elements = 1e8;
  EXPECT_EQ(m.kernel(copy), 500 + 400'000);
  // Not vectorisable: 1e8 elements at 200 per ns, 0.5 ms, not 0.4.
  copy.strided = true;
  EXPECT_EQ(m.kernel(copy), 500 + 500'000);
  EXPECT_EQ(emugpu::cost_rule(copy, g).rule, "strided elementwise rule");
  // 32-bit ones move twice the bytes: the bandwidth bounds them.
  copy.bytes = 8e8;
  copy.dtype = DType::kFloat32;
  EXPECT_EQ(m.kernel(copy), 500 + 800'000);
}

TEST(CostModel, LayerNormsOfShortRowsCostTheirRowsNotTheirBytes) {
  const auto g = gpu();  // 80 SMs
  KernelParams p = ideal();
  p.norm_efficiency = 1;
  p.norm_row_ns = 200;
  const emugpu::CostModel m(g, {}, p);
  // 1e8 fp32 elements in and out: 0.8 ms at the bandwidth.
  OpCost ln{0, 8e8, DType::kFloat32, OpFamily::kNorm};
  ln.elements = 1e8;
  ln.columns = 1000;  // 1e5 rows: 0.25 ms of blocks, under the bandwidth's time
  EXPECT_EQ(m.kernel(ln), 500 + 800'000);
  ln.columns = 96;  // ConvNeXt's first stage: 1.04 M rows, 2.6 ms
  EXPECT_NEAR(static_cast<double>(m.kernel(ln)), 500 + 1e8 / 96 * 200 / 80, 2);
  EXPECT_EQ(emugpu::cost_rule(ln, g).rule, "bandwidth rule, per-row floor");
}

TEST(CostModel, WinogradSpeedsUpOnlyEligibleFp32Passes) {
  const auto g = gpu();
  KernelParams p = ideal();
  p.winograd_gain = 2;
  const emugpu::CostModel m(g, {}, p);
  const emugpu::CostModel plain(g, {}, ideal());
  OpCost conv{0, 0, DType::kFloat32, OpFamily::kConv};
  conv.conv = {64, 256, 14, 14, 256, 3, 3, 14, 14, 1, 1};
  conv.gemm_count = emugpu::conv_gemms(conv.conv, true, false, false, conv.gemms.data());
  EXPECT_TRUE(conv.gemms[0].winograd);
  EXPECT_NEAR(static_cast<double>(m.kernel(conv) - 500) / static_cast<double>(plain.kernel(conv) - 500), 0.5, 0.01);
  conv.dtype = DType::kFloat16;  // tensor cores: no Winograd
  EXPECT_EQ(m.kernel(conv), plain.kernel(conv));
}

TEST(CostModel, KernelParamsComeFromTheArchitecture) {
  auto g = gpu();
  EXPECT_EQ(emugpu::default_kernel_params(g).source, "table: volta");
  g.major = 3;
  g.minor = 7;
  EXPECT_EQ(emugpu::default_kernel_params(g).source, "table: kepler");
  g.major = 8;
  g.minor = 9;
  EXPECT_EQ(emugpu::default_kernel_params(g).source, "table: ampere");  // Ada shares Ampere's row
  g.major = 12;
  EXPECT_EQ(emugpu::default_kernel_params(g).source, "table: blackwell");
}

TEST(CostModel, KernelParamsAreCheckedByName) {
  KernelParams p;
  emugpu::set_kernel_param(p, "memory_efficiency", 0.5);
  EXPECT_EQ(p.memory_efficiency, 0.5);
  EXPECT_THROW(emugpu::set_kernel_param(p, "memory_efficiency", 1.5), emugpu::Error);
  EXPECT_THROW(emugpu::set_kernel_param(p, "memory_efficency", 0.5), emugpu::Error);
  EXPECT_THROW(emugpu::set_kernel_param(p, "launch_ns", std::nan("")), emugpu::Error);
  const auto g = gpu();
  KernelParams bad;
  bad.simt_efficiency = 0;
  EXPECT_THROW(emugpu::CostModel(g, {}, bad), emugpu::Error);
}

TEST(CostModel, LaunchLatencyIsAFloor) {
  const auto g = gpu();
  emugpu::CostModel m(g);
  EXPECT_EQ(m.kernel({0, 0, DType::kFloat32}), static_cast<emugpu::TimeNs>(m.kernel_params().launch_ns));
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
