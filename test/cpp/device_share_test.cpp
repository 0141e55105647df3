// A device whose GPU's compute is shared with other processes (time_share.h).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "device.h"
#include "test_gpu.h"

namespace {

using emugpu::Device;
using emugpu::Engine;
using emugpu::ManualClock;
using emugpu::TimeNs;
using emugpu::TimeShare;

constexpr TimeNs kMs = 1'000'000;

// Grants a fixed share and keeps what the device reported; reports at every launch.
class FixedShare final : public TimeShare {
 public:
  explicit FixedShare(double share) : share(share) {}
  TimeNs report_ns() const override { return 0; }
  TimeNs window_ns() const override { return 10 * kMs; }
  double report(const Report& r) override {
    reports.push_back(r);
    return share;
  }
  double share;
  std::vector<Report> reports;
};

struct Shared {
  ManualClock clock;
  emugpu::GpuSpec gpu = emugpu::testing::test_gpu();
  Device dev{0, gpu, clock};
  std::shared_ptr<FixedShare> share;
  explicit Shared(double s) : share(std::make_shared<FixedShare>(s)) { dev.share_time(share); }
};

TEST(DeviceShare, ComputeRunsAtItsShareAndCopiesAtFullRate) {
  Shared s(0.25);
  const TimeNs start = s.clock.now();
  EXPECT_DOUBLE_EQ(s.dev.compute_share(), 1.0);  // until the first report
  EXPECT_EQ(s.dev.launch(0, Engine::kCompute, 1 * kMs), start + 4 * kMs);
  EXPECT_DOUBLE_EQ(s.dev.compute_share(), 0.25);
  EXPECT_EQ(s.dev.launch(0, Engine::kCompute, 1 * kMs), start + 8 * kMs);
  EXPECT_EQ(s.dev.launch(1, Engine::kHostToDevice, 1 * kMs), start + 1 * kMs);
}

TEST(DeviceShare, AProfiledRegionTakesItsTimeAtTheShare) {
  Shared s(0.5);
  s.dev.launch(0, Engine::kCompute, 0);  // the first report sets the share
  s.dev.synchronize();
  const TimeNs start = s.clock.now();
  s.dev.forward_begin(0, "m:forward", 4 * kMs);
  s.dev.launch(0, Engine::kCompute, 100'000);
  s.dev.forward_end(0, "m:backward", 0, false);
  s.dev.synchronize();
  EXPECT_EQ(s.clock.now(), start + 8 * kMs);
}

TEST(DeviceShare, ReportsHowBusyTheComputeEngineWasAndItsIterations) {
  Shared s(1.0);
  // Busy back to back for 50 ms (five windows): the busy fraction approaches 1.
  for (int i = 0; i < 50; ++i) {
    s.dev.launch(0, Engine::kCompute, 1 * kMs);
    s.clock.advance(1 * kMs);
  }
  s.dev.synchronize();
  s.dev.launch(0, Engine::kCompute, 0);
  const double busy = s.share->reports.back().busy;
  EXPECT_GT(busy, 0.99);
  EXPECT_LE(busy, 1.0);
  EXPECT_EQ(s.share->reports.back().iteration_ns, 50 * kMs);  // the work between two host waits
  // Then idle for 50 ms: it decays towards 0.
  s.clock.advance(50 * kMs);
  s.dev.launch(0, Engine::kCompute, 0);
  EXPECT_LT(s.share->reports.back().busy, 0.01);
  EXPECT_EQ(s.share->reports.back().now, s.clock.now());
}

TEST(DeviceShare, ReportsItsKernelsOccupancyWeighedByTheirTime) {
  Shared s(1.0);
  // 1 ms kernels holding the whole GPU in 100 us blocks, 0.1 ms ones holding
  // a tenth in 10 us blocks, 0.5 ms ones holding 30% and moving 0.4 ms of
  // bytes at the peak bandwidth (drawing 80% of it).
  for (int i = 0; i < 10; ++i) {
    s.dev.launch(0, Engine::kCompute, 1 * kMs, {1.0, 100e3});
    s.dev.launch(0, Engine::kCompute, kMs / 10, {0.1, 10e3});
    s.dev.launch(0, Engine::kCompute, kMs / 2, {0.3, 5e3, 0.4 * kMs});
    s.clock.advance(kMs + kMs / 10 + kMs / 2);
  }
  s.dev.launch(0, Engine::kCompute, 0, {0.5, 0});
  const auto& r = s.share->reports.back();
  EXPECT_NEAR(r.demand, (1.0 * 1.0 + 0.1 * 0.1 + 0.3 * 0.5) / 1.6, 0.01);
  EXPECT_NEAR(static_cast<double>(r.hold_ns), (100e3 * 1.0 + 10e3 * 0.1 + 5e3 * 0.5) / 1.6, 1e3);
  // And by class: the GPU-filling kernels in the top SM bin, the small ones
  // in the lowest, the bandwidth-bound ones in their SM bin's bandwidth twin.
  const int top = emugpu::kSmBins - 1, bound = emugpu::kSmBins + 1;
  EXPECT_NEAR(r.bins[top].fraction, 1.0 / 1.6, 0.01);
  EXPECT_NEAR(r.bins[top].demand, 1.0, 1e-9);
  EXPECT_NEAR(static_cast<double>(r.bins[top].hold_ns), 100e3, 1);
  EXPECT_NEAR(static_cast<double>(r.bins[top].kernel_ns), 1.0 * kMs, 1);
  EXPECT_EQ(r.bins[top].bandwidth, 0.0);
  EXPECT_NEAR(r.bins[0].fraction, 0.1 / 1.6, 0.01);
  EXPECT_NEAR(r.bins[0].demand, 0.1, 1e-9);
  EXPECT_NEAR(static_cast<double>(r.bins[0].kernel_ns), 0.1 * kMs, 1);
  EXPECT_NEAR(r.bins[bound].fraction, 0.5 / 1.6, 0.01);
  EXPECT_NEAR(r.bins[bound].demand, 0.3, 1e-9);
  EXPECT_NEAR(r.bins[bound].bandwidth, 0.8, 1e-9);
  for (int i = 0; i < emugpu::kDemandBins; ++i) {
    if (i != 0 && i != top && i != bound) {
      EXPECT_EQ(r.bins[i].fraction, 0.0) << "bin " << i;
    }
  }
}

TEST(DeviceShare, HalfBusyReportsHalf) {
  Shared s(1.0);
  for (int i = 0; i < 100; ++i) {
    s.dev.launch(0, Engine::kCompute, 1 * kMs);
    s.clock.advance(2 * kMs);
  }
  s.dev.launch(0, Engine::kCompute, 0);
  EXPECT_NEAR(s.share->reports.back().busy, 0.5, 0.05);
}

}  // namespace

namespace {

TEST(DeviceShare, AProcessThatJustStartedReportsWhatItDidSoFar) {
  Shared s(1.0);
  // 2 ms of a 10 ms window, busy throughout: 1, not the 0.18 a plain average from 0 would say.
  s.dev.launch(0, Engine::kCompute, 2 * kMs);
  s.clock.advance(2 * kMs);
  s.dev.launch(0, Engine::kCompute, 0);
  EXPECT_NEAR(s.share->reports.back().busy, 1.0, 1e-9);
}

}  // namespace
