#include "device.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "error.h"
#include "test_gpu.h"

namespace {

using emugpu::Device;
using emugpu::Engine;
using emugpu::ManualClock;
using emugpu::RegionReport;
using emugpu::TimeNs;

constexpr TimeNs kUs = 1'000, kMs = 1'000'000;

using emugpu::testing::test_gpu;

// A model's ops: cost-model estimates, launched with host gaps between them.
struct Loop {
  ManualClock clock;
  emugpu::GpuSpec gpu = test_gpu();
  Device dev{0, gpu, clock};
  std::mt19937 rng{7};

  void ops(int n, TimeNs estimate, TimeNs gap_lo, TimeNs gap_hi) {
    std::uniform_int_distribution<TimeNs> gap(gap_lo, gap_hi);
    for (int i = 0; i < n; ++i) {
      clock.advance(gap(rng));
      dev.launch(0, Engine::kCompute, estimate);
    }
  }
  RegionReport report(const std::string& key) {
    for (const auto& r : dev.region_report()) {
      if (r.key == key) return r;
    }
    ADD_FAILURE() << "no region " << key;
    return {};
  }
};

TEST(Device, LaunchDoesNotBlockTheHost) {
  Loop l;
  const TimeNs now = l.clock.now();
  EXPECT_EQ(l.dev.launch(0, Engine::kCompute, 50 * kMs), now + 50 * kMs);
  EXPECT_EQ(l.clock.now(), now);
}

TEST(Device, AnEmulatedSlowerHostSpacesItsLaunchesOut) {
  Loop l;
  l.dev.set_host_pace(60 * kUs);
  const TimeNs start = l.clock.now();
  TimeNs end = 0;
  auto paced = [&](TimeNs estimate) {
    l.dev.pace_host();
    return l.dev.launch(0, Engine::kCompute, estimate);
  };
  for (int i = 0; i < 10; ++i) end = paced(10 * kUs);
  // Kernels shorter than the host's time per op: the device waits for the host.
  EXPECT_EQ(l.clock.now() - start, 9 * 60 * kUs);
  EXPECT_EQ(end - start, 9 * 60 * kUs + 10 * kUs);
  // A host already slower than the pace is not slowed further.
  l.clock.advance(100 * kUs);
  const TimeNs before = l.clock.now();
  paced(10 * kUs);
  EXPECT_EQ(l.clock.now(), before);
  // Kernels longer than the pace: the device's time, as before.
  l.clock.advance(kMs);
  const TimeNs busy_start = l.clock.now();
  for (int i = 0; i < 10; ++i) end = paced(kMs);
  EXPECT_EQ(end, busy_start + 10 * kMs);
}

TEST(Device, SynchronizeBlocksUntilTheDeviceIsDone) {
  Loop l;
  const TimeNs end = l.dev.launch(0, Engine::kCompute, 20 * kMs);
  l.dev.synchronize();
  EXPECT_EQ(l.clock.now(), end);
  EXPECT_EQ(l.dev.host_blocked_ns(), 20 * kMs);
}

TEST(Device, AFullLaunchQueueBlocksTheHost) {
  ManualClock clock;
  const auto gpu = test_gpu();
  Device dev(0, gpu, clock, 4);
  const TimeNs start = clock.now();
  for (int i = 0; i < 8; ++i) dev.launch(0, Engine::kCompute, 5 * kMs);
  EXPECT_EQ(clock.now() - start, 20 * kMs);  // launches 5..8 waited for 1..4
}

TEST(Device, CopyEnginesOverlapCompute) {
  Loop l;
  const TimeNs now = l.clock.now();
  l.dev.launch(0, Engine::kCompute, 10 * kMs);
  EXPECT_EQ(l.dev.launch(1, Engine::kHostToDevice, 10 * kMs), now + 10 * kMs);
}

TEST(Device, EventsRecordWhereTheStreamWillBe) {
  Loop l;
  const TimeNs end = l.dev.launch(0, Engine::kCompute, 3 * kMs);
  EXPECT_EQ(l.dev.record(0), end);
  EXPECT_EQ(l.dev.record(5), l.clock.now());  // an idle stream: now
  l.dev.stream_wait(5, end);
  EXPECT_EQ(l.dev.launch(5, Engine::kCompute, kMs), end + kMs);
}

// Iterations of forward (target F) and backward + update (target B); the
// host leaves random gaps between ops, all shorter than the device needs.
TEST(DeviceRegions, EveryIterationTakesItsProfiledTimeWhateverTheHostGaps) {
  Loop l;
  const TimeNs fwd = 10 * kMs, bwd = 20 * kMs;
  for (int it = 0; it < 6; ++it) {
    const TimeNs t0 = l.dev.record(0);
    l.dev.forward_begin(0, "m:forward", fwd);
    l.ops(100, 40 * kUs, 0, it == 3 ? 90 * kUs : 20 * kUs);  // iteration 3: the host is slower
    l.dev.forward_end(0, "m:backward", bwd, true);
    l.ops(5, 10 * kUs, 0, 5 * kUs);  // loss
    l.dev.backward_reached(0, "m:backward", bwd);
    l.ops(250, 30 * kUs, 0, 40 * kUs);
    l.dev.synchronize();
    EXPECT_EQ(l.clock.now() - t0, fwd + bwd) << "iteration " << it;
  }
  EXPECT_EQ(l.report("m:forward").occurrences, 6);
  EXPECT_EQ(l.report("m:forward").host_bound, 0);
  EXPECT_EQ(l.report("m:backward").last_time, bwd);
}

TEST(DeviceRegions, AHostLateBetweenRegionsShrinksTheNextRegionInsteadOfAddingToIt) {
  Loop l;
  const TimeNs t0 = l.dev.record(0);
  l.dev.forward_begin(0, "m:forward", 5 * kMs);
  l.ops(10, 100 * kUs, 0, 0);
  l.dev.synchronize_stream(0);  // the host waits for the forward's ops...
  l.clock.advance(5 * kMs);     // ...and comes back after the forward's profiled end
  l.dev.forward_end(0, "m:backward", 8 * kMs, true);
  l.dev.backward_reached(0, "m:backward", 8 * kMs);
  l.ops(10, 100 * kUs, 0, 0);
  l.dev.synchronize();
  EXPECT_EQ(l.clock.now() - t0, 13 * kMs);  // back to back: 5 + 8
  EXPECT_EQ(l.report("m:backward").host_bound, 0);
}

TEST(DeviceRegions, AForwardStartsWhenTheModelWasCalled) {
  Loop l;
  const TimeNs called = l.clock.now();
  l.clock.advance(200 * kUs);  // the planner's own work before it opens the region
  l.dev.forward_begin(0, "m:forward", 5 * kMs, called);
  l.ops(10, 10 * kUs, 0, 0);
  l.dev.forward_end(0, "m:backward", kMs, false);
  l.dev.synchronize();
  EXPECT_EQ(l.clock.now() - called, 5 * kMs);
}

TEST(DeviceRegions, AHostSlowerThanTheProfileIsReportedAsHostBound) {
  Loop l;
  l.dev.forward_begin(0, "m:forward", 1 * kMs);
  l.ops(100, 5 * kUs, 20 * kUs, 20 * kUs);  // 2 ms of launching for a 1 ms forward
  l.dev.forward_end(0, "m:backward", kMs, false);
  const RegionReport r = l.report("m:forward");
  EXPECT_EQ(r.host_bound, 1);
  EXPECT_GT(r.last_time, 1900 * kUs);
  EXPECT_GT(r.worst_excess, 0);
}

TEST(DeviceRegions, AnEvaluationForwardOpensNoBackwardRegion) {
  Loop l;
  l.dev.forward_begin(0, "m:forward", 5 * kMs);
  l.ops(10, 10 * kUs, 0, 0);
  l.dev.forward_end(0, "m:backward", 8 * kMs, /*expects_backward=*/false);
  const TimeNs before = l.dev.record(0);
  EXPECT_EQ(l.dev.launch(0, Engine::kCompute, 7 * kUs), before + 7 * kUs);  // untouched by any region
  l.dev.synchronize();
  EXPECT_EQ(l.report("m:forward").occurrences, 1);
  for (const auto& r : l.dev.region_report()) EXPECT_NE(r.key, "m:backward");
}

TEST(DeviceRegions, ASyncBeforeBackwardDoesNotCloseTheBackwardRegion) {
  Loop l;
  l.dev.forward_begin(0, "m:forward", 5 * kMs);
  l.ops(10, 10 * kUs, 0, 0);
  l.dev.forward_end(0, "m:backward", 8 * kMs, true);
  l.dev.launch_and_wait(0, Engine::kDeviceToHost, 2 * kUs);  // accuracy.item() before loss.backward()
  const TimeNs t = l.clock.now();
  l.dev.backward_reached(0, "m:backward", 8 * kMs);
  l.ops(10, 10 * kUs, 0, 0);
  l.dev.synchronize();
  EXPECT_EQ(l.report("m:backward").occurrences, 1);
  EXPECT_EQ(l.clock.now() - t, 8 * kMs - 2 * kUs);  // the region began at the forward's end
}

TEST(DeviceRegions, GradientAccumulationChargesEveryMicroStep) {
  Loop l;
  const TimeNs fwd = 4 * kMs, bwd = 6 * kMs;
  for (int step = 0; step < 3; ++step) {
    const TimeNs t0 = l.dev.record(0);
    for (int micro = 0; micro < 4; ++micro) {
      l.dev.forward_begin(0, "m:forward", fwd);
      l.ops(50, 30 * kUs, 0, 10 * kUs);
      l.dev.forward_end(0, "m:backward", bwd, true);
      l.dev.backward_reached(0, "m:backward", bwd);
      l.ops(micro == 3 ? 160 : 100, 30 * kUs, 0, 10 * kUs);  // the last one also steps
    }
    l.dev.synchronize();
    EXPECT_EQ(l.clock.now() - t0, 4 * (fwd + bwd)) << "step " << step;
  }
}

TEST(DeviceRegions, TwoModelsInOneLoopEachTakeTheirTimes) {
  // A GAN step: G forward; D on real and on fake.detach(); D backward and
  // step; D on fake; backward through D into G; G step.
  Loop l;
  const TimeNs gf = 2 * kMs, gb = 3 * kMs, df = 1 * kMs, db = 2 * kMs;
  for (int it = 0; it < 3; ++it) {
    const TimeNs t0 = l.dev.record(0);
    l.dev.forward_begin(0, "G:forward", gf);
    l.ops(20, 20 * kUs, 0, 5 * kUs);
    l.dev.forward_end(0, "G:backward", gb, true);
    for (int pass = 0; pass < 2; ++pass) {
      l.dev.forward_begin(0, "D:forward", df);
      l.ops(10, 20 * kUs, 0, 5 * kUs);
      l.dev.forward_end(0, "D:backward", db, true);
    }
    l.dev.backward_reached(0, "D:backward", db);
    l.ops(30, 20 * kUs, 0, 5 * kUs);
    l.dev.forward_begin(0, "D:forward", df);
    l.ops(10, 20 * kUs, 0, 5 * kUs);
    l.dev.forward_end(0, "D:backward", db, true);
    l.dev.backward_reached(0, "D:backward", db);
    l.ops(20, 20 * kUs, 0, 5 * kUs);
    l.dev.backward_reached(0, "G:backward", gb);
    l.ops(30, 20 * kUs, 0, 5 * kUs);
    l.dev.synchronize();
    EXPECT_EQ(l.clock.now() - t0, gf + 3 * df + 2 * db + gb) << "iteration " << it;
  }
  EXPECT_GE(l.report("G:backward").cancelled, 0);
  EXPECT_EQ(l.report("D:backward").cancelled, 3);  // the forward on real data opened one that never ran
}

TEST(DeviceRegions, AnExceptionClosesTheRegionWithoutAPad) {
  Loop l;
  l.dev.forward_begin(0, "m:forward", 50 * kMs);
  l.ops(3, 10 * kUs, 0, 0);
  l.dev.region_abort();
  const TimeNs now = l.clock.now();
  const TimeNs ready = l.dev.device_ready();
  EXPECT_EQ(l.dev.launch(0, Engine::kCompute, 10 * kUs), ready + 10 * kUs);  // unscaled
  l.dev.synchronize();
  EXPECT_LT(l.clock.now() - now, kMs);  // no 50 ms pad
  EXPECT_EQ(l.report("m:forward").aborted, 1);
  EXPECT_EQ(l.report("m:forward").occurrences, 0);
}

// DDP's backward: a bucket's all-reduce follows the compute stream from
// inside the backward (not a sync point), and the compute stream waits for
// its end (the Reducer's finalize). The single-GPU profile measured no such
// wait: the region's remaining work keeps its profiled share after it.
TEST(DeviceRegions, ABackwardWaitingForACollectiveTakesItsProfileAndTheExposedWait) {
  Loop l;
  const TimeNs fwd = 10 * kMs, bwd = 20 * kMs;
  auto iteration = [&](TimeNs collective, TimeNs copy = 0, TimeNs decompress = 0) {
    const TimeNs t0 = l.dev.record(0);
    l.dev.forward_begin(0, "m:forward", fwd);
    l.ops(100, 40 * kUs, 0, 0);
    l.dev.forward_end(0, "m:backward", bwd, true);
    l.dev.backward_reached(0, "m:backward", bwd);
    l.ops(125, 30 * kUs, 0, 0);
    TimeNs end = 0;
    if (collective > 0) {
      const auto after = l.dev.follow(5, 0, false);
      end = l.dev.collective_launch(5, after->force(), collective);
      if (decompress > 0) {  // a comm hook's callback: a side stream waits for it and works on its output
        l.dev.stream_wait(9, end);
        l.dev.launch(9, Engine::kCompute, decompress);
        end = l.dev.record_pending(9, false)->force();
      }
      l.dev.stream_wait(0, end);
    }
    if (copy > 0) l.dev.stream_wait(0, l.dev.launch(7, Engine::kHostToDevice, copy));
    l.ops(125, 30 * kUs, 0, 0);
    l.dev.synchronize();
    return std::pair{l.clock.now() - t0, end - t0};
  };
  iteration(0);  // learns the backward's work
  EXPECT_EQ(iteration(0).first, fwd + bwd);
  // Half the backward's work done: the profiled GPU is at fwd + bwd / 2.
  EXPECT_EQ(iteration(300 * kUs).first, fwd + bwd);  // it ends before that
  const auto [took, collective_end] = iteration(15 * kMs);
  EXPECT_GT(collective_end, fwd + bwd / 2);
  EXPECT_EQ(took, collective_end + bwd / 2);
  const RegionReport r = l.report("m:backward");
  EXPECT_EQ(r.waited, collective_end + bwd / 2 - fwd - bwd);
  EXPECT_EQ(r.host_bound, 0);
  EXPECT_EQ(r.occurrences, 4);  // the follow did not close it
  // A wait for work the profile measured (here a copy) does not move the end.
  EXPECT_EQ(iteration(0, 5 * kMs).first, fwd + bwd);
  EXPECT_EQ(iteration(5 * kMs).first, fwd + bwd + 4523750);  // the same wait for a collective does
  // Side-stream work that began at the collective's end extends it.
  const auto [with_callback, callback_end] = iteration(5 * kMs, 0, 100 * kUs);
  EXPECT_GT(callback_end, fwd + bwd / 2);
  // The callback's 100 us of work counts as region work done: 3850 of the 7500 expected.
  EXPECT_EQ(with_callback, callback_end + std::llround((1.0 - 3850.0 / 7500.0) * static_cast<double>(bwd)));
}

TEST(DeviceRegions, AnEventAfterTheStepSeesTheWholeIteration) {
  Loop l;
  const TimeNs start = l.dev.record(0);
  l.dev.forward_begin(0, "m:forward", 3 * kMs);
  l.ops(10, 10 * kUs, 0, 0);
  l.dev.forward_end(0, "m:backward", 5 * kMs, true);
  l.dev.backward_reached(0, "m:backward", 5 * kMs);
  l.ops(10, 10 * kUs, 0, 0);
  EXPECT_EQ(l.dev.record(0) - start, 8 * kMs);
}

TEST(Device, UtilizationIsTheBusyShareOfTheLastSecond) {
  Loop l;
  l.dev.launch(0, Engine::kCompute, 250 * kMs);
  l.clock.advance(1000 * kMs);
  EXPECT_EQ(l.dev.utilization(), 25);
}

TEST(Device, PoolStreamsAreRecycledRoundRobin) {
  Loop l;
  const int64_t first = l.dev.pool_stream(false);
  for (int i = 1; i < emugpu::kPoolStreams; ++i) EXPECT_NE(l.dev.pool_stream(false), first);
  EXPECT_EQ(l.dev.pool_stream(false), first);
  EXPECT_GT(l.dev.pool_stream(true), emugpu::kPoolStreams);
}

TEST(Device, RejectsNegativeDurations) {
  Loop l;
  EXPECT_THROW(l.dev.launch(0, Engine::kCompute, -1), emugpu::Error);
}

}  // namespace

