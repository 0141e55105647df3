#include "clock.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "error.h"

namespace {

using emugpu::Engine;
using emugpu::host_now;
using emugpu::Timeline;

TEST(SteadyClock, SleepsUntilTheDeadlineAndNotMuchLonger) {
  // Never early; late by at most 5 ms in the best of three tries (one try may
  // be descheduled on a loaded host, e.g. under sanitizers; a clock that
  // oversleeps does so every time).
  emugpu::SteadyClock clock;
  emugpu::TimeNs best_late = INT64_MAX;
  for (int i = 0; i < 3; ++i) {
    const auto start = clock.now();
    clock.sleep_until(start + 20'000'000);
    const auto slept = clock.now() - start;
    EXPECT_GE(slept, 20'000'000);
    best_late = std::min(best_late, slept - 20'000'000);
  }
  EXPECT_LT(best_late, 5'000'000);
}

TEST(SteadyClock, LongWaitsCanBeInterrupted) {
  emugpu::SteadyClock clock;
  int checks = 0;
  emugpu::set_wait_interrupt_check([&] {
    if (++checks == 2) throw std::runtime_error("interrupted");
  });
  const auto start = clock.now();
  EXPECT_THROW(clock.sleep_until(start + 10'000'000'000), std::runtime_error);
  emugpu::set_wait_interrupt_check(nullptr);
  EXPECT_LT(clock.now() - start, 1'000'000'000);
  EXPECT_EQ(checks, 2);
}

TEST(SteadyClock, ShortWaitsNeverCallTheInterruptCheck) {
  emugpu::SteadyClock clock;
  int checks = 0;
  emugpu::set_wait_interrupt_check([&] { ++checks; });
  clock.sleep_until(clock.now() + 5'000'000);
  emugpu::set_wait_interrupt_check(nullptr);
  EXPECT_EQ(checks, 0);
}

TEST(ManualClock, SleepingJumpsToTheDeadline) {
  emugpu::ManualClock clock(100);
  clock.sleep_until(50);  // in the past: no change
  EXPECT_EQ(clock.now(), 100);
  clock.sleep_until(1000);
  EXPECT_EQ(clock.now(), 1000);
  clock.advance(5);
  EXPECT_EQ(clock.now(), 1005);
}

TEST(Timeline, WorkOnOneStreamIsSerialized) {
  Timeline t;
  const auto first = t.place(0, Engine::kCompute, t.start_of(0, Engine::kCompute, 100), 1000, 100);
  const auto second = t.place(0, Engine::kCompute, t.start_of(0, Engine::kCompute, 100), 1000, 100);
  EXPECT_EQ(first, 1100);
  EXPECT_EQ(second, 2100);
  EXPECT_EQ(t.stream_ready(0), 2100);
}

TEST(Timeline, TheComputeEngineSerializesStreamsButCopyEnginesOverlapIt) {
  Timeline t;
  t.place(0, Engine::kCompute, t.start_of(0, Engine::kCompute, 0), 1000, 0);
  EXPECT_EQ(t.start_of(1, Engine::kCompute, 0), 1000);
  EXPECT_EQ(t.start_of(1, Engine::kHostToDevice, 0), 0);
}

TEST(Timeline, StreamWaitOrdersAfterAnEvent) {
  Timeline t;
  const auto event = t.place(1, Engine::kHostToDevice, 0, 5000, 0);
  t.stream_wait(0, event);
  EXPECT_EQ(t.start_of(0, Engine::kCompute, 0), 5000);
  EXPECT_EQ(t.device_ready(), 5000);
}

TEST(Timeline, AFullLaunchQueueNamesTheTimeToWaitFor) {
  Timeline t(2);
  for (int i = 1; i <= 3; ++i) t.place(0, Engine::kCompute, t.start_of(0, Engine::kCompute, 0), 100, 0);
  EXPECT_EQ(t.queue_wait(0), 200);  // the second of three pending must finish first
  EXPECT_EQ(t.queue_wait(250), 0);
}

TEST(Timeline, StatsCountLaunchesAndBusyTime) {
  Timeline t;
  t.place(0, Engine::kCompute, 0, 1000, 0);
  t.place(0, Engine::kCompute, 1000, 2000, 0);
  EXPECT_EQ(t.engine_stats(Engine::kCompute).launches, 2);
  EXPECT_EQ(t.engine_stats(Engine::kCompute).busy_ns, 3000);
  t.reset_stats();
  EXPECT_EQ(t.engine_stats(Engine::kCompute).launches, 0);
}

TEST(Timeline, RejectsNegativeDurations) {
  Timeline t;
  EXPECT_THROW(t.place(0, Engine::kCompute, 0, -1, 0), emugpu::Error);
}

TEST(Clock, SecondsToNanosecondsIsRangeChecked) {
  EXPECT_EQ(emugpu::seconds_to_ns(1.5), 1'500'000'000);
  EXPECT_THROW(emugpu::seconds_to_ns(-1), emugpu::Error);
  EXPECT_THROW(emugpu::seconds_to_ns(std::numeric_limits<double>::quiet_NaN()), emugpu::Error);
  EXPECT_GT(emugpu::seconds_to_ns(1e300), 0);  // clamped, not overflowed
}

}  // namespace
