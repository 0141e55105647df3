#include "device.h"

#include <algorithm>
#include <cmath>

#include "error.h"

namespace emugpu {
namespace {

constexpr TimeNs kUtilizationWindow = 1'000'000'000;

}  // namespace

Device::Device(int index, const GpuSpec& gpu, Clock& clock, size_t queue_depth, CostModelParams cost)
    : index_(index),
      gpu_(gpu),
      clock_(clock),
      allocator_(index, gpu.name, usable_memory_bytes(gpu), gpu.memory_bytes),
      cost_(gpu, cost),
      timeline_(queue_depth) {}

bool Device::replay_locked() {
  while (!held_.empty()) {
    Held& h = held_.front();
    if (h.gate && !h.gate->known()) return true;
    auto apply = std::move(h.apply);
    const TimeNs host_time = h.host_time;
    held_.pop_front();
    apply(host_time);
  }
  return false;
}

bool Device::held_queue_full_locked() { return replay_locked() && held_.size() >= timeline_.queue_depth(); }

template <typename Apply>
void Device::apply_or_hold_locked(TimeNs now, Apply&& apply) {
  if (replay_locked()) {
    held_.push_back({now, nullptr, std::forward<Apply>(apply)});
  } else {
    apply(now);
  }
}

bool Device::poll() {
  std::lock_guard<std::mutex> lock(mutex_);
  return replay_locked();
}

bool Device::held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !held_.empty();
}

void Device::resolve() { resolve_until(nullptr); }

void Device::resolve_until(const PendingTime* target) {
  for (;;) {
    std::shared_ptr<PendingTime> gate;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const bool held = replay_locked();
      if (!held || (target != nullptr && target->known())) return;
      gate = held_.front().gate;
    }
    try {
      gate->force();
    } catch (...) {
      gate->set(0);  // the wait is dropped; the held work after it goes on
      {
        std::lock_guard<std::mutex> lock(mutex_);
        replay_locked();
      }
      throw;
    }
  }
}

TimeNs Device::place_locked(int64_t stream, Engine engine, TimeNs start, TimeNs duration, TimeNs now) {
  const TimeNs end = timeline_.place(stream, engine, start, duration, now);
  // Work on a side stream that begins the moment a collective ends (a comm
  // hook's decompression, FSDP's copy-out) extends it: a profiled region's
  // wait for that work is a wait for the collective.
  if (engine != Engine::kCollective && !collective_ends_.empty() && regions_.budgeted() &&
      stream != regions_.home_stream() && collective_end(start)) {
    remember_collective_end(end);
  }
  if (engine == Engine::kCompute && duration > 0) {
    if (!busy_.empty() && start <= busy_.back().second) {
      busy_.back().second = std::max(busy_.back().second, end);
    } else {
      busy_.emplace_back(start, end);
    }
    while (busy_.size() > 1 && busy_.front().second < now - kUtilizationWindow) busy_.pop_front();
  }
  return end;
}

void Device::block_until(TimeNs t) {
  const TimeNs start = clock_.now();
  double host_bound = -1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    host_bound = host_bound_.observe(start, timeline_.host_idle_ns());
  }
  if (host_bound >= 0) report_host_bound(index_, host_bound);
  if (t <= start) return;
  clock_.sleep_until(t);
  std::lock_guard<std::mutex> lock(mutex_);
  blocked_ns_ += clock_.now() - start;
}

template <typename Place>
TimeNs Device::place_when_queued(Place&& place, bool count_held) {
  for (;;) {
    TimeNs wait = 0;
    bool full_of_held = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const TimeNs now = clock_.now();
      full_of_held = held_queue_full_locked() && count_held;
      if (!full_of_held) {
        wait = timeline_.queue_wait(now);
        if (wait == 0) return place(now);
      }
    }
    if (full_of_held) {
      resolve();  // held launches fill the queue too
    } else {
      block_until(wait);  // the launch queue is full, as CUDA's gets
    }
  }
}

