// The virtual clock: emulated time that never sleeps.
//
// A host wait (synchronize, .item(), a full launch queue, time.sleep) moves
// the process's time to the moment it waits for instead of sleeping until
// it. Between the emulator's calls the host's time advances by its own work,
// so that an emulated GPU that waits for a slow host still does:
//  - measured: the calling thread's CPU time since it last left the emulator
//    (the emulator's own bookkeeping, which a CUDA host does not do, is left
//    out), plus `op_ns` per call for the launch a CUDA host makes and this
//    one does not;
//  - modelled: a fixed time per op (`op_ns`, `backward_op_ns` for the ops
//    autograd's engine launches, plus `list_tensor_ns` per tensor of a
//    foreach op's lists) and `read_ns` per clock read, nothing measured, so
//    that a run's times are the same on every rerun and machine.
// Charges are per op, not per call: an op's output allocated in a call of
// its own just before the op (an out-of-place op, a tensor factory) is paid
// for by that op, as a CUDA host allocates inside the op it launches.
// Both divide host work by `speed` (a host that many times faster).
//
// One clock per process, shared by its threads: host work of concurrent
// threads adds up, as if one host thread did it all (training loops have
// one launching thread at a time: the script's, or autograd's during
// backward). Threads enter and leave the emulator through enter()/leave();
// only those are charged, so the emulator's own threads (runners, I/O)
// never move the clock.
#pragma once

#include <atomic>
#include <cstdint>

#include "clock.h"

namespace emugpu {

enum class ClockKind { kReal, kVirtual };
enum class HostModel { kMeasured, kModelled };

struct HostCost {
  HostModel model = HostModel::kMeasured;
  double speed = 1.0;          // > 0
  TimeNs op_ns = 0;            // per op (measured: the launch a CUDA host makes and this one does not)
  TimeNs read_ns = 0;          // modelled: per clock read by the script
  TimeNs backward_op_ns = -1;  // per op autograd's engine launches; < 0: op_ns
  TimeNs list_tensor_ns = 0;   // per tensor of a foreach op's lists beyond its first
};

// What a call into the emulator is to a CUDA host.
enum class HostCall {
  kOp,          // an op launched by the script (or a module, an optimizer)
  kBackwardOp,  // an op autograd's engine launches during backward
  kAllocation,  // an output allocated before its op: the op that follows pays for it
};

// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID); tests inject their own.
class CpuClock {
 public:
  virtual ~CpuClock() = default;
  virtual TimeNs thread_cpu_ns() const = 0;
};
const CpuClock& thread_cpu_clock();

struct VirtualClockStats {
  TimeNs elapsed_ns = 0;  // virtual time since the clock started (or its stats were reset)
  TimeNs host_ns = 0;     // of which charged as host work
  TimeNs waited_ns = 0;   // of which jumped over by waits
  TimeNs slept_ns = 0;    // of which the script slept (time.sleep)
  int64_t calls = 0;      // ops charged (outermost emulator calls but allocations)
  int64_t reads = 0;      // clock reads by the script
  double wall_s = 0;      // real seconds over the same span
};

class VirtualClock final : public Clock {
 public:
  explicit VirtualClock(TimeNs start, HostCost cost = {}, const CpuClock& cpu = thread_cpu_clock());

  TimeNs now() const override { return now_.load(std::memory_order_acquire); }
  // Jumps to `deadline` (never back); the jump counts as waiting.
  void sleep_until(TimeNs deadline) override;

  void set_host_cost(const HostCost& cost);
  HostCost host_cost() const;

  // The calling thread enters the emulator: the outermost entry charges the
  // thread's host work since it last left, and, for an op, the op's price
  // (`list_tensors`: the tensors in a foreach op's lists). Nested entries
  // charge nothing.
  void enter(HostCall call = HostCall::kOp, int64_t list_tensors = 0);
  // The calling thread leaves the emulator (pairs with enter()).
  void leave();
  // Work a CUDA host never does (copying bytes the emulated GPU would copy
  // on the device), wherever it happens: its CPU time is charged to nobody.
  // Unlike enter(), no launch is charged, and a thread that never entered
  // stays uncharged (the emulator's own threads). Pairs with leave_uncharged().
  void enter_uncharged();
  void leave_uncharged();
  // A script reads the time: its host work until now is charged first.
  TimeNs read();
  // time.sleep(d): host work until now, then `d` more (d >= 0).
  void sleep_for(TimeNs d);
  // Moves to at least `t` (a message stamped `t` arrived); counts as waiting.
  void receive(TimeNs t);
  // Measured host: the calling thread spent `ns` blocked off the CPU in
  // work a real host would wait for too (a DataLoader worker's file reads),
  // which its CPU time does not hold. Added as host work, not scaled by the
  // host's speed (storage is no faster for it). The modelled host ignores it.
  void charge_blocked(TimeNs ns);

  VirtualClockStats stats() const;
  void reset_stats();
  // In a fork()ed child (pthread_atfork): its thread's CPU clock restarted
  // at zero, and its work since the fork is charged at its first call.
  static void after_fork();

 private:
  struct ThreadMark;
  ThreadMark& mark();
  void charge_host(ThreadMark& m);
  void charge_op(TimeNs price);
  void add(TimeNs ns, std::atomic<TimeNs>& bucket);
  void move_to(TimeNs t, std::atomic<TimeNs>& bucket);

  const CpuClock& cpu_;
  const uint64_t id_;
  std::atomic<TimeNs> now_;
  std::atomic<int> model_;
  std::atomic<double> speed_;
  std::atomic<TimeNs> op_ns_;
  std::atomic<TimeNs> read_ns_;
  std::atomic<TimeNs> backward_op_ns_;
  std::atomic<TimeNs> list_tensor_ns_;
  std::atomic<TimeNs> stats_start_;
  std::atomic<TimeNs> wall_start_;
  std::atomic<TimeNs> host_ns_{0};
  std::atomic<TimeNs> waited_ns_{0};
  std::atomic<TimeNs> slept_ns_{0};
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> reads_{0};
};

// Scoped enter()/leave() of a clock that may be absent (the real clock).
class EmulatorCall {
 public:
  explicit EmulatorCall(VirtualClock* clock, HostCall call = HostCall::kOp, int64_t list_tensors = 0) : clock_(clock) {
    if (clock_ != nullptr) clock_->enter(call, list_tensors);
  }
  ~EmulatorCall() {
    if (clock_ != nullptr) clock_->leave();
  }
  EmulatorCall(const EmulatorCall&) = delete;
  EmulatorCall& operator=(const EmulatorCall&) = delete;

 private:
  VirtualClock* clock_;
};

// Scoped enter_uncharged()/leave_uncharged() of a clock that may be absent.
class UnchargedWork {
 public:
  explicit UnchargedWork(VirtualClock* clock) : clock_(clock) {
    if (clock_ != nullptr) clock_->enter_uncharged();
  }
  ~UnchargedWork() {
    if (clock_ != nullptr) clock_->leave_uncharged();
  }
  UnchargedWork(const UnchargedWork&) = delete;
  UnchargedWork& operator=(const UnchargedWork&) = delete;

 private:
  VirtualClock* clock_;
};

const char* clock_kind_name(ClockKind kind);
const char* host_model_name(HostModel model);

}  // namespace emugpu
