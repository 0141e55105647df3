// c10::Allocator for pinned host memory (pin_memory, DataLoader pin_memory=True)
// over the core's mlock-backed caching HostAllocator.
#include "backend/host_allocator.h"

#include <c10/util/Exception.h>

#include "backend/runtime.h"
#include "core/host_allocator.h"

namespace emugpu {

HostAllocator& host_allocator() {
  static HostAllocator* allocator = new HostAllocator();  // leaked: pinned tensors may outlive statics
  return *allocator;
}

namespace {

void delete_pinned(void* ptr) { host_allocator().free(ptr); }

class PinnedAllocator final : public c10::Allocator {
 public:
  // Page-locked (when the process may lock pages) host memory, cached.
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return {nullptr, nullptr, &delete_pinned, c10::Device(c10::kCPU)};
    void* ptr = translate_errors([&] { return host_allocator().allocate(nbytes); });
    if (host_allocator().lock_refused()) {
      TORCH_WARN_ONCE(
          "emugpu: could not lock pinned host memory (mlock refused: no CAP_IPC_LOCK or "
          "RLIMIT_MEMLOCK too low); pinned tensors use ordinary memory, timing is unaffected");
    }
    return {ptr, ptr, &delete_pinned, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

}  // namespace

c10::Allocator* pinned_allocator() {
  static PinnedAllocator allocator;
  return &allocator;
}

bool is_pinned_ptr(const void* ptr) { return ptr != nullptr && host_allocator().contains(ptr); }

}  // namespace emugpu
