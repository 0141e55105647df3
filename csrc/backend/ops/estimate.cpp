#include "backend/ops/estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

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

double dim(const at::Tensor& t, int64_t d) { return static_cast<double>(t.size(d)); }

// Input sizes, kernel sizes and output sizes of a convolution as a 2-D
// shape: 1-D and 3-D convolutions fold their spatial dims into H and R.
ConvShape conv_shape(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& output, double groups,
                     double stride) {
  ConvShape c;
  c.n = dim(input, 0);
  c.c = dim(input, 1);
  c.k = dim(output, 1);
  c.groups = groups;
  c.stride = stride;
  const auto format = input.suggest_memory_format();
  c.channels_last = format == at::MemoryFormat::ChannelsLast || format == at::MemoryFormat::ChannelsLast3d;
  const int64_t spatial = input.dim() - 2;
  if (spatial == 2) {
    c.h = dim(input, 2), c.w = dim(input, 3), c.r = dim(weight, 2), c.s = dim(weight, 3);
    c.p = dim(output, 2), c.q = dim(output, 3);
    return c;
  }
  c.h = c.r = c.p = 1;
  c.w = c.s = c.q = 1;
  for (int64_t d = 2; d < input.dim(); ++d) c.h *= dim(input, d), c.r *= dim(weight, d), c.p *= dim(output, d);
  return c;
}

void set_conv(OpCost& cost, const OpInfo& info, const std::vector<at::Tensor>& outputs,
              const std::vector<c10::IValue>& args) {
  const bool forward = info.family == OpFamily::kConv;
  auto arg_int = [&](int index, double fallback) {
    if (index < 0) return fallback;
    const c10::IValue& v = args[static_cast<size_t>(index)];
    if (v.isInt()) return static_cast<double>(v.toInt());
    if (v.isIntList() && !v.toIntVector().empty()) {
      const auto list = v.toIntVector();
      return std::all_of(list.begin(), list.end(), [&](int64_t x) { return x == list[0]; })
                 ? static_cast<double>(list[0])
                 : 0.0;  // mixed strides: no Winograd
    }
    return fallback;
  };
  const double groups = std::max(arg_int(info.groups_arg, 1), 1.0);
  const double stride = arg_int(info.stride_arg, 1);
  const bool transposed = info.transposed_arg >= 0 && args[static_cast<size_t>(info.transposed_arg)].toBool();
  const at::Tensor input = args[forward ? 0 : 1].toTensor();
  const at::Tensor weight = args[forward ? 1 : 2].toTensor();
  const at::Tensor output = forward ? outputs.at(0) : args[0].toTensor();
  bool passes[3] = {forward, false, false};  // forward, input gradient, weight gradient
  int bias = 0;
  if (!forward && info.mask_arg >= 0) {
    const auto mask = args[static_cast<size_t>(info.mask_arg)].toBoolList();
    passes[1] = mask.get(0);
    passes[2] = mask.get(1);
    bias = mask.get(2) ? 1 : 0;
  }
  // A transposed convolution's forward is a convolution's input gradient
  // (and the other way round), with input and output swapped.
  cost.conv = transposed ? conv_shape(output, weight, input, groups, stride)
                         : conv_shape(input, weight, output, groups, stride);
  if (transposed) std::swap(passes[0], passes[1]);
  cost.gemm_count = conv_gemms(cost.conv, passes[0], passes[1], passes[2], cost.gemms.data());
  cost.flops = 0;
  for (int i = 0; i < cost.gemm_count; ++i) {
    const GemmShape& g = cost.gemms[static_cast<size_t>(i)];
    cost.flops += matmul_flops(g.batch, g.m, g.k, g.n);
  }
  cost.kernels = std::max(cost.gemm_count + bias, 1);
}

// CUDA's multi_tensor_apply launches one kernel per chunk of tensors (fewer
// the more lists a kernel walks) and per 320 blocks of 64 Ki elements.
int foreach_kernels(const std::vector<c10::IValue>& args) {
  int depth = 0;
  double tensors = 0, numel = 0;
  for (const auto& a : args) {
    if (!a.isTensorList()) continue;
    ++depth;
    if (depth > 1) continue;
    for (const at::Tensor& t : a.toTensorVector()) tensors += 1, numel += static_cast<double>(t.numel());
  }
  static constexpr double kTensorsPerLaunch[] = {110, 110, 64, 48, 36, 30};
  const double per_launch = kTensorsPerLaunch[std::clamp(depth, 0, 5)];
  const double launches = std::max(std::ceil(tensors / per_launch), std::ceil(numel / (65536.0 * 320)));
  return static_cast<int>(std::clamp(launches, 1.0, 1e6));
}

