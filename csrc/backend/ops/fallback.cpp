// The boxed fallback for PrivateUse1: shapes from the op's Meta kernel (or a
// data-dependent shape rule), outputs on the emulated allocator, time from
// the cost model, values from the CPU kernel in compute mode.
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <string_view>
#include <unordered_map>

#include "backend/allocator.h"
#include "backend/ops/common.h"

namespace emugpu {
namespace {

constexpr auto kEmu = c10::DeviceType::PrivateUse1;

enum class Family {
  kElementwise, kNorm, kMm, kBmm, kAddmm, kBaddbmm, kConv, kConvBackward, kAttention, kAttentionBackward,
};

// Ops whose shapes do not come from a Meta kernel: output sizes that depend
// on values (taken from real bytes where the inputs hold them, else an upper
// bound, else an error), and a few ops PyTorch ships without a Meta kernel.
enum class DataDependent {
  kNone, kNonzero, kMaskedSelect, kUnique2, kUniqueDim, kUniqueConsecutive, kIndexWithMask,
  kNeedsValues,  // no bound exists (bincount, repeat_interleave): real inputs or an error
  kGruCell, kGruCellBackward,  // fused GRU cell: no Meta kernel in PyTorch
};

// Output sizes depend on input values (index_put keeps its input's shape).
bool depends_on_values(DataDependent d, const std::string& name) {
  switch (d) {
    case DataDependent::kNone:
    case DataDependent::kGruCell:
    case DataDependent::kGruCellBackward:
      return false;
    case DataDependent::kIndexWithMask:
      return name == "aten::index";
    default:
      return true;
  }
}

struct ReturnInfo {
  int alias_arg = -1;  // argument the return aliases, -1 for a fresh output
  bool write = false;  // in-place / out= (true) or view (false)
};

struct OpInfo {
  std::string name;
  Family family = Family::kElementwise;
  DataDependent data_dependent = DataDependent::kNone;
  bool value_dependent = false;  // output sizes depend on input values
  std::vector<ReturnInfo> returns;
  std::vector<bool> writes;  // per argument: mutated by the op
  std::vector<bool> reads;   // per argument: read by the op (all but out= arguments)
  bool metadata_only = true;  // only views: no kernel runs on the device
  bool per_tensor_devices = false;  // foreach / fused ops: list entries may sit on different devices
  bool host_index_tensors = false;  // CPU index or length tensors are accepted, as CUDA does
};

const c10::AliasInfo* element_alias(const c10::Argument& a) {
  const c10::AliasInfo* info = a.alias_info();
  if (info != nullptr && info->beforeSets().empty() && !info->containedTypes().empty()) {
    return &info->containedTypes()[0];
  }
  return info;
}

Family family_of(const std::string& name) {
  static const std::unordered_map<std::string, Family> table = {
      {"aten::mm", Family::kMm}, {"aten::bmm", Family::kBmm},
      {"aten::addmm", Family::kAddmm}, {"aten::_addmm_activation", Family::kAddmm},
      {"aten::baddbmm", Family::kBaddbmm},
      {"aten::convolution", Family::kConv}, {"aten::convolution_overrideable", Family::kConv},
      {"aten::convolution_backward", Family::kConvBackward},
      {"aten::convolution_backward_overrideable", Family::kConvBackward},
      {"aten::_scaled_dot_product_fused_attention_overrideable", Family::kAttention},
      {"aten::_scaled_dot_product_flash_attention", Family::kAttention},
      {"aten::_scaled_dot_product_efficient_attention", Family::kAttention},
      {"aten::_scaled_dot_product_fused_attention_overrideable_backward", Family::kAttentionBackward},
      {"aten::_scaled_dot_product_flash_attention_backward", Family::kAttentionBackward},
      {"aten::_scaled_dot_product_efficient_attention_backward", Family::kAttentionBackward},
      {"aten::native_layer_norm", Family::kNorm}, {"aten::native_layer_norm_backward", Family::kNorm},
      {"aten::native_batch_norm", Family::kNorm}, {"aten::native_batch_norm_backward", Family::kNorm},
      {"aten::_native_batch_norm_legit", Family::kNorm},
      {"aten::_native_batch_norm_legit_no_training", Family::kNorm},
      {"aten::_batch_norm_with_update", Family::kNorm}, {"aten::batch_norm_backward", Family::kNorm},
      {"aten::native_group_norm", Family::kNorm}, {"aten::native_group_norm_backward", Family::kNorm},
      {"aten::_fused_rms_norm", Family::kNorm},
  };
  auto it = table.find(name);
  return it == table.end() ? Family::kElementwise : it->second;
}

DataDependent data_dependent_of(const std::string& name) {
  static const std::unordered_map<std::string, DataDependent> table = {
      {"aten::nonzero", DataDependent::kNonzero},
      {"aten::masked_select", DataDependent::kMaskedSelect},
      {"aten::_unique2", DataDependent::kUnique2},
      {"aten::_unique", DataDependent::kUnique2},
      {"aten::unique_dim", DataDependent::kUniqueDim},
      {"aten::unique_consecutive", DataDependent::kUniqueConsecutive},
      {"aten::index", DataDependent::kIndexWithMask},
      {"aten::index_put_", DataDependent::kIndexWithMask},
      {"aten::index_put", DataDependent::kIndexWithMask},
      {"aten::_index_put_impl_", DataDependent::kIndexWithMask},
      {"aten::bincount", DataDependent::kNeedsValues},
      {"aten::repeat_interleave", DataDependent::kNeedsValues},
      {"aten::_thnn_fused_gru_cell", DataDependent::kGruCell},
      {"aten::_thnn_fused_gru_cell_backward", DataDependent::kGruCellBackward},
  };
  auto it = table.find(name);
  return it == table.end() ? DataDependent::kNone : it->second;
}

OpInfo analyze(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  OpInfo info;
  info.name = schema.name();
  info.family = family_of(info.name);
  info.data_dependent = data_dependent_of(info.name);
  info.value_dependent = depends_on_values(info.data_dependent, info.name);
  info.per_tensor_devices = info.name.rfind("aten::_foreach", 0) == 0 || info.name.rfind("aten::_fused", 0) == 0 ||
                            info.name.rfind("aten::_amp_foreach", 0) == 0;
  static const std::unordered_map<std::string, bool> host_index_ops = {
      {"aten::index", true}, {"aten::index_put", true}, {"aten::index_put_", true},
      {"aten::_index_put_impl_", true}, {"aten::lstm", true}, {"aten::gru", true}, {"aten::rnn_tanh", true},
      {"aten::rnn_relu", true}, {"aten::_pack_padded_sequence", true},
  };
  info.host_index_tensors = host_index_ops.count(info.name) != 0;
  const auto& args = schema.arguments();
  info.writes.resize(args.size());
  info.reads.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* a = element_alias(args[i]);
    info.writes[i] = a != nullptr && a->isWrite();
    info.reads[i] = !(info.writes[i] && args[i].kwarg_only());
    if (info.writes[i]) info.metadata_only = false;
  }
  for (const auto& ret : schema.returns()) {
    ReturnInfo r;
    const auto* ra = element_alias(ret);
    if (ra != nullptr) {
      for (size_t i = 0; i < args.size() && r.alias_arg < 0; ++i) {
        const auto* a = element_alias(args[i]);
        if (a == nullptr) continue;
        for (const auto& set : ra->beforeSets()) {
          if (a->beforeSets().count(set) != 0) {
            r.alias_arg = static_cast<int>(i);
            r.write = a->isWrite();
            break;
          }
        }
      }
    }
    if (r.alias_arg < 0 || r.write) info.metadata_only = false;
    info.returns.push_back(r);
  }
  // An op that neither returns nor writes anything still ran on the device.
  if (info.returns.empty() && std::none_of(info.writes.begin(), info.writes.end(), [](bool w) { return w; })) {
    info.metadata_only = false;
  }
  return info;
}

const OpInfo& info_for(const c10::OperatorHandle& op) {
  // Per thread, so the hot path takes no lock; schemas live as long as the process.
  thread_local std::unordered_map<const c10::FunctionSchema*, OpInfo> cache;
  const auto* key = &op.schema();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, analyze(op)).first;
  return it->second;
}

