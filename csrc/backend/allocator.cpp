#include "backend/allocator.h"

#include <c10/core/Allocator.h>

#include <algorithm>
#include <cstring>

namespace emugpu {

namespace {

void delete_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  if (block != nullptr) block->owner->free(block);
}

void copy_stats(const StatArray& from, c10::CachingAllocator::StatArray& to) {
  for (size_t i = 0; i < from.size(); ++i) {
    to[i].current = from[i].current;
    to[i].peak = from[i].peak;
    to[i].allocated = from[i].allocated;
    to[i].freed = from[i].freed;
  }
}

}  // namespace

c10::DataPtr EmuDeviceAllocator::allocate(size_t nbytes) {
  return allocate_on(current_device(), nbytes);
}

c10::DataPtr EmuDeviceAllocator::allocate_on(int device, size_t nbytes) {
  const c10::Device where(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  if (nbytes == 0) return {nullptr, nullptr, &delete_block, where};
  Block* block = translate_errors([&] { return Runtime::get().device(device).allocator().allocate(nbytes); });
  if (Runtime::get().compute_mode()) block->materialized = true;
  return {block->ptr, block, &delete_block, where};
}

c10::DeleterFnPtr EmuDeviceAllocator::raw_deleter() const { return &delete_block; }

void EmuDeviceAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

bool EmuDeviceAllocator::initialized() { return Runtime::get().configured(); }

void EmuDeviceAllocator::emptyCache(c10::MempoolId_t /*mempool_id*/) {
  if (!Runtime::get().configured()) return;
  for (int i = 0; i < Runtime::get().device_count(); ++i) {
    Runtime::get().device(i).allocator().empty_cache();
  }
}

void EmuDeviceAllocator::recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) {
  // Blocks are handed out in timeline order; a freed block's reuse cannot
  // race with emulated work, so there is nothing to defer.
}

c10::CachingDeviceAllocator::DeviceStats EmuDeviceAllocator::getDeviceStats(c10::DeviceIndex device) {
  const AllocatorStats s =
      translate_errors([&] { return Runtime::get().device(device).allocator().stats(); });
  c10::CachingDeviceAllocator::DeviceStats out;
  copy_stats(s.allocation, out.allocation);
  copy_stats(s.segment, out.segment);
  copy_stats(s.active, out.active);
  copy_stats(s.inactive_split, out.inactive_split);
  copy_stats(s.allocated_bytes, out.allocated_bytes);
  copy_stats(s.reserved_bytes, out.reserved_bytes);
  copy_stats(s.active_bytes, out.active_bytes);
  copy_stats(s.inactive_split_bytes, out.inactive_split_bytes);
  copy_stats(s.requested_bytes, out.requested_bytes);
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  out.num_device_alloc = s.num_device_alloc;
  out.num_device_free = s.num_device_free;
  return out;
}

void EmuDeviceAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  translate_errors([&] { Runtime::get().device(device).allocator().reset_accumulated_stats(); });
}

void EmuDeviceAllocator::resetPeakStats(c10::DeviceIndex device) {
  translate_errors([&] { Runtime::get().device(device).allocator().reset_peak_stats(); });
}

std::pair<size_t, size_t> EmuDeviceAllocator::getMemoryInfo(c10::DeviceIndex device) {
  return translate_errors([&] {
    Device& d = Runtime::get().device(device);
    const uint64_t total = d.gpu().memory_bytes;
    const uint64_t used = d.allocator().reserved() + kCudaContextBytes;
    return std::pair<size_t, size_t>(total > used ? total - used : 0, total);
  });
}

EmuDeviceAllocator& device_allocator() {
  static EmuDeviceAllocator allocator;
  return allocator;
}

// Registered at load time so that every emugpu storage comes from it.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &device_allocator());

Block* block_of(const c10::Storage& storage) {
  return static_cast<Block*>(storage.data_ptr().get_context());
}

bool is_materialized(const c10::Storage& storage) {
  const Block* block = block_of(storage);
  return block != nullptr && block->materialized;
}

void set_materialized(const c10::Storage& storage, bool value) {
  if (Block* block = block_of(storage)) block->materialized = value;
}

void resize_storage(const c10::Storage& storage, size_t nbytes) {
  if (nbytes == storage.nbytes()) return;
  TORCH_CHECK(storage.resizable(), "emugpu: trying to resize a storage that is not resizable");
  const int device = storage.device().index();
  c10::DataPtr fresh = device_allocator().allocate_on(device, nbytes);
  const size_t keep = std::min(nbytes, storage.nbytes());
  const bool real = is_materialized(storage);
  if (keep > 0 && real) std::memcpy(fresh.get(), storage.data(), keep);
  if (auto* block = static_cast<Block*>(fresh.get_context()); block != nullptr && real) block->materialized = true;
  storage.set_data_ptr_noswap(std::move(fresh));
  storage.set_nbytes(nbytes);
}

}  // namespace emugpu
