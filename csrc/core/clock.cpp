#include "clock.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <thread>

#include "error.h"

namespace emugpu {
namespace {

std::mutex g_interrupt_mutex;
std::function<void()> g_interrupt_check;

}  // namespace

void check_wait_interrupt() {
  std::function<void()> check;
  {
    std::lock_guard<std::mutex> lock(g_interrupt_mutex);
    check = g_interrupt_check;
  }
  if (check) check();
}

TimeNs host_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TimeNs SteadyClock::now() const { return host_now(); }

void SteadyClock::sleep_until(TimeNs deadline) {
  // The kernel's timer slack and wake-up latency are tens of microseconds:
  // sleep short of the deadline and spin the rest. Long sleeps wake up every
  // kSlice to let the host interrupt them.
  constexpr TimeNs kSpin = 200'000;
  constexpr TimeNs kSlice = kInterruptSliceNs;
  auto sleep_to = [](TimeNs t) {
    std::this_thread::sleep_until(std::chrono::steady_clock::time_point(std::chrono::nanoseconds(t)));
  };
  TimeNs now = host_now();
  while (deadline - now > kSpin + kSlice) {
    sleep_to(now + kSlice);
    check_wait_interrupt();
    now = host_now();
  }
  if (deadline - now > kSpin) sleep_to(deadline - kSpin);
  while (host_now() < deadline) std::this_thread::yield();
}

void ManualClock::sleep_until(TimeNs deadline) {
  TimeNs now = now_.load();
  while (now < deadline && !now_.compare_exchange_weak(now, deadline)) {
  }
}

Clock& steady_clock() {
  static SteadyClock clock;
  return clock;
}

void set_wait_interrupt_check(std::function<void()> check) {
  std::lock_guard<std::mutex> lock(g_interrupt_mutex);
  g_interrupt_check = std::move(check);
}

TimeNs seconds_to_ns(double seconds) {
  EMUGPU_CHECK(std::isfinite(seconds) && seconds >= 0, kValue, "expected a duration >= 0 s, got ", seconds);
  return static_cast<TimeNs>(std::min(seconds * 1e9, static_cast<double>(kMaxDurationNs)));
}

TimeNs ns_from_double(double ns) {
  EMUGPU_CHECK(!std::isnan(ns) && ns >= 0, kRuntime, "expected a computed duration >= 0 ns, got ", ns,
               "; this is a bug in torch-emugpu's cost model, please report it with the op that caused it");
  // Compared before the cast: casting a double beyond int64 is undefined.
  if (ns >= static_cast<double>(kMaxDurationNs)) return kMaxDurationNs;
  return static_cast<TimeNs>(std::llround(ns));
}

TimeNs add_saturating(TimeNs a, TimeNs b) {
  return b > 0 && a > std::numeric_limits<TimeNs>::max() - b ? std::numeric_limits<TimeNs>::max() : a + b;
}

Timeline::Timeline(size_t queue_depth) : queue_depth_(queue_depth) {
  EMUGPU_CHECK(queue_depth > 0, kValue, "launch queue depth must be positive, got 0");
}

TimeNs Timeline::start_of(int64_t stream, Engine engine, TimeNs now) const {
  auto it = stream_ready_.find(stream);
  const TimeNs ready = it == stream_ready_.end() ? 0 : it->second;
  return std::max({now, ready, engine_ready_[static_cast<int>(engine)]});
}

TimeNs Timeline::place(int64_t stream, Engine engine, TimeNs start, TimeNs duration, TimeNs now) {
  EMUGPU_CHECK(duration >= 0, kValue, "operation duration must be >= 0 ns, got ", duration);
  const int e = static_cast<int>(engine);
  const TimeNs end = add_saturating(start, duration);
  // Work that starts no later than its launch, after every engine went idle,
  // waited for the host. A device never used has nothing to be idle from.
  const TimeNs busy_until = *std::max_element(engine_ready_.begin(), engine_ready_.end());
  if (busy_until > 0 && start > busy_until && start <= now) host_idle_ns_ += start - busy_until;
  TimeNs& ready = stream_ready_[stream];
  ready = std::max(ready, end);
  engine_ready_[e] = std::max(engine_ready_[e], end);
  stats_[e].launches += 1;
  stats_[e].busy_ns = add_saturating(stats_[e].busy_ns, duration);
  if (end > now) pending_.push_back(end);
  return end;
}

TimeNs Timeline::queue_wait(TimeNs now) {
  while (!pending_.empty() && pending_.front() <= now) pending_.pop_front();
  return pending_.size() >= queue_depth_ ? pending_[pending_.size() - queue_depth_] : 0;
}

TimeNs Timeline::stream_ready(int64_t stream) const {
  auto it = stream_ready_.find(stream);
  return it == stream_ready_.end() ? 0 : it->second;
}

TimeNs Timeline::device_ready() const {
  TimeNs t = *std::max_element(engine_ready_.begin(), engine_ready_.end());
  for (const auto& [id, ready] : stream_ready_) t = std::max(t, ready);
  return t;
}

TimeNs Timeline::engine_ready(Engine engine) const { return engine_ready_[static_cast<int>(engine)]; }

void Timeline::stream_wait(int64_t stream, TimeNs t) {
  TimeNs& ready = stream_ready_[stream];
  ready = std::max(ready, t);
}

}  // namespace emugpu