void Device::attach_pcie(std::shared_ptr<PcieLinks> links, int uplink, double occupancy_factor) {
  EMUGPU_CHECK(std::isfinite(occupancy_factor) && occupancy_factor > 0, kValue, "device ", index_,
               ": expected a positive PCIe occupancy factor, got ", occupancy_factor);
  std::lock_guard<std::mutex> lock(mutex_);
  pcie_ = std::move(links);
  uplink_ = uplink;
  occupancy_factor_ = occupancy_factor;
}

void Device::set_host_pace(TimeNs ns) {
  EMUGPU_CHECK(ns >= 0, kValue, "device ", index_, ": expected a host time per op >= 0 ns, got ", ns);
  host_pace_ = ns;
}

void Device::pace_host() {
  const TimeNs pace = host_pace_.load();
  if (pace <= 0) return;
  const TimeNs due = last_launch_.load() + pace;
  TimeNs now = clock_.now();
  if (now < due) {
    clock_.sleep_until(due);
    now = clock_.now();
  }
  last_launch_ = now;
}

TimeNs Device::launch_locked(int64_t stream, Engine engine, TimeNs estimate, TimeNs now, Occupancy occupancy) {
  if ((engine == Engine::kHostToDevice || engine == Engine::kDeviceToHost) && pcie_) {
    const TimeNs ready = timeline_.start_of(stream, engine, now);
    const TimeNs occupancy = ns_from_double(static_cast<double>(estimate) * occupancy_factor_);
    const TimeNs begin = pcie_->reserve(uplink_, engine == Engine::kHostToDevice, ready, occupancy);
    return place_locked(stream, engine, begin, std::max(estimate, occupancy), now);
  }
  const TimeNs start = timeline_.start_of(stream, engine, now);
  if (engine != Engine::kCompute) return place_locked(stream, engine, start, estimate, now);
  const TimeNs shared = shared_locked(estimate);
  const TimeNs duration = regions_.active() ? regions_.retime(shared, start, stream) : shared;
  const TimeNs alone = shared == estimate ? duration : ns_from_double(static_cast<double>(duration) * rate_.load());
  work_since_wait_ += alone;
  if (share_) {
    const auto d = static_cast<double>(alone);
    const double demand = std::clamp(occupancy.demand, 0.0, 1.0);
    // Over its duration alone as placed (a profile's time, where one covers
    // it): a kernel the profile finds slower draws less bandwidth.
    const double bandwidth = d > 0 ? std::clamp(occupancy.memory_ns / d, 0.0, 1.0) : 0.0;
    const auto bin = static_cast<size_t>(demand_bin(demand, bandwidth));
    kernel_sum_[bin] += d;
    demand_sum_[bin] += demand * d;
    hold_sum_[bin] += std::max(occupancy.hold_ns, 0.0) * d;
    duration_sum_[bin] += d * d;
    bandwidth_sum_[bin] += bandwidth * d;
  }
  return place_locked(stream, engine, start, duration, now);
}

TimeNs Device::shared_locked(TimeNs estimate) const {
  const double rate = rate_.load(std::memory_order_relaxed);
  return rate < 1.0 ? ns_from_double(static_cast<double>(estimate) / rate) : estimate;
}

void Device::share_time(std::shared_ptr<TimeShare> share) {
  std::lock_guard<std::mutex> lock(mutex_);
  share_ = std::move(share);
  rate_ = 1.0;
  next_report_ = 0;
  next_report_clock_ = 0;
  share_from_ = clock_.now();
  busy_average_ = 0;
  unweighted_ = 1.0;
  iteration_average_ = 0;
  work_since_wait_ = 0;
  kernel_sum_ = demand_sum_ = hold_sum_ = duration_sum_ = bandwidth_sum_ = {};
}

