#include "caching_allocator.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "error.h"

namespace emugpu {

size_t round_allocation_size(size_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  EMUGPU_CHECK(size <= kMaxCapacity, kOutOfMemory, "cannot round an allocation of ", size,
               " bytes: expected at most 2^60 bytes, far beyond any GPU; request less memory");
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

size_t segment_size_for(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  EMUGPU_CHECK(rounded <= kMaxCapacity, kOutOfMemory, "cannot size a segment for ", rounded,
               " bytes: expected at most 2^60 bytes, far beyond any GPU; request less memory");
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

void FileRanges::give_back(uint64_t offset, uint64_t size) {
  auto [it, inserted] = free_.emplace(offset, size);
  EMUGPU_CHECK(inserted, kRuntime, "memfd range at offset ", offset, " given back twice");
  if (auto next = std::next(it); next != free_.end() && offset + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    if (auto prev = std::prev(it); prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

CachingAllocator::CachingAllocator(int device, std::string gpu_name, uint64_t capacity, uint64_t total)
    : device_(device), gpu_name_(std::move(gpu_name)), capacity_(capacity), total_(total ? total : capacity) {
  EMUGPU_CHECK(capacity > 0 && capacity <= kMaxCapacity, kValue,
               "emulated GPU capacity: expected 1 byte to 2^60 bytes, got ", capacity,
               " bytes; check the GPU's memory_gib in the catalog");
  const std::string name = "emugpu" + std::to_string(device);
  fd_ = memfd_create(name.c_str(), MFD_CLOEXEC);
  // Without a memfd (old kernel, seccomp) the device still works; only sharing does not.
  if (fd_ < 0) memfd_error_ = std::strerror(errno);
}

CachingAllocator::~CachingAllocator() {
  for (auto& [base, first] : segments_) {
    size_t total = 0;
    for (Block* b = first; b != nullptr;) {
      Block* next = b->next;
      total += b->size;
      delete b;
      b = next;
    }
    munmap(base, total);
  }
  if (fd_ >= 0) close(fd_);  // the file lives on while other processes map it
}

SharedRange CachingAllocator::share_info(const Block* block) const {
  std::lock_guard<std::mutex> lock(mutex_);
  EMUGPU_CHECK(fd_ >= 0, kRuntime, "cannot share memory of emulated device ", device_,
               ": expected a memfd behind its segments, but memfd_create failed (", memfd_error_,
               "); sharing between processes needs Linux 3.17+ with memfd_create allowed");
  EMUGPU_CHECK(block != nullptr && block->owner == this && block->allocated, kRuntime,
               "cannot share a block of emulated device ", device_, ": expected an allocated block of this device");
  return {fd_, block->file_offset, block->size};
}

void CachingAllocator::update(StatArray& stat, bool small, int64_t amount) {
  stat[kAggregate].add(amount);
  stat[small ? kSmallPool : kLargePool].add(amount);
}

void CachingAllocator::insert_free(Block* block) {
  block->counted_inactive = block->is_split();
  if (block->counted_inactive) {
    update(stats_.inactive_split, block->small, 1);
    update(stats_.inactive_split_bytes, block->small, static_cast<int64_t>(block->size));
  }
  (block->small ? small_free_ : large_free_).insert(block);
}

void CachingAllocator::erase_free(Block* block) {
  (block->small ? small_free_ : large_free_).erase(block);
  if (block->counted_inactive) {
    update(stats_.inactive_split, block->small, -1);
    update(stats_.inactive_split_bytes, block->small, -static_cast<int64_t>(block->size));
    block->counted_inactive = false;
  }
}

Block* CachingAllocator::take_free_block(FreeSet& pool, size_t size) {
  Block key;
  key.size = size;
  key.ptr = nullptr;
  auto it = pool.lower_bound(&key);
  if (it == pool.end()) return nullptr;
  Block* block = *it;
  erase_free(block);
  return block;
}

void CachingAllocator::share(std::shared_ptr<SharedCapacity> shared) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shared) {
    const uint64_t held = reserved_locked();
    uint64_t others = 0;
    EMUGPU_CHECK(held == 0 || shared->take(held, others), kOutOfMemory, "emugpu out of memory: emulated GPU ", device_,
                 " (", gpu_name_, ") holds ", format_bytes(static_cast<double>(held)),
                 " already, which the shared GPU cannot take (its other users hold ",
                 format_bytes(static_cast<double>(others)), ")");
  }
  if (shared_) shared_->give_back(reserved_locked());
  shared_ = std::move(shared);
}

Block* CachingAllocator::new_segment(size_t size, bool small) {
  if (reserved_locked() + size > capacity_) return nullptr;
  if (shared_ && !shared_->take(size, others_)) return nullptr;  // cudaMalloc fails: the others hold the rest
  uint64_t offset = 0;
  void* base = nullptr;
  if (fd_ >= 0) {
    // Segment sizes are multiples of 2 MiB, so every offset is page aligned.
    offset = ranges_.take(size, [&](uint64_t end) {
      EMUGPU_CHECK(ftruncate(fd_, static_cast<off_t>(end)) == 0, kRuntime,
                   "could not grow the memfd of emulated device ", device_, " to ",
                   format_bytes(static_cast<double>(end)), ": ", std::strerror(errno),
                   "; raise the process's file size limit (ulimit -f)");
    });
    base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, static_cast<off_t>(offset));
    if (base == MAP_FAILED) ranges_.give_back(offset, size);
  } else {
    base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  }
  if (base == MAP_FAILED && shared_) shared_->give_back(size);
  EMUGPU_CHECK(base != MAP_FAILED, kRuntime, "could not reserve ", format_bytes(size),
               " of host address space for emulated device ", device_,
               "; raise the process's virtual memory limit (ulimit -v)");
  auto* block = new Block;
  block->ptr = static_cast<char*>(base);
  block->size = size;
  block->file_offset = offset;
  block->small = small;
  segments_[block->ptr] = block;
  update(stats_.segment, small, 1);
  update(stats_.reserved_bytes, small, static_cast<int64_t>(size));
  stats_.num_device_alloc += 1;
  return block;
}

void CachingAllocator::release_cached_segments() {
  uint64_t released = 0;
  for (auto it = segments_.begin(); it != segments_.end();) {
    Block* block = it->second;
    if (block->allocated || block->next != nullptr) {
      ++it;
      continue;
    }
    erase_free(block);
    update(stats_.segment, block->small, -1);
    update(stats_.reserved_bytes, block->small, -static_cast<int64_t>(block->size));
    stats_.num_device_free += 1;
    munmap(block->ptr, block->size);
    if (fd_ >= 0) {
      // Hand the pages back to the host now; the range is reused later. shmem
      // supports punching holes, so a failure would only keep pages until reuse.
      (void)fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(block->file_offset),
                      static_cast<off_t>(block->size));
      ranges_.give_back(block->file_offset, block->size);
    }
    released += block->size;
    delete block;
    it = segments_.erase(it);
  }
  if (released > 0 && shared_) shared_->give_back(released);  // one request for them all
}

uint64_t CachingAllocator::reserved_locked() const {
  return static_cast<uint64_t>(stats_.reserved_bytes[kAggregate].current);
}

uint64_t CachingAllocator::reserved() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_locked();
}

Block* CachingAllocator::allocate(size_t requested) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Before any arithmetic (rounding SIZE_MAX would wrap to a tiny block);
  // smaller oversized requests take CUDA's path: free the cache, retry, fail.
  if (requested > kMaxCapacity) throw_oom(requested, requested);
  const size_t size = round_allocation_size(requested);
  const bool small = size <= kSmallSize;
  Block* block = take_free_block(small ? small_free_ : large_free_, size);
  if (block == nullptr) {
    const size_t segment = segment_size_for(size);
    block = new_segment(segment, small);
    if (block == nullptr) {
      // cudaMalloc failed: free every cached segment and try once more.
      stats_.num_alloc_retries += 1;
      release_cached_segments();
      block = new_segment(segment, small);
    }
    if (block == nullptr) throw_oom(requested, segment);
  }
  const size_t remaining = block->size - size;
  if (small ? remaining >= kMinBlockSize : remaining > kSmallSize) {
    auto* rest = new Block;
    rest->ptr = block->ptr + size;
    rest->file_offset = block->file_offset + size;
    rest->size = remaining;
    rest->small = small;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    insert_free(rest);
  }
  block->owner = this;
  block->allocated = true;
  block->requested = requested;
  block->materialized = false;
  block->exported = false;
  update(stats_.allocation, small, 1);
  update(stats_.active, small, 1);
  update(stats_.allocated_bytes, small, static_cast<int64_t>(block->size));
  update(stats_.active_bytes, small, static_cast<int64_t>(block->size));
  update(stats_.requested_bytes, small, static_cast<int64_t>(requested));
  return block;
}

