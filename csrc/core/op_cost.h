// What an aten op costs in FLOPs, by op family. The glue measures tensors
// (bytes read and written); these formulas say how much arithmetic the
// families that do more than one operation per element perform.
#pragma once

#include <array>
#include <string_view>

namespace emugpu {

enum class OpFamily {
  kElementwise,  // one operation per output element: pointwise ops, pooling, fills, random
  kReduction,    // sums, means, softmax and losses: one operation per input element
  kNorm,         // layer, group and RMS norms: a row per block, kept on chip
  kMm,
  kBmm,
  kAddmm,
  kBaddbmm,
  kConv,
  kConvBackward,
  kAttention,
  kAttentionBackward,
  kGather,       // embedding, index_select, gather/scatter, index_put: bytes moved, scattered
  kOptimizer,    // _foreach_* and _fused_* kernels: a few launches over many tensors
  kCopy,         // copies and concatenations within one GPU (read + write)
  kUnmodelled,   // no family known: charged by the bytes it moves, as an elementwise kernel
  kBatchNorm,    // statistics over N*H*W per channel, then normalisation: strided, two passes
  kRnn,          // a whole cuDNN RNN forward (aten::_cudnn_rnn): all layers and timesteps (rnn_cost.h)
  kRnnBackward,  // its backward (aten::_cudnn_rnn_backward): data and weight gradients
};
constexpr int kOpFamilyCount = 18;

// "matmul", "convolution", ...: how cost_report() names a family.
const char* op_family_name(OpFamily family);

// The family of an aten operator ("aten::mm"). Ops outside the name table
// are kElementwise when PyTorch tags them pointwise, kReduction when tagged
// reduction, and kUnmodelled otherwise.
OpFamily op_family(std::string_view aten_name, bool pointwise_tag = false, bool reduction_tag = false);
// Families timed as GEMMs (the others are timed by the bytes they move).
bool is_gemm_family(OpFamily family);

// One GEMM-shaped kernel: `batch` independent (m x k) @ (k x n) products.
struct GemmShape {
  double batch = 1;
  double m = 0;
  double n = 0;
  double k = 0;
  bool winograd = false;     // a 3x3 stride-1 convolution pass cuDNN may run as Winograd
  bool weight_grad = false;  // a convolution's weight gradient (a reduction over N*P*Q per filter tap)
  // An operand's leading dimension (its row stride in memory) is not in
  // 16-byte groups, whatever m, n and k are: a transposed view of a matrix
  // with an odd width (GPT-2 head's weight gradient reads dY^T, whose
  // leading dimension is the 50257 words).
  bool unaligned_ld = false;
};

// A 2-D convolution: N images of C x H x W, K filters of C/groups x R x S,
// outputs of P x Q.
struct ConvShape {
  double n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, s = 0, p = 0, q = 0, groups = 1;
  double stride = 1;
  bool channels_last = false;  // NHWC activations: tensor-core kernels need no layout transforms
};

// The GEMMs a convolution runs as implicit GEMMs (cuDNN's default form):
// forward (N*P*Q x K/g, reduction C/g*R*S per group), the input gradient
// (N*H*W x C/g over K/g*R*S, over R*S/stride^2 taps when strided) and the weight gradient (K/g x C/g*R*S over
// N*P*Q). Returns how many of `out` it filled: one per pass asked for.
int conv_gemms(const ConvShape& conv, bool forward, bool input_grad, bool weight_grad, GemmShape* out);
// True for the families whose fp32 math runs on tensor cores as TF32 when
// cuBLAS (matmuls) or cuDNN (convolutions) allow it.
bool uses_cublas(OpFamily family);
bool uses_cudnn(OpFamily family);

// 2 * batch * m * k * n multiply-adds of a (batched) matrix product.
double matmul_flops(double batch, double m, double k, double n);
// Fused attention over (batch * heads) sequences of L queries and S keys,
// head sizes E (queries/keys) and Ev (values); the backward does 2.5 times
// the forward's work (it recomputes the scores).
double attention_flops(double batch_heads, double l, double s, double e, double ev, bool backward);
// Mean, variance, scale and shift in a few passes: about eight per element.
double norm_flops(double numel);
// How many times a row-wise softmax kernel reads its input rows (forward:
// the input; backward: the gradient, and for softmax the output too). Rows
// that fit a block's default shared memory (48 KiB) or a warp's registers
// are read once; longer ones once per pass: three forward (maximum, sum of
// exponentials, output), two backward (the row's sum, then the gradient).
double softmax_row_reads(double row_bytes, bool backward);
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