// Backend `emu`: a collective starts at the latest start over ranks, holds
// only its stream (and the collective engine), and the host never waits.
TEST(Device, CollectiveStartsAtTheLatestRankAndHoldsOnlyItsStream) {
  Loop l;
  const TimeNs now = l.clock.now();
  l.dev.launch(0, Engine::kCompute, 10 * kMs);
  EXPECT_EQ(l.dev.collective_start(0), now + 10 * kMs);
  EXPECT_EQ(l.dev.collective_start(5), now);
  // Another rank reached it at +30 ms.
  EXPECT_EQ(l.dev.collective_launch(0, now + 30 * kMs, 2 * kMs), now + 32 * kMs);
  EXPECT_EQ(l.clock.now(), now);
  EXPECT_EQ(l.dev.launch(1, Engine::kCompute, 1 * kMs), now + 11 * kMs);  // compute on another stream overlaps
  EXPECT_EQ(l.dev.launch(0, Engine::kCompute, 1 * kMs), now + 33 * kMs);  // later work on its stream waits
  // The next collective queues behind the first on the collective engine.
  EXPECT_EQ(l.dev.collective_start(7), now + 32 * kMs);
  EXPECT_EQ(l.dev.engine_stats(Engine::kCollective).busy_ns, 2 * kMs);
  EXPECT_THROW(l.dev.collective_launch(0, now, -1), emugpu::Error);
}

// Placed when the last rank's start arrives, later than that start: the
// collective still starts there (the ranks agree on its end), not when this
// host learned it.
TEST(Device, CollectivePlacedLateStartsAtTheRanksLatestStart) {
  Loop l;
  const TimeNs t = l.dev.collective_start(0);
  l.clock.advance(3 * kMs);  // the exchange took this long
  EXPECT_EQ(l.dev.collective_launch(0, t + 1 * kMs, 2 * kMs), t + 3 * kMs);
}

TEST(Device, CollectiveIsNotRetimedByAProfiledRegion) {
  Loop l;
  l.dev.forward_begin(0, "model", 100 * kMs);
  l.ops(3, 1 * kMs, 0, 0);
  const TimeNs start = l.dev.collective_start(0);
  EXPECT_EQ(l.dev.collective_launch(0, start, 5 * kMs), start + 5 * kMs);
}
