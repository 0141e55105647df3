#include "backend/ops/op_info.h"

#include <algorithm>
#include <unordered_map>

namespace emugpu {
namespace {

// Output sizes depend on input values (index_put keeps its input's shape).
bool depends_on_values(DataDependent d, const std::string& name) {
  switch (d) {
    case DataDependent::kNone:
    case DataDependent::kGruCell:
    case DataDependent::kGruCellBackward: return false;
    case DataDependent::kIndexWithMask: return name == "aten::index";
    default: return true;
  }
}
const c10::AliasInfo* element_alias(const c10::Argument& a) {
  const c10::AliasInfo* info = a.alias_info();
  if (info != nullptr && info->beforeSets().empty() && !info->containedTypes().empty()) {
    return &info->containedTypes()[0];
  }
  return info;
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

// Scalar, float, complex, optionally, or a list of them.
bool floating_scalar(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::NumberType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::ComplexType: return true;
    case c10::TypeKind::OptionalType: return floating_scalar(type->castRaw<c10::OptionalType>()->getElementType());
    case c10::TypeKind::ListType: return floating_scalar(type->castRaw<c10::ListType>()->getElementType());
    default: return false;
  }
}

OpInfo analyze(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  OpInfo info;
  info.name = schema.name();
  info.family = op_family(info.name, op.hasTag(at::Tag::pointwise), op.hasTag(at::Tag::reduction));
  info.data_dependent = data_dependent_of(info.name);
  info.value_dependent = depends_on_values(info.data_dependent, info.name);
  info.per_tensor_devices = info.name.rfind("aten::_foreach", 0) == 0 || info.name.rfind("aten::_fused", 0) == 0 ||
                            info.name.rfind("aten::_amp_foreach", 0) == 0;
  static const std::unordered_map<std::string, bool> host_index_ops = {
      {"aten::index", true},
      {"aten::index_put", true},
      {"aten::index_put_", true},
      {"aten::_index_put_impl_", true},
      {"aten::lstm", true},
      {"aten::gru", true},
      {"aten::rnn_tanh", true},
      {"aten::rnn_relu", true},
      {"aten::_pack_padded_sequence", true},
  };
  info.host_index_tensors = host_index_ops.count(info.name) != 0;
  info.keeps_values = info.name == "aten::resize_" || info.name == "aten::resize_as_";
  info.random = info.name == "aten::native_dropout" || (info.name.rfind("aten::_scaled_dot_product_", 0) == 0 &&
                                                        info.name.find("backward") == std::string::npos);
  const auto& args = schema.arguments();
  info.writes.resize(args.size());
  info.reads.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& n = args[i].name();
    const int index = static_cast<int>(i);
    if (n == "groups") info.groups_arg = index;
    if (n == "stride") info.stride_arg = index;
    if (n == "transposed") info.transposed_arg = index;
    if (n == "is_causal") info.causal_arg = index;
    if (n == "output_mask") info.mask_arg = index;
    if (args[i].type()->kind() == c10::TypeKind::OptionalType &&
        args[i].type()->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType) {
      info.generator_arg = index;
    }
    const auto* a = element_alias(args[i]);
    info.writes[i] = a != nullptr && a->isWrite();
    info.reads[i] = !(info.writes[i] && args[i].kwarg_only());
    if (info.writes[i]) info.metadata_only = false;
  }
  if (info.generator_arg >= 0) info.random = true;
  info.host_kernel = op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU);
  info.overwrites =
      (info.random && info.name != "aten::native_dropout") || info.name == "aten::fill_" || info.name == "aten::zero_";
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
  // In place: writes positional arguments only. out= arguments (keyword-only)
  // are resized to what the values say (arange's out).
  bool writes_any = false, writes_out = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!info.writes[i]) continue;
    (args[i].kwarg_only() ? writes_out : writes_any) = true;
  }
  const bool returns_written = std::all_of(info.returns.begin(), info.returns.end(),
                                           [](const ReturnInfo& r) { return r.alias_arg >= 0 && r.write; });
  info.value_free.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    info.value_free[i] = writes_any && !writes_out && returns_written && floating_scalar(args[i].type());
  }
  // An op that neither returns nor writes anything still ran on the device.
  if (info.returns.empty() && std::none_of(info.writes.begin(), info.writes.end(), [](bool w) { return w; })) {
    info.metadata_only = false;
  }
  return info;
}

}  // namespace

const OpInfo& info_for(const c10::OperatorHandle& op) {
  // Per thread, so the hot path takes no lock; schemas live as long as the process.
  thread_local std::unordered_map<const c10::FunctionSchema*, OpInfo> cache;
  const auto* key = &op.schema();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, analyze(op)).first;
  return it->second;
}

}  // namespace emugpu
