#include "backend/ops/sparse_layout.h"

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseCsrTensorUtils.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/native/SparseTensorUtils.h>
#include <c10/core/DeviceGuard.h>

#include "backend/allocator.h"
#include "backend/ops/common.h"
#include "backend/ops/tensor_util.h"

namespace emugpu {
namespace {

// Member accessors that read the impl directly: the Tensor methods
// (_indices(), sparse_dim(), ...) are ops that would dispatch back here.
at::SparseTensorImpl* coo(const at::Tensor& t) { return at::sparse::get_sparse_impl(t); }
at::SparseCsrTensorImpl* compressed(const at::Tensor& t) { return at::sparse_csr::get_sparse_csr_impl(t); }

c10::DispatchKeySet sparse_keys(c10::Layout layout, bool host) {
  if (layout == c10::kSparse)
    return c10::DispatchKeySet(host ? c10::DispatchKey::SparseCPU : c10::DispatchKey::SparsePrivateUse1);
  return c10::DispatchKeySet(host ? c10::DispatchKey::SparseCsrCPU : c10::DispatchKey::SparseCsrPrivateUse1);
}

// An empty sparse tensor of `like`'s layout and dtype on the host or on
// emugpu:`device`, whose members are then set with `assign`.
at::Tensor empty_sparse(const at::Tensor& like, bool host, int device) {
  if (like.layout() == c10::kSparse) {
    // Its placeholder members are allocated on the current device.
    c10::DeviceGuard guard(host ? c10::Device(c10::kCPU) : c10::Device(kEmu, static_cast<c10::DeviceIndex>(device)));
    return at::detail::make_tensor<at::SparseTensorImpl>(sparse_keys(like.layout(), host), like.dtype());
  }
  const c10::Device where = host ? c10::Device(c10::kCPU) : c10::Device(kEmu, static_cast<c10::DeviceIndex>(device));
  return at::detail::make_tensor<at::SparseCsrTensorImpl>(sparse_keys(like.layout(), host), where, like.layout(),
                                                          like.dtype());
}

// Gives sparse `dst` the structure of `src` with members `m` (already on dst's side).
void assign(const at::Tensor& dst, const at::Tensor& src, const std::vector<at::Tensor>& m) {
  if (src.layout() == c10::kSparse) {
    auto* impl = coo(dst);
    impl->raw_resize_(coo(src)->sparse_dim(), coo(src)->dense_dim(), src.sizes());
    impl->set_indices_and_values_unsafe(m[0], m[1]);
    impl->set_coalesced(coo(src)->coalesced());
  } else {
    compressed(dst)->set_member_tensors(m[0], m[1], m[2], src.sizes());
  }
}

}  // namespace

std::vector<at::Tensor> sparse_members(const at::Tensor& t) {
  if (!is_sparse_layout(t)) return {};
  if (t.layout() == c10::kSparse) return {coo(t)->indices(), coo(t)->values()};
  return {compressed(t)->compressed_indices(), compressed(t)->plain_indices(), compressed(t)->values()};
}

int64_t sparse_nnz(const at::Tensor& t) {
  if (!is_sparse_layout(t)) return 0;
  return t.layout() == c10::kSparse ? coo(t)->nnz() : compressed(t)->values().size(0);
}

at::Tensor HostMap::alias_to_host(const at::Tensor& emu, bool written) {
  const bool real = emu.numel() == 0 || is_materialized(emu.storage());
  if (!written) all_real_ = all_real_ && real;
  if (timing_ && !real && !written) return at::full(emu.sizes(), placeholder_, emu.options().device(c10::kCPU));
  at::Tensor host = host_alias(emu);
  if (emu.storage().nbytes() > 0) aliases_.emplace_back(emu.storage().data(), emu);
  return host;
}

at::Tensor HostMap::to_host(const at::Tensor& emu, bool written) {
  if (!is_emu(emu)) return emu;
  if (!is_sparse_layout(emu)) return alias_to_host(emu, written);
  std::vector<at::Tensor> members;
  for (const at::Tensor& m : sparse_members(emu)) members.push_back(alias_to_host(m, false));
  at::Tensor twin = empty_sparse(emu, /*host=*/true, device_);
  assign(twin, emu, members);
  twins_.emplace_back(emu, twin);
  return twin;
}

at::Tensor HostMap::twin_of(const at::Tensor& host) const {
  for (const auto& [emu, twin] : twins_) {
    if (twin.unsafeGetTensorImpl() == host.unsafeGetTensorImpl()) return emu;
  }
  return {};
}

at::Tensor HostMap::to_emu(const at::Tensor& host, bool real) {
  if (!host.defined() || is_emu(host)) return host;
  if (at::Tensor emu = twin_of(host); emu.defined()) return emu;
  if (is_sparse_layout(host)) {
    std::vector<at::Tensor> members;
    for (const at::Tensor& m : sparse_members(host)) members.push_back(to_emu(m, real));
    at::Tensor out = empty_sparse(host, /*host=*/false, device_);
    assign(out, host, members);
    return out;
  }
  if (host.storage().nbytes() > 0) {
    for (const auto& [data, emu] : aliases_) {
      if (data == host.storage().data()) return view_of(emu, TensorDesc::of(host));
    }
  }
  at::Tensor out = new_device_tensor(device_, TensorDesc::of(host));
  host_alias(out).copy_(host);
  set_materialized(out.storage(), real);
  return out;
}

void HostMap::write_back(const at::Tensor& emu, bool real) {
  for (const auto& [e, twin] : twins_) {
    if (e.unsafeGetTensorImpl() != emu.unsafeGetTensorImpl()) continue;
    std::vector<at::Tensor> members;
    for (const at::Tensor& m : sparse_members(twin)) members.push_back(to_emu(m, real));
    assign(emu, twin, members);
    for (const at::Tensor& m : members) {
      if (m.storage().nbytes() > 0) set_materialized(m.storage(), real);
    }
    return;
  }
}

}  // namespace emugpu
