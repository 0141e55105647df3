// Memory that a call deferred to an OrderedRunner still reads or writes. A
// collective that moves real bytes computes its result on its group's
// runner after the launch returned, as an NCCL kernel writes its output
// after the host went on; host code that touches that memory (an op, a
// copy, .item()) first runs the runner through the calls that touch it, as
// stream order would make a CUDA kernel or a synchronizing copy wait.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ordered_runner.h"

namespace emugpu {

class PendingWrites {
 public:
  // Submits `call` to `runner`; until it has run, await(k) for each k in
  // `keys` runs the runner through it. Its entry goes when the call ends
  // (its error, if any, is the ticket's).
  std::shared_ptr<OrderedRunner::Ticket> submit(const std::shared_ptr<OrderedRunner>& runner,
                                                std::vector<const void*> keys, OrderedRunner::Call call);
  // One atomic load: the common case, nothing pending, costs an op nothing.
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }
  size_t size() const { return count_.load(std::memory_order_acquire); }
  // Runs through every pending call that touches `key`, in submission
  // order, on this thread unless the runner's thread already has; rethrows
  // the first error. Returns at once inside a runner's call (the calls
  // registered since come after it), unless a Horizon is open.
  void await(const void* key);

  // The calls submitted so far end before the next one's id.
  uint64_t watermark() const;
  // While one lives on a thread inside a runner's call (a deferred post that
  // reads what earlier calls write), await() runs through the calls
  // submitted before `watermark`, and only those: later ones may wait for it.
  class Horizon {
   public:
    explicit Horizon(uint64_t watermark);
    ~Horizon();
    Horizon(const Horizon&) = delete;
    Horizon& operator=(const Horizon&) = delete;

   private:
    uint64_t outer_;
  };

 private:
  struct Entry {
    uint64_t id;
    std::vector<const void*> keys;
    std::shared_ptr<OrderedRunner> runner;
    std::shared_ptr<OrderedRunner::Ticket> ticket;
  };
  void remove(uint64_t id);

  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  uint64_t next_id_ = 0;
  std::atomic<size_t> count_{0};
};

}  // namespace emugpu
