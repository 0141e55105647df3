#include "host_allocator.h"

#include <gtest/gtest.h>

#include <cstring>

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
  EXPECT_EQ(a.stats().cached_bytes, 8192);
  void* q = a.allocate(7000);
  EXPECT_EQ(p, q);
  EXPECT_EQ(a.stats().reused, 1);
  EXPECT_EQ(a.stats().allocated_bytes, 8192);
  a.free(q);
  a.empty_cache();
  EXPECT_EQ(a.stats().cached_bytes, 0);
  EXPECT_FALSE(a.contains(q));
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

}  // namespace
