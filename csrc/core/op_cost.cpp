#include "op_cost.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "error.h"

namespace emugpu {

OpFamily op_family(std::string_view aten_name) {
  static const std::unordered_map<std::string_view, OpFamily> table = {
      {"aten::mm", OpFamily::kMm}, {"aten::bmm", OpFamily::kBmm},
      {"aten::addmm", OpFamily::kAddmm}, {"aten::_addmm_activation", OpFamily::kAddmm},
      {"aten::baddbmm", OpFamily::kBaddbmm},
      {"aten::convolution", OpFamily::kConv}, {"aten::convolution_overrideable", OpFamily::kConv},
      {"aten::convolution_backward", OpFamily::kConvBackward},
      {"aten::convolution_backward_overrideable", OpFamily::kConvBackward},
      {"aten::_scaled_dot_product_fused_attention_overrideable", OpFamily::kAttention},
      {"aten::_scaled_dot_product_flash_attention", OpFamily::kAttention},
      {"aten::_scaled_dot_product_efficient_attention", OpFamily::kAttention},
      {"aten::_scaled_dot_product_fused_attention_overrideable_backward", OpFamily::kAttentionBackward},
      {"aten::_scaled_dot_product_flash_attention_backward", OpFamily::kAttentionBackward},
      {"aten::_scaled_dot_product_efficient_attention_backward", OpFamily::kAttentionBackward},
      {"aten::native_layer_norm", OpFamily::kNorm}, {"aten::native_layer_norm_backward", OpFamily::kNorm},
      {"aten::native_batch_norm", OpFamily::kNorm}, {"aten::native_batch_norm_backward", OpFamily::kNorm},
      {"aten::_native_batch_norm_legit", OpFamily::kNorm},
      {"aten::_native_batch_norm_legit_no_training", OpFamily::kNorm},
      {"aten::_batch_norm_with_update", OpFamily::kNorm}, {"aten::batch_norm_backward", OpFamily::kNorm},
      {"aten::native_group_norm", OpFamily::kNorm}, {"aten::native_group_norm_backward", OpFamily::kNorm},
      {"aten::_fused_rms_norm", OpFamily::kNorm},
  };
  auto it = table.find(aten_name);
  return it == table.end() ? OpFamily::kElementwise : it->second;
}

const char* op_family_name(OpFamily family) {
  switch (family) {
    case OpFamily::kElementwise: return "elementwise and other (by bytes)";
    case OpFamily::kNorm: return "normalization";
    case OpFamily::kMm: return "matmul (mm)";
    case OpFamily::kBmm: return "batched matmul (bmm)";
    case OpFamily::kAddmm: return "matmul + bias (addmm)";
    case OpFamily::kBaddbmm: return "batched matmul + bias (baddbmm)";
    case OpFamily::kConv: return "convolution forward";
    case OpFamily::kConvBackward: return "convolution backward";
    case OpFamily::kAttention: return "attention forward";
    case OpFamily::kAttentionBackward: return "attention backward";
    case OpFamily::kCopy: return "copies within the GPU";
  }
  return "?";
}

bool uses_cublas(OpFamily f) {
  return f == OpFamily::kMm || f == OpFamily::kBmm || f == OpFamily::kAddmm || f == OpFamily::kBaddbmm;
}

bool uses_cudnn(OpFamily f) { return f == OpFamily::kConv || f == OpFamily::kConvBackward; }

double matmul_flops(double batch, double m, double k, double n) {
  EMUGPU_CHECK(batch >= 0 && m >= 0 && k >= 0 && n >= 0, kValue, "matmul sizes must be >= 0, got batch ", batch,
               ", m ", m, ", k ", k, ", n ", n);
  return 2.0 * batch * m * k * n;
}

double conv_flops(double out_numel, double weight_numel, double out_channels, int passes) {
  EMUGPU_CHECK(passes >= 0 && passes <= 2, kValue, "a convolution backward runs 0 to 2 passes, got ", passes);
  const double per_output = weight_numel / std::max(out_channels, 1.0);
  return 2.0 * out_numel * per_output * passes;
}

double attention_flops(double batch_heads, double l, double s, double e, double ev, bool backward) {
  const double forward = 2.0 * batch_heads * l * s * (e + ev);
  return backward ? 2.5 * forward : forward;
}

double norm_flops(double numel) { return 8.0 * numel; }

double spmm_flops(double nnz, double entry_numel, double n) {
  EMUGPU_CHECK(nnz >= 0 && entry_numel >= 0 && n >= 0, kValue, "SpMM sizes must be >= 0, got nnz ", nnz,
               ", entry size ", entry_numel, ", n ", n);
  return 2.0 * nnz * entry_numel * n;
}

double spmm_bytes(double nnz, double sparse_bytes, double n, double element_size, double out_bytes) {
  EMUGPU_CHECK(nnz >= 0 && sparse_bytes >= 0 && n >= 0 && element_size >= 0 && out_bytes >= 0, kValue,
               "SpMM sizes must be >= 0, got nnz ", nnz, ", sparse bytes ", sparse_bytes, ", n ", n,
               ", element size ", element_size, ", output bytes ", out_bytes);
  return sparse_bytes + nnz * n * element_size + out_bytes;
}

}  // namespace emugpu