// PyTorch's rule (_select_batch_norm_backend) for its CUDA batch norms:
// cuDNN unless an operand is bfloat16, or the input is half and the weights
// are not float32, or there are no weights.
bool batch_norm_on_cudnn(const std::vector<c10::IValue>& args, bool backward) {
  const size_t data = backward ? 1 : 0, weight = backward ? 2 : 1;
  if (args.size() <= weight || !args[data].isTensor() || !args[weight].isTensor()) return false;
  const at::Tensor& x = args[data].toTensor();
  const at::Tensor& w = args[weight].toTensor();
  if (!x.defined() || !w.defined()) return false;
  if (x.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kBFloat16) return false;
  return x.scalar_type() != at::kHalf || w.scalar_type() == at::kFloat;
}

// What row-wise softmax and loss kernels read beyond each operand once:
// long softmax rows are read once per pass, nll_loss gathers one logit per
// target (its backward zero-fills the gradient and scatters into it: the
// logits only give the shape).
double reduction_extra_bytes(const OpInfo& info, const std::vector<c10::IValue>& args) {
  auto tensor = [&](size_t i) { return i < args.size() && args[i].isTensor() ? args[i].toTensor() : at::Tensor(); };
  auto row_bytes = [&](const at::Tensor& t, size_t dim_arg) {
    if (!t.defined() || t.dim() == 0 || dim_arg >= args.size() || !args[dim_arg].isInt()) return 0.0;
    const int64_t d = at::maybe_wrap_dim(args[dim_arg].toInt(), t.dim());
    // Softmax over an inner dimension runs other (spatial) kernels.
    if (t.stride(d) != 1) return 0.0;
    return dim(t, d) * static_cast<double>(t.element_size());
  };
  const std::string& n = info.name;
  if (n == "aten::_softmax" || n == "aten::_log_softmax") {
    const at::Tensor x = tensor(0);
    if (!x.defined()) return 0;
    return (softmax_row_reads(row_bytes(x, 1), false) - 1) * numel_bytes(x);
  }
  if (n == "aten::_softmax_backward_data" || n == "aten::_log_softmax_backward_data") {
    const at::Tensor grad = tensor(0), out = tensor(1);
    if (!grad.defined() || !out.defined()) return 0;
    // Softmax's row sum is over grad * output, log-softmax's over grad alone.
    const double reread = numel_bytes(grad) + (n == "aten::_softmax_backward_data" ? numel_bytes(out) : 0);
    return (softmax_row_reads(row_bytes(out, 2), true) - 1) * reread;
  }
  if (n == "aten::nll_loss_forward" || n == "aten::nll_loss2d_forward") {
    const at::Tensor self = tensor(0), target = tensor(1);
    if (!self.defined() || !target.defined()) return 0;
    return static_cast<double>(target.numel() * self.element_size()) - numel_bytes(self);
  }
  if (n == "aten::nll_loss_backward" || n == "aten::nll_loss2d_backward") {
    const at::Tensor self = tensor(1);
    return self.defined() ? -numel_bytes(self) : 0;
  }
  return 0;
}

// Whether PyTorch's TensorIterator runs an elementwise op or copy in its
// vectorised kernel: every operand dense, of the output's sizes and strides,
// and, but for copies (vectorised casts), of one floating dtype (bool masks
// and comparisons' outputs need no cast). A broadcast, strided or
// mixed-dtype operand takes the kernel that loads one element at a time.
// Single elements (scalars) do not count.
bool vectorizable(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs, bool copy) {
  if (outputs.empty() || !outputs.front().defined()) return true;
  const at::Tensor& out = outputs.front();
  if (out.numel() <= 1) return true;
  if (!out.is_non_overlapping_and_dense()) return false;
  std::optional<at::ScalarType> floating;
  bool mixed = false;
  auto same = [&](const at::Tensor& t) {
    if (!t.defined() || t.numel() <= 1) return true;
    if (at::isFloatingType(t.scalar_type())) {
      mixed = mixed || (floating && *floating != t.scalar_type());
      floating = t.scalar_type();
    }
    return t.sizes() == out.sizes() && t.strides() == out.strides();
  };
  const bool dense =
      std::all_of(inputs.begin(), inputs.end(), same) && std::all_of(outputs.begin(), outputs.end(), same);
  return dense && (copy || !mixed);
}

