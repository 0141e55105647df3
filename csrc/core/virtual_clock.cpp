#include "virtual_clock.h"

#include <time.h>

#include <algorithm>
#include <cmath>

#include "error.h"

namespace emugpu {
namespace {

class ThreadCpuClock final : public CpuClock {
 public:
  TimeNs thread_cpu_ns() const override {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return TimeNs{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  }
};

std::atomic<uint64_t> g_next_clock_id{1};
// Bumped in a forked child: marks taken before the fork are stale there.
std::atomic<uint64_t> g_generation{0};
// In a fork()ed child, the generation its forking thread (its only thread)
// started in: that thread's CPU clock restarted at zero at the fork, and its
// work since (a DataLoader worker setting itself up) is the child's own.
thread_local uint64_t t_forked_in = 0;

void check_cost(const HostCost& cost) {
  EMUGPU_CHECK(std::isfinite(cost.speed) && cost.speed > 0, kValue,
               "virtual clock: expected a host speed > 0 (EMUGPU_HOST_SPEED), got ", cost.speed);
  EMUGPU_CHECK(cost.op_ns >= 0 && cost.op_ns <= kMaxDurationNs, kValue,
               "virtual clock: expected a host time per op from 0 to ", kMaxDurationNs, " ns, got ", cost.op_ns);
  EMUGPU_CHECK(cost.read_ns >= 0 && cost.read_ns <= kMaxDurationNs, kValue,
               "virtual clock: expected a host time per clock read from 0 to ", kMaxDurationNs, " ns, got ",
               cost.read_ns);
  EMUGPU_CHECK(cost.backward_op_ns <= kMaxDurationNs, kValue,
               "virtual clock: expected a host time per backward op up to ", kMaxDurationNs,
               " ns (or < 0: the time per op), got ", cost.backward_op_ns);
  EMUGPU_CHECK(cost.list_tensor_ns >= 0 && cost.list_tensor_ns <= kMaxDurationNs, kValue,
               "virtual clock: expected a host time per foreach list tensor from 0 to ", kMaxDurationNs, " ns, got ",
               cost.list_tensor_ns);
}

}  // namespace

struct VirtualClock::ThreadMark {
  uint64_t clock = 0;
  uint64_t generation = 0;
  int depth = 0;
  TimeNs cpu = 0;
  bool started = false;    // `cpu` holds a reading of this thread's clock
  bool allocated = false;  // an allocation awaits the op that pays for it
};

const CpuClock& thread_cpu_clock() {
  static const ThreadCpuClock clock;
  return clock;
}

const char* clock_kind_name(ClockKind kind) { return kind == ClockKind::kVirtual ? "virtual" : "real"; }
const char* host_model_name(HostModel model) { return model == HostModel::kModelled ? "modelled" : "measured"; }

VirtualClock::VirtualClock(TimeNs start, HostCost cost, const CpuClock& cpu)
    : cpu_(cpu),
      id_(g_next_clock_id.fetch_add(1)),
      now_(start),
      model_(static_cast<int>(cost.model)),
      speed_(cost.speed),
      op_ns_(cost.op_ns),
      read_ns_(cost.read_ns),
      backward_op_ns_(cost.backward_op_ns),
      list_tensor_ns_(cost.list_tensor_ns),
      stats_start_(start),
      wall_start_(host_now()) {
  check_cost(cost);
}

void VirtualClock::set_host_cost(const HostCost& cost) {
  check_cost(cost);
  model_ = static_cast<int>(cost.model);
  speed_ = cost.speed;
  op_ns_ = cost.op_ns;
  read_ns_ = cost.read_ns;
  backward_op_ns_ = cost.backward_op_ns;
  list_tensor_ns_ = cost.list_tensor_ns;
}

HostCost VirtualClock::host_cost() const {
  return HostCost{static_cast<HostModel>(model_.load()),
                  speed_.load(),
                  op_ns_.load(),
                  read_ns_.load(),
                  backward_op_ns_.load(),
                  list_tensor_ns_.load()};
}

VirtualClock::ThreadMark& VirtualClock::mark() {
  thread_local ThreadMark m;
  const uint64_t generation = g_generation.load(std::memory_order_relaxed);
  if (m.clock != id_ || m.generation != generation) {
    const bool since_fork = t_forked_in == generation && generation != 0;
    if (since_fork) t_forked_in = 0;  // once: the process's clock is the one the fork interrupted
    m = ThreadMark{id_, generation, 0, 0, since_fork, false};
  }
  return m;
}

void VirtualClock::add(TimeNs ns, std::atomic<TimeNs>& bucket) {
  if (ns <= 0) return;
  TimeNs cur = now_.load();
  while (!now_.compare_exchange_weak(cur, add_saturating(cur, ns))) {
  }
  bucket.fetch_add(ns);
}

void VirtualClock::move_to(TimeNs t, std::atomic<TimeNs>& bucket) {
  TimeNs cur = now_.load();
  while (cur < t) {
    if (now_.compare_exchange_weak(cur, t)) {
      bucket.fetch_add(t - cur);
      return;
    }
  }
}

void VirtualClock::charge_host(ThreadMark& m) {
  if (static_cast<HostModel>(model_.load(std::memory_order_relaxed)) != HostModel::kMeasured) return;
  const TimeNs cpu = cpu_.thread_cpu_ns();
  // A thread's first call has no mark to measure from: its work before it is not charged.
  const TimeNs work = m.started ? std::max<TimeNs>(0, cpu - m.cpu) : 0;
  m.cpu = cpu;
  m.started = true;
  add(static_cast<TimeNs>(std::llround(static_cast<double>(work) / speed_.load(std::memory_order_relaxed))), host_ns_);
}

void VirtualClock::charge_op(TimeNs price) {
  add(static_cast<TimeNs>(std::llround(static_cast<double>(price) / speed_.load(std::memory_order_relaxed))), host_ns_);
  calls_.fetch_add(1, std::memory_order_relaxed);
}

void VirtualClock::enter(HostCall call, int64_t list_tensors) {
  ThreadMark& m = mark();
  if (m.depth++ > 0) return;
  charge_host(m);
  if (call == HostCall::kAllocation) {
    m.allocated = true;  // several outputs of one op are still one op
    return;
  }
  m.allocated = false;
  const TimeNs backward = backward_op_ns_.load(std::memory_order_relaxed);
  TimeNs price = call == HostCall::kBackwardOp && backward >= 0 ? backward : op_ns_.load(std::memory_order_relaxed);
  if (list_tensors > 1) {  // in double: a huge list saturates, never overflows
    const double extra =
        static_cast<double>(list_tensors - 1) * static_cast<double>(list_tensor_ns_.load(std::memory_order_relaxed));
    price = add_saturating(price, static_cast<TimeNs>(std::min(extra, static_cast<double>(kMaxDurationNs))));
  }
  charge_op(price);
}

void VirtualClock::leave() {
  ThreadMark& m = mark();
  if (m.depth == 0 || --m.depth > 0) return;
  if (static_cast<HostModel>(model_.load(std::memory_order_relaxed)) == HostModel::kMeasured) {
    m.cpu = cpu_.thread_cpu_ns();
    m.started = true;
  }
}

void VirtualClock::enter_uncharged() {
  ThreadMark& m = mark();
  if (m.depth++ > 0) return;
  if (m.started) charge_host(m);
}

void VirtualClock::leave_uncharged() {
  ThreadMark& m = mark();
  if (m.depth == 0 || --m.depth > 0) return;
  if (m.started && static_cast<HostModel>(model_.load(std::memory_order_relaxed)) == HostModel::kMeasured) {
    m.cpu = cpu_.thread_cpu_ns();
  }
}

TimeNs VirtualClock::read() {
  ThreadMark& m = mark();
  if (m.depth == 0) {
    charge_host(m);
    if (m.allocated) {  // no op followed the allocation (torch.empty): it was an op of its own
      m.allocated = false;
      charge_op(op_ns_.load(std::memory_order_relaxed));
    }
    if (static_cast<HostModel>(model_.load(std::memory_order_relaxed)) == HostModel::kModelled) {
      add(static_cast<TimeNs>(std::llround(static_cast<double>(read_ns_.load(std::memory_order_relaxed)) /
                                           speed_.load(std::memory_order_relaxed))),
          host_ns_);
    }
    reads_.fetch_add(1, std::memory_order_relaxed);
  }
  return now();
}

void VirtualClock::sleep_for(TimeNs d) {
  EMUGPU_CHECK(d >= 0, kValue, "virtual clock: expected a sleep >= 0 ns, got ", d);
  read();
  add(std::min(d, kMaxDurationNs), slept_ns_);
}

void VirtualClock::sleep_until(TimeNs deadline) { move_to(deadline, waited_ns_); }

void VirtualClock::receive(TimeNs t) { move_to(t, waited_ns_); }

void VirtualClock::charge_blocked(TimeNs ns) {
  EMUGPU_CHECK(ns >= 0, kValue, "virtual clock: expected a blocked time >= 0 ns, got ", ns);
  if (static_cast<HostModel>(model_.load(std::memory_order_relaxed)) == HostModel::kModelled) return;
  ThreadMark& m = mark();
  if (m.depth == 0) charge_host(m);  // the thread's CPU work until now comes first (not a clock read)
  add(std::min(ns, kMaxDurationNs), host_ns_);
}

VirtualClockStats VirtualClock::stats() const {
  VirtualClockStats s;
  s.elapsed_ns = now() - stats_start_.load();
  s.host_ns = host_ns_.load();
  s.waited_ns = waited_ns_.load();
  s.slept_ns = slept_ns_.load();
  s.calls = calls_.load();
  s.reads = reads_.load();
  s.wall_s = static_cast<double>(host_now() - wall_start_.load()) / 1e9;
  return s;
}

void VirtualClock::reset_stats() {
  stats_start_ = now();
  wall_start_ = host_now();
  host_ns_ = 0;
  waited_ns_ = 0;
  slept_ns_ = 0;
  calls_ = 0;
  reads_ = 0;
}

void VirtualClock::after_fork() { t_forked_in = g_generation.fetch_add(1) + 1; }

}  // namespace emugpu
