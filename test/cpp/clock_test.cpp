#include "clock.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace {

using emugpu::Engine;
using emugpu::host_now;
using emugpu::Timeline;

TEST(Clock, LaunchDoesNotBlockTheHost) {
  Timeline t;
  const auto before = host_now();
  const auto end = t.launch(0, Engine::kCompute, 50'000'000);
  EXPECT_LT(host_now() - before, 5'000'000);
  EXPECT_GE(end - before, 50'000'000);
}

TEST(Clock, WorkOnOneStreamIsSerialized) {
  Timeline t;
  const auto first = t.launch(0, Engine::kCompute, 1'000'000);
  const auto second = t.launch(0, Engine::kCompute, 1'000'000);
  EXPECT_GE(second - first, 1'000'000);
  EXPECT_EQ(t.stream_ready(0), second);
}

TEST(Clock, CopyEngineOverlapsCompute) {
  Timeline t;
  const auto start = host_now();
  const auto compute = t.launch(0, Engine::kCompute, 10'000'000);
  const auto copy = t.launch(1, Engine::kHostToDevice, 10'000'000);
  EXPECT_LT(copy - start, 15'000'000);  // did not queue behind compute
  EXPECT_LT(compute - start, 15'000'000);
}

TEST(Clock, StreamWaitOrdersAfterAnEvent) {
  Timeline t;
  const auto event = t.launch(1, Engine::kHostToDevice, 5'000'000);
  t.stream_wait(0, event);
  const auto after = t.launch(0, Engine::kCompute, 1'000);
  EXPECT_GE(after, event + 1'000);
}

TEST(Clock, SynchronizeWaitsUntilTheTimelineIsDone) {
  Timeline t;
  const auto start = host_now();
  t.launch(0, Engine::kCompute, 20'000'000);
  t.wait_device();
  const auto waited = host_now() - start;
  EXPECT_GE(waited, 20'000'000);
  EXPECT_LT(waited, 25'000'000);
}

TEST(Clock, FullLaunchQueueBlocksTheHost) {
  Timeline t(4);
  const auto start = host_now();
  for (int i = 0; i < 8; ++i) t.launch(0, Engine::kCompute, 5'000'000);
  // Launch 5..8 waited for launches 1..4 to finish.
  EXPECT_GE(host_now() - start, 20'000'000);
}

TEST(Clock, StatsCountLaunchesAndBusyTime) {
  Timeline t;
  t.launch(0, Engine::kCompute, 1000);
  t.launch(0, Engine::kCompute, 2000);
  EXPECT_EQ(t.engine_stats(Engine::kCompute).launches, 2);
  EXPECT_EQ(t.engine_stats(Engine::kCompute).busy_ns, 3000);
  t.reset_stats();
  EXPECT_EQ(t.engine_stats(Engine::kCompute).launches, 0);
}

TEST(Clock, ConcurrentLaunchesFromManyThreadsAreAllCharged) {
  Timeline t;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&t] {
      for (int j = 0; j < 1000; ++j) t.launch(0, Engine::kCompute, 1000);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.engine_stats(Engine::kCompute).launches, 4000);
  EXPECT_EQ(t.engine_stats(Engine::kCompute).busy_ns, 4'000'000);
}

TEST(Clock, RejectsNegativeDurations) {
  Timeline t;
  EXPECT_ANY_THROW(t.launch(0, Engine::kCompute, -1));
}

}  // namespace
