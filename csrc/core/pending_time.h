// A device time that the host learns later: a deferred collective's end is
// known only once every rank has launched it, and an event recorded behind
// it only once that end is placed. Device::stream_wait on one that is not
// known yet holds the device's later work (device.h) instead of blocking the
// host, as a CUDA stream waits for an NCCL kernel the host never waits for.
#pragma once

#include <atomic>
#include <functional>

#include "clock.h"

namespace emugpu {

class PendingTime {
 public:
  static constexpr TimeNs kUnknown = -1;
  // Makes the time known, blocking as long as that takes, and returns it
  // (a collective: run the group's runner through it). May throw.
  using Force = std::function<TimeNs()>;

  PendingTime() = default;
  explicit PendingTime(TimeNs known) : time_(known) {}
  PendingTime(const PendingTime&) = delete;
  PendingTime& operator=(const PendingTime&) = delete;

  // Set once, before the object is shared with other threads.
  void set_force(Force force) { force_ = std::move(force); }

  bool known() const { return time_.load(std::memory_order_acquire) != kUnknown; }
  // kUnknown until known.
  TimeNs value() const { return time_.load(std::memory_order_acquire); }
  // The first value set stays.
  void set(TimeNs t);
  // The time, forcing it known first.
  TimeNs force();

 private:
  std::atomic<TimeNs> time_{kUnknown};
  Force force_;
};

}  // namespace emugpu