void Device::report_share() {
  // Due every report_ns() of real time, and under a clock that runs ahead of
  // real time (the virtual one) every tenth of a window of its own time, so
  // that the busy fraction follows the GPU's time, not the emulating host's.
  const TimeNs real = steady_clock().now(), now = clock_.now();
  if (real < next_report_.load(std::memory_order_relaxed) && now < next_report_clock_.load(std::memory_order_relaxed)) {
    return;
  }
  bool idle = false;
  if (!reporting_.compare_exchange_strong(idle, true)) return;  // another thread reports
  struct Done {
    std::atomic<bool>& flag;
    ~Done() { flag.store(false); }
  } done{reporting_};  // also when the report throws (the daemon is gone): the next launch fails too
  next_report_ = real + share_->report_ns();
  next_report_clock_ = now + share_->window_ns() / 10;
  TimeShare::Report report;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    report = share_report_locked(clock_.now());
  }
  rate_.store(share_->report(report));
}

TimeShare::Report Device::share_report_locked(TimeNs now) {
  if (now > share_from_) {
    // Busy time since the last report (the merged intervals, newest last),
    // folded into an average over the window.
    TimeNs busy = 0;
    for (auto it = busy_.rbegin(); it != busy_.rend() && it->second > share_from_; ++it) {
      const TimeNs a = std::max(it->first, share_from_), b = std::min(it->second, now);
      if (b > a) busy += b - a;
    }
    const double span = static_cast<double>(now - share_from_);
    const double keep = std::exp(-span / static_cast<double>(share_->window_ns()));
    busy_average_ = busy_average_ * keep + (static_cast<double>(busy) / span) * (1.0 - keep);
    unweighted_ *= keep;  // what the average still owes its zero start
    for (size_t i = 0; i < kernel_sum_.size(); ++i) {
      kernel_sum_[i] *= keep;
      demand_sum_[i] *= keep;
      hold_sum_[i] *= keep;
      duration_sum_[i] *= keep;
      bandwidth_sum_[i] *= keep;
    }
    share_from_ = now;
  }
  // Bias-corrected, so that a process that just started reports what it did
  // so far instead of an average that starts at 0 (and takes a window to rise).
  const double busy = unweighted_ < 1.0 ? busy_average_ / (1.0 - unweighted_) : 0.0;
  // An iteration under way counts as soon as it is longer than the average
  // (a share that starts small must not keep a long iteration's weight small).
  // Kernels weighed by their time: the kernel running at a random moment.
  double kernels = 0, demand = 0, hold = 0;
  for (size_t i = 0; i < kernel_sum_.size(); ++i) {
    kernels += kernel_sum_[i];
    demand += demand_sum_[i];
    hold += hold_sum_[i];
  }
  const bool any = kernels > 0;
  TimeShare::Report report{std::clamp(busy, 0.0, 1.0),
                           std::max(iteration_average_, work_since_wait_),
                           now,
                           timeline_.engine_ready(Engine::kCompute),
                           any ? demand / kernels : 1.0,
                           any ? ns_from_double(hold / kernels) : 0,
                           {}};
  for (size_t i = 0; any && i < kernel_sum_.size(); ++i) {
    if (kernel_sum_[i] <= 0) continue;
    report.bins[i] = {kernel_sum_[i] / kernels, demand_sum_[i] / kernel_sum_[i],
                      ns_from_double(hold_sum_[i] / kernel_sum_[i]), ns_from_double(duration_sum_[i] / kernel_sum_[i]),
                      bandwidth_sum_[i] / kernel_sum_[i]};
  }
  return report;
}

TimeNs Device::launch(int64_t stream, Engine engine, TimeNs estimate, Occupancy occupancy) {
  EMUGPU_CHECK(estimate >= 0, kValue, "device ", index_, ": expected an operation duration >= 0 ns, got ", estimate);
  if (share_ && engine == Engine::kCompute) report_share();
  return place_when_queued([&](TimeNs now) {
    if (!held_.empty()) {
      held_.push_back({now, nullptr, [this, stream, engine, estimate, occupancy](TimeNs t) {
                         launch_locked(stream, engine, estimate, t, occupancy);
                       }});
      return kNotYet;
    }
    return launch_locked(stream, engine, estimate, now, occupancy);
  });
}

