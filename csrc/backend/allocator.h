// The emugpu device allocator (c10::DeviceAllocator over the core's
// emulated CUDA caching allocator) and helpers on emugpu storages.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

#include "backend/runtime.h"

namespace emugpu {

class EmuDeviceAllocator final : public c10::DeviceAllocator {
 public:
  // Allocates on the current emugpu device.
  c10::DataPtr allocate(size_t nbytes) override;
  // Allocates on `device` regardless of the current one.
  c10::DataPtr allocate_on(int device, size_t nbytes);
  c10::DeleterFnPtr raw_deleter() const override;
  // Device memory is host-addressable, so a plain memcpy is a valid copy.
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;
};

EmuDeviceAllocator& device_allocator();

// The core block behind an emugpu storage (nullptr for empty storages).
Block* block_of(const c10::Storage& storage);
bool is_materialized(const c10::Storage& storage);
void set_materialized(const c10::Storage& storage, bool value);
// Grows (or shrinks) an emugpu storage, keeping its real bytes.
void resize_storage(const c10::Storage& storage, size_t nbytes);

}  // namespace emugpu
