#include "host_bound.h"

#include <algorithm>
#include <mutex>

namespace emugpu {
namespace {

std::mutex g_handler_mutex;
HostBoundHandler g_handler;

}  // namespace

double HostBoundMonitor::observe(TimeNs now, TimeNs idle_total) {
  if (window_start_ < 0) {
    window_start_ = now;
    idle_at_start_ = idle_total;
    return -1;
  }
  const TimeNs span = now - window_start_;
  if (span < kWindowNs) return -1;
  // Idle time is counted when the gap closes, so it can exceed a window that began mid-gap.
  const double fraction = std::min(1.0, static_cast<double>(idle_total - idle_at_start_) / static_cast<double>(span));
  window_start_ = now;
  idle_at_start_ = idle_total;
  if (!warmed_up_) {
    warmed_up_ = true;
    return -1;
  }
  stats_.windows += 1;
  stats_.last_idle_fraction = fraction;
  stats_.worst_idle_fraction = std::max(stats_.worst_idle_fraction, fraction);
  if (fraction <= kIdleFraction) return -1;
  stats_.host_bound += 1;
  return fraction;
}

void set_host_bound_handler(HostBoundHandler handler) {
  std::lock_guard<std::mutex> lock(g_handler_mutex);
  g_handler = std::move(handler);
}

void report_host_bound(int device, double idle_fraction) {
  HostBoundHandler handler;
  {
    std::lock_guard<std::mutex> lock(g_handler_mutex);
    handler = g_handler;
  }
  if (handler) handler(device, idle_fraction);
}

}  // namespace emugpu
