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

// The core block behind an emugpu storage (nullptr for empty storages); for
// a storage opened from another process, a stand-in with `owner == nullptr`.
Block* block_of(const c10::Storage& storage);
bool is_materialized(const c10::Storage& storage);
void set_materialized(const c10::Storage& storage, bool value);
// Grows (or shrinks) an emugpu storage, keeping its real bytes.
void resize_storage(const c10::Storage& storage, size_t nbytes);

// What another process needs to map an emugpu storage's bytes: `length`
// bytes of `fd` from `map_offset` (page aligned), the data `data_offset` into
// that range. `fd` stays owned by this process; senders duplicate it.
struct SharedStorage {
  int fd = -1;
  uint64_t map_offset = 0;
  uint64_t map_length = 0;
  uint64_t data_offset = 0;
  uint64_t nbytes = 0;
  int device = 0;
  bool materialized = false;
  TimeNs ready_ns = 0;  // when the sharing stream's work is done (CLOCK_MONOTONIC, as in every process)
};

// Describes a non-empty emugpu storage, allocated here or opened from elsewhere.
SharedStorage share_storage(const c10::Storage& storage);
// Maps a storage another process shared (the caller keeps owning `shared.fd`)
// on `emugpu:<shared.device>`; this device's current stream waits for the
// sender's work. Not counted in this process's allocator statistics, as CUDA
// does not count opened IPC handles.
c10::Storage open_shared_storage(const SharedStorage& shared);
// A shared storage that arrives again while still open here: takes on the
// sender's "holds real bytes" flag when set and waits for the sender's work.
void refresh_shared_storage(const c10::Storage& storage, bool materialized, TimeNs ready_ns);

}  // namespace emugpu
