// Tensor helpers shared by the op files: walking the tensors inside boxed
// arguments, device checks, and emugpu tensors made from metadata.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "backend/ops/op_info.h"

namespace emugpu {

constexpr auto kEmu = c10::DeviceType::PrivateUse1;

inline bool is_emu(const at::Tensor& t) { return t.defined() && t.device().type() == kEmu; }

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
  if (v.isTensor())
    fn(v.toTensor());
  else if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorList()) fn(t);
  else if (v.isOptionalTensorList()) {
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList())
      if (t) fn(*t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList())
      if (e.isTensor()) fn(e.toTensor());
  }
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

// True when every emugpu tensor among the arguments holds real bytes.
bool all_materialized(const std::vector<c10::IValue>& args);
// The device an op runs on: its first emugpu tensor's, else an emugpu device
// argument's, else the current device. Ops that mix devices fail as on CUDA
// (zero-dimensional CPU tensors pass, and, where the op allows it, CPU index
// tensors and tensors of other emugpu devices). One pass over the arguments.
int op_device(const OpInfo& info, const std::vector<c10::IValue>& args);
// The emugpu tensor `self` takes the metadata an in-place/out= op gave its
// meta twin, growing its storage if the op resized it.
void adopt_metadata(const at::Tensor& self, const TensorDesc& d);
// A view of `base`'s storage with the geometry `d`.
at::Tensor view_of(const at::Tensor& base, const TensorDesc& d);
// A fresh emugpu tensor on `device` with the geometry `d`.
at::Tensor new_device_tensor(int device, const TensorDesc& d);
double numel_bytes(const at::Tensor& t);

}  // namespace emugpu