bool is_emu(const at::Tensor& t) { return t.defined() && t.device().type() == kEmu; }

at::Tensor to_meta(const at::Tensor& t) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                       c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
                       c10::GetAllocator(c10::kMeta), /*resizable=*/true);
  auto meta = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
  meta.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return meta;
}

// Applies `fn` to every tensor inside an argument, rebuilding the IValue.
template <typename Fn>
c10::IValue map_tensors(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(fn(t));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
      out.push_back(t.has_value() ? std::optional<at::Tensor>(fn(*t)) : std::nullopt);
    }
    return out;
  }
  if (v.isList()) {  // e.g. Tensor?[] parsed as a generic list
    auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& e : list) out.push_back(e.isTensor() ? c10::IValue(fn(e.toTensor())) : e);
    return out;
  }
  return v;
}

template <typename Fn>
void for_each_tensor(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) fn(v.toTensor());
  else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) fn(t);
  else if (v.isOptionalTensorList()) {
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) if (t) fn(*t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList()) if (e.isTensor()) fn(e.toTensor());
  }
}

bool all_materialized(const std::vector<c10::IValue>& args) {
  bool all = true;
  for (const auto& a : args) {
    for_each_tensor(a, [&](const at::Tensor& t) {
      if (is_emu(t) && t.numel() > 0 && !is_materialized(t.storage())) all = false;
    });
  }
  return all;
}

