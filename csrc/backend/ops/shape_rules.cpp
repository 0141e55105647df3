#include "backend/ops/shape_rules.h"

#include <ATen/ATen.h>

#include "backend/ops/tensor_util.h"

namespace emugpu {
namespace {

at::Tensor to_meta(const at::Tensor& t) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                       c10::DataPtr(nullptr, c10::Device(c10::kMeta)), c10::GetAllocator(c10::kMeta),
                       /*resizable=*/true);
  auto meta = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::Meta),
                                                       t.dtype());
  meta.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return meta;
}

c10::IValue meta_arg(const c10::IValue& v) {
  if (v.isDevice() && v.toDevice().type() == kEmu) return c10::Device(c10::kMeta);
  if (v.isGenerator()) return c10::IValue();  // meta kernels ignore the generator
  return map_tensors(v, [](const at::Tensor& t) { return is_emu(t) ? to_meta(t) : t; });
}

// Upper bound for data-dependent outputs: every element selected, all distinct.
at::Tensor meta_empty(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).device(c10::kMeta));
}

void run_data_dependent(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack& meta_stack,
                        size_t num_args) {
  auto args = torch::jit::last(meta_stack, num_args);
  const at::Tensor self = args[0].isTensor() ? args[0].toTensor() : at::Tensor();
  std::vector<c10::IValue> results;
  switch (info.data_dependent) {
    case DataDependent::kNonzero: results.emplace_back(meta_empty({self.numel(), self.dim()}, at::kLong)); break;
    case DataDependent::kMaskedSelect: {
      const auto shape = at::infer_size(self.sizes(), args[1].toTensor().sizes());
      results.emplace_back(meta_empty({c10::multiply_integers(shape)}, self.scalar_type()));
      break;
    }
    case DataDependent::kUnique2: {
      const bool inverse = num_args > 2 && args[2].toBool();
      const bool counts = num_args > 3 && args[3].toBool();
      results.emplace_back(meta_empty({self.numel()}, self.scalar_type()));
      results.emplace_back(meta_empty(inverse ? self.sizes() : at::IntArrayRef{0}, at::kLong));
      if (info.name != "aten::_unique") {
        results.emplace_back(meta_empty({counts ? self.numel() : 0}, at::kLong));
      }
      break;
    }
    case DataDependent::kUniqueDim:
    case DataDependent::kUniqueConsecutive: {
      std::optional<int64_t> dim;
      if (info.data_dependent == DataDependent::kUniqueDim)
        dim = args[1].toInt();
      else if (!args[3].isNone())
        dim = args[3].toInt();
      const int64_t n = dim ? self.size(*dim) : self.numel();
      results.emplace_back(dim ? meta_empty(self.sizes(), self.scalar_type()) : meta_empty({n}, self.scalar_type()));
      results.emplace_back(meta_empty(dim ? at::IntArrayRef{n} : self.sizes(), at::kLong));
      results.emplace_back(meta_empty({n}, at::kLong));
      break;
    }
    case DataDependent::kIndexWithMask: {
      // Boolean masks become index tensors as long as the mask: the policy
      // of nonzero, applied before the op's own Meta kernel runs.
      auto indices = args[1].toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> expanded;
      for (const std::optional<at::Tensor>& idx : indices) {
        if (idx && (idx->scalar_type() == at::kBool || idx->scalar_type() == at::kByte)) {
          for (int64_t d = 0; d < idx->dim(); ++d) expanded.push_back(meta_empty({idx->numel()}, at::kLong));
        } else {
          expanded.push_back(idx);
        }
      }
      meta_stack[meta_stack.size() - num_args + 1] = expanded;
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta_stack);
      return;
    }
    case DataDependent::kGruCell: {
      // (input_gates, hidden_gates, hx, ...) -> (hy, workspace [B, 5H])
      const at::Tensor hx = args[2].toTensor();
      results.emplace_back(meta_empty(hx.sizes(), hx.scalar_type()));
      results.emplace_back(meta_empty({hx.size(0), 5 * hx.size(1)}, hx.scalar_type()));
      break;
    }
    case DataDependent::kGruCellBackward: {
      // (grad_hy [B, H], workspace, has_bias) -> gates' grads [B, 3H] x2, grad_hx, bias grads [3H] x2
      const at::Tensor grad = args[0].toTensor();
      const int64_t b = grad.size(0), h = grad.size(1);
      const bool bias = args[2].toBool();
      results.emplace_back(meta_empty({b, 3 * h}, grad.scalar_type()));
      results.emplace_back(meta_empty({b, 3 * h}, grad.scalar_type()));
      results.emplace_back(meta_empty({b, h}, grad.scalar_type()));
      results.emplace_back(bias ? meta_empty({3 * h}, grad.scalar_type()) : at::Tensor());
      results.emplace_back(bias ? meta_empty({3 * h}, grad.scalar_type()) : at::Tensor());
      break;
    }
    case DataDependent::kNeedsValues:  // handled before the Meta kernel runs
    case DataDependent::kNone: break;
  }
  torch::jit::drop(meta_stack, num_args);
  for (auto& r : results) meta_stack.push_back(std::move(r));
}

