#include "op_cost.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "error.h"

namespace emugpu {

namespace {

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// Activations and their backward and in-place forms: PyTorch tags only some
// of them pointwise in C++ (threshold_backward and hardswish are not).
bool is_activation(std::string_view name) {
  static const std::unordered_map<std::string_view, bool> bases = {
      {"threshold", true},   {"relu", true},        {"relu6", true},
      {"hardswish", true},   {"hardsigmoid", true}, {"hardtanh", true},
      {"gelu", true},        {"silu", true},        {"mish", true},
      {"elu", true},         {"leaky_relu", true},  {"softplus", true},
      {"sigmoid", true},     {"tanh", true},        {"log_sigmoid_forward", true},
      {"log_sigmoid", true}, {"prelu", true},       {"rrelu_with_noise", true},
      {"celu", true},        {"selu", true},        {"glu", true},
  };
  if (!starts_with(name, "aten::")) return false;
  name.remove_prefix(6);
  constexpr std::string_view kBackward = "_backward";
  if (name.size() > kBackward.size() && name.substr(name.size() - kBackward.size()) == kBackward) {
    name.remove_suffix(kBackward.size());
  }
  if (!name.empty() && name.back() == '_') name.remove_suffix(1);
  return bases.count(name) != 0;
}

}  // namespace

OpFamily op_family(std::string_view aten_name, bool pointwise_tag, bool reduction_tag) {
  using F = OpFamily;
  static const std::unordered_map<std::string_view, OpFamily> table = {
      {"aten::mm", F::kMm},
      {"aten::bmm", F::kBmm},
      {"aten::addmm", F::kAddmm},
      {"aten::_addmm_activation", F::kAddmm},
      {"aten::baddbmm", F::kBaddbmm},
      {"aten::convolution", F::kConv},
      {"aten::convolution_overrideable", F::kConv},
      {"aten::convolution_backward", F::kConvBackward},
      {"aten::convolution_backward_overrideable", F::kConvBackward},
      {"aten::_scaled_dot_product_fused_attention_overrideable", F::kAttention},
      {"aten::_scaled_dot_product_flash_attention", F::kAttention},
      {"aten::_scaled_dot_product_efficient_attention", F::kAttention},
      {"aten::_scaled_dot_product_cudnn_attention", F::kAttention},
      {"aten::_scaled_dot_product_fused_attention_overrideable_backward", F::kAttentionBackward},
      {"aten::_scaled_dot_product_flash_attention_backward", F::kAttentionBackward},
      {"aten::_scaled_dot_product_efficient_attention_backward", F::kAttentionBackward},
      {"aten::_scaled_dot_product_cudnn_attention_backward", F::kAttentionBackward},
      {"aten::native_layer_norm", F::kNorm},
      {"aten::native_layer_norm_backward", F::kNorm},
      {"aten::native_batch_norm", F::kBatchNorm},
      {"aten::native_batch_norm_backward", F::kBatchNorm},
      {"aten::_native_batch_norm_legit", F::kBatchNorm},
      {"aten::_native_batch_norm_legit_no_training", F::kBatchNorm},
      {"aten::_batch_norm_with_update", F::kBatchNorm},
      {"aten::batch_norm_backward", F::kBatchNorm},
      {"aten::native_group_norm", F::kNorm},
      {"aten::native_group_norm_backward", F::kNorm},
      {"aten::_fused_rms_norm", F::kNorm},
      {"aten::_fused_rms_norm_backward", F::kNorm},
      {"aten::_cudnn_rnn", F::kRnn},
      {"aten::_cudnn_rnn_backward", F::kRnnBackward},
      // Row reductions that PyTorch does not tag as reductions.
      {"aten::_softmax", F::kReduction},
      {"aten::_log_softmax", F::kReduction},
      {"aten::_softmax_backward_data", F::kReduction},
      {"aten::_log_softmax_backward_data", F::kReduction},
      {"aten::nll_loss_forward", F::kReduction},
      {"aten::nll_loss_backward", F::kReduction},
      {"aten::nll_loss2d_forward", F::kReduction},
      {"aten::nll_loss2d_backward", F::kReduction},
      {"aten::mse_loss", F::kReduction},
      {"aten::mse_loss_backward", F::kReduction},
      {"aten::smooth_l1_loss", F::kReduction},
      {"aten::smooth_l1_loss_backward", F::kReduction},
      {"aten::binary_cross_entropy", F::kReduction},
      {"aten::binary_cross_entropy_backward", F::kReduction},
      {"aten::cumsum", F::kReduction},
      {"aten::cumprod", F::kReduction},
      {"aten::sort", F::kReduction},
      {"aten::topk", F::kReduction},
      {"aten::kthvalue", F::kReduction},
      {"aten::_cdist_forward", F::kReduction},
      {"aten::_masked_softmax", F::kReduction},
      // Window, fill and random kernels: one pass over their outputs.
      {"aten::max_pool2d_with_indices", F::kElementwise},
      {"aten::max_pool2d_with_indices_backward", F::kElementwise},
      {"aten::max_pool3d_with_indices", F::kElementwise},
      {"aten::max_pool3d_with_indices_backward", F::kElementwise},
      {"aten::avg_pool2d", F::kElementwise},
      {"aten::avg_pool2d_backward", F::kElementwise},
      {"aten::avg_pool3d", F::kElementwise},
      {"aten::avg_pool3d_backward", F::kElementwise},
      {"aten::_adaptive_avg_pool2d", F::kElementwise},
      {"aten::_adaptive_avg_pool2d_backward", F::kElementwise},
      {"aten::adaptive_max_pool2d", F::kElementwise},
      {"aten::adaptive_max_pool2d_backward", F::kElementwise},
      {"aten::upsample_nearest2d", F::kElementwise},
      {"aten::upsample_nearest2d_backward", F::kElementwise},
      {"aten::upsample_bilinear2d", F::kElementwise},
      {"aten::upsample_bilinear2d_backward", F::kElementwise},
      {"aten::native_dropout", F::kElementwise},
      {"aten::native_dropout_backward", F::kElementwise},
      {"aten::fill_", F::kElementwise},
      {"aten::zero_", F::kElementwise},
      {"aten::uniform_", F::kElementwise},
      {"aten::normal_", F::kElementwise},
      {"aten::bernoulli_", F::kElementwise},
      {"aten::random_", F::kElementwise},
      {"aten::arange", F::kElementwise},
      {"aten::constant_pad_nd", F::kElementwise},
      {"aten::reflection_pad2d", F::kElementwise},
      {"aten::masked_fill_", F::kElementwise},
      // Memory movement.
      {"aten::cat", F::kCopy},
      {"aten::stack", F::kCopy},
      {"aten::clone", F::kCopy},
      {"aten::_to_copy", F::kCopy},
      {"aten::copy_", F::kCopy},
      {"aten::repeat", F::kCopy},
      {"aten::flip", F::kCopy},
      {"aten::roll", F::kCopy},
      {"aten::tril", F::kCopy},
      {"aten::triu", F::kCopy},
      // Scattered reads and writes.
      {"aten::embedding", F::kGather},
      {"aten::embedding_dense_backward", F::kGather},
      {"aten::index_select", F::kGather},
      {"aten::gather", F::kGather},
      {"aten::scatter", F::kGather},
      {"aten::scatter_add", F::kGather},
      {"aten::scatter_add_", F::kGather},
      {"aten::scatter_", F::kGather},
      {"aten::index", F::kGather},
      {"aten::index_put_", F::kGather},
      {"aten::_index_put_impl_", F::kGather},
      {"aten::index_add_", F::kGather},
      {"aten::index_add", F::kGather},
      {"aten::index_copy_", F::kGather},
      {"aten::masked_scatter_", F::kGather},
      {"aten::embedding_bag", F::kGather},
      {"aten::_embedding_bag", F::kGather},
      {"aten::_embedding_bag_backward", F::kGather},
      {"aten::_embedding_bag_dense_backward", F::kGather},
  };
  auto it = table.find(aten_name);
  if (it != table.end()) return it->second;
  if (starts_with(aten_name, "aten::_foreach_") || starts_with(aten_name, "aten::_fused_") ||
      starts_with(aten_name, "aten::_amp_foreach_")) {
    return F::kOptimizer;
  }
  if (pointwise_tag || is_activation(aten_name)) return F::kElementwise;
  if (reduction_tag) return F::kReduction;
  return F::kUnmodelled;
}

bool is_gemm_family(OpFamily f) {
  switch (f) {
    case OpFamily::kMm:
    case OpFamily::kBmm:
    case OpFamily::kAddmm:
    case OpFamily::kBaddbmm:
    case OpFamily::kConv:
    case OpFamily::kConvBackward:
    case OpFamily::kAttention:
    case OpFamily::kAttentionBackward: return true;
    default: return false;
  }
}

int conv_gemms(const ConvShape& c, bool forward, bool input_grad, bool weight_grad, GemmShape* out) {
  EMUGPU_CHECK(c.groups >= 1 && c.n >= 0 && c.c >= 0 && c.k >= 0 && c.h >= 0 && c.w >= 0 && c.r >= 0 && c.s >= 0 &&
                   c.p >= 0 && c.q >= 0,
               kValue, "convolution sizes must be >= 0 and groups >= 1, got N ", c.n, ", C ", c.c, ", K ", c.k,
               ", groups ", c.groups);
  const double g = c.groups;
  const bool winograd = c.r == 3 && c.s == 3 && c.stride == 1 && c.c > g;
  int count = 0;
  if (forward) out[count++] = {g, c.n * c.p * c.q, c.k / g, c.c / g * c.r * c.s, winograd};
  if (input_grad) {
    // A strided input gradient reaches each input pixel through R/stride x
    // S/stride taps only (cuDNN skips the zeros); a filter narrower than the
    // stride reaches only R/stride of the pixels. Either way its FLOPs are
    // the forward's, not stride^2 times them.
    const double stride = std::max(c.stride, 1.0);
    const double taps_r = std::max(c.r / stride, 1.0), taps_s = std::max(c.s / stride, 1.0);
    const double rows = c.h * std::min(c.r / stride, 1.0), cols = c.w * std::min(c.s / stride, 1.0);
    out[count++] = {g, c.n * rows * cols, c.c / g, c.k / g * taps_r * taps_s, winograd};
  }
  if (weight_grad) out[count++] = {g, c.k / g, c.c / g * c.r * c.s, c.n * c.p * c.q, false, true};
  return count;
}

const char* op_family_name(OpFamily family) {
  switch (family) {
    case OpFamily::kElementwise: return "elementwise";
    case OpFamily::kReduction: return "reductions, softmax and losses";
    case OpFamily::kNorm: return "normalization (layer, group, RMS)";
    case OpFamily::kBatchNorm: return "batch normalization";
    case OpFamily::kMm: return "matmul (mm)";
    case OpFamily::kBmm: return "batched matmul (bmm)";
    case OpFamily::kAddmm: return "matmul + bias (addmm)";
    case OpFamily::kBaddbmm: return "batched matmul + bias (baddbmm)";
    case OpFamily::kConv: return "convolution forward";
    case OpFamily::kConvBackward: return "convolution backward";
    case OpFamily::kAttention: return "attention forward";
    case OpFamily::kAttentionBackward: return "attention backward";
    case OpFamily::kGather: return "embedding, gather and scatter";
    case OpFamily::kOptimizer: return "optimizer (foreach and fused)";
    case OpFamily::kCopy: return "copies within the GPU";
    case OpFamily::kUnmodelled: return "unmodelled (by bytes)";
    case OpFamily::kRnn: return "recurrent layers forward (cuDNN RNN)";
    case OpFamily::kRnnBackward: return "recurrent layers backward (cuDNN RNN)";
  }
  return "?";
}

bool uses_cublas(OpFamily f) {
  return f == OpFamily::kMm || f == OpFamily::kBmm || f == OpFamily::kAddmm || f == OpFamily::kBaddbmm;
}

bool uses_cudnn(OpFamily f) { return f == OpFamily::kConv || f == OpFamily::kConvBackward; }

double matmul_flops(double batch, double m, double k, double n) {
  EMUGPU_CHECK(batch >= 0 && m >= 0 && k >= 0 && n >= 0, kValue, "matmul sizes must be >= 0, got batch ", batch, ", m ",
               m, ", k ", k, ", n ", n);
  return 2.0 * batch * m * k * n;
}

double attention_flops(double batch_heads, double l, double s, double e, double ev, bool backward) {
  const double forward = 2.0 * batch_heads * l * s * (e + ev);
  return backward ? 2.5 * forward : forward;
}

double norm_flops(double numel) { return 8.0 * numel; }

double softmax_row_reads(double row_bytes, bool backward) {
  constexpr double kOnChipBytes = 48 * 1024;
  if (row_bytes <= kOnChipBytes) return 1;
  return backward ? 2 : 3;
}

double spmm_flops(double nnz, double entry_numel, double n) {
  EMUGPU_CHECK(nnz >= 0 && entry_numel >= 0 && n >= 0, kValue, "SpMM sizes must be >= 0, got nnz ", nnz,
               ", entry size ", entry_numel, ", n ", n);
  return 2.0 * nnz * entry_numel * n;
}

double spmm_bytes(double nnz, double sparse_bytes, double n, double element_size, double out_bytes) {
  EMUGPU_CHECK(nnz >= 0 && sparse_bytes >= 0 && n >= 0 && element_size >= 0 && out_bytes >= 0, kValue,
               "SpMM sizes must be >= 0, got nnz ", nnz, ", sparse bytes ", sparse_bytes, ", n ", n, ", element size ",
               element_size, ", output bytes ", out_bytes);
  return sparse_bytes + nnz * n * element_size + out_bytes;
}

}  // namespace emugpu