int device_of(const std::vector<c10::IValue>& args) {
  for (const auto& a : args) {
    int found = -1;
    for_each_tensor(a, [&](const at::Tensor& t) {
      if (found < 0 && is_emu(t)) found = t.device().index();
    });
    if (found >= 0) return found;
    if (a.isDevice() && a.toDevice().type() == kEmu && a.toDevice().has_index()) return a.toDevice().index();
  }
  return current_device();
}

// Ops mixing devices fail as on CUDA: every tensor on the op's device, but
// for zero-dimensional CPU tensors (scalars) and, for indexing and packed
// sequences, CPU index tensors.
void check_devices(const OpInfo& info, const std::vector<c10::IValue>& args, int device) {
  for (const auto& a : args) {
    for_each_tensor(a, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (is_emu(t)) {
        if (t.device().index() == device || info.per_tensor_devices) return;
      } else if (t.device().is_cpu() && (t.dim() == 0 || info.host_index_tensors)) {
        return;
      }
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, emugpu:",
                  device, " and ", t.device(), "! (when checking the arguments of ", info.name,
                  "); move them to one device with .to()");
    });
  }
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
    case DataDependent::kNonzero:
      results.emplace_back(meta_empty({self.numel(), self.dim()}, at::kLong));
      break;
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
      if (info.data_dependent == DataDependent::kUniqueDim) dim = args[1].toInt();
      else if (!args[3].isNone()) dim = args[3].toInt();
      const int64_t n = dim ? self.size(*dim) : self.numel();
      results.emplace_back(dim ? meta_empty(self.sizes(), self.scalar_type())
                               : meta_empty({n}, self.scalar_type()));
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
    case DataDependent::kNone:
      break;
  }
  torch::jit::drop(meta_stack, num_args);
  for (auto& r : results) meta_stack.push_back(std::move(r));
}


// Metadata of one output tensor, as the Meta kernel (or a shape rule) left it.
struct TensorDesc {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;
  size_t nbytes = 0;
  caffe2::TypeMeta dtype;

  static TensorDesc of(const at::Tensor& t) {
    return {t.sizes().vec(), t.strides().vec(), t.storage_offset(), t.storage().nbytes(), t.dtype()};
  }
};

struct OutDesc {
  enum class Kind { kTensor, kTensorList, kUndefined, kOther } kind = Kind::kOther;
  std::vector<TensorDesc> tensors;
  c10::IValue other;
};

