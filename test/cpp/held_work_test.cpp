// A stream that waits for a time not known yet (a deferred collective's
// end) holds the device's later work instead of blocking the host.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>

#include "device.h"
#include "pending_time.h"
#include "test_gpu.h"

namespace {

using emugpu::Device;
using emugpu::Engine;
using emugpu::ManualClock;
using emugpu::PendingTime;
using emugpu::TimeNs;

constexpr TimeNs kUs = 1'000, kMs = 1'000'000;

struct Held {
  ManualClock clock;
  emugpu::GpuSpec gpu = emugpu::testing::test_gpu();
  Device dev{0, gpu, clock, 8};
  std::shared_ptr<PendingTime> end = std::make_shared<PendingTime>();
};

TEST(HeldWork, WaitingForAnUnknownTimeNeitherBlocksTheHostNorPlacesLaterWork) {
  Held h;
  const TimeNs t0 = h.clock.now();
  h.dev.launch(0, Engine::kCompute, 1 * kMs);
  h.dev.stream_wait(0, h.end);
  EXPECT_TRUE(h.dev.held());
  EXPECT_EQ(h.dev.launch(0, Engine::kCompute, 2 * kMs), Device::kNotYet);
  EXPECT_EQ(h.dev.launch(1, Engine::kCompute, 3 * kMs), Device::kNotYet);  // every stream keeps host order
  EXPECT_EQ(h.clock.now(), t0);
  EXPECT_EQ(h.dev.engine_stats(Engine::kCompute).launches, 1);
  h.end->set(t0 + 10 * kMs);  // the last rank arrived: the collective ends there
  EXPECT_EQ(h.dev.stream_ready(0), t0 + 12 * kMs);
  EXPECT_EQ(h.dev.stream_ready(1), t0 + 15 * kMs);  // after stream 0's kernel on the one compute engine
  EXPECT_FALSE(h.dev.held());
  EXPECT_EQ(h.clock.now(), t0);
}

TEST(HeldWork, HeldWorkStartsNoEarlierThanTheHostLaunchedIt) {
  Held h;
  const TimeNs t0 = h.clock.now();
  h.dev.stream_wait(0, h.end);
  h.clock.advance(5 * kMs);
  h.dev.launch(0, Engine::kCompute, 1 * kMs);
  h.clock.advance(5 * kMs);
  h.end->set(t0 + 1 * kMs);  // known late, but it ended before the launch
  EXPECT_EQ(h.dev.stream_ready(0), t0 + 6 * kMs);
}

TEST(HeldWork, AnEventRecordedWhileHeldLearnsItsTimeWhenTheWorkIsPlaced) {
  Held h;
  const TimeNs t0 = h.clock.now();
  h.dev.stream_wait(0, h.end);
  h.dev.launch(0, Engine::kCompute, 2 * kMs);
  const auto event = h.dev.record_pending(0);
  EXPECT_FALSE(event->known());
  h.dev.stream_wait(1, event);  // another stream waits for the event: held too
  h.dev.launch(1, Engine::kCompute, 1 * kMs);
  h.end->set(t0 + 4 * kMs);
  EXPECT_EQ(h.dev.stream_ready(1), t0 + 7 * kMs);
  EXPECT_EQ(event->value(), t0 + 6 * kMs);
  // Recorded on a device that is not held, the time is known at once.
  EXPECT_EQ(h.dev.record_pending(0)->value(), t0 + 6 * kMs);
}

TEST(HeldWork, AHostWaitForcesThePendingTimeAndBlocksUntilTheWorkIsDone) {
  Held h;
  const TimeNs t0 = h.clock.now();
  int forced = 0;
  h.end->set_force([&] {
    ++forced;
    return t0 + 3 * kMs;
  });
  h.dev.stream_wait(0, h.end);
  h.dev.launch(0, Engine::kCompute, 1 * kMs);
  h.dev.synchronize();
  EXPECT_EQ(forced, 1);
  EXPECT_EQ(h.clock.now(), t0 + 4 * kMs);
  EXPECT_FALSE(h.dev.held());
}

TEST(HeldWork, AnErrorLearningTheTimeReachesTheHostWaitAndDropsTheWait) {
  Held h;
  const TimeNs t0 = h.clock.now();
  h.end->set_force([]() -> TimeNs { throw std::runtime_error("rank 1 exited"); });
  h.dev.stream_wait(0, h.end);
  h.dev.launch(0, Engine::kCompute, 1 * kMs);
  EXPECT_THROW(h.dev.synchronize(), std::runtime_error);
  EXPECT_FALSE(h.dev.held());
  h.dev.synchronize();
  EXPECT_EQ(h.clock.now(), t0 + 1 * kMs);
}

TEST(HeldWork, HeldLaunchesFillTheLaunchQueueToo) {
  Held h;  // queue depth 8
  const TimeNs t0 = h.clock.now();
  int forced = 0;
  h.end->set_force([&] {
    ++forced;
    return t0 + 1 * kMs;
  });
  h.dev.stream_wait(0, h.end);
  for (int i = 0; i < 7; ++i) h.dev.launch(0, Engine::kCompute, 100 * kUs);
  EXPECT_EQ(forced, 0);
  h.dev.launch(0, Engine::kCompute, 100 * kUs);  // 8 held entries: the queue is full
  EXPECT_EQ(forced, 1);
  EXPECT_FALSE(h.dev.held());
}

TEST(HeldWork, RegionStepsWhileHeldKeepTheirPlaceAmongTheLaunches) {
  Held h;
  const TimeNs t0 = h.clock.now();
  h.dev.stream_wait(0, h.end);
  h.dev.forward_begin(0, "m:forward", 10 * kMs);
  h.dev.launch(0, Engine::kCompute, 1 * kMs);
  h.dev.forward_end(0, "m:backward", 20 * kMs, false);
  h.end->set(t0 + 2 * kMs);
  // As if the collective's end had been known at the wait: the region opens where its
  // stream stands (after the collective) and takes its profiled 10 ms from there.
  EXPECT_EQ(h.dev.stream_ready(0), t0 + 12 * kMs);
  ASSERT_EQ(h.dev.region_report().size(), 1u);
  EXPECT_EQ(h.dev.region_report()[0].occurrences, 1);
}

TEST(HeldWork, ACollectiveLaunchedWhileHeldLearnsItsStartWithoutBlocking) {
  Held h;
  const TimeNs t0 = h.clock.now();
  const int64_t comm = h.dev.pool_stream(false);
  h.dev.stream_wait(0, h.end);  // behind an earlier collective
  h.dev.launch(0, Engine::kCompute, 1 * kMs);
  const auto after = h.dev.follow(comm, 0);  // the next collective follows stream 0
  h.clock.advance(1 * kMs);
  h.dev.launch(0, Engine::kCompute, 5 * kMs);  // held work after it does not delay it
  EXPECT_FALSE(after->known());
  EXPECT_EQ(h.clock.now(), t0 + 1 * kMs);
  h.end->set(t0 + 2 * kMs);
  EXPECT_EQ(after->force(), t0 + 3 * kMs);
  EXPECT_EQ(h.dev.collective_start_at(comm, t0), t0 + 3 * kMs);
}

}  // namespace
