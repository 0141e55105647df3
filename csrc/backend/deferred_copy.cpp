#include "backend/deferred_copy.h"

#include <c10/util/Exception.h>

#include "backend/allocator.h"
#include "backend/ops/common.h"
#include "backend/runtime.h"

namespace emugpu {
namespace {

// Where a copy's tensor lies in device memory, kept without the tensor: a
// recorded copy must not keep its source's memory allocated (the emulated
// allocator would count it), and is done or dropped before that memory goes.
struct HostGeometry {
  void* base = nullptr;
  size_t nbytes = 0;
  caffe2::TypeMeta dtype;
  c10::SmallVector<int64_t, 5> sizes, strides;
  int64_t offset = 0;

  static HostGeometry of(const at::Tensor& t) {
    return {const_cast<void*>(t.storage().data()),
            t.storage().nbytes(),
            t.dtype(),
            c10::SmallVector<int64_t, 5>(t.sizes().begin(), t.sizes().end()),
            c10::SmallVector<int64_t, 5>(t.strides().begin(), t.strides().end()),
            t.storage_offset()};
  }
  at::Tensor view() const {
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(base, c10::Device(c10::kCPU)), nullptr,
                         /*resizable=*/false);
    auto host =
        at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
    host.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
    return host;
  }
};

bool may_defer(const Block* b) { return b != nullptr && b->owner != nullptr && !b->exported.load(); }

}  // namespace

DeferredCopies& deferred_copies() {
  static auto* copies = new DeferredCopies();  // never destroyed: storages die during static destruction
  return *copies;
}

bool defer_copy(const at::Tensor& dst, const at::Tensor& src) {
  if (Runtime::get().compute_mode() || dst.numel() == 0) return false;
  Block* into = block_of(dst.storage());
  Block* from = block_of(src.storage());
  if (!may_defer(into) || !may_defer(from) || into == from) return false;
  const bool whole = dst.storage_offset() == 0 && dst.is_non_overlapping_and_dense() &&
                     static_cast<size_t>(dst.numel()) * dst.element_size() == dst.storage().nbytes();
  const UnchargedWork uncharged(active_virtual_clock());  // recording may do the copies that read `dst`
  return deferred_copies().record(
      into, from, [d = HostGeometry::of(dst), s = HostGeometry::of(src)] { move_bytes(d.view(), s.view()); }, whole);
}

void bytes_for_read(Block* block) {
  if (block == nullptr || !DeferredCopies::involved(block)) return;
  const UnchargedWork uncharged(active_virtual_clock());
  deferred_copies().resolve(block);
}

void bytes_for_write(Block* block) {
  if (block == nullptr || !DeferredCopies::involved(block)) return;
  const UnchargedWork uncharged(active_virtual_clock());
  deferred_copies().before_write(block);
}

void bytes_discarded(Block* block) noexcept {
  if (block == nullptr || !DeferredCopies::involved(block)) return;
  try {
    const UnchargedWork uncharged(active_virtual_clock());
    deferred_copies().discard(block);
  } catch (const std::exception& e) {
    TORCH_WARN("emugpu: a copy deferred until its source was freed or overwritten failed (", e.what(),
               "); the tensor it wrote holds the bytes it had before");
  }
}

}  // namespace emugpu