[[noreturn]] void no_shape_rule(const std::string& name, const std::string& why) {
  // Both modes find output shapes before anything else, so compute mode is no way out.
  TORCH_CHECK_NOT_IMPLEMENTED(false, "emugpu: operator '", name, "' has no shape rule (its Meta kernel failed: ", why,
                              "). Run it on the CPU (move its inputs with .cpu()), or report the operator to ",
                              "torch-emugpu.");
}

// cuDNN's memory-format rule for convolutions (PyTorch's
// cudnn_conv_suggest_memory_format): the output, and a backward's input and
// weight gradients, are channels-last when the input or the weight is. The
// Meta kernel leaves them contiguous, so without this a channels_last model
// would turn NCHW after its first convolution and be charged NCHW's layout
// transforms in every later one.
at::MemoryFormat cudnn_conv_memory_format(const at::Tensor& input, const at::Tensor& weight) {
  if (!input.defined() || !weight.defined()) return at::MemoryFormat::Contiguous;
  const at::MemoryFormat in = input.suggest_memory_format(), w = weight.suggest_memory_format();
  if (weight.dim() == 4 && (in == at::MemoryFormat::ChannelsLast || w == at::MemoryFormat::ChannelsLast)) {
    return at::MemoryFormat::ChannelsLast;
  }
  if (weight.dim() == 5 && (in == at::MemoryFormat::ChannelsLast3d || w == at::MemoryFormat::ChannelsLast3d)) {
    return at::MemoryFormat::ChannelsLast3d;
  }
  return at::MemoryFormat::Contiguous;
}

void follow_cudnn_conv_format(const OpInfo& info, const std::vector<c10::IValue>& args, std::vector<OutDesc>& outs) {
  const bool forward = info.name == "aten::convolution";
  if (!forward && info.name != "aten::convolution_backward") return;
  const size_t in = forward ? 0 : 1, w = forward ? 1 : 2;
  if (args.size() <= w || !args[in].isTensor() || !args[w].isTensor()) return;
  const at::Tensor& weight = args[w].toTensor();
  const at::MemoryFormat format = cudnn_conv_memory_format(args[in].toTensor(), weight);
  if (format == at::MemoryFormat::Contiguous) return;
  // The output; or the input and weight gradients (the bias gradient is 1-D).
  const size_t count = forward ? 1 : 2;
  for (size_t i = 0; i < count && i < outs.size(); ++i) {
    if (outs[i].kind != OutDesc::Kind::kTensor || outs[i].tensors.size() != 1) continue;
    TensorDesc& d = outs[i].tensors[0];
    if (static_cast<int64_t>(d.sizes.size()) != weight.dim()) continue;
    d = TensorDesc::of(at::empty(d.sizes, at::TensorOptions().device(at::kMeta).dtype(d.dtype).memory_format(format)));
  }
}

}  // namespace

std::vector<OutDesc> run_shape_rule(const OpInfo& info, const c10::OperatorHandle& op,
                                    const std::vector<c10::IValue>& args, size_t num_args) {
  DataDependent rule = info.data_dependent;
  if (rule == DataDependent::kNeedsValues) {
    // repeat_interleave's output_size, when given, makes its Meta kernel exact.
    const bool sized = info.name == "aten::repeat_interleave" && !args.back().isNone();
    TORCH_CHECK_NOT_IMPLEMENTED(
        sized, "emugpu: the output size of '", info.name,
        "' depends on input values that timing mode never computed (its inputs hold placeholders). "
        "Copy those inputs from the host, pass an explicit size where the op takes one (e.g. "
        "repeat_interleave(..., output_size=N)), or use EMUGPU_MODE=compute.");
    rule = DataDependent::kNone;
  }
  torch::jit::Stack meta_stack;
  meta_stack.reserve(num_args);
  for (const auto& a : args) meta_stack.push_back(meta_arg(a));
  try {
    if (rule != DataDependent::kNone) {
      run_data_dependent(info, op, meta_stack, num_args);
    } else {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta_stack);
    }
  } catch (const c10::NotImplementedError& e) {
    no_shape_rule(info.name, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    if (msg.find("Meta") != std::string::npos || msg.find("meta") != std::string::npos) {
      no_shape_rule(info.name, msg);
    }
    throw;
  }
  std::vector<OutDesc> outs(meta_stack.size());
  for (size_t i = 0; i < meta_stack.size(); ++i) {
    const c10::IValue& m = meta_stack[i];
    OutDesc& o = outs[i];
    if (m.isTensor() && m.toTensor().defined() && m.toTensor().is_meta()) {
      o.kind = OutDesc::Kind::kTensor;
      o.tensors.push_back(TensorDesc::of(m.toTensor()));
    } else if (m.isTensor() && !m.toTensor().defined()) {
      o.kind = OutDesc::Kind::kUndefined;
    } else if (m.isTensorList()) {
      o.kind = OutDesc::Kind::kTensorList;
      for (const at::Tensor& t : m.toTensorList()) o.tensors.push_back(TensorDesc::of(t));
    } else {
      o.other = m;
    }
  }
  follow_cudnn_conv_format(info, args, outs);
  return outs;
}

}  // namespace emugpu
