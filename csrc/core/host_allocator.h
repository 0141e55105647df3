// Page-locked ("pinned") host memory, cached for reuse as CUDA's host
// allocator does: pin_memory() and DataLoader(pin_memory=True) get blocks
// from here, and copies from them may run asynchronously on the copy engines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "stat.h"

namespace emugpu {

// 256 TiB: more than any host has, and small enough that rounding up to a
// power of two cannot overflow.
constexpr size_t kMaxHostBlock = size_t{1} << 48;

// Named as torch.cuda.host_memory_stats() names them, plus what pinning costs
// an emulated host: locked bytes, cache hits.
struct HostAllocatorStats {
  Stat allocations;      // blocks owned, handed out or cached
  Stat allocated_bytes;  // their bytes
  Stat active_requests;  // blocks handed out
  Stat active_bytes;
  int64_t num_host_alloc = 0;  // blocks mapped to grow the pool
  int64_t num_host_free = 0;   // cached blocks returned to the system
  int64_t requests = 0;        // allocate() calls
  int64_t cache_hits = 0;      // of those, served from the cache
  int64_t locked_bytes = 0;    // owned bytes that mlock pinned
  bool locked = true;          // false once mlock was refused
  int64_t cached_bytes() const { return allocated_bytes.current - active_bytes.current; }
};

class HostAllocator {
 public:
  HostAllocator() = default;
  ~HostAllocator();
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;

  // Returns at least `size` bytes; sizes round up to a power of two (>= 4 KiB)
  // so freed blocks fit later requests. Never returns nullptr for size > 0;
  // throws kOutOfMemory beyond kMaxHostBlock.
  void* allocate(size_t size);
  void free(void* ptr);
  // True if `ptr` points into a block of this allocator (allocated or cached).
  bool contains(const void* ptr) const;
  // Unlocks and returns every cached block to the system.
  void empty_cache();
  HostAllocatorStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  // Whether the last mlock failed (no privilege or RLIMIT_MEMLOCK); the
  // memory is then ordinary, and the caller should say so once.
  bool lock_refused() const;

 private:
  struct Block {
    size_t size;
    bool free;
    bool locked;
  };

  void release(char* ptr, const Block& block);

  mutable std::mutex mutex_;
  std::map<char*, Block> blocks_;        // every block, by address
  std::multimap<size_t, char*> cached_;  // free blocks, by size
  HostAllocatorStats stats_;
  bool lock_refused_ = false;
};

}  // namespace emugpu
