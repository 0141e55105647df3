#include "backend/ops/estimate.h"

#include <algorithm>

#include "backend/ops/sparse_layout.h"
#include "backend/ops/tensor_util.h"

namespace emugpu {
namespace {

DType dtype_class(at::ScalarType s, bool tensor_core_fp32) {
  switch (s) {
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kDouble: return DType::kFloat64;
    case at::kFloat: return tensor_core_fp32 ? DType::kTensorFloat32 : DType::kFloat32;
    default: return at::isFloatingType(s) ? DType::kFloat32 : DType::kInteger;
  }
}

}  // namespace

OpCost estimate(const OpInfo& info, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                const std::vector<c10::IValue>& args) {
  OpCost cost;
  cost.family = info.family;
  double out_numel = 0;
  at::ScalarType dtype = at::kFloat;
  bool found_float = false;
  for (const auto& t : inputs) {
    cost.bytes += numel_bytes(t);
    if (!found_float && at::isFloatingType(t.scalar_type())) dtype = t.scalar_type(), found_float = true;
  }
  for (const auto& t : outputs) {
    cost.bytes += numel_bytes(t);
    out_numel += static_cast<double>(t.numel());
  }
  // Elementwise ops do about one operation per output element, reductions
  // one per input element; the other families count their own (core/op_cost.h).
  const double in_numel = inputs.empty() ? 0 : static_cast<double>(inputs.front().numel());
  cost.flops = std::max(out_numel, in_numel);
  auto size = [&](size_t arg, int64_t dim) { return static_cast<double>(args[arg].toTensor().size(dim)); };
  switch (info.family) {
    case OpFamily::kMm:
      cost.flops = matmul_flops(1, size(0, 0), size(0, 1), size(1, 1));
      break;
    case OpFamily::kAddmm:
      cost.flops = matmul_flops(1, size(1, 0), size(1, 1), size(2, 1));
      break;
    case OpFamily::kBmm:
      cost.flops = matmul_flops(size(0, 0), size(0, 1), size(0, 2), size(1, 2));
      break;
    case OpFamily::kBaddbmm:
      cost.flops = matmul_flops(size(1, 0), size(1, 1), size(1, 2), size(2, 2));
      break;
    case OpFamily::kConv:
    case OpFamily::kConvBackward: {
      const bool forward = info.family == OpFamily::kConv;
      const at::Tensor weight = args[forward ? 1 : 2].toTensor();
      const at::Tensor out = forward ? outputs.at(0) : args[0].toTensor();
      int passes = 1;
      if (!forward) {
        const auto mask = args.back().toBoolList();
        passes = (mask.get(0) ? 1 : 0) + (mask.get(1) ? 1 : 0);
      }
      cost.flops = conv_flops(static_cast<double>(out.numel()), static_cast<double>(weight.numel()),
                              static_cast<double>(weight.size(0)), passes);
      break;
    }
    case OpFamily::kAttention:
    case OpFamily::kAttentionBackward: {
      const size_t first = info.family == OpFamily::kAttention ? 0 : 1;
      const at::Tensor q = args[first].toTensor(), k = args[first + 1].toTensor(), v = args[first + 2].toTensor();
      // (B, H, L, E) layout; flash-style kernels never store the L x S matrix.
      const double b_h = static_cast<double>(q.numel()) / static_cast<double>(q.size(-1) * q.size(-2));
      cost.flops = attention_flops(b_h, static_cast<double>(q.size(-2)), static_cast<double>(k.size(-2)),
                                   static_cast<double>(q.size(-1)), static_cast<double>(v.size(-1)),
                                   info.family == OpFamily::kAttentionBackward);
      break;
    }
    case OpFamily::kNorm:
      cost.flops = norm_flops(in_numel);
      break;
    case OpFamily::kElementwise:
    case OpFamily::kCopy:  // never an aten op's family (op_family): copies are charged by copy_from
      break;
  }
  const bool tf32 = (uses_cublas(info.family) && at::globalContext().allowTF32CuBLAS()) ||
                    (uses_cudnn(info.family) && at::globalContext().allowTF32CuDNN());
  cost.dtype = dtype_class(dtype, tf32);
  return cost;
}

namespace {

double tensor_bytes(const at::Tensor& t) {
  if (!is_sparse_layout(t)) return numel_bytes(t);
  double bytes = 0;
  for (const at::Tensor& m : sparse_members(t)) bytes += numel_bytes(m);
  return bytes;
}

}  // namespace

OpCost estimate_sparse(const OpInfo& info, const std::vector<c10::IValue>& args,
                       const std::vector<at::Tensor>& outputs) {
  OpCost cost;
  cost.family = info.family;
  at::Tensor sparse;
  size_t sparse_arg = 0;
  double in_bytes = 0, numel = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    for_each_tensor(args[i], [&](const at::Tensor& t) {
      if (!is_emu(t)) return;
      if (info.reads[i]) in_bytes += tensor_bytes(t);
      if (is_sparse_layout(t) && !sparse.defined()) sparse = t, sparse_arg = i;
    });
  }
  double out_bytes = 0;
  for (const auto& t : outputs) {
    out_bytes += tensor_bytes(t);
    numel = std::max(numel, static_cast<double>(is_sparse_layout(t) ? sparse_nnz(t) : t.numel()));
  }
  const at::ScalarType dtype = sparse.defined() ? sparse.scalar_type() : at::kFloat;
  cost.dtype = dtype_class(dtype, /*tensor_core_fp32=*/false);  // cuSPARSE runs on the CUDA cores
  const bool accumulates = info.family == OpFamily::kAddmm || info.family == OpFamily::kBaddbmm ||
                           info.name == "aten::addmv";
  const bool product = accumulates || info.family == OpFamily::kMm || info.family == OpFamily::kBmm ||
                       info.name == "aten::mv";
  if (product && sparse.defined() && outputs.size() == 1 && !is_sparse_layout(outputs[0])) {
    const at::Tensor& out = outputs[0];
    const double nnz = static_cast<double>(sparse_nnz(sparse));
    const double entry = nnz > 0 ? static_cast<double>(sparse_members(sparse).back().numel()) / nnz : 1;
    // The first matrix operand sparse: each entry meets a row of the output's
    // columns; the second: a column of its rows.
    const bool first = sparse_arg == (accumulates ? 1u : 0u);
    const double n = out.dim() < 2 ? 1 : static_cast<double>(first ? out.size(-1) : out.size(-2));
    // An accumulated `self` is read once more.
    const double written = out_bytes + (accumulates ? numel_bytes(out) : 0);
    cost.flops = spmm_flops(nnz, entry, n);
    cost.bytes = spmm_bytes(nnz, tensor_bytes(sparse), n, static_cast<double>(out.element_size()), written);
    return cost;
  }
  cost.bytes = in_bytes + out_bytes;
  cost.flops = numel;
  return cost;
}

}  // namespace emugpu
