// The PCIe uplinks that several emulated GPUs of one node share: GPUs behind
// one PCIe switch, or every GPU of a node behind the host's bandwidth. Each
// direction of each uplink is a FIFO that a copy occupies for as long as its
// bytes take at the uplink's rate, so copies of GPUs on one uplink queue
// behind each other while those on different uplinks overlap.
//
// The uplinks live in this process's memory (the GPUs of one process, as
// DataParallel drives them) or in a POSIX shared-memory segment that every
// process of one emulated node maps (torchrun's ranks), lock-free either way.
// Times are the host's steady clock, which the processes of a node share.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "clock.h"
#include "shm_segment.h"

namespace emugpu {

class PcieLinks {
 public:
  static constexpr int kMaxUplinks = 64;

  static std::shared_ptr<PcieLinks> in_process();
  // Opens the node's segment `name` ("/..." as shm_open wants; see
  // private_segment_name), creating it if no live process of the node holds
  // it; every opener sees the same uplinks. Refuses a segment another user
  // could have written.
  static std::shared_ptr<PcieLinks> shared(const std::string& name);
  // Removes the segment's name (each process keeps its mapping).
  static void unlink(const std::string& name);
  ~PcieLinks() = default;
  PcieLinks(const PcieLinks&) = delete;
  PcieLinks& operator=(const PcieLinks&) = delete;

  // When a copy that may start at `earliest` does start on `uplink`
  // (0..kMaxUplinks-1) in its direction: `earliest`, or later while earlier
  // copies still occupy it; the copy then occupies it for `occupancy` ns
  // (at most kMaxBacklogNs). A free time read from the segment more than
  // kMaxBacklogNs after `earliest` is refused as corrupt, never summed.
  static constexpr TimeNs kMaxBacklogNs = 86'400'000'000'000;  // a day of queued copies
  TimeNs reserve(int uplink, bool to_device, TimeNs earliest, TimeNs occupancy);

 private:
  explicit PcieLinks(std::atomic<int64_t>* slots);

  std::atomic<int64_t>* slots_;          // free-at time per uplink and direction
  std::unique_ptr<ShmSegment> segment_;  // the node's, or none
  std::unique_ptr<std::atomic<int64_t>[]> own_;
};

}  // namespace emugpu