// What one (op, argument metadata) produces: reused on every later call with
// the same metadata, so steady-state iterations never run a Meta kernel.
struct ShapeResult {
  std::vector<OutDesc> outs;
  TimeNs duration = 0;
};

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (int64_t w : k) h = (h ^ static_cast<uint64_t>(w)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

void encode_tensor(const at::Tensor& t, Key& key) {
  if (!t.defined()) {
    key.push_back(-1);
    return;
  }
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(static_cast<int64_t>(t.device().type()) * 256 + t.device().index());
  key.push_back(t.dim());
  for (int64_t s : t.sizes()) key.push_back(s);
  for (int64_t s : t.strides()) key.push_back(s);
  key.push_back(t.storage_offset());
  key.push_back(t.has_storage() ? static_cast<int64_t>(t.storage().nbytes()) : -2);
}

// Appends what determines an argument's effect on output shapes; false for
// argument kinds that cannot be keyed (the call then runs uncached).
bool encode(const c10::IValue& v, Key& key) {
  // Each kind pushes its own tag first, so different kinds never collide.
  if (v.isTensor()) {
    key.push_back(1);
    encode_tensor(v.toTensor(), key);
  } else if (v.isNone() || v.isGenerator()) {
    key.push_back(2);
  } else if (v.isInt()) {
    key.push_back(3);
    key.push_back(v.toInt());
  } else if (v.isBool()) {
    key.push_back(v.toBool() ? 4 : 5);
  } else if (v.isDouble()) {
    key.push_back(6);
    key.push_back(std::bit_cast<int64_t>(v.toDouble()));
  } else if (v.isComplexDouble()) {
    const auto c = v.toComplexDouble();
    key.push_back(7);
    key.push_back(std::bit_cast<int64_t>(c.real()));
    key.push_back(std::bit_cast<int64_t>(c.imag()));
  } else if (v.isString()) {
    key.push_back(8);
    key.push_back(static_cast<int64_t>(std::hash<std::string_view>{}(v.toStringView())));
  } else if (v.isDevice()) {
    key.push_back(9);
    key.push_back(static_cast<int64_t>(v.toDevice().type()) * 256 + v.toDevice().index());
  } else if (v.isTensorList()) {
    key.push_back(10);
    key.push_back(static_cast<int64_t>(v.toTensorList().size()));
    for (const at::Tensor& t : v.toTensorList()) encode_tensor(t, key);
  } else if (v.isIntList()) {
    key.push_back(11);
    key.push_back(static_cast<int64_t>(v.toIntList().size()));
    for (int64_t x : v.toIntList()) key.push_back(x);
  } else if (v.isBoolList()) {
    key.push_back(12);
    key.push_back(static_cast<int64_t>(v.toBoolList().size()));
    for (bool x : v.toBoolList()) key.push_back(x ? 1 : 0);
  } else if (v.isDoubleList()) {
    key.push_back(13);
    key.push_back(static_cast<int64_t>(v.toDoubleList().size()));
    for (double x : v.toDoubleList()) key.push_back(std::bit_cast<int64_t>(x));
  } else if (v.isList()) {
    key.push_back(14);
    key.push_back(static_cast<int64_t>(v.toList().size()));
    for (const c10::IValue& e : v.toList()) {
      if (!encode(e, key)) return false;
    }
  } else {
    return false;
  }
  return true;
}

std::atomic<int64_t> g_cache_generation{0};
std::atomic<int64_t> g_cache_hits{0};
std::atomic<int64_t> g_cache_misses{0};

struct ShapeCache {
  int64_t generation = -1;
  std::unordered_map<Key, ShapeResult, KeyHash> entries;
};

ShapeCache& shape_cache() {
  thread_local ShapeCache cache;
  const int64_t generation = g_cache_generation.load(std::memory_order_relaxed);
  if (cache.generation != generation || cache.entries.size() > 200000) {
    cache.entries.clear();
    cache.generation = generation;
  }
  return cache;
}

// The emugpu tensor `self` takes the metadata an in-place/out= op gave its
// meta twin, growing its storage if the op resized it.
void adopt_metadata(const at::Tensor& self, const TensorDesc& d) {
  if (self.sizes() == c10::IntArrayRef(d.sizes) && self.strides() == c10::IntArrayRef(d.strides) &&
      self.storage_offset() == d.offset) {
    return;
  }
  if (self.storage().nbytes() < d.nbytes) resize_storage(self.storage(), d.nbytes);
  self.unsafeGetTensorImpl()->set_sizes_and_strides(d.sizes, d.strides, d.offset);
}

at::Tensor view_of(const at::Tensor& base, const TensorDesc& d) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                       base.key_set(), d.dtype);
  out.unsafeGetTensorImpl()->set_sizes_and_strides(d.sizes, d.strides, d.offset);
  return out;
}

