#include "caching_allocator.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "error.h"

namespace {

using emugpu::CachingAllocator;
using emugpu::kAggregate;
using emugpu::kLargePool;
using emugpu::kSmallPool;

constexpr size_t MiB = 1 << 20;
constexpr uint64_t GiB = 1ull << 30;

TEST(CachingAllocator, RoundsLikeCuda) {
  EXPECT_EQ(emugpu::round_allocation_size(1), 512u);
  EXPECT_EQ(emugpu::round_allocation_size(513), 1024u);
  EXPECT_EQ(emugpu::segment_size_for(4096), 2 * MiB);
  EXPECT_EQ(emugpu::segment_size_for(5 * MiB), 20 * MiB);
  EXPECT_EQ(emugpu::segment_size_for(11 * MiB), 12 * MiB);
}

TEST(CachingAllocator, SmallAllocationsShareATwoMiBSegment) {
  CachingAllocator a(0, "test", GiB);
  auto* x = a.allocate(1000);
  auto* y = a.allocate(1000);
  const auto s = a.stats();
  EXPECT_EQ(s.segment[kAggregate].current, 1);
  EXPECT_EQ(s.reserved_bytes[kSmallPool].current, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(s.allocated_bytes[kAggregate].current, 2048);
  EXPECT_EQ(s.requested_bytes[kAggregate].current, 2000);
  EXPECT_EQ(y->ptr, x->ptr + 1024);
  a.free(x);
  a.free(y);
  EXPECT_EQ(a.stats().allocated_bytes[kAggregate].current, 0);
  EXPECT_EQ(a.stats().reserved_bytes[kAggregate].current, static_cast<int64_t>(2 * MiB));
}

TEST(CachingAllocator, MidSizedRequestsGetTwentyMiBSegmentsAndSplit) {
  CachingAllocator a(0, "test", GiB);
  auto* x = a.allocate(3 * MiB);
  auto* y = a.allocate(3 * MiB);
  const auto s = a.stats();
  EXPECT_EQ(s.segment[kLargePool].current, 1);
  EXPECT_EQ(s.reserved_bytes[kAggregate].current, static_cast<int64_t>(20 * MiB));
  EXPECT_EQ(s.inactive_split_bytes[kAggregate].current, static_cast<int64_t>(14 * MiB));
  a.free(x);
  a.free(y);
  EXPECT_EQ(a.stats().inactive_split_bytes[kAggregate].current, 0);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes[kAggregate].current, 0);
}

TEST(CachingAllocator, FreedBlocksAreReusedWithoutNewSegments) {
  CachingAllocator a(0, "test", GiB);
  for (int i = 0; i < 10; ++i) a.free(a.allocate(64 * MiB));
  const auto s = a.stats();
  EXPECT_EQ(s.num_device_alloc, 1);
  EXPECT_EQ(s.allocation[kAggregate].allocated, 10);
  EXPECT_EQ(s.allocated_bytes[kAggregate].peak, static_cast<int64_t>(64 * MiB));
}

TEST(CachingAllocator, PeaksResetToCurrent) {
  CachingAllocator a(0, "test", GiB);
  auto* x = a.allocate(100 * MiB);
  a.free(a.allocate(200 * MiB));
  EXPECT_EQ(a.stats().allocated_bytes[kAggregate].peak, static_cast<int64_t>(300 * MiB));
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().allocated_bytes[kAggregate].peak, static_cast<int64_t>(100 * MiB));
  a.free(x);
}

TEST(CachingAllocator, OutOfMemoryIsACudaStyleError) {
  CachingAllocator a(3, "Tesla T4", GiB);
  auto* x = a.allocate(800 * MiB);
  try {
    a.allocate(400 * MiB);
    FAIL() << "expected out of memory";
  } catch (const emugpu::Error& e) {
    EXPECT_EQ(e.kind(), emugpu::ErrorKind::kOutOfMemory);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Tried to allocate 400.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("total capacity of 1.00 GiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Tesla T4"), std::string::npos) << msg;
  }
  EXPECT_EQ(a.stats().num_ooms, 1);
  a.free(x);
}

