// Copies of real bytes between device blocks, done when their bytes are
// needed rather than when they are launched.
//
// A GPU casts or copies device memory on the device, at no cost to its host.
// Here device memory is host memory, so doing such a copy at launch (a
// weight cast under autocast, a clone of labels) costs the host what the GPU
// would do. Instead the torch layer records the copy against its
// destination block and does it only when someone needs the destination's
// bytes: a read-back, a value-dependent op, a process that maps the block.
// Until then:
//  - the source's bytes must stay what they were: before anything writes
//    the source (real bytes or a placeholder) or frees it, the copies that
//    read it are done;
//  - the destination's own bytes are not there yet: whoever reads them, or
//    writes part of them, first has its pending copies done, in launch
//    order, each after the copies into its own source.
// Writing a block first does the copies that read it, so no block ever
// depends on itself (the graph stays acyclic) and a block's pending copies
// never outlive it.
//
// Blocks are the caching allocator's; the copy itself is a callback (the
// torch layer's CPU copy), run under this object's lock: it must not call
// back into it. One object per process, shared by its threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "caching_allocator.h"

namespace emugpu {

struct DeferredCopyStats {
  int64_t recorded = 0;  // copies recorded
  int64_t done = 0;      // of which done because their bytes were needed
  int64_t dropped = 0;   // of which never done: overwritten or freed first
  int64_t pending = 0;   // recorded and neither done nor dropped
};

class DeferredCopies {
 public:
  using Copy = std::function<void()>;

  // A block with pending copies into it, or copies that read it, answers
  // true: one atomic load, so blocks with neither cost their users nothing.
  static bool involved(const Block* b) { return b->deferred.load(std::memory_order_acquire); }

  // Records `copy`, which writes `dst` from `src` (different blocks).
  // Anything that read `dst` is done first (it is a write). `whole`: the
  // copy writes every byte of `dst`, so earlier pending copies into it are
  // dropped. Returns false, recording nothing, when `dst` already has
  // `max_pending` copies pending: the caller copies now (a buffer refilled
  // piece by piece must not queue work without bound).
  bool record(Block* dst, Block* src, Copy copy, bool whole, size_t max_pending = kMaxPendingPerBlock);
  // `b`'s bytes are needed (read, or written in part): its pending copies
  // are done, sources first.
  void resolve(Block* b);
  // `b` is about to be written: the copies that read it are done first,
  // then its own (a write may cover only part of it).
  void before_write(Block* b);
  // `b`'s bytes stop mattering (a placeholder wrote it, or it is freed):
  // the copies that read it are done, its own pending copies dropped.
  void discard(Block* b);
  // The involved block whose range holds `p`, or nullptr.
  Block* find(const void* p) const;

  DeferredCopyStats stats() const;
  void reset_stats();

  static constexpr size_t kMaxPendingPerBlock = 64;

 private:
  struct Pending {
    Block* src;
    Copy copy;
  };
  struct Node {
    std::vector<Pending> into;           // copies that write this block, in launch order
    std::unordered_set<Block*> readers;  // blocks with a pending copy that reads this one
  };

  void resolve_locked(Block* b);
  void resolve_readers_locked(Block* b);
  void drop_into_locked(Block* b);
  // After copies[i] (into `b`) was done or dropped: `b` stops reading its source unless a later one reads it too.
  void unlink_locked(Block* b, const std::vector<Pending>& copies, size_t i);
  void tidy_locked(Block* b);  // forgets `b`'s node once it is empty

  mutable std::mutex mutex_;
  std::unordered_map<Block*, Node> nodes_;
  DeferredCopyStats stats_;
};

}  // namespace emugpu