at::Tensor new_device_tensor(int device, const TensorDesc& d) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), d.nbytes, device_allocator().allocate_on(device, d.nbytes),
                       &device_allocator(), /*resizable=*/true);
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), d.dtype);
  out.unsafeGetTensorImpl()->set_sizes_and_strides(d.sizes, d.strides, d.offset);
  return out;
}

double numel_bytes(const at::Tensor& t) { return static_cast<double>(t.numel()) * t.element_size(); }

DType dtype_class(at::ScalarType s, bool tensor_core_fp32) {
  switch (s) {
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kDouble: return DType::kFloat64;
    case at::kFloat: return tensor_core_fp32 ? DType::kTensorFloat32 : DType::kFloat32;
    default: return at::isFloatingType(s) ? DType::kFloat32 : DType::kInteger;
  }
}

OpCost estimate(const OpInfo& info, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                const std::vector<c10::IValue>& args) {
  OpCost cost;
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
  // one per input element; normalizations about eight (mean, variance,
  // scale and shift, in a few passes).
  double in_numel = inputs.empty() ? 0 : static_cast<double>(inputs.front().numel());
  cost.flops = std::max(out_numel, in_numel);
  auto arg = [&](size_t i) { return args[i].toTensor(); };
  bool tf32 = false;
  switch (info.family) {
    case Family::kMm:
      cost.flops = 2.0 * arg(0).size(0) * arg(0).size(1) * arg(1).size(1);
      tf32 = at::globalContext().allowTF32CuBLAS();
      break;
    case Family::kAddmm:
      cost.flops = 2.0 * arg(1).size(0) * arg(1).size(1) * arg(2).size(1);
      tf32 = at::globalContext().allowTF32CuBLAS();
      break;
    case Family::kBmm:
      cost.flops = 2.0 * arg(0).size(0) * arg(0).size(1) * arg(0).size(2) * arg(1).size(2);
      tf32 = at::globalContext().allowTF32CuBLAS();
      break;
    case Family::kBaddbmm:
      cost.flops = 2.0 * arg(1).size(0) * arg(1).size(1) * arg(1).size(2) * arg(2).size(2);
      tf32 = at::globalContext().allowTF32CuBLAS();
      break;
    case Family::kConv:
    case Family::kConvBackward: {
      const at::Tensor weight = info.family == Family::kConv ? arg(1) : arg(2);
      const at::Tensor out = info.family == Family::kConv ? outputs.at(0) : arg(0);
      const double per_output = static_cast<double>(weight.numel()) / std::max<int64_t>(weight.size(0), 1);
      double passes = 1;
      if (info.family == Family::kConvBackward) {
        const auto mask = args.back().toBoolList();
        passes = static_cast<double>((mask.get(0) ? 1 : 0) + (mask.get(1) ? 1 : 0));
      }
      cost.flops = 2.0 * out.numel() * per_output * passes;
      tf32 = at::globalContext().allowTF32CuDNN();
      break;
    }
    case Family::kAttention:
    case Family::kAttentionBackward: {
      const at::Tensor q = arg(info.family == Family::kAttention ? 0 : 1);
      const at::Tensor k = arg(info.family == Family::kAttention ? 1 : 2);
      const at::Tensor v = arg(info.family == Family::kAttention ? 2 : 3);
      // (B, H, L, E) layout; flash-style kernels never store the L x S matrix.
      const double b_h = static_cast<double>(q.numel()) / (q.size(-1) * q.size(-2));
      cost.flops = 2.0 * b_h * q.size(-2) * k.size(-2) * (q.size(-1) + v.size(-1));
      if (info.family == Family::kAttentionBackward) cost.flops *= 2.5;
      break;
    }
    case Family::kNorm:
      cost.flops = 8.0 * in_numel;
      break;
    case Family::kElementwise:
      break;
  }
  cost.dtype = dtype_class(dtype, tf32);
  return cost;
}

[[noreturn]] void no_shape_rule(const std::string& name, const std::string& why) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "emugpu: operator '", name,
      "' has no shape rule in timing mode (its Meta kernel failed: ", why,
      "). Run it on the CPU (move its inputs with .cpu()), use EMUGPU_MODE=compute, "
      "or report the operator to torch-emugpu.");
}

