#include "backend/ops/tensor_util.h"

#include <optional>

#include "backend/allocator.h"
#include "backend/runtime.h"

namespace emugpu {

bool all_materialized(const std::vector<c10::IValue>& args) {
  bool all = true;
  for (const auto& a : args) {
    for_each_tensor(a, [&](const at::Tensor& t) {
      if (is_emu(t) && t.numel() > 0 && !is_materialized(t.storage())) all = false;
    });
  }
  return all;
}

int op_device(const OpInfo& info, const std::vector<c10::IValue>& args) {
  int device = -1;
  std::optional<c10::Device> stray;  // the first tensor on a device the op may not mix in
  for (const auto& a : args) {
    for_each_tensor(a, [&](const at::Tensor& t) {
      if (!t.defined() || stray) return;
      if (is_emu(t)) {
        if (device < 0)
          device = t.device().index();
        else if (t.device().index() != device && !info.per_tensor_devices)
          stray = t.device();
      } else if (!(t.device().is_cpu() && (t.dim() == 0 || info.host_index_tensors))) {
        stray = t.device();
      }
    });
    if (device < 0 && a.isDevice() && a.toDevice().type() == kEmu && a.toDevice().has_index()) {
      device = a.toDevice().index();
    }
  }
  if (device < 0) device = current_device();
  TORCH_CHECK(!stray, "Expected all tensors to be on the same device, but found at least two devices, emugpu:", device,
              " and ", *stray, "! (when checking the arguments of ", info.name,
              "); move them to one device with .to()");
  return device;
}

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
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), d.dtype);
  out.unsafeGetTensorImpl()->set_sizes_and_strides(d.sizes, d.strides, d.offset);
  return out;
}

double numel_bytes(const at::Tensor& t) { return static_cast<double>(t.numel()) * t.element_size(); }

}  // namespace emugpu