TEST(CachingAllocator, OutOfMemoryFreesTheCacheBeforeGivingUp) {
  CachingAllocator a(0, "test", GiB);
  a.free(a.allocate(600 * MiB));
  auto* y = a.allocate(700 * MiB);  // fits only once the cached 600 MiB is released
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  a.free(y);
}

TEST(CachingAllocator, ReservedIsReadSafelyWhileThreadsAllocate) {
  // Run under ThreadSanitizer (scripts/sanitize.sh) this also proves reserved()
  // takes the allocator's lock.
  CachingAllocator a(0, "test", GiB);
  std::atomic<bool> done{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&a, t] {
      for (int i = 0; i < 200; ++i) {
        auto* small = a.allocate(1000 + t);
        auto* large = a.allocate((3 + t) * MiB);
        a.free(small);
        a.free(large);
        if (i % 50 == 0) a.empty_cache();
      }
    });
  }
  std::thread reader([&] {
    while (!done.load()) {
      const uint64_t r = a.reserved();
      EXPECT_LE(r, GiB);
      EXPECT_EQ(r % (2 * MiB), 0u) << r;  // whole segments only
    }
  });
  for (auto& w : workers) w.join();
  done = true;
  reader.join();
  EXPECT_EQ(a.reserved(), static_cast<uint64_t>(a.stats().reserved_bytes[kAggregate].current));
  EXPECT_EQ(a.stats().allocation[kAggregate].allocated, 4 * 200 * 2);
  EXPECT_EQ(a.stats().allocated_bytes[kAggregate].current, 0);
}

TEST(CachingAllocator, HugeRequestsAreOutOfMemoryInsteadOfWrapping) {
  CachingAllocator a(0, "test", GiB);
  for (size_t size : {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX / 2 + 1, size_t{GiB} + 1}) {
    try {
      a.allocate(size);
      FAIL() << "expected out of memory for " << size;
    } catch (const emugpu::Error& e) {
      EXPECT_EQ(e.kind(), emugpu::ErrorKind::kOutOfMemory) << e.what();
    }
  }
  EXPECT_EQ(a.stats().allocation[kAggregate].allocated, 0);
  EXPECT_EQ(a.reserved(), 0u);
  EXPECT_THROW(emugpu::round_allocation_size(SIZE_MAX), emugpu::Error);
  EXPECT_THROW(emugpu::segment_size_for(SIZE_MAX), emugpu::Error);
  EXPECT_THROW(CachingAllocator(0, "test", UINT64_MAX), emugpu::Error);
}

long resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

TEST(CachingAllocator, UntouchedDeviceMemoryCostsNoHostRam) {
  CachingAllocator a(0, "test", 40 * GiB);
  const long before = resident_kib();
  auto* x = a.allocate(20 * GiB);
  EXPECT_LT(resident_kib() - before, 64 * 1024);
  std::memset(x->ptr, 1, 16 * MiB);  // the bytes are really there
  EXPECT_EQ(x->ptr[16 * MiB - 1], 1);
  a.free(x);
}

// Another process sees a block through the memfd; a second mapping in this
// process reads the same file pages the same way.
TEST(CachingAllocator, SegmentsAreSharedMemory) {
  CachingAllocator a(0, "test", GiB);
  ASSERT_GE(a.memfd(), 0) << "memfd_create unavailable on this host";
  auto* x = a.allocate(1000);
  auto* y = a.allocate(3 * MiB);
  for (auto* b : {x, y}) {
    const auto shared = a.share_info(b);
    EXPECT_EQ(shared.fd, a.memfd());
    EXPECT_EQ(shared.size, b->size);
    std::memset(b->ptr, 0x5a, 100);
    const long page = sysconf(_SC_PAGESIZE);
    const uint64_t start = shared.offset / page * page;
    const size_t lead = shared.offset - start;
    void* view = mmap(nullptr, lead + 100, PROT_READ | PROT_WRITE, MAP_SHARED, shared.fd, static_cast<off_t>(start));
    ASSERT_NE(view, MAP_FAILED);
    char* bytes = static_cast<char*>(view) + lead;
    EXPECT_EQ(bytes[0], 0x5a);
    EXPECT_EQ(bytes[99], 0x5a);
    bytes[50] = 7;  // writes travel the other way too
    EXPECT_EQ(b->ptr[50], 7);
    munmap(view, lead + 100);
  }
  a.free(x);
  a.free(y);
}

