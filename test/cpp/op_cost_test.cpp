#include "op_cost.h"

#include <gtest/gtest.h>

#include "error.h"

namespace {

using emugpu::OpFamily;

TEST(OpCost, FamiliesComeFromTheAtenName) {
  EXPECT_EQ(emugpu::op_family("aten::addmm"), OpFamily::kAddmm);
  EXPECT_EQ(emugpu::op_family("aten::convolution_backward"), OpFamily::kConvBackward);
  EXPECT_EQ(emugpu::op_family("aten::native_layer_norm"), OpFamily::kNorm);
  EXPECT_EQ(emugpu::op_family("aten::native_batch_norm_backward"), OpFamily::kBatchNorm);
  // Outside the table, PyTorch's tags decide; with no tag the op is unmodelled.
  EXPECT_EQ(emugpu::op_family("aten::add", true, false), OpFamily::kElementwise);
  EXPECT_EQ(emugpu::op_family("aten::amax", false, true), OpFamily::kReduction);
  EXPECT_EQ(emugpu::op_family("aten::some_new_op"), OpFamily::kUnmodelled);
  EXPECT_EQ(emugpu::op_family("aten::threshold_backward"), OpFamily::kElementwise);
  EXPECT_EQ(emugpu::op_family("aten::hardswish_"), OpFamily::kElementwise);
  EXPECT_EQ(emugpu::op_family("aten::tanh_backward"), OpFamily::kElementwise);
  EXPECT_EQ(emugpu::op_family("aten::_log_softmax"), OpFamily::kReduction);
  EXPECT_EQ(emugpu::op_family("aten::embedding_dense_backward"), OpFamily::kGather);
  EXPECT_EQ(emugpu::op_family("aten::_foreach_mul_"), OpFamily::kOptimizer);
  EXPECT_EQ(emugpu::op_family("aten::_fused_adamw_"), OpFamily::kOptimizer);
  EXPECT_EQ(emugpu::op_family("aten::cat"), OpFamily::kCopy);
  EXPECT_TRUE(emugpu::is_gemm_family(OpFamily::kConvBackward));
  EXPECT_FALSE(emugpu::is_gemm_family(OpFamily::kNorm));
  EXPECT_TRUE(emugpu::uses_cublas(OpFamily::kBmm));
  EXPECT_TRUE(emugpu::uses_cudnn(OpFamily::kConv));
  EXPECT_FALSE(emugpu::uses_cublas(OpFamily::kConv));
}

TEST(OpCost, ConvolutionsRunAsImplicitGemms) {
  // resnet50's 3x3 convolution at 14x14: N=32, C=K=256.
  const emugpu::ConvShape conv{32, 256, 14, 14, 256, 3, 3, 14, 14, 1, 1};
  emugpu::GemmShape g[3];
  ASSERT_EQ(emugpu::conv_gemms(conv, true, true, true, g), 3);
  EXPECT_DOUBLE_EQ(g[0].m, 32 * 14 * 14);  // forward: one row per output pixel
  EXPECT_DOUBLE_EQ(g[0].n, 256);
  EXPECT_DOUBLE_EQ(g[0].k, 256 * 9);
  EXPECT_TRUE(g[0].winograd);
  EXPECT_DOUBLE_EQ(g[1].n, 256);  // input gradient: C columns over K*R*S
  EXPECT_TRUE(g[1].winograd);
  EXPECT_DOUBLE_EQ(g[2].m, 256);  // weight gradient: reduces over N*P*Q
  EXPECT_DOUBLE_EQ(g[2].k, 32 * 14 * 14);
  EXPECT_FALSE(g[2].winograd);
  // Every pass does the forward's FLOPs.
  for (const auto& x : g) EXPECT_DOUBLE_EQ(2 * x.batch * x.m * x.n * x.k, 2.0 * 32 * 196 * 256 * 2304);
  // Grouped: one GEMM per group; stride 2 is no Winograd case.
  const emugpu::ConvShape grouped{8, 128, 28, 28, 128, 3, 3, 14, 14, 32, 2};
  ASSERT_EQ(emugpu::conv_gemms(grouped, false, true, false, g), 1);
  EXPECT_DOUBLE_EQ(g[0].batch, 32);
  EXPECT_DOUBLE_EQ(g[0].n, 4);
  EXPECT_FALSE(g[0].winograd);
  EXPECT_THROW(emugpu::conv_gemms({1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1}, true, false, false, g), emugpu::Error);
}

TEST(OpCost, MatmulCountsTwoFlopsPerMultiplyAdd) {
  EXPECT_DOUBLE_EQ(emugpu::matmul_flops(1, 64, 128, 32), 2.0 * 64 * 128 * 32);
  EXPECT_DOUBLE_EQ(emugpu::matmul_flops(8, 4, 4, 4), 8 * 2.0 * 64);
  EXPECT_THROW(emugpu::matmul_flops(1, -1, 1, 1), emugpu::Error);
}

TEST(OpCost, StridedInputGradientDoesTheForwardsFlops) {
  emugpu::GemmShape g[3];
  const auto flops = [](const emugpu::GemmShape& x) { return 2 * x.batch * x.m * x.n * x.k; };
  // resnet's 3x3 stride-2 convolution 56x56 -> 28x28: each input pixel gets 9/4 taps.
  const emugpu::ConvShape down{32, 128, 56, 56, 128, 3, 3, 28, 28, 1, 2};
  ASSERT_EQ(emugpu::conv_gemms(down, true, true, false, g), 2);
  EXPECT_DOUBLE_EQ(g[1].m, 32 * 56 * 56);
  EXPECT_DOUBLE_EQ(g[1].k, 128 * 2.25);
  EXPECT_DOUBLE_EQ(flops(g[1]), flops(g[0]));
  // A 1x1 stride-2 projection reaches a quarter of the input pixels, one tap each.
  const emugpu::ConvShape proj{32, 256, 56, 56, 512, 1, 1, 28, 28, 1, 2};
  ASSERT_EQ(emugpu::conv_gemms(proj, true, true, false, g), 2);
  EXPECT_DOUBLE_EQ(g[1].m, 32 * 28 * 28);
  EXPECT_DOUBLE_EQ(g[1].k, 512);
  EXPECT_DOUBLE_EQ(flops(g[1]), flops(g[0]));
}

TEST(OpCost, AttentionBackwardIsTwoAndAHalfForwards) {
  const double f = emugpu::attention_flops(12, 1024, 1024, 64, 64, false);
  EXPECT_DOUBLE_EQ(f, 2.0 * 12 * 1024 * 1024 * 128);
  EXPECT_DOUBLE_EQ(emugpu::attention_flops(12, 1024, 1024, 64, 64, true), 2.5 * f);
  EXPECT_DOUBLE_EQ(emugpu::norm_flops(100), 800);
}

TEST(OpCost, LongSoftmaxRowsAreReadOncePerPass) {
  // 1000 float32 classes stay on chip; GPT-2's 50257 (201 KB a row) do not.
  EXPECT_EQ(emugpu::softmax_row_reads(1000 * 4, false), 1);
  EXPECT_EQ(emugpu::softmax_row_reads(1000 * 4, true), 1);
  EXPECT_EQ(emugpu::softmax_row_reads(48 * 1024, false), 1);
  EXPECT_EQ(emugpu::softmax_row_reads(50257 * 4, false), 3);  // maximum, sum of exponentials, output
  EXPECT_EQ(emugpu::softmax_row_reads(50257 * 4, true), 2);   // the row's sum, then the gradient
}

TEST(OpCost, SparseProductsScaleWithStoredEntriesNotDenseSize) {
  // A 100k x 100k adjacency with 1M entries times 64 features: the dense
  // product would be 2 * 1e10 * 64 FLOPs.
  EXPECT_DOUBLE_EQ(emugpu::spmm_flops(1e6, 1, 64), 2.0 * 1e6 * 64);
  EXPECT_DOUBLE_EQ(emugpu::spmm_flops(1e6, 4, 64), 4 * 2.0 * 1e6 * 64);  // hybrid: blocks of 4 values
  const double sparse = 1e6 * (2 * 8 + 4), out = 1e5 * 64 * 4;
  EXPECT_DOUBLE_EQ(emugpu::spmm_bytes(1e6, sparse, 64, 4, out), sparse + 1e6 * 64 * 4 + out);
  EXPECT_LT(emugpu::spmm_bytes(2e5, sparse, 64, 4, out), emugpu::spmm_bytes(1e6, sparse, 64, 4, out));
  EXPECT_THROW(emugpu::spmm_flops(-1, 1, 64), emugpu::Error);
  EXPECT_THROW(emugpu::spmm_bytes(1, 0, -64, 4, 0), emugpu::Error);
}

}  // namespace
