#include "op_cost.h"

#include <gtest/gtest.h>

#include "error.h"

namespace {

using emugpu::OpFamily;

TEST(OpCost, FamiliesComeFromTheAtenName) {
  EXPECT_EQ(emugpu::op_family("aten::addmm"), OpFamily::kAddmm);
  EXPECT_EQ(emugpu::op_family("aten::convolution_backward"), OpFamily::kConvBackward);
  EXPECT_EQ(emugpu::op_family("aten::native_layer_norm"), OpFamily::kNorm);
  EXPECT_EQ(emugpu::op_family("aten::add"), OpFamily::kElementwise);
  EXPECT_TRUE(emugpu::uses_cublas(OpFamily::kBmm));
  EXPECT_TRUE(emugpu::uses_cudnn(OpFamily::kConv));
  EXPECT_FALSE(emugpu::uses_cublas(OpFamily::kConv));
}

TEST(OpCost, MatmulCountsTwoFlopsPerMultiplyAdd) {
  EXPECT_DOUBLE_EQ(emugpu::matmul_flops(1, 64, 128, 32), 2.0 * 64 * 128 * 32);
  EXPECT_DOUBLE_EQ(emugpu::matmul_flops(8, 4, 4, 4), 8 * 2.0 * 64);
  EXPECT_THROW(emugpu::matmul_flops(1, -1, 1, 1), emugpu::Error);
}

TEST(OpCost, ConvolutionBackwardCountsItsPasses) {
  // resnet's first conv: 64 filters of 3x7x7 over a 112x112 output, batch 1.
  const double out = 64.0 * 112 * 112, weight = 64.0 * 3 * 7 * 7;
  EXPECT_DOUBLE_EQ(emugpu::conv_flops(out, weight, 64, 1), 2 * out * 147);
  EXPECT_DOUBLE_EQ(emugpu::conv_flops(out, weight, 64, 2), 4 * out * 147);
  EXPECT_EQ(emugpu::conv_flops(out, weight, 64, 0), 0);
  EXPECT_THROW(emugpu::conv_flops(out, weight, 64, 3), emugpu::Error);
}

TEST(OpCost, AttentionBackwardIsTwoAndAHalfForwards) {
  const double f = emugpu::attention_flops(12, 1024, 1024, 64, 64, false);
  EXPECT_DOUBLE_EQ(f, 2.0 * 12 * 1024 * 1024 * 128);
  EXPECT_DOUBLE_EQ(emugpu::attention_flops(12, 1024, 1024, 64, 64, true), 2.5 * f);
  EXPECT_DOUBLE_EQ(emugpu::norm_flops(100), 800);
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