TimeNs Device::collective_launch(int64_t stream, TimeNs start, TimeNs duration) {
  EMUGPU_CHECK(duration >= 0, kValue, "device ", index_, ": expected a collective duration >= 0 ns, got ", duration);
  // Placed now even while the device is held: it was launched before the
  // held work (its start is known), and held work may wait for its end.
  // Never resolves: the runner that calls this is what a resolve waits for.
  return place_when_queued(
      [&](TimeNs now) {
        // Not `now`: the ranks' starts already include their launches, and the
        // host may learn them late (a deferred collective is placed when the
        // last rank's start arrives); the exchange's own wall time is not the GPU's.
        const TimeNs begin = std::max(start, timeline_.start_of(stream, Engine::kCollective, 0));
        const TimeNs end = place_locked(stream, Engine::kCollective, begin, duration, now);
        remember_collective_end(end);
        return end;
      },
      false);
}

void Device::settle_locked(TimeNs now) {
  if (work_since_wait_ > 0) {
    // An iteration's compute, as far as sync points tell (fifo sharing weighs by it).
    iteration_average_ = iteration_average_ == 0 ? work_since_wait_ : (iteration_average_ + work_since_wait_) / 2;
    work_since_wait_ = 0;
  }
  if (regions_.active() && regions_.kind() == RegionKind::kBackward && regions_.started()) {
    close_locked(RegionOutcome::kCompleted, now);
  }
}

void Device::settle() {
  std::lock_guard<std::mutex> lock(mutex_);
  apply_or_hold_locked(clock_.now(), [this](TimeNs t) { settle_locked(t); });
}

void Device::synchronize() {
  resolve();
  settle();
  block_until(device_ready());
}

void Device::synchronize_stream(int64_t stream) {
  resolve();
  settle();
  block_until(stream_ready(stream));
}

TimeNs Device::launch_and_wait(int64_t stream, Engine engine, TimeNs estimate) {
  resolve();
  settle();
  TimeNs end = launch(stream, engine, estimate);
  if (end == kNotYet) {  // another thread held the device meanwhile
    resolve();
    end = stream_ready(stream);
  }
  block_until(end);
  return end;
}

void Device::wait_until(TimeNs t) {
  resolve();
  block_until(t);
}

TimeNs Device::record(int64_t stream) { return record_pending(stream)->force(); }

template <typename Point>
std::shared_ptr<PendingTime> Device::pending_point(Point&& point) {
  std::lock_guard<std::mutex> lock(mutex_);
  const TimeNs now = clock_.now();
  if (!replay_locked()) return std::make_shared<PendingTime>(point(now));
  auto time = std::make_shared<PendingTime>();
  // Only the gates held before it: later ones may wait for what waits for this.
  time->set_force([this, weak = std::weak_ptr<PendingTime>(time)] {
    const auto self = weak.lock();
    resolve_until(self.get());
    return self->value();
  });
  held_.push_back({now, nullptr, [time, point = std::forward<Point>(point)](TimeNs t) { time->set(point(t)); }});
  return time;
}

std::shared_ptr<PendingTime> Device::record_pending(int64_t stream, bool settles) {
  return pending_point([this, stream, settles](TimeNs now) {
    if (settles) settle_locked(now);
    return std::max(timeline_.stream_ready(stream), now);
  });
}

std::shared_ptr<PendingTime> Device::stream_ready_pending(int64_t stream) {
  return pending_point([this, stream](TimeNs) { return timeline_.stream_ready(stream); });
}

std::shared_ptr<PendingTime> Device::follow(int64_t waiter, int64_t stream, bool settles) {
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    full = held_queue_full_locked();
  }
  if (full) resolve();  // a collective is a launch: held work fills the launch queue too
  return pending_point([this, waiter, stream, settles](TimeNs now) {
    if (settles) settle_locked(now);
    const TimeNs t = std::max(timeline_.stream_ready(stream), now);
    wait_locked(waiter, t);
    return t;
  });
}

TimeNs Device::collective_start(int64_t stream) {
  // Exchanged with the other ranks now: the held work launched before it is
  // placed first (forcing only the times that work waits for).
  return pending_point([this, stream](TimeNs now) { return timeline_.start_of(stream, Engine::kCollective, now); })
      ->force();
}

