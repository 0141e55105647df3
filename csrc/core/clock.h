// Time sources and the emulated GPU's timeline of engines and streams.
//
// Times are nanoseconds on a Clock. The real one is the host's steady clock;
// tests inject a ManualClock so that timeline behaviour never depends on how
// busy the host is. Timeline itself is a plain data structure without locks
// or waits: Device (device.h) owns one, locks it and decides when to block.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <unordered_map>

namespace emugpu {

using TimeNs = int64_t;

// kCollective runs torch.distributed collectives (NCCL runs them on its own
// streams, concurrently with compute kernels on other streams).
enum class Engine : int { kCompute = 0, kHostToDevice = 1, kDeviceToHost = 2, kCollective = 3 };
constexpr int kEngineCount = 4;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimeNs now() const = 0;
  // Blocks the calling thread until now() >= deadline. May throw when the
  // wait is interrupted (see set_wait_interrupt_check).
  virtual void sleep_until(TimeNs deadline) = 0;
};

// The host's steady clock: an absolute sleep to just before the deadline,
// then a short spin, checking for interrupts during long sleeps.
class SteadyClock final : public Clock {
 public:
  TimeNs now() const override;
  void sleep_until(TimeNs deadline) override;
};

// A clock that moves only when told to (tests): sleeping jumps to the deadline.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(TimeNs start = 1'000'000'000) : now_(start) {}
  TimeNs now() const override { return now_.load(); }
  void sleep_until(TimeNs deadline) override;
  void advance(TimeNs by) { now_.fetch_add(by); }

 private:
  std::atomic<TimeNs> now_;
};

// The process-wide steady clock.
Clock& steady_clock();
TimeNs host_now();

// Installs a function that long host waits call every few tens of
// milliseconds; it may throw to abandon the wait (Ctrl-C in Python). Waits
// shorter than that never call it, so short waits stay accurate.
void set_wait_interrupt_check(std::function<void()> check);
// Runs that function, if any: waits that are not sleeps (a peer's message,
// a store key) call it between slices of at most kInterruptSliceNs, long
// loops of the host's own work (a calibration fit) every so often.
void check_wait_interrupt();
constexpr TimeNs kInterruptSliceNs = 50'000'000;

// The longest duration the emulator charges: a century, far beyond any wait
// worth emulating and far below overflow (a TimeNs holds 292 years).
constexpr TimeNs kMaxDurationNs = TimeNs{100} * 365 * 24 * 3600 * 1'000'000'000;

// Clamps a duration in seconds to nanoseconds without overflowing.
TimeNs seconds_to_ns(double seconds);
// A duration computed in double nanoseconds (bytes over a rate, FLOPs over a
// peak) as a TimeNs: rounded, and saturated at kMaxDurationNs where a tiny
// rate or a huge size makes it longer (or infinite), so that it never wraps
// to a negative time. A NaN or negative one is a bug: kRuntime.
TimeNs ns_from_double(double ns);
// a + b for times and durations >= 0, saturating at the largest TimeNs.
TimeNs add_saturating(TimeNs a, TimeNs b);

struct EngineStats {
  int64_t launches = 0;
  TimeNs busy_ns = 0;
};

class Timeline {
 public:
  // `queue_depth` is how many launched, unfinished operations the host may
  // run ahead of the device before a launch blocks (CUDA's is about 1024).
  explicit Timeline(size_t queue_depth = 1024);

  // When work launched now on `stream` and `engine` could start.
  TimeNs start_of(int64_t stream, Engine engine, TimeNs now) const;
  // Puts `duration` of work at `start` (from start_of); returns its end.
  TimeNs place(int64_t stream, Engine engine, TimeNs start, TimeNs duration, TimeNs now);
  // The time a launch at `now` must wait for (0 when the queue has room).
  TimeNs queue_wait(TimeNs now);
  size_t queue_depth() const { return queue_depth_; }

  TimeNs stream_ready(int64_t stream) const;
  TimeNs device_ready() const;
  TimeNs engine_ready(Engine engine) const;
  // Makes later work on `stream` wait for `t` (Event.wait / stream.wait_event).
  void stream_wait(int64_t stream, TimeNs t);

  EngineStats engine_stats(Engine engine) const { return stats_[static_cast<int>(engine)]; }
  // Device time every engine sat idle before work that could not start
  // earlier because it was launched late (the host, or another rank's host
  // for a collective): the measure of a host-bound run.
  TimeNs host_idle_ns() const { return host_idle_ns_; }
  void reset_stats() { stats_ = {}; }

 private:
  size_t queue_depth_;
  std::unordered_map<int64_t, TimeNs> stream_ready_;
  std::array<TimeNs, kEngineCount> engine_ready_{};
  TimeNs host_idle_ns_ = 0;
  std::array<EngineStats, kEngineCount> stats_{};
  std::deque<TimeNs> pending_;  // end times of launched work, in launch order
};

}  // namespace emugpu
