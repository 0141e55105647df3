#include "virtual_clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "device.h"
#include "error.h"
#include "test_gpu.h"

namespace {

using emugpu::Device;
using emugpu::EmulatorCall;
using emugpu::Engine;
using emugpu::HostCost;
using emugpu::HostModel;
using emugpu::TimeNs;
using emugpu::VirtualClock;

constexpr TimeNs kUs = 1'000, kMs = 1'000'000, kStart = 1'000'000'000;

// CPU time the test sets by hand, the same for every thread.
class FakeCpu final : public emugpu::CpuClock {
 public:
  TimeNs thread_cpu_ns() const override { return ns; }
  TimeNs ns = 5 * kMs;
};

HostCost measured(TimeNs op_ns = 0, double speed = 1) { return {HostModel::kMeasured, speed, op_ns, 0}; }
HostCost modelled(TimeNs op_ns, TimeNs read_ns) { return {HostModel::kModelled, 1, op_ns, read_ns}; }

TEST(VirtualClock, AWaitJumpsToItsDeadlineWithoutSleeping) {
  VirtualClock clock(kStart);
  const auto before = std::chrono::steady_clock::now();
  clock.sleep_until(kStart + 3600 * TimeNs{1'000'000'000});  // an hour
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(30));
  EXPECT_EQ(clock.now(), kStart + 3600 * TimeNs{1'000'000'000});
  EXPECT_EQ(clock.stats().waited_ns, 3600 * TimeNs{1'000'000'000});
}

TEST(VirtualClock, TimeNeverGoesBack) {
  VirtualClock clock(kStart);
  clock.sleep_until(kStart + kMs);
  clock.sleep_until(kStart);
  clock.receive(kStart + kUs);
  EXPECT_EQ(clock.now(), kStart + kMs);
}

TEST(VirtualClock, MeasuredChargesTheHostsWorkBetweenCallsButNotInsideThem) {
  FakeCpu cpu;
  VirtualClock clock(kStart, measured(2 * kUs), cpu);
  {
    EmulatorCall call(&clock);  // the thread's first call: nothing before it to measure from
    cpu.ns += 40 * kUs;         // the emulator's own bookkeeping
  }
  EXPECT_EQ(clock.now(), kStart + 2 * kUs);
  cpu.ns += 7 * kUs;  // the script's work
  {
    EmulatorCall call(&clock);
    cpu.ns += 90 * kUs;
  }
  EXPECT_EQ(clock.now(), kStart + 2 * kUs + 7 * kUs + 2 * kUs);
  EXPECT_EQ(clock.stats().host_ns, 11 * kUs);
  EXPECT_EQ(clock.stats().calls, 2);
}

TEST(VirtualClock, NestedCallsChargeOnce) {
  FakeCpu cpu;
  VirtualClock clock(kStart, measured(3 * kUs), cpu);
  clock.read();  // marks the thread
  cpu.ns += 10 * kUs;
  {
    EmulatorCall outer(&clock);
    cpu.ns += 5 * kUs;
    EmulatorCall inner(&clock);  // an op the fallback runs for a shape
    cpu.ns += 5 * kUs;
  }
  EXPECT_EQ(clock.now(), kStart + 10 * kUs + 3 * kUs);
  EXPECT_EQ(clock.stats().calls, 1);
}

TEST(VirtualClock, UnchargedWorkCostsTheHostNothingAndIsNoLaunch) {
  FakeCpu cpu;
  VirtualClock clock(kStart, measured(3 * kUs), cpu);
  clock.read();        // marks the thread
  cpu.ns += 10 * kUs;  // the script's work
  {
    emugpu::UnchargedWork work(&clock);  // a deferred copy done when a tensor is freed
    cpu.ns += 900 * kUs;
  }
  cpu.ns += 4 * kUs;
  clock.read();
  EXPECT_EQ(clock.now(), kStart + 14 * kUs);
  EXPECT_EQ(clock.stats().calls, 0);
}

TEST(VirtualClock, UnchargedWorkLeavesAThreadThatNeverEnteredUncharged) {
  FakeCpu cpu;
  VirtualClock clock(kStart, measured(3 * kUs), cpu);
  {
    emugpu::UnchargedWork work(&clock);  // a runner thread: none of its work is the host's
    cpu.ns += 50 * kUs;
  }
  cpu.ns += 20 * kUs;
  { EmulatorCall call(&clock); }  // its first call: nothing before it to measure from
  EXPECT_EQ(clock.now(), kStart + 3 * kUs);
}

TEST(VirtualClock, HostSpeedScalesHostWork) {
  FakeCpu cpu;
  VirtualClock clock(kStart, measured(4 * kUs, 2.0), cpu);
  clock.read();
  cpu.ns += 10 * kUs;
  { EmulatorCall call(&clock); }
  EXPECT_EQ(clock.now(), kStart + 5 * kUs + 2 * kUs);
}

TEST(VirtualClock, ModelledHostIgnoresTheCpuAndChargesFixedCosts) {
  FakeCpu cpu;
  VirtualClock clock(kStart, modelled(8 * kUs, 1 * kUs), cpu);
  for (int i = 0; i < 5; ++i) {
    cpu.ns += 123 * kUs * (i + 1);  // whatever this machine does
    EmulatorCall call(&clock);
  }
  clock.read();
  EXPECT_EQ(clock.now(), kStart + 5 * 8 * kUs + 1 * kUs);
}

TEST(VirtualClock, AnOpPaysForTheOutputsAllocatedJustBeforeIt) {
  FakeCpu cpu;
  VirtualClock clock(kStart, modelled(8 * kUs, 0), cpu);
  { EmulatorCall output(&clock, emugpu::HostCall::kAllocation); }
  { EmulatorCall second_output(&clock, emugpu::HostCall::kAllocation); }
  EXPECT_EQ(clock.now(), kStart);  // nothing yet: the op has not come
  { EmulatorCall op(&clock); }
  EXPECT_EQ(clock.now(), kStart + 8 * kUs);  // one op, as a CUDA host allocates inside the op
  EXPECT_EQ(clock.stats().calls, 1);
}

TEST(VirtualClock, AnAllocationNoOpFollowsIsAnOpOfItsOwn) {
  FakeCpu cpu;
  VirtualClock clock(kStart, modelled(8 * kUs, 1 * kUs), cpu);
  { EmulatorCall empty(&clock, emugpu::HostCall::kAllocation); }  // torch.empty, then the script reads the time
  clock.read();
  EXPECT_EQ(clock.now(), kStart + 8 * kUs + 1 * kUs);
  EXPECT_EQ(clock.stats().calls, 1);
  clock.read();  // charged once
  EXPECT_EQ(clock.now(), kStart + 8 * kUs + 2 * kUs);
}

TEST(VirtualClock, BackwardOpsAndForeachListsHaveTheirOwnPrices) {
  FakeCpu cpu;
  HostCost cost = modelled(8 * kUs, 0);
  cost.backward_op_ns = 11 * kUs;
  cost.list_tensor_ns = 2 * kUs;
  VirtualClock clock(kStart, cost, cpu);
  { EmulatorCall op(&clock, emugpu::HostCall::kBackwardOp); }
  EXPECT_EQ(clock.now(), kStart + 11 * kUs);
  { EmulatorCall foreach_op(&clock, emugpu::HostCall::kOp, 5); }  // five tensors per list: four beyond the first
  EXPECT_EQ(clock.now(), kStart + 11 * kUs + 8 * kUs + 4 * 2 * kUs);
  cost.backward_op_ns = -1;  // as the forward's
  clock.set_host_cost(cost);
  { EmulatorCall op(&clock, emugpu::HostCall::kBackwardOp); }
  EXPECT_EQ(clock.now(), kStart + 11 * kUs + 16 * kUs + 8 * kUs);
  EXPECT_EQ(clock.stats().calls, 3);
}

TEST(VirtualClock, MeasuredHostAddsOneLaunchPerOpNotPerAllocation) {
  FakeCpu cpu;
  VirtualClock clock(kStart, measured(3 * kUs), cpu);
  clock.read();  // marks the thread
  cpu.ns += 10 * kUs;
  { EmulatorCall output(&clock, emugpu::HostCall::kAllocation); }
  cpu.ns += 2 * kUs;
  { EmulatorCall op(&clock); }
  EXPECT_EQ(clock.now(), kStart + 12 * kUs + 3 * kUs);
}

TEST(VirtualClock, AScriptSpinningOnTheClockReachesItsDeadline) {
  for (const HostCost cost : {modelled(8 * kUs, 1 * kUs), measured()}) {
    VirtualClock clock(kStart, cost);  // the real CPU clock: the spin's own work moves it (measured)
    const TimeNs deadline = kStart + 2 * kMs;
    int64_t spins = 0;
    while (clock.read() < deadline) {
      ASSERT_LT(++spins, 100'000'000) << emugpu::host_model_name(cost.model);
    }
  }
}

TEST(VirtualClock, SleepAdvancesByItsDurationAndSaturates) {
  FakeCpu cpu;
  VirtualClock clock(kStart, modelled(0, 0), cpu);
  clock.sleep_for(250 * kMs);
  EXPECT_EQ(clock.now(), kStart + 250 * kMs);
  EXPECT_EQ(clock.stats().slept_ns, 250 * kMs);
  for (int i = 0; i < 4; ++i) clock.sleep_for(emugpu::kMaxDurationNs);  // beyond a TimeNs: saturates
  EXPECT_EQ(clock.now(), std::numeric_limits<TimeNs>::max());
  EXPECT_THROW(clock.sleep_for(-1), emugpu::Error);
}

TEST(VirtualClock, BlockedTimeIsMeasuredHostWorkUnscaledAndTheModelledHostIgnoresIt) {
  FakeCpu cpu;
  VirtualClock clock(kStart, measured(0, 4.0), cpu);
  clock.read();                    // the thread's first read: nothing before it to measure from
  cpu.ns += 8 * kMs;               // CPU work: a 4x faster host does it in 2 ms
  clock.charge_blocked(30 * kMs);  // a read from storage: no faster on that host
  EXPECT_EQ(clock.now(), kStart + 2 * kMs + 30 * kMs);
  EXPECT_EQ(clock.stats().host_ns, 32 * kMs);
  EXPECT_THROW(clock.charge_blocked(-1), emugpu::Error);

  VirtualClock fixed(kStart, modelled(0, 0), cpu);
  fixed.charge_blocked(30 * kMs);
  EXPECT_EQ(fixed.now(), kStart);
}

TEST(VirtualClock, ABadHostCostIsRefusedWithItsValue) {
  for (double speed : {0.0, -1.0, std::nan("")}) {
    try {
      VirtualClock clock(kStart, measured(0, speed));
      ADD_FAILURE() << "speed " << speed << " accepted";
    } catch (const emugpu::Error& e) {
      EXPECT_NE(std::string(e.what()).find("EMUGPU_HOST_SPEED"), std::string::npos) << e.what();
    }
  }
  VirtualClock clock(kStart);
  EXPECT_THROW(clock.set_host_cost(modelled(-1, 0)), emugpu::Error);
  HostCost bad_list = modelled(1, 0);
  bad_list.list_tensor_ns = -1;
  try {
    clock.set_host_cost(bad_list);
    ADD_FAILURE() << "a negative time per list tensor accepted";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("got -1"), std::string::npos) << e.what();
  }
}

TEST(VirtualClock, ThreadsThatNeverEnterDoNotMoveIt) {
  FakeCpu cpu;
  VirtualClock clock(kStart, measured(), cpu);
  std::thread runner([&] { cpu.ns += 50 * kMs; });  // an emulator thread's work
  runner.join();
  clock.read();
  EXPECT_EQ(clock.now(), kStart);
}

TEST(VirtualClock, AForkedChildsWorkSinceTheForkIsItsOwn) {
  FakeCpu cpu;
  VirtualClock clock(kStart, measured(), cpu);
  clock.read();
  cpu.ns = 1 * kUs;  // the child's thread clock restarted at zero: 1 us of work since the fork (setting up)
  VirtualClock::after_fork();
  clock.read();
  cpu.ns += 4 * kUs;
  clock.read();
  EXPECT_EQ(clock.now(), kStart + 5 * kUs);
  // Another thread's first call still has no mark to measure from.
  std::thread([&] {
    cpu.ns += 7 * kUs;
    clock.read();
  }).join();
  EXPECT_EQ(clock.now(), kStart + 5 * kUs);
}

TEST(VirtualClock, ADeviceSynchronizeJumpsToTheEndOfItsWork) {
  FakeCpu cpu;
  VirtualClock clock(kStart, modelled(10 * kUs, 0), cpu);
  const emugpu::GpuSpec gpu = emugpu::testing::test_gpu();
  Device dev(0, gpu, clock);
  TimeNs end = 0;
  for (int i = 0; i < 100; ++i) {
    EmulatorCall call(&clock);
    end = dev.launch(0, Engine::kCompute, 1 * kMs);
  }
  EXPECT_EQ(clock.now(), kStart + 100 * 10 * kUs);  // the host ran ahead
  const auto before = std::chrono::steady_clock::now();
  {
    EmulatorCall call(&clock);
    dev.synchronize();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(30));
  EXPECT_EQ(end, kStart + 10 * kUs + 100 * kMs);  // GPU-bound: the first launch, then back to back
  EXPECT_EQ(clock.now(), end);
}

TEST(VirtualClock, AHostSlowerThanTheDeviceSetsThePace) {
  FakeCpu cpu;
  VirtualClock clock(kStart, modelled(50 * kUs, 0), cpu);
  const emugpu::GpuSpec gpu = emugpu::testing::test_gpu();
  Device dev(0, gpu, clock);
  for (int i = 0; i < 100; ++i) {
    EmulatorCall call(&clock);
    dev.launch(0, Engine::kCompute, 10 * kUs);
  }
  {
    EmulatorCall call(&clock);
    dev.synchronize();
  }
  // The device finished each op before the next launch; the synchronize call is host work too.
  EXPECT_EQ(clock.now(), kStart + 101 * 50 * kUs);
  EXPECT_EQ(clock.stats().waited_ns, 0);
}

}  // namespace
