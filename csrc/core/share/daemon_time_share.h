// One emulated device's compute as a share of an emugpud GPU (time_share.h):
// the device's reports go to the daemon, whose policy grants the share.
//
// Under the virtual clock the attached processes' clocks also stay within a
// fifth of a window of each other: a report from a process further ahead of
// the earliest live one waits, in real time, until that one catches up. So
// a process never places work far beyond the time up to which the others'
// busy fractions are known, and one that starts or stops is seen by the
// others within that bound. A laggard that does not move during kPatience
// of real time waited on (blocked outside the emulator: on this process, on
// input, on a rank that waits for this one) is not waited for again until it
// moves: pacing must never deadlock.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

#include "share/client.h"
#include "time_share.h"

namespace emugpu::share {

class DaemonTimeShare final : public TimeShare {
 public:
  // `keep_pace`: this process runs the virtual clock (the real one is shared by construction).
  // `sm_fraction`: the device's SMs over the daemon GPU's (an MPS client's
  // active-thread cap), so that demands reach the daemon in whole-GPU terms.
  DaemonTimeShare(std::shared_ptr<Client> client, uint32_t gpu, bool keep_pace, double sm_fraction = 1.0)
      : client_(std::move(client)), gpu_(gpu), keep_pace_(keep_pace), sm_fraction_(sm_fraction) {}

  TimeNs report_ns() const override { return client_->welcome().report_ns; }
  TimeNs window_ns() const override { return client_->welcome().window_ns; }
  double report(const Report& r) override {
    const auto busy = static_cast<uint32_t>(std::clamp(r.busy, 0.0, 1.0) * kPpm + 0.5);
    const auto whole_gpu = [this](double demand) {
      return static_cast<uint32_t>(std::clamp(demand * sm_fraction_, 0.0, 1.0) * kPpm + 0.5);
    };
    ShareReport report{gpu_,
                       busy,
                       std::max<TimeNs>(r.iteration_ns, 0),
                       r.now,
                       r.busy_until,
                       whole_gpu(r.demand),
                       std::max<TimeNs>(r.hold_ns, 0),
                       {}};
    for (size_t i = 0; i < r.bins.size(); ++i) {
      const DemandBin& b = r.bins[i];
      // The bandwidth is the GPU's under an active-thread cap too (MPS splits SMs, not memory).
      report.bins[i] = {static_cast<uint32_t>(std::clamp(b.fraction, 0.0, 1.0) * kPpm + 0.5), whole_gpu(b.demand),
                        std::max<TimeNs>(b.hold_ns, 0), std::max<TimeNs>(b.kernel_ns, 0),
                        static_cast<uint32_t>(std::clamp(b.bandwidth, 0.0, 1.0) * kPpm + 0.5)};
    }
    ShareGrant grant = client_->share(report);
    const TimeNs skew = window_ns() / 5;
    const auto give_up = std::chrono::steady_clock::now() + kPatience;
    while (keep_pace_ && grant.lowest_now != kNoTime && grant.lowest_now != stuck_ && r.now > grant.lowest_now + skew) {
      if (std::chrono::steady_clock::now() > give_up) {
        stuck_ = grant.lowest_now;
        break;
      }
      std::this_thread::sleep_for(std::chrono::nanoseconds(report_ns()));
      grant = client_->share(report);
    }
    return static_cast<double>(grant.rate_ppm) / kPpm;
  }

 private:
  std::shared_ptr<Client> client_;
  uint32_t gpu_;
  // Long enough for a process that still runs on a loaded host (2 cores,
  // several jobs: a laggard may not report for a few hundred ms), short
  // enough that a finished one delays the others once, briefly. emugpud's
  // SharingConfig::patience_ns is the same.
  static constexpr std::chrono::milliseconds kPatience{1000};
  bool keep_pace_;
  double sm_fraction_;
  TimeNs stuck_ = kNoTime;  // a laggard's time that did not move within kPatience
};

}  // namespace emugpu::share
