// Emulated CUDA caching allocator: the same rounding, pools, segment sizes,
// block splitting and statistics as PyTorch's CUDACachingAllocator, over
// reserved host address space (MAP_NORESERVE), so an emulated GPU's memory
// costs host RAM only where bytes are really written. Segments are ranges of
// one sparse memfd per allocator, so other processes can map a block's bytes
// (the emulated counterpart of CUDA IPC).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "stat.h"

namespace emugpu {

constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallSize = 1 << 20;     // requests up to this use the small pool
constexpr size_t kSmallBuffer = 2 << 20;   // small-pool segment size
constexpr size_t kLargeBuffer = 20 << 20;  // segment for requests under kMinLargeAlloc
constexpr size_t kMinLargeAlloc = 10 << 20;
constexpr size_t kRoundLarge = 2 << 20;
// Far above any GPU; keeps sizes and their int64 statistics from overflowing.
constexpr uint64_t kMaxCapacity = uint64_t{1} << 60;

size_t round_allocation_size(size_t size);
size_t segment_size_for(size_t rounded);

enum Pool : int { kAggregate = 0, kSmallPool = 1, kLargePool = 2 };
using StatArray = std::array<Stat, 3>;

struct AllocatorStats {
  StatArray allocation, segment, active, inactive_split;
  StatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
  Stat oversize_allocations, oversize_segments;
};

class CachingAllocator;

struct Block {
  CachingAllocator* owner = nullptr;
  char* ptr = nullptr;
  size_t size = 0;
  uint64_t file_offset = 0;  // where `ptr` lives in the owner's memfd
  size_t requested = 0;
  bool allocated = false;
  bool small = false;
  bool counted_inactive = false;
  // Set by the torch layer when real bytes were copied in; blocks that only
  // hold computed (so never computed) values read back as placeholders.
  // Atomic: backward writes it from the autograd engine's threads.
  std::atomic<bool> materialized{false};
  // Maintained by DeferredCopies (deferred_copies.h): a copy into or out of
  // this block waits until its bytes are needed.
  std::atomic<bool> deferred{false};
  // Set by the torch layer when another process may map the block: its
  // bytes must be real at all times, so no copy into or out of it waits.
  std::atomic<bool> exported{false};
  Block* prev = nullptr;  // neighbours within the same segment
  Block* next = nullptr;
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// File ranges of the allocator's memfd: free ranges by offset, first fit,
// neighbours merged on release; the file grows at its end when nothing fits.
// Not thread-safe (the allocator's lock covers it).
class FileRanges {
 public:
  // Returns the offset of `size` bytes; `grow(new_end)` is called first when
  // the file must become longer.
  template <typename Grow>
  uint64_t take(uint64_t size, Grow&& grow);
  void give_back(uint64_t offset, uint64_t size);
  uint64_t end() const { return end_; }
  const std::map<uint64_t, uint64_t>& free_ranges() const { return free_; }

 private:
  std::map<uint64_t, uint64_t> free_;  // offset -> size
  uint64_t end_ = 0;
};

// What another process needs to map a block: the memfd and the block's range in it.
struct SharedRange {
  int fd = -1;
  uint64_t offset = 0;
  size_t size = 0;
};

// Memory of the GPU that other processes use too (the sharing daemon's): a
// new segment takes its bytes there first, a released one gives them back.
class SharedCapacity {
 public:
  virtual ~SharedCapacity() = default;
  // Takes `bytes` for this process: true, or false when the GPU's other
  // users leave too little (`others` then holds what they have).
  virtual bool take(uint64_t bytes, uint64_t& others) = 0;
  virtual void give_back(uint64_t bytes) = 0;
};

class CachingAllocator {
 public:
  // `capacity` is what CUDA would let cudaMalloc hand out on this GPU;
  // `device`, `gpu_name` and `total` (the GPU's memory, default `capacity`)
  // only appear in messages.
  CachingAllocator(int device, std::string gpu_name, uint64_t capacity, uint64_t total = 0);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Throws kOutOfMemory, with a CUDA-style message, when it cannot fit
  // (requests beyond the capacity included, however large).
  Block* allocate(size_t size);
  void free(Block* block);
  void empty_cache();

  // From now on segments are also taken from `shared` (the segments held
  // already are taken from it first); nullptr: this process alone.
  void share(std::shared_ptr<SharedCapacity> shared);

  AllocatorStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  uint64_t capacity() const { return capacity_; }
  uint64_t reserved() const;
  int device() const { return device_; }

  // The memfd behind every segment (-1 when the host could not create one);
  // owned by the allocator.
  int memfd() const { return fd_; }
  // The memfd range of an allocated block of this allocator; throws kRuntime
  // when sharing is unavailable (no memfd) or the block is not allocated here.
  SharedRange share_info(const Block* block) const;

 private:
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeSet = std::set<Block*, BlockLess>;

  Block* take_free_block(FreeSet& pool, size_t size);
  Block* new_segment(size_t size, bool small);
  void release_cached_segments();
  uint64_t reserved_locked() const;
  void insert_free(Block* block);
  void erase_free(Block* block);
  void update(StatArray& stat, bool small, int64_t amount);
  template <typename Fn>
  void for_each_stat(Fn&& fn);
  [[noreturn]] void throw_oom(size_t requested, size_t segment);

  mutable std::mutex mutex_;
  int fd_ = -1;
  std::string memfd_error_;  // why fd_ is -1
  FileRanges ranges_;
  int device_;
  std::string gpu_name_;
  uint64_t capacity_;
  uint64_t total_;
  FreeSet small_free_;
  FreeSet large_free_;
  std::unordered_map<char*, Block*> segments_;  // segment base -> first block
  AllocatorStats stats_;
  std::shared_ptr<SharedCapacity> shared_;
  uint64_t others_ = 0;  // what the GPU's other users held at the last refusal
};

std::string format_bytes(double bytes);

template <typename Grow>
uint64_t FileRanges::take(uint64_t size, Grow&& grow) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - size;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + size, rest);
    return offset;
  }
  // Nothing fits: a free range at the end of the file is extended.
  uint64_t offset = end_;
  if (!free_.empty()) {
    auto last = std::prev(free_.end());
    if (last->first + last->second == end_) offset = last->first;
  }
  grow(offset + size);
  if (offset != end_) free_.erase(offset);
  end_ = offset + size;
  return offset;
}

}  // namespace emugpu
