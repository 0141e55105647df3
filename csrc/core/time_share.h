// A GPU's compute shared with other processes (emugpud's time sharing): the
// share of the GPU's speed this process's kernels get. The device renews it
// at a coarse grain (every report_ns() of real time while it launches work),
// reporting how busy it kept the GPU; between reports every op is placed
// locally at the last share.
#pragma once

#include <algorithm>
#include <array>

#include "clock.h"

namespace emugpu {

// MPS: a process's kernels grouped by what they hold of the GPU, so that
// the daemon's expectation runs over which kernels meet: two jobs whose mean
// demands add up to one GPU still collide when each has kernels that fill
// it, and two jobs' bandwidth-bound kernels compete for memory even where
// their SMs fit side by side. A kernel's bin: the quarter of the SMs its
// demand falls in ([i, i + 1) / kSmBins), and whether it draws at least
// half of the peak memory bandwidth alone (the upper kSmBins bins).
constexpr int kSmBins = 4;
constexpr int kDemandBins = 2 * kSmBins;
constexpr double kBandwidthBound = 0.5;
struct DemandBin {
  double fraction = 0;   // of the process's kernel time (time-weighted recent average)
  double demand = 0;     // the bin's kernels' time-weighted mean demand of the SMs
  TimeNs hold_ns = 0;    // and their blocks' time-weighted mean hold time
  TimeNs kernel_ns = 0;  // and their time-weighted mean duration alone
  double bandwidth = 0;  // and the time-weighted mean share of the peak memory bandwidth they draw alone
};
using DemandHistogram = std::array<DemandBin, kDemandBins>;
inline int demand_bin(double demand, double bandwidth) {
  return std::clamp(static_cast<int>(demand * kSmBins), 0, kSmBins - 1) + (bandwidth >= kBandwidthBound ? kSmBins : 0);
}

class TimeShare {
 public:
  struct Report {
    double busy = 0;          // fraction of the recent window the compute engine had work
    TimeNs iteration_ns = 0;  // compute work between host waits, on the GPU alone (recent average)
    TimeNs now = 0;           // the device's clock
    TimeNs busy_until = 0;    // where the compute launched so far ends
    double demand = 1.0;      // fraction of the device's SMs its kernels hold (time-weighted recent average)
    TimeNs hold_ns = 0;       // how long its kernels' blocks hold an SM (time-weighted recent average)
    DemandHistogram bins{};   // its kernels by demand (all fractions 0 before its first kernel)
  };
  virtual ~TimeShare() = default;
  // Real time between reports.
  virtual TimeNs report_ns() const = 0;
  // The clock time a reported busy fraction averages over.
  virtual TimeNs window_ns() const = 0;
  // Returns the share in (0, 1] for the work launched until the next report.
  virtual double report(const Report& report) = 0;
};

}  // namespace emugpu