void CachingAllocator::free(Block* block) {
  std::lock_guard<std::mutex> lock(mutex_);
  EMUGPU_CHECK(block != nullptr && block->allocated, kRuntime, "emulated device ", device_,
               ": free of a block that is not allocated");
  block->allocated = false;
  const bool small = block->small;
  update(stats_.allocation, small, -1);
  update(stats_.active, small, -1);
  update(stats_.allocated_bytes, small, -static_cast<int64_t>(block->size));
  update(stats_.active_bytes, small, -static_cast<int64_t>(block->size));
  update(stats_.requested_bytes, small, -static_cast<int64_t>(block->requested));
  // Merge with free neighbours, as CUDA's allocator does.
  for (Block* other : {block->prev, block->next}) {
    if (other == nullptr || other->allocated) continue;
    erase_free(other);
    if (other == block->prev) {
      block->ptr = other->ptr;
      block->file_offset = other->file_offset;
      block->prev = other->prev;
      if (block->prev)
        block->prev->next = block;
      else
        segments_[block->ptr] = block;
    } else {
      block->next = other->next;
      if (block->next) block->next->prev = block;
    }
    block->size += other->size;
    delete other;
  }
  insert_free(block);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_segments();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

template <typename Fn>
void CachingAllocator::for_each_stat(Fn&& fn) {
  for (StatArray* s :
       {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split, &stats_.allocated_bytes,
        &stats_.reserved_bytes, &stats_.active_bytes, &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
    for (Stat& stat : *s) fn(stat);
  }
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for_each_stat([](Stat& s) { s.reset_peak(); });
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for_each_stat([](Stat& s) { s.reset_accumulated(); });
  stats_.num_alloc_retries = stats_.num_ooms = 0;
  stats_.num_device_alloc = stats_.num_device_free = 0;
}

void CachingAllocator::throw_oom(size_t requested, size_t segment) {
  stats_.num_ooms += 1;
  const uint64_t reserved_now = reserved_locked();
  const auto allocated = static_cast<uint64_t>(stats_.allocated_bytes[kAggregate].current);
  const uint64_t others = shared_ ? others_ : 0;
  const uint64_t used = reserved_now + others;
  const uint64_t free_bytes = capacity_ > used ? capacity_ - used : 0;
  detail::throw_error(ErrorKind::kOutOfMemory, "emugpu out of memory. Tried to allocate ", format_bytes(requested),
                      " (a ", format_bytes(segment), " segment). Emulated GPU ", device_, " (", gpu_name_,
                      ") has a total capacity of ", format_bytes(total_), " of which ", format_bytes(free_bytes),
                      " is free. Of the allocated memory ", format_bytes(allocated), " is allocated by PyTorch, and ",
                      format_bytes(reserved_now - allocated), " is reserved by PyTorch but unallocated.",
                      shared_ ? " Other processes sharing this GPU through emugpud hold " +
                                    format_bytes(static_cast<double>(others)) + " of it."
                              : std::string(),
                      " Reduce the batch size, or emulate a GPU with more memory (EMUGPU_GPU).");
}

}  // namespace emugpu
