#include "pending_writes.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace emugpu {
namespace {

// A call that waits for `release` (another rank that has not arrived yet).
OrderedRunner::Call blocked_until(std::atomic<bool>& release, std::atomic<int>& value, int write) {
  return [&release, &value, write] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    value.store(write);
    return int64_t{write};
  };
}

TEST(PendingWrites, AwaitSeesTheWritesOfEveryCallOnItsKey) {
  auto runner = std::make_shared<OrderedRunner>();
  PendingWrites writes;
  int a = 0, b = 0;
  std::atomic<bool> release{false};
  std::atomic<int> value{0};
  writes.submit(runner, {&a}, blocked_until(release, value, 1));
  writes.submit(runner, {&a, &b}, [&] {
    value.store(value.load() * 10 + 2);
    return int64_t{0};
  });
  EXPECT_FALSE(writes.empty());
  EXPECT_EQ(writes.size(), 2u);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    release = true;
  });
  writes.await(&b);  // the call on b comes after the one on a only: runs both, in order
  EXPECT_EQ(value.load(), 12);
  EXPECT_TRUE(writes.empty());
  releaser.join();
}

TEST(PendingWrites, AwaitOnAnotherKeyDoesNotWait) {
  auto runner = std::make_shared<OrderedRunner>();
  PendingWrites writes;
  int a = 0, other = 0;
  std::atomic<bool> release{false};
  std::atomic<int> value{0};
  auto ticket = writes.submit(runner, {&a}, blocked_until(release, value, 7));
  const auto start = std::chrono::steady_clock::now();
  writes.await(&other);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
  EXPECT_FALSE(ticket->done());
  EXPECT_EQ(writes.size(), 1u);
  release = true;
  writes.await(&a);
  EXPECT_EQ(value.load(), 7);
}

// A send deferred on a runner of its own reads what the collectives
// launched before it wrote, never what later ones (which may wait for it) do.
TEST(PendingWrites, AHorizonAwaitsOnlyTheCallsSubmittedBeforeIt) {
  auto runner = std::make_shared<OrderedRunner>();
  auto poster = std::make_shared<OrderedRunner>();
  PendingWrites writes;
  int a = 0;
  std::atomic<bool> never{false};
  std::atomic<int> value{0};
  auto first = writes.submit(runner, {&a}, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    value.store(1);
    return int64_t{1};
  });
  const uint64_t watermark = writes.watermark();
  // Later, and never done while the post runs: awaiting it would hang.
  auto later = writes.submit(runner, {&a}, blocked_until(never, value, 2));
  std::atomic<int> seen{-1};
  std::atomic<int> seen_without{-1};
  auto post = poster->submit([&] {
    {
      PendingWrites::Horizon horizon(watermark);
      writes.await(&a);
      seen = value.load();
    }
    writes.await(&a);  // inside a call, no horizon: returns at once
    seen_without = value.load();
    return int64_t{0};
  });
  poster->run_through(post);
  EXPECT_EQ(seen.load(), 1);
  EXPECT_EQ(seen_without.load(), 1);
  EXPECT_TRUE(first->done());
  EXPECT_FALSE(later->done());
  never = true;
  runner->run_through(later);
  EXPECT_EQ(value.load(), 2);
}

TEST(PendingWrites, EntriesGoWhenTheRunnersThreadRunsTheCalls) {
  auto runner = std::make_shared<OrderedRunner>();
  PendingWrites writes;
  int a = 0;
  std::vector<std::shared_ptr<OrderedRunner::Ticket>> tickets;
  for (int i = 0; i < 100; ++i) tickets.push_back(writes.submit(runner, {&a}, [i] { return int64_t{i}; }));
  for (int spin = 0; spin < 5000 && !writes.empty(); ++spin) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(writes.empty());  // nobody awaited: the runner's thread removed them
  EXPECT_EQ(runner->run_through(tickets.back()), 99);
}

TEST(PendingWrites, AwaitRethrowsTheCallsError) {
  auto runner = std::make_shared<OrderedRunner>();
  PendingWrites writes;
  int a = 0;
  std::atomic<bool> release{false};
  std::atomic<int> value{0};
  writes.submit(runner, {&a}, blocked_until(release, value, 1));
  writes.submit(runner, {&a}, []() -> int64_t { throw std::runtime_error("ranks disagree"); });
  release = true;
  EXPECT_THROW(writes.await(&a), std::runtime_error);
  EXPECT_TRUE(writes.empty());
}

TEST(PendingWrites, ACallThatTouchesTheMemoryDoesNotWaitForLaterCalls) {
  auto runner = std::make_shared<OrderedRunner>();
  PendingWrites writes;
  int a = 0;
  std::atomic<bool> awaited{false};
  // The first call awaits its own memory, which a later call also touches:
  // waiting for that call from inside this one would never end.
  auto first = writes.submit(runner, {&a}, [&] {
    writes.await(&a);
    awaited = true;
    return int64_t{1};
  });
  auto second = writes.submit(runner, {&a}, [] { return int64_t{2}; });
  EXPECT_EQ(runner->run_through(second), 2);
  EXPECT_TRUE(awaited.load());
  EXPECT_FALSE(OrderedRunner::in_call());
}

}  // namespace
}  // namespace emugpu