TEST(CachingAllocator, SplitBlocksKnowTheirFileOffsets) {
  CachingAllocator a(0, "test", GiB);
  auto* x = a.allocate(1000);
  auto* y = a.allocate(1000);
  auto* big = a.allocate(3 * MiB);
  auto* big2 = a.allocate(3 * MiB);
  EXPECT_EQ(y->file_offset, x->file_offset + 1024);
  EXPECT_EQ(big2->file_offset, big->file_offset + 3 * MiB);
  EXPECT_EQ(a.share_info(y).offset, y->file_offset);
  // Segments do not overlap in the file.
  EXPECT_TRUE(big->file_offset >= x->file_offset + 2 * MiB || x->file_offset >= big->file_offset + 20 * MiB);
  const uint64_t first = x->file_offset;
  a.free(x);
  a.free(y);  // merges with x: the merged block starts at x's offset
  auto* z = a.allocate(2000);
  EXPECT_EQ(z->file_offset, first);
  a.free(z);
  a.free(big);
  a.free(big2);
}

TEST(CachingAllocator, SharingABlockOfAnotherAllocatorIsRefused) {
  CachingAllocator a(0, "test", GiB);
  CachingAllocator b(1, "test", GiB);
  auto* x = a.allocate(1000);
  EXPECT_THROW(b.share_info(x), emugpu::Error);
  EXPECT_THROW(a.share_info(nullptr), emugpu::Error);
  a.free(x);
  EXPECT_THROW(a.share_info(x), emugpu::Error);  // no longer allocated
}

long file_kib(int fd) {
  struct stat st {};
  EXPECT_EQ(fstat(fd, &st), 0);
  return static_cast<long>(st.st_blocks) / 2;
}

TEST(CachingAllocator, ReleasedSegmentsReturnTheirPagesAndRanges) {
  CachingAllocator a(0, "test", GiB);
  ASSERT_GE(a.memfd(), 0);
  auto* x = a.allocate(64 * MiB);
  const uint64_t offset = x->file_offset;
  std::memset(x->ptr, 1, 16 * MiB);
  EXPECT_GE(file_kib(a.memfd()), 16 * 1024);
  a.free(x);
  EXPECT_GE(file_kib(a.memfd()), 16 * 1024);  // cached, as CUDA keeps it
  a.empty_cache();
  EXPECT_LT(file_kib(a.memfd()), 1024);  // the hole is punched
  auto* y = a.allocate(64 * MiB);
  EXPECT_EQ(y->file_offset, offset);  // the range is reused, the file does not grow
  EXPECT_EQ(y->ptr[0], 0);            // released bytes do not come back
  a.free(y);
}

TEST(FileRanges, FirstFitMergesNeighboursAndGrowsAtTheEnd) {
  emugpu::FileRanges r;
  uint64_t end = 0;
  auto grow = [&](uint64_t e) { end = e; };
  EXPECT_EQ(r.take(2 * MiB, grow), 0u);
  EXPECT_EQ(r.take(4 * MiB, grow), 2 * MiB);
  EXPECT_EQ(r.take(2 * MiB, grow), 6 * MiB);
  EXPECT_EQ(end, 8 * MiB);
  r.give_back(0, 2 * MiB);
  r.give_back(6 * MiB, 2 * MiB);
  EXPECT_EQ(r.free_ranges().size(), 2u);
  r.give_back(2 * MiB, 4 * MiB);  // joins both neighbours
  ASSERT_EQ(r.free_ranges().size(), 1u);
  EXPECT_EQ(r.free_ranges().begin()->second, 8 * MiB);
  EXPECT_EQ(r.take(2 * MiB, grow), 0u);  // first fit
  EXPECT_EQ(end, 8 * MiB);
  // A free tail is extended instead of leaving a gap.
  EXPECT_EQ(r.take(10 * MiB, grow), 2 * MiB);
  EXPECT_EQ(end, 12 * MiB);
  EXPECT_TRUE(r.free_ranges().empty());
  r.give_back(0, 2 * MiB);
  EXPECT_THROW(r.give_back(0, 2 * MiB), emugpu::Error);  // twice is a bug
}

}  // namespace
