#include "host_allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>

#include "error.h"

namespace emugpu {

namespace {
constexpr size_t kMinHostBlock = 4096;
}

HostAllocator::~HostAllocator() {
  for (auto& [ptr, block] : blocks_) release(ptr, block);
}

void HostAllocator::release(char* ptr, const Block& block) {
  if (block.locked) munlock(ptr, block.size);
  munmap(ptr, block.size);
}

void* HostAllocator::allocate(size_t size) {
  EMUGPU_CHECK(size > 0, kValue, "pinned host allocation of 0 bytes");
  EMUGPU_CHECK(size <= kMaxHostBlock, kOutOfMemory, "pinned host allocation of ", size,
               " bytes: expected at most 2^48 bytes (256 TiB); request less memory");
  const size_t rounded = std::bit_ceil(std::max(size, kMinHostBlock));
  const auto bytes = static_cast<int64_t>(rounded);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.requests += 1;
  stats_.active_requests.add(1);
  stats_.active_bytes.add(bytes);
  auto it = cached_.lower_bound(rounded);
  if (it != cached_.end() && it->first == rounded) {
    char* ptr = it->second;
    cached_.erase(it);
    blocks_[ptr].free = false;
    stats_.cache_hits += 1;
    return ptr;
  }
  void* mem = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {  // nothing was handed out
    stats_.active_requests.add(-1);
    stats_.active_bytes.add(-bytes);
  }
  EMUGPU_CHECK(mem != MAP_FAILED, kOutOfMemory, "could not allocate ", rounded,
               " bytes of pinned host memory; free host memory or use smaller batches");
  const bool locked = mlock(mem, rounded) == 0;
  if (!locked) {
    lock_refused_ = true;
    stats_.locked = false;
  }
  blocks_[static_cast<char*>(mem)] = Block{rounded, false, locked};
  stats_.num_host_alloc += 1;
  stats_.allocations.add(1);
  stats_.allocated_bytes.add(bytes);
  if (locked) stats_.locked_bytes += bytes;
  return mem;
}

void HostAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(static_cast<char*>(ptr));
  EMUGPU_CHECK(it != blocks_.end() && !it->second.free, kRuntime,
               "pinned host free of a pointer this allocator did not hand out");
  it->second.free = true;
  cached_.emplace(it->second.size, it->first);
  stats_.active_requests.add(-1);
  stats_.active_bytes.add(-static_cast<int64_t>(it->second.size));
}

bool HostAllocator::contains(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto* p = static_cast<char*>(const_cast<void*>(ptr));
  auto it = blocks_.upper_bound(p);
  if (it == blocks_.begin()) return false;
  --it;
  return p < it->first + it->second.size;
}

void HostAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [size, ptr] : cached_) {
    auto it = blocks_.find(ptr);
    if (it->second.locked) stats_.locked_bytes -= static_cast<int64_t>(size);
    release(ptr, it->second);
    blocks_.erase(it);
    stats_.num_host_free += 1;
    stats_.allocations.add(-1);
    stats_.allocated_bytes.add(-static_cast<int64_t>(size));
  }
  cached_.clear();
}

bool HostAllocator::lock_refused() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lock_refused_;
}

HostAllocatorStats HostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void HostAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Stat* s : {&stats_.allocations, &stats_.allocated_bytes, &stats_.active_requests, &stats_.active_bytes}) {
    s->reset_peak();
  }
}

void HostAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Stat* s : {&stats_.allocations, &stats_.allocated_bytes, &stats_.active_requests, &stats_.active_bytes}) {
    s->reset_accumulated();
  }
  stats_.num_host_alloc = stats_.num_host_free = stats_.requests = stats_.cache_hits = 0;
}

}  // namespace emugpu
