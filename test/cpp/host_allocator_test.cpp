#include "host_allocator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "error.h"

namespace {

using emugpu::HostAllocator;

TEST(HostAllocator, BlocksAreUsableAndRecognized) {
  HostAllocator a;
  auto* p = static_cast<char*>(a.allocate(10000));
  std::memset(p, 7, 10000);
  EXPECT_EQ(p[9999], 7);
  EXPECT_TRUE(a.contains(p));
  EXPECT_TRUE(a.contains(p + 16383));  // rounded up to 16 KiB
  EXPECT_FALSE(a.contains(p + 16384));
  int on_stack = 0;
  EXPECT_FALSE(a.contains(&on_stack));
  a.free(p);
}

TEST(HostAllocator, FreedBlocksAreReusedForTheSameSizeClass) {
  HostAllocator a;
  void* p = a.allocate(5000);
  a.free(p);
  EXPECT_EQ(a.stats().cached_bytes(), 8192);
  void* q = a.allocate(7000);
  EXPECT_EQ(p, q);
  const auto s = a.stats();
  EXPECT_EQ(s.requests, 2);
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.num_host_alloc, 1);
  EXPECT_EQ(s.allocated_bytes.current, 8192);
  EXPECT_EQ(s.active_bytes.current, 8192);
  EXPECT_EQ(s.cached_bytes(), 0);
  a.free(q);
  a.empty_cache();
  EXPECT_EQ(a.stats().cached_bytes(), 0);
  EXPECT_EQ(a.stats().num_host_free, 1);
  EXPECT_FALSE(a.contains(q));
}

TEST(HostAllocator, StatsFollowTorchCudaHostMemoryStats) {
  HostAllocator a;
  void* p = a.allocate(4096);
  void* q = a.allocate(100000);  // 128 KiB block
  a.free(p);
  auto s = a.stats();
  EXPECT_EQ(s.allocations.current, 2);  // handed out or cached
  EXPECT_EQ(s.allocated_bytes.current, 4096 + 131072);
  EXPECT_EQ(s.active_requests.current, 1);
  EXPECT_EQ(s.active_requests.peak, 2);
  EXPECT_EQ(s.active_bytes.current, 131072);
  EXPECT_EQ(s.active_bytes.freed, 4096);
  if (s.locked) {  // else some mlock was refused
    EXPECT_EQ(s.locked_bytes, 4096 + 131072);
  }
  EXPECT_LE(s.locked_bytes, 4096 + 131072);
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().active_requests.peak, 1);
  a.reset_accumulated_stats();
  s = a.stats();
  EXPECT_EQ(s.active_bytes.freed, 0);
  EXPECT_EQ(s.requests, 0);
  EXPECT_EQ(s.allocated_bytes.current, 4096 + 131072);  // current values stay
  a.free(q);
  a.empty_cache();
  s = a.stats();
  EXPECT_EQ(s.allocations.current, 0);
  EXPECT_EQ(s.locked_bytes, 0);
}

TEST(HostAllocator, RejectsForeignFreesAndEmptyRequests) {
  HostAllocator a;
  int x = 0;
  EXPECT_THROW(a.free(&x), emugpu::Error);
  EXPECT_THROW(a.allocate(0), emugpu::Error);
}

TEST(HostAllocator, ReportsWhetherPagesAreLocked) {
  HostAllocator a;
  void* p = a.allocate(4096);
  EXPECT_EQ(a.stats().locked, !a.lock_refused());
  a.free(p);
}

TEST(HostAllocator, HugeRequestsThrowInsteadOfOverflowingTheRounding) {
  HostAllocator a;
  for (size_t size : {SIZE_MAX, SIZE_MAX / 2 + 2, emugpu::kMaxHostBlock + 1}) {
    try {
      a.allocate(size);
      FAIL() << "expected an error for " << size;
    } catch (const emugpu::Error& e) {
      EXPECT_EQ(e.kind(), emugpu::ErrorKind::kOutOfMemory) << e.what();
    }
  }
  EXPECT_EQ(a.stats().requests, 0);
  EXPECT_EQ(a.stats().allocations.current, 0);
}

TEST(HostAllocator, LockStateIsReadSafelyWhileThreadsAllocate) {
  // Under ThreadSanitizer this checks lock_refused() takes the lock.
  HostAllocator a;
  std::atomic<bool> done{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&a] {
      for (int i = 0; i < 100; ++i) a.free(a.allocate(4096 * (1 + i % 3)));
    });
  }
  std::thread reader([&] {
    while (!done.load()) (void)a.lock_refused();
  });
  for (auto& w : workers) w.join();
  done = true;
  reader.join();
  EXPECT_EQ(a.stats().requests, 400);
  EXPECT_EQ(a.stats().active_bytes.current, 0);
  EXPECT_EQ(a.stats().locked, !a.lock_refused());
}

}  // namespace
