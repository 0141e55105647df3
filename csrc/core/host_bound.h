// Says when a run is host-bound: the device sat idle waiting for the host to
// launch work, so the iteration times measure this host rather than the GPU.
// Ranks that share a few cores, or a host slower than the GPU's, get there.
//
// Idle time is counted by the timeline (Timeline::host_idle_ns); this
// monitor cuts host time into windows of at least kWindowNs, closed at host
// waits (a loop's sync points), and calls a window host-bound when the device
// sat idle more than kIdleFraction of it. The first window is warm-up (model
// construction, shape caches) and is not judged.
#pragma once

#include <cstdint>
#include <functional>

#include "clock.h"

namespace emugpu {

struct HostBoundStats {
  int64_t windows = 0;             // judged windows
  int64_t host_bound = 0;          // of them, host-bound
  double last_idle_fraction = 0;   // idle share of the last judged window
  double worst_idle_fraction = 0;  // the largest seen
};

class HostBoundMonitor {
 public:
  static constexpr TimeNs kWindowNs = 500'000'000;
  static constexpr double kIdleFraction = 0.10;

  // At a host wait at `now`, with `idle_total` the timeline's idle time so
  // far. Returns the idle fraction of a window it just judged host-bound,
  // or a negative number.
  double observe(TimeNs now, TimeNs idle_total);
  const HostBoundStats& stats() const { return stats_; }

 private:
  TimeNs window_start_ = -1;
  TimeNs idle_at_start_ = 0;
  bool warmed_up_ = false;
  HostBoundStats stats_;
};

// Called (outside any lock) when a device's window is judged host-bound; the
// torch layer turns it into a warning.
using HostBoundHandler = std::function<void(int device, double idle_fraction)>;
void set_host_bound_handler(HostBoundHandler handler);
void report_host_bound(int device, double idle_fraction);

}  // namespace emugpu
