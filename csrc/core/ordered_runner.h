// Runs calls one at a time, in the order they were submitted: on a thread of
// its own, or inline on a thread that needs one of them done now
// (run_through), which saves the two hand-overs between threads that a
// synchronous wait would otherwise pay. Backend `emu` places its deferred
// collectives with it: each needs the other ranks' start times, and every
// rank must place them on a stream in launch order.
//
// The thread is detached: a process that exits while a call waits for a
// rank that died must not wait for it. Destroying the runner drops the calls
// not yet started and lets the running one finish on its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>

namespace emugpu {

class OrderedRunner {
 public:
  using Call = std::function<int64_t()>;

  // One submitted call: done once it ran, with its value or its error.
  class Ticket {
   public:
    bool done() const { return done_.load(std::memory_order_acquire); }
    // The call's error once done (null: none, or not done yet).
    std::exception_ptr error() const { return done() ? error_ : nullptr; }

   private:
    friend class OrderedRunner;
    std::atomic<bool> done_{false};
    int64_t value_ = 0;
    std::exception_ptr error_;
  };

  OrderedRunner();
  ~OrderedRunner();
  OrderedRunner(const OrderedRunner&) = delete;
  OrderedRunner& operator=(const OrderedRunner&) = delete;

  std::shared_ptr<Ticket> submit(Call call);
  // Runs the calls up to `ticket`'s on this thread, unless the runner's
  // thread already has, and returns its value (rethrows its error).
  int64_t run_through(const std::shared_ptr<Ticket>& ticket);
  // run_through of the last call submitted so far (none: returns at once).
  void drain();
  // Whether this thread is running a call of some runner now: such a call
  // must not wait for later calls (they cannot run before it ends).
  static bool in_call();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace emugpu