// A sum or mean over outer dimensions that keeps the contiguous inner ones
// (PyTorch's column reduction: a bias gradient sums the rows of dY): the kept
// elements inner to every reduced dimension; 0 for other reductions.
double reduction_columns(const OpInfo& info, const std::vector<c10::IValue>& args) {
  if ((info.name != "aten::sum" && info.name != "aten::mean") || args.size() < 2 || !args[0].isTensor() ||
      !args[1].isIntList()) {
    return 0;
  }
  const at::Tensor& x = args[0].toTensor();
  const auto dims = args[1].toIntVector();
  if (!x.defined() || x.dim() < 2 || dims.empty()) return 0;
  std::vector<bool> reduced(static_cast<size_t>(x.dim()), false);
  for (const int64_t d : dims) reduced[static_cast<size_t>(at::maybe_wrap_dim(d, x.dim()))] = true;
  int64_t innermost_reduced = std::numeric_limits<int64_t>::max();
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (reduced[static_cast<size_t>(i)] && x.size(i) > 1) innermost_reduced = std::min(innermost_reduced, x.stride(i));
  }
  if (innermost_reduced == std::numeric_limits<int64_t>::max()) return 0;
  double columns = 1;
  bool contiguous_kept = false;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (reduced[static_cast<size_t>(i)] || x.size(i) <= 1 || x.stride(i) >= innermost_reduced) continue;
    columns *= dim(x, i);
    contiguous_kept = contiguous_kept || x.stride(i) == 1;
  }
  return contiguous_kept ? columns : 0;
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
  auto size = [&](size_t arg, int64_t d) { return dim(args[arg].toTensor(), d); };
  auto set_gemm = [&](double batch, double m, double k, double n) {
    cost.flops = matmul_flops(batch, m, k, n);
    cost.gemm_count = 1;
    cost.gemms[0] = {batch, m, n, k, false};
  };
  // cuBLAS reads each operand along its leading dimension (the row stride of
  // a row-major matrix, the column stride of a transposed view): one that is
  // not in 16-byte groups sends it to its align1 kernels.
  auto unaligned_ld = [&](size_t arg) {
    if (arg >= args.size() || !args[arg].isTensor()) return false;
    const at::Tensor& t = args[arg].toTensor();
    if (!t.defined() || t.dim() < 2 || t.size(-1) <= 1 || t.size(-2) <= 1) return false;
    const int64_t ld = t.stride(-1) == 1 ? t.stride(-2) : t.stride(-2) == 1 ? t.stride(-1) : 0;
    return ld > 0 && (ld * static_cast<int64_t>(t.element_size())) % 16 != 0;
  };
  auto mark_ld = [&](size_t a, size_t b) { cost.gemms[0].unaligned_ld = unaligned_ld(a) || unaligned_ld(b); };
  switch (info.family) {
    case OpFamily::kMm: set_gemm(1, size(0, 0), size(0, 1), size(1, 1)), mark_ld(0, 1); break;
    case OpFamily::kAddmm: set_gemm(1, size(1, 0), size(1, 1), size(2, 1)), mark_ld(1, 2); break;
    case OpFamily::kBmm: set_gemm(size(0, 0), size(0, 1), size(0, 2), size(1, 2)), mark_ld(0, 1); break;
    case OpFamily::kBaddbmm: set_gemm(size(1, 0), size(1, 1), size(1, 2), size(2, 2)), mark_ld(1, 2); break;
    case OpFamily::kConv:
    case OpFamily::kConvBackward: set_conv(cost, info, outputs, args); break;
    case OpFamily::kAttention:
    case OpFamily::kAttentionBackward: {
      const bool backward = info.family == OpFamily::kAttentionBackward;
      const size_t first = backward ? 1 : 0;
      const at::Tensor q = args[first].toTensor(), k = args[first + 1].toTensor(), v = args[first + 2].toTensor();
      // (B, H, L, E) layout; flash-style kernels never store the L x S
      // matrix, and causal masks skip half of its tiles.
      const bool causal = info.causal_arg >= 0 && args[static_cast<size_t>(info.causal_arg)].isBool() &&
                          args[static_cast<size_t>(info.causal_arg)].toBool();
      const double b_h = static_cast<double>(q.numel()) / (dim(q, -1) * dim(q, -2)) * (causal ? 0.5 : 1.0);
      const double l = dim(q, -2), s = dim(k, -2), e = dim(q, -1), ev = dim(v, -1);
      cost.flops = attention_flops(b_h, l, s, e, ev, backward);
      cost.gemm_count = 1;
      cost.gemms[0] = {b_h, l, s, (e + ev) * (backward ? 2.5 : 1.0), false};
      cost.kernels = backward ? 3 : 1;  // the backward: preprocessing, the main kernel, dQ's conversion
      break;
    }
    case OpFamily::kNorm:
    case OpFamily::kBatchNorm:
      cost.flops = norm_flops(in_numel);
      cost.backward = info.name.find("backward") != std::string::npos;
      if (cost.backward) cost.kernels = 2;
      // Batch norm reads its input twice (statistics over the batch, then
      // normalisation); layer, group and RMS norms keep a row on chip.
      if (!inputs.empty() && info.family == OpFamily::kBatchNorm) {
        if (inputs.front().dim() >= 2) cost.channels = dim(inputs.front(), 1);
        // Eval mode (running statistics: native_batch_norm's `training`
        // false, or the no_training op) normalises in one pass; the core
        // times it from its own bytes (cost_model.cpp).
        cost.running_stats =
            info.name == "aten::_native_batch_norm_legit_no_training" ||
            ((info.name == "aten::native_batch_norm" || info.name == "aten::_native_batch_norm_legit") &&
             args.size() > 5 && args[5].isBool() && !args[5].toBool());
        if (cost.running_stats) {
          const at::Tensor& x = inputs.front();
          if (x.dim() >= 2 && x.size(0) > 0 && x.size(1) > 0) {
            cost.plane = static_cast<double>(x.numel()) / (dim(x, 0) * dim(x, 1));
          }
          cost.cudnn = batch_norm_on_cudnn(args, false);
          break;
        }
        cost.bytes += numel_bytes(inputs.front());
        // Its kernels run at a rate of elements: 16-bit inputs take as long
        // as 32-bit ones (the H100 sweep: 0.9-1.8x the float32 time).
        const auto element = inputs.front().element_size();
        if (element < 4) cost.bytes *= 4.0 / static_cast<double>(element);
        cost.cudnn = batch_norm_on_cudnn(args, cost.backward);
      }
      // Layer norms run a block per row of the normalised shape.
      if (info.name == "aten::native_layer_norm" || info.name == "aten::native_layer_norm_backward") {
        const size_t x = cost.backward ? 1 : 0;
        if (args.size() > x + 1 && args[x].isTensor() && args[x + 1].isIntList()) {
          double width = 1;
          for (const int64_t n : args[x + 1].toIntVector()) width *= static_cast<double>(n);
          cost.columns = width;
          cost.elements = static_cast<double>(args[x].toTensor().numel());
        }
      }
      // Layer norm's backward runs the weight and bias gradients in a
      // kernel of their own (column sums): it reads dy and x once more.
      if (info.name == "aten::native_layer_norm_backward" && info.mask_arg >= 0 && args[0].isTensor() &&
          args[1].isTensor() && args[static_cast<size_t>(info.mask_arg)].isBoolList()) {
        const auto mask = args[static_cast<size_t>(info.mask_arg)].toBoolList();
        if (mask.get(1) || mask.get(2)) {
          cost.bytes += numel_bytes(args[0].toTensor()) + numel_bytes(args[1].toTensor());
        }
      }
      break;
    case OpFamily::kOptimizer: cost.kernels = foreach_kernels(args); break;
    case OpFamily::kReduction:
      cost.bytes = std::max(cost.bytes + reduction_extra_bytes(info, args), 0.0);
      cost.columns = reduction_columns(info, args);
      break;
    case OpFamily::kElementwise:
    case OpFamily::kCopy:
      // Concatenations run batched copies of their own, vectorised where aligned.
      cost.strided = info.name != "aten::cat" && info.name != "aten::stack" &&
                     !vectorizable(inputs, outputs, info.family == OpFamily::kCopy);
      cost.elements = out_numel;
      break;
    case OpFamily::kGather:
    case OpFamily::kUnmodelled: break;
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
  const bool accumulates =
      info.family == OpFamily::kAddmm || info.family == OpFamily::kBaddbmm || info.name == "aten::addmv";
  const bool product =
      accumulates || info.family == OpFamily::kMm || info.family == OpFamily::kBmm || info.name == "aten::mv";
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