// Copies a host result into its emugpu output; where the CPU kernel's shape
// differs from the Meta kernel's (e.g. empty saved statistics in eval-mode
// batch norm), the CPU's is the one a real GPU kernel would match.
at::Tensor store_host_result(int device, const at::Tensor& out, const at::Tensor& value) {
  at::Tensor dst = out;
  if (!value.defined()) return value;
  if (out.sizes() != value.sizes() || out.scalar_type() != value.scalar_type()) {
    dst = new_device_tensor(device, TensorDesc::of(value));
    set_materialized(dst.storage(), true);
  }
  host_alias(dst).copy_(value);
  return dst;
}

void compute_on_host(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                     torch::jit::Stack& host_results) {
  host_results.clear();
  for (const auto& a : args) {
    if (a.isDevice() && a.toDevice().type() == kEmu) host_results.emplace_back(c10::Device(c10::kCPU));
    else if (a.isGenerator()) host_results.emplace_back();  // host default generator
    else host_results.push_back(map_tensors(a, [](const at::Tensor& t) { return is_emu(t) ? host_alias(t) : t; }));
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &host_results);
}


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
  return outs;
}

}  // namespace

at::Tensor host_alias(const at::Tensor& t) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                       c10::DataPtr(const_cast<void*>(t.storage().data()), c10::Device(c10::kCPU)),
                       nullptr, /*resizable=*/false);
  auto host = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  host.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return host;
}

at::Tensor new_device_tensor(int device, const at::Tensor& like) {
  return new_device_tensor(device, TensorDesc::of(like));
}

TimeNs charge(int device, Engine engine, TimeNs estimate) {
  return Runtime::get().device(device).launch(current_stream_id(device), engine, estimate);
}

TimeNs charge_and_wait(int device, Engine engine, TimeNs estimate) {
  return Runtime::get().device(device).launch_and_wait(current_stream_id(device), engine, estimate);
}

void invalidate_shape_caches() { g_cache_generation.fetch_add(1); }

std::pair<int64_t, int64_t> shape_cache_stats() { return {g_cache_hits.load(), g_cache_misses.load()}; }

void emugpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
  const OpInfo& info = info_for(op);
  const size_t num_args = op.schema().arguments().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  const int device = device_of(args);
  check_devices(info, args, device);
  const bool compute = Runtime::get().compute_mode();

  // Outputs whose shape depends on values are computed on the host when the
  // values are real: always in compute mode, in timing mode when every input
  // holds copied-in bytes (then the outputs do too).
  if (info.value_dependent && (compute || all_materialized(args))) {
    torch::jit::Stack host;
    compute_on_host(op, args, host);
    torch::jit::drop(*stack, num_args);
    std::vector<at::Tensor> inputs, outputs;
    for (const auto& r : host) {
      at::Tensor out = new_device_tensor(device, r.toTensor());
      host_alias(out).copy_(r.toTensor());
      set_materialized(out.storage(), true);
      outputs.push_back(out);
      stack->emplace_back(out);
    }
    for (const auto& a : args) for_each_tensor(a, [&](const at::Tensor& t) { if (is_emu(t)) inputs.push_back(t); });
    // Reading the values is a host sync, as on CUDA (nonzero waits for its input).
    translate_errors([&] {
      charge_and_wait(device, Engine::kCompute,
                      Runtime::get().device(device).cost().kernel(estimate(info, inputs, outputs, args)));
    });
    return;
  }

  // 1. Shapes: from the cache, or from the Meta kernel on mirrored meta tensors.
  // Built in a per-thread buffer (no allocation per op); copied only on a miss.
  thread_local Key key;
  key.clear();
  key.push_back(reinterpret_cast<intptr_t>(&op.schema()));
  key.push_back((at::globalContext().allowTF32CuBLAS() ? 1 : 0) + (at::globalContext().allowTF32CuDNN() ? 2 : 0));
  bool cacheable = true;
  for (const auto& a : args) {
    if (!encode(a, key)) {
      cacheable = false;
      break;
    }
  }
  ShapeCache& cache = shape_cache();
  const ShapeResult* cached = nullptr;
  if (cacheable) {
    auto it = cache.entries.find(key);
    if (it != cache.entries.end()) cached = &it->second;
  }
  (cached ? g_cache_hits : g_cache_misses).fetch_add(1, std::memory_order_relaxed);
  std::vector<OutDesc> fresh_outs;
  Key miss_key;
  if (cached == nullptr) {
    miss_key = key;  // the shape rule may re-enter this fallback and reuse `key`
    fresh_outs = run_shape_rule(info, op, args, num_args);
  }
  const std::vector<OutDesc>& outs = cached ? cached->outs : fresh_outs;

  // 2. Outputs on emugpu: inputs for in-place/out=, views of inputs, or fresh.
  std::vector<c10::IValue> results;
  std::vector<at::Tensor> outputs;
  results.reserve(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    const OutDesc& o = outs[i];
    const ReturnInfo r = i < info.returns.size() ? info.returns[i] : ReturnInfo{};
    if (o.kind == OutDesc::Kind::kOther) {
      results.push_back(o.other);
    } else if (o.kind == OutDesc::Kind::kUndefined) {
      results.emplace_back(at::Tensor());
    } else if (r.alias_arg >= 0) {
      const c10::IValue& base = args[r.alias_arg];
      at::Tensor self;
      for_each_tensor(base, [&](const at::Tensor& t) { if (!self.defined()) self = t; });
      if (o.kind == OutDesc::Kind::kTensor && r.write && base.isTensor()) {
        adopt_metadata(self, o.tensors[0]);
        outputs.push_back(self);
        results.emplace_back(self);
      } else if (o.kind == OutDesc::Kind::kTensor) {
        results.emplace_back(view_of(self, o.tensors[0]));
      } else {
        c10::List<at::Tensor> views;
        for (const TensorDesc& d : o.tensors) views.push_back(view_of(self, d));
        results.emplace_back(views);
      }
    } else if (o.kind == OutDesc::Kind::kTensor) {
      at::Tensor out = translate_errors([&] { return new_device_tensor(device, o.tensors[0]); });
      outputs.push_back(out);
      results.emplace_back(out);
    } else {
      c10::List<at::Tensor> list;
      for (const TensorDesc& d : o.tensors) {
        at::Tensor out = translate_errors([&] { return new_device_tensor(device, d); });
        outputs.push_back(out);
        list.push_back(out);
      }
      results.emplace_back(list);
    }
  }
  // Written values are placeholders in timing mode, real in compute mode.
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < args.size(); ++i) {
    for_each_tensor(args[i], [&](const at::Tensor& t) {
      if (!is_emu(t)) return;
      if (cached == nullptr && info.reads[i]) inputs.push_back(t);
      if (info.writes[i]) set_materialized(t.storage(), compute);
    });
  }
  for (const auto& out : outputs) set_materialized(out.storage(), compute);

  // 3. Values, in compute mode, from the CPU kernel over host aliases.
  if (compute && !info.metadata_only) {
    torch::jit::Stack host;
    compute_on_host(op, args, host);
    for (size_t i = 0; i < host.size() && i < results.size(); ++i) {
      const ReturnInfo r = i < info.returns.size() ? info.returns[i] : ReturnInfo{};
      if (r.alias_arg >= 0) continue;  // written in place, or a view
      if (results[i].isTensor() && results[i].toTensor().defined() && host[i].isTensor()) {
        results[i] = store_host_result(device, results[i].toTensor(), host[i].toTensor());
      } else if (results[i].isTensorList()) {
        auto outs_list = results[i].toTensorList();
        auto vals = host[i].toTensorList();
        for (size_t j = 0; j < outs_list.size(); ++j) {
          outs_list.set(j, store_host_result(device, outs_list.get(j), vals.get(j)));
        }
      } else if (!results[i].isTensor()) {
        results[i] = host[i];
      }
    }
  }

  // 4. Time: every op that runs a kernel is charged to the current stream.
  TimeNs duration = 0;
  if (cached != nullptr) {
    duration = cached->duration;
  } else if (!info.metadata_only) {
    duration = translate_errors([&] {
      return Runtime::get().device(device).cost().kernel(estimate(info, inputs, outputs, args));
    });
  }
  if (cached == nullptr && cacheable) {
    cache.entries.emplace(std::move(miss_key), ShapeResult{std::move(fresh_outs), duration});
  }
  if (!info.metadata_only) {
    translate_errors([&] { charge(device, Engine::kCompute, duration); });
  }

  torch::jit::drop(*stack, num_args);
  for (auto& r : results) stack->push_back(std::move(r));
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&emugpu_fallback>());
}

}  // namespace emugpu
