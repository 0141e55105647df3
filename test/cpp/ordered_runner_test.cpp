#include "ordered_runner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "error.h"

namespace emugpu {
namespace {

TEST(OrderedRunner, RunsCallsInSubmissionOrder) {
  OrderedRunner runner;
  std::mutex m;
  std::vector<int> order;
  std::vector<std::shared_ptr<OrderedRunner::Ticket>> tickets;
  for (int i = 0; i < 200; ++i) {
    tickets.push_back(runner.submit([&, i] {
      std::lock_guard lock(m);
      order.push_back(i);
      return int64_t{i} * 10;
    }));
  }
  EXPECT_EQ(runner.run_through(tickets[150]), 1500);
  runner.drain();
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  for (auto& t : tickets) EXPECT_TRUE(t->done());
}

TEST(OrderedRunner, RunThroughRunsEarlierCallsOnTheCallingThread) {
  OrderedRunner runner;
  std::atomic<bool> release{false};
  // The runner's thread is busy with the first call, so the later ones either
  // wait for it (calls never overlap) or run here once it is done.
  auto first = runner.submit([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return int64_t{1};
  });
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  std::vector<std::shared_ptr<OrderedRunner::Ticket>> later;
  for (int i = 0; i < 50; ++i) {
    later.push_back(runner.submit([&] {
      if (running.fetch_add(1) != 0) overlaps.fetch_add(1);
      running.fetch_sub(1);
      return int64_t{2};
    }));
  }
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    release = true;
  });
  EXPECT_EQ(runner.run_through(later.back()), 2);
  releaser.join();
  EXPECT_TRUE(first->done());
  EXPECT_EQ(overlaps.load(), 0);
}

TEST(OrderedRunner, AnErrorReachesItsWaiterAndLaterCallsStillRun) {
  OrderedRunner runner;
  auto bad = runner.submit([]() -> int64_t { throw Error(ErrorKind::kValue, "ranks disagree"); });
  auto good = runner.submit([] { return int64_t{7}; });
  EXPECT_EQ(runner.run_through(good), 7);
  try {
    runner.run_through(bad);
    FAIL() << "expected the call's error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kValue);
    EXPECT_STREQ(e.what(), "ranks disagree");
  }
}

TEST(OrderedRunner, TheThreadRunsCallsNobodyWaitsFor) {
  OrderedRunner runner;
  auto t = runner.submit([] { return int64_t{3}; });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!t->done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(t->done());
}

TEST(OrderedRunner, DestroyingDropsPendingCallsWithAnError) {
  // Shared with the detached thread, which finishes the running call after the runner is gone.
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto later_ran = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<OrderedRunner::Ticket> first;
  std::shared_ptr<OrderedRunner::Ticket> later;
  {
    OrderedRunner runner;
    first = runner.submit([release] {
      while (!release->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return int64_t{0};
    });
    // Wait until the thread took the first call, so the second is pending.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    later = runner.submit([later_ran] {
      later_ran->store(true);
      return int64_t{1};
    });
  }
  EXPECT_TRUE(later->done());
  EXPECT_TRUE(later->error() != nullptr);
  release->store(true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!first->done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(first->done());
  EXPECT_FALSE(later_ran->load());
}

}  // namespace
}  // namespace emugpu
