#include "clock.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "error.h"

namespace emugpu {

TimeNs host_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void sleep_until(TimeNs deadline) {
  // The kernel's timer slack and wake-up latency are tens of microseconds;
  // sleep short of the deadline and spin the rest to stay accurate.
  constexpr TimeNs kSpin = 200'000;
  TimeNs now = host_now();
  if (deadline - now > kSpin) {
    std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
        std::chrono::nanoseconds(deadline - kSpin)));
  }
  while (host_now() < deadline) {
    std::this_thread::yield();
  }
}

Timeline::Timeline(size_t queue_depth) : queue_depth_(queue_depth) {
  EMUGPU_CHECK(queue_depth > 0, kValue, "launch queue depth must be positive, got 0");
}

TimeNs Timeline::launch(int64_t stream, Engine engine, TimeNs duration) {
  EMUGPU_CHECK(duration >= 0, kValue, "operation duration must be >= 0 ns, got ", duration);
  const int e = static_cast<int>(engine);
  TimeNs wait_for = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const TimeNs now = host_now();
    while (!pending_.empty() && pending_.front() <= now) pending_.pop_front();
    if (pending_.size() >= queue_depth_) wait_for = pending_[pending_.size() - queue_depth_];
  }
  if (wait_for > 0) wait_until(wait_for);

  std::lock_guard<std::mutex> lock(mutex_);
  const TimeNs now = host_now();
  TimeNs& ready = stream_ready_[stream];
  const TimeNs start = std::max({now, ready, engine_ready_[e]});
  const TimeNs end = start + duration;
  ready = end;
  engine_ready_[e] = end;
  stats_[e].launches += 1;
  stats_[e].busy_ns += duration;
  if (end > now) pending_.push_back(end);
  return end;
}

void Timeline::wait_until(TimeNs t) {
  const TimeNs start = host_now();
  if (t <= start) return;
  sleep_until(t);
  blocked_ns_.fetch_add(host_now() - start, std::memory_order_relaxed);
}

TimeNs Timeline::stream_ready(int64_t stream) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = stream_ready_.find(stream);
  return it == stream_ready_.end() ? 0 : it->second;
}

TimeNs Timeline::device_ready() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TimeNs t = *std::max_element(engine_ready_.begin(), engine_ready_.end());
  for (const auto& [id, ready] : stream_ready_) t = std::max(t, ready);
  return t;
}

TimeNs Timeline::engine_ready(Engine engine) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return engine_ready_[static_cast<int>(engine)];
}

void Timeline::stream_wait(int64_t stream, TimeNs t) {
  std::lock_guard<std::mutex> lock(mutex_);
  TimeNs& ready = stream_ready_[stream];
  ready = std::max(ready, t);
}

EngineStats Timeline::engine_stats(Engine engine) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_[static_cast<int>(engine)];
}

void Timeline::reset_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_ = {};
  blocked_ns_.store(0);
}

}  // namespace emugpu