TimeNs Device::collective_start_at(int64_t stream, TimeNs host_time) {
  std::lock_guard<std::mutex> lock(mutex_);
  replay_locked();  // what was launched before it; held work after it stays held
  return timeline_.start_of(stream, Engine::kCollective, host_time);
}

bool Device::collective_end(TimeNs t) const {
  return std::find(collective_ends_.begin(), collective_ends_.end(), t) != collective_ends_.end();
}

void Device::remember_collective_end(TimeNs t) {
  collective_ends_.push_back(t);
  if (collective_ends_.size() > kCollectiveEnds) collective_ends_.pop_front();
}

void Device::wait_locked(int64_t stream, TimeNs t) {
  // Whether through Work.wait(), its future's events or a chain of events
  // behind them, a wait for a collective waits for exactly its end (or the
  // end of side-stream work that began there).
  if (regions_.budgeted() && regions_.home_stream() == stream && collective_end(t)) {
    regions_.waited(timeline_.stream_ready(stream), t);
  }
  timeline_.stream_wait(stream, t);
}

void Device::stream_wait(int64_t stream, TimeNs t) {
  std::lock_guard<std::mutex> lock(mutex_);
  apply_or_hold_locked(clock_.now(), [this, stream, t](TimeNs) { wait_locked(stream, t); });
}

void Device::stream_wait(int64_t stream, const std::shared_ptr<PendingTime>& t) {
  EMUGPU_CHECK(t != nullptr, kValue, "device ", index_, ": expected a pending time to wait for, got none");
  std::lock_guard<std::mutex> lock(mutex_);
  if (!replay_locked() && t->known()) {
    wait_locked(stream, t->value());
    return;
  }
  held_.push_back({clock_.now(), t, [this, stream, t](TimeNs) { wait_locked(stream, t->value()); }});
}

TimeNs Device::stream_ready(int64_t stream) {
  resolve();
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_.stream_ready(stream);
}

TimeNs Device::device_ready() {
  resolve();
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_.device_ready();
}

bool Device::close_locked(RegionOutcome outcome, TimeNs now) {
  if (!regions_.active()) return false;
  const int64_t stream = regions_.stream();
  // The region's work ends where the compute engine (and its stream) stand;
  // the pad may lie in the host's past when the host came late to close it.
  const TimeNs finish = std::max(timeline_.engine_ready(Engine::kCompute), timeline_.stream_ready(stream));
  TimeNs end = finish, pad = 0;
  if (outcome == RegionOutcome::kCompleted) {
    pad = regions_.pad_needed(finish);
    if (pad > 0) {
      end = place_locked(stream, Engine::kCompute, finish, pad, now);
      work_since_wait_ += ns_from_double(static_cast<double>(pad) * rate_.load());
    }
  }
  regions_.close(outcome, end, pad);
  return outcome == RegionOutcome::kCompleted;
}

void Device::open_locked(int64_t stream, const std::string& key, RegionKind kind, TimeNs target, bool started,
                         bool chained, TimeNs now_in, TimeNs host_time) {
  // A region that follows a complete one starts where that one ended, even if
  // the host comes late: a profiled iteration is its regions back to back (the
  // profile's times include the host's own latencies), and late host work
  // shrinks the new region's budget instead of adding to it. Otherwise it
  // starts when the host opens it.
  const TimeNs now = host_time > 0 ? std::min(host_time, now_in) : now_in;
  const TimeNs start = timeline_.start_of(stream, Engine::kCompute, chained ? 0 : now);
  // A shared GPU runs the profiled work at this process's share.
  regions_.open(key, kind, target == kUnbudgeted ? target : shared_locked(target), start, stream, started);
}

void Device::forward_begin_locked(int64_t stream, const std::string& key, TimeNs target, TimeNs called_at, TimeNs now) {
  bool chained = false;
  if (regions_.active()) {
    const bool unstarted_backward = regions_.kind() == RegionKind::kBackward && !regions_.started();
    chained = close_locked(unstarted_backward ? RegionOutcome::kCancelled : RegionOutcome::kCompleted, now);
  }
  open_locked(stream, key, RegionKind::kForward, target, true, chained, now, called_at);
}

