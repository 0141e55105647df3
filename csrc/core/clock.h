// The emulated GPU timeline: engines, streams and events over host time.
//
// Times are nanoseconds on the host's steady clock. Launching work only moves
// the timeline forward; the host blocks only in the wait_* calls (and when the
// launch queue is full, as with CUDA).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>

namespace emugpu {

using TimeNs = int64_t;

enum class Engine : int { kCompute = 0, kHostToDevice = 1, kDeviceToHost = 2 };
constexpr int kEngineCount = 3;

TimeNs host_now();
// Sleeps until `deadline`: an absolute sleep to just before it, then a spin.
void sleep_until(TimeNs deadline);

struct EngineStats {
  int64_t launches = 0;
  TimeNs busy_ns = 0;
};

class Timeline {
 public:
  // `queue_depth` is how many launched, unfinished operations the host may
  // run ahead of the device before a launch blocks (CUDA's is about 1024).
  explicit Timeline(size_t queue_depth = 1024);

  // Enqueues `duration` of work on `stream` and `engine`; returns its end time.
  TimeNs launch(int64_t stream, Engine engine, TimeNs duration);
  // Time at which all work enqueued so far on `stream` is done.
  TimeNs stream_ready(int64_t stream) const;
  // Time at which all work enqueued so far on the device is done.
  TimeNs device_ready() const;
  // Time at which all work enqueued so far on `engine` is done.
  TimeNs engine_ready(Engine engine) const;
  // Makes later work on `stream` wait for `t` (Event.wait / stream.wait_event).
  void stream_wait(int64_t stream, TimeNs t);

  // Host blocking points; the time spent in them is counted (host_blocked_ns).
  void wait_until(TimeNs t);
  void wait_stream(int64_t stream) { wait_until(stream_ready(stream)); }
  void wait_device() { wait_until(device_ready()); }
  TimeNs host_blocked_ns() const { return blocked_ns_.load(std::memory_order_relaxed); }

  EngineStats engine_stats(Engine engine) const;
  void reset_stats();

 private:
  mutable std::mutex mutex_;
  size_t queue_depth_;
  std::unordered_map<int64_t, TimeNs> stream_ready_;
  std::array<TimeNs, kEngineCount> engine_ready_{};
  std::array<EngineStats, kEngineCount> stats_{};
  std::deque<TimeNs> pending_;  // end times of launched work, in launch order
  std::atomic<TimeNs> blocked_ns_{0};
};

}  // namespace emugpu
