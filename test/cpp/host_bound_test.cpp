#include "host_bound.h"

#include <gtest/gtest.h>

#include <vector>

#include "device.h"
#include "test_gpu.h"

namespace {

using emugpu::Device;
using emugpu::Engine;
using emugpu::HostBoundMonitor;
using emugpu::ManualClock;
using emugpu::TimeNs;

constexpr TimeNs kMs = 1'000'000;

using emugpu::testing::test_gpu;

// An iteration: `kernels` kernels of `kernel` each, the host taking `host`
// to launch each, then a synchronize.
struct Loop {
  ManualClock clock;
  emugpu::GpuSpec gpu = test_gpu();
  Device dev{0, gpu, clock};

  void iteration(int kernels, TimeNs kernel, TimeNs host) {
    for (int i = 0; i < kernels; ++i) {
      clock.advance(host);
      dev.launch(0, Engine::kCompute, kernel);
    }
    dev.synchronize();
  }
};

TEST(Timeline, CountsIdleBeforeLateLaunchesOnly) {
  emugpu::Timeline t;
  TimeNs now = 10 * kMs;
  t.place(0, Engine::kCompute, t.start_of(0, Engine::kCompute, now), 2 * kMs, now);  // first use: no idle
  EXPECT_EQ(t.host_idle_ns(), 0);
  now = 15 * kMs;  // the device finished at 12 ms: idle 3 ms
  t.place(0, Engine::kCompute, t.start_of(0, Engine::kCompute, now), 2 * kMs, now);
  EXPECT_EQ(t.host_idle_ns(), 3 * kMs);
  now = 16 * kMs;  // queued behind running work: no idle
  t.place(0, Engine::kCompute, t.start_of(0, Engine::kCompute, now), 2 * kMs, now);
  EXPECT_EQ(t.host_idle_ns(), 3 * kMs);
  // Starting later than its launch (a stream waiting on an event) is not the host's doing.
  t.stream_wait(1, 40 * kMs);
  t.place(1, Engine::kCompute, t.start_of(1, Engine::kCompute, now), 1 * kMs, now);
  EXPECT_EQ(t.host_idle_ns(), 3 * kMs);
}

TEST(Timeline, CollectiveStartedByALateRankCountsAsIdle) {
  emugpu::Timeline t;
  t.place(0, Engine::kCompute, 10 * kMs, 1 * kMs, 10 * kMs);  // busy until 11 ms
  // The latest rank launched at 14 ms; this host learns it at 15 ms.
  t.place(0, Engine::kCollective, 14 * kMs, 1 * kMs, 15 * kMs);
  EXPECT_EQ(t.host_idle_ns(), 3 * kMs);
}

TEST(HostBoundMonitor, JudgesWindowsAfterWarmUp) {
  HostBoundMonitor m;
  EXPECT_LT(m.observe(0, 0), 0);                                    // opens the warm-up window
  EXPECT_LT(m.observe(HostBoundMonitor::kWindowNs, 400 * kMs), 0);  // warm-up: never judged
  EXPECT_EQ(m.stats().windows, 0);
  const TimeNs w = HostBoundMonitor::kWindowNs;
  EXPECT_LT(m.observe(w + 100 * kMs, 450 * kMs), 0);  // too short to judge
  EXPECT_EQ(m.stats().windows, 0);
  EXPECT_NEAR(m.observe(2 * w, 400 * kMs + w / 2), 0.5, 1e-9);  // idle half the window
  EXPECT_EQ(m.stats().windows, 1);
  EXPECT_EQ(m.stats().host_bound, 1);
  EXPECT_LT(m.observe(3 * w, 400 * kMs + w / 2 + w / 20), 0);  // 5%: not host-bound
  EXPECT_EQ(m.stats().windows, 2);
  EXPECT_EQ(m.stats().host_bound, 1);
  EXPECT_NEAR(m.stats().last_idle_fraction, 0.05, 1e-9);
  EXPECT_NEAR(m.stats().worst_idle_fraction, 0.5, 1e-9);
}

TEST(HostBoundMonitor, DeviceBoundLoopIsNeverHostBound) {
  Loop l;
  for (int i = 0; i < 40; ++i) l.iteration(20, 2 * kMs, kMs / 10);  // host 0.1 ms per 2 ms kernel
  const auto s = l.dev.host_bound_stats();
  EXPECT_GE(s.windows, 2);
  EXPECT_EQ(s.host_bound, 0);
  EXPECT_LT(s.worst_idle_fraction, HostBoundMonitor::kIdleFraction);
}

TEST(HostBoundMonitor, HostBoundLoopIsReported) {
  Loop l;
  std::vector<std::pair<int, double>> reported;
  emugpu::set_host_bound_handler([&](int device, double f) { reported.emplace_back(device, f); });
  for (int i = 0; i < 40; ++i) l.iteration(20, 1 * kMs, 3 * kMs);  // host 3 ms per 1 ms kernel
  emugpu::set_host_bound_handler(nullptr);
  const auto s = l.dev.host_bound_stats();
  EXPECT_GE(s.windows, 2);
  EXPECT_EQ(s.host_bound, s.windows);
  EXPECT_NEAR(s.last_idle_fraction, 2.0 / 3.0, 0.02);
  ASSERT_EQ(static_cast<int64_t>(reported.size()), s.host_bound);
  EXPECT_EQ(reported.front().first, 0);
  EXPECT_GT(l.dev.host_idle_ns(), 0);
}

TEST(HostBoundMonitor, ResetStatsStartsTheWindowsOver) {
  Loop l;
  for (int i = 0; i < 20; ++i) l.iteration(20, 1 * kMs, 3 * kMs);  // host-bound
  ASSERT_GT(l.dev.host_bound_stats().host_bound, 0);
  l.dev.reset_stats();
  EXPECT_EQ(l.dev.host_bound_stats().windows, 0);
  l.clock.advance(10'000 * kMs);  // a long pause: the first window after the reset is warm-up
  for (int i = 0; i < 40; ++i) l.iteration(20, 2 * kMs, kMs / 10);  // device-bound
  const auto s = l.dev.host_bound_stats();
  EXPECT_GE(s.windows, 2);
  EXPECT_EQ(s.host_bound, 0);
}

}  // namespace