int64_t Device::forward_begin(int64_t stream, const std::string& key, TimeNs target, TimeNs called_at) {
  std::lock_guard<std::mutex> lock(mutex_);
  apply_or_hold_locked(clock_.now(), [this, stream, key, target, called_at](TimeNs t) {
    forward_begin_locked(stream, key, target, called_at, t);
  });
  return regions_.host_bound_total();
}

void Device::forward_end_locked(int64_t stream, const std::string& backward_key, TimeNs backward_target,
                                bool expects_backward, TimeNs now) {
  bool chained = false;
  if (regions_.active() && regions_.kind() == RegionKind::kForward) {
    chained = close_locked(RegionOutcome::kCompleted, now);
  }
  if (expects_backward && !regions_.active()) {
    open_locked(stream, backward_key, RegionKind::kBackward, backward_target, false, chained, now);
  }
}

void Device::forward_end(int64_t stream, const std::string& backward_key, TimeNs backward_target,
                         bool expects_backward) {
  std::lock_guard<std::mutex> lock(mutex_);
  apply_or_hold_locked(clock_.now(), [=, this](TimeNs t) {
    forward_end_locked(stream, backward_key, backward_target, expects_backward, t);
  });
}

void Device::backward_reached_locked(int64_t stream, const std::string& backward_key, TimeNs backward_target,
                                     TimeNs now) {
  if (regions_.active() && regions_.kind() == RegionKind::kBackward && regions_.key() == backward_key) {
    regions_.mark_started();
    return;
  }
  bool chained = false;
  if (regions_.active()) {
    const bool unstarted_backward = regions_.kind() == RegionKind::kBackward && !regions_.started();
    chained = close_locked(unstarted_backward ? RegionOutcome::kCancelled : RegionOutcome::kCompleted, now);
  }
  open_locked(stream, backward_key, RegionKind::kBackward, backward_target, true, chained, now);
}

void Device::backward_reached(int64_t stream, const std::string& backward_key, TimeNs backward_target) {
  std::lock_guard<std::mutex> lock(mutex_);
  apply_or_hold_locked(clock_.now(),
                       [=, this](TimeNs t) { backward_reached_locked(stream, backward_key, backward_target, t); });
}

void Device::region_abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  apply_or_hold_locked(clock_.now(), [this](TimeNs t) { close_locked(RegionOutcome::kAborted, t); });
}

std::vector<RegionReport> Device::region_report() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return regions_.report();
}

std::optional<BatchCostCurve> Device::region_cost_curve(const std::string& key, int64_t observed_batch) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<TimeNs>* estimates = regions_.last_estimates(key);
  if (estimates == nullptr) return std::nullopt;
  return cost_curve(*estimates, cost_.kernel_params().launch_ns, observed_batch);
}

EngineStats Device::engine_stats(Engine engine) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_.engine_stats(engine);
}

TimeNs Device::host_blocked_ns() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blocked_ns_;
}

HostBoundStats Device::host_bound_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return host_bound_.stats();
}

TimeNs Device::host_idle_ns() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_.host_idle_ns();
}

int Device::utilization() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const TimeNs now = clock_.now();
  const TimeNs from = now - kUtilizationWindow;
  TimeNs busy = 0;
  for (const auto& [start, end] : busy_) {
    const TimeNs a = std::max(start, from), b = std::min(end, now);
    if (b > a) busy += b - a;
  }
  return static_cast<int>((busy * 100 + kUtilizationWindow / 2) / kUtilizationWindow);
}

void Device::reset_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  replay_locked();
  timeline_.reset_stats();
  blocked_ns_ = 0;
  host_bound_ = HostBoundMonitor();  // windows start over, the first again a warm-up
}

int64_t Device::pool_stream(bool high_priority) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int p = high_priority ? 1 : 0;
  const int64_t id = 1 + p * kPoolStreams + next_pool_[p];
  next_pool_[p] = (next_pool_[p] + 1) % kPoolStreams;
  return id;
}

}  // namespace emugpu
