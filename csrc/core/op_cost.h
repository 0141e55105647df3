// What an aten op costs in FLOPs, by op family. The glue measures tensors
// (bytes read and written); these formulas say how much arithmetic the
// families that do more than one operation per element perform.
#pragma once

#include <string_view>

namespace emugpu {

enum class OpFamily {
  kElementwise,  // one operation per output (or input, for reductions) element
  kNorm,
  kMm,
  kBmm,
  kAddmm,
  kBaddbmm,
  kConv,
  kConvBackward,
  kAttention,
  kAttentionBackward,
  kCopy,  // a copy within one GPU (read + write), charged by CostModel::device_copy
};
constexpr int kOpFamilyCount = 11;

// "matmul", "convolution", ...: how cost_report() names a family.
const char* op_family_name(OpFamily family);

// The family of an aten operator ("aten::mm"); kElementwise for the rest.
OpFamily op_family(std::string_view aten_name);
// True for the families whose fp32 math runs on tensor cores as TF32 when
// cuBLAS (matmuls) or cuDNN (convolutions) allow it.
bool uses_cublas(OpFamily family);
bool uses_cudnn(OpFamily family);

// 2 * batch * m * k * n multiply-adds of a (batched) matrix product.
double matmul_flops(double batch, double m, double k, double n);
// A convolution producing `out_numel` outputs from a weight of
// `weight_numel` elements over `out_channels` filters; its backward runs
// `passes` kernels (input and/or weight gradients).
double conv_flops(double out_numel, double weight_numel, double out_channels, int passes);
// Fused attention over (batch * heads) sequences of L queries and S keys,
// head sizes E (queries/keys) and Ev (values); the backward does 2.5 times
// the forward's work (it recomputes the scores).
double attention_flops(double batch_heads, double l, double s, double e, double ev, bool backward);
// Mean, variance, scale and shift in a few passes: about eight per element.
double norm_flops(double numel);
// A sparse x dense product (cuSPARSE SpMM): each of `nnz` stored entries
// (blocks of `entry_numel` values in hybrid tensors) multiplies `n` dense
// elements, 2 FLOPs each.
double spmm_flops(double nnz, double entry_numel, double n);
// The bytes SpMM moves: the sparse operand once (`sparse_bytes`: indices and
// values), one gathered row of `n` dense elements per stored entry (sparse
// rows hit scattered dense rows, so there is little cache reuse to count on),
// and the output once.
double spmm_bytes(double nnz, double sparse_bytes, double n, double element_size, double out_bytes);

}  // namespace emugpu
