#include "pcie_links.h"

#include <algorithm>

#include "error.h"

namespace emugpu {
namespace {

constexpr int kSlots = 2 * PcieLinks::kMaxUplinks;
constexpr size_t kLength = kSlots * sizeof(std::atomic<int64_t>);
static_assert(std::atomic<int64_t>::is_always_lock_free, "shared uplinks need address-free atomics");

}  // namespace

PcieLinks::PcieLinks(std::atomic<int64_t>* slots) : slots_(slots) {}

std::shared_ptr<PcieLinks> PcieLinks::in_process() {
  auto own = std::make_unique<std::atomic<int64_t>[]>(kSlots);
  for (int i = 0; i < kSlots; ++i) own[i].store(0);
  std::shared_ptr<PcieLinks> links(new PcieLinks(own.get()));
  links->own_ = std::move(own);
  return links;
}

std::shared_ptr<PcieLinks> PcieLinks::shared(const std::string& name) {
  bool fresh = false;
  auto segment = std::make_unique<ShmSegment>(ShmSegment::attach_or_create(name, kLength, fresh));
  std::shared_ptr<PcieLinks> links(new PcieLinks(static_cast<std::atomic<int64_t>*>(segment->data())));
  links->segment_ = std::move(segment);
  return links;
}

void PcieLinks::unlink(const std::string& name) { ShmSegment::unlink(name); }

TimeNs PcieLinks::reserve(int uplink, bool to_device, TimeNs earliest, TimeNs occupancy) {
  EMUGPU_CHECK(uplink >= 0 && uplink < kMaxUplinks, kValue, "PCIe uplinks: expected an uplink from 0 to ",
               kMaxUplinks - 1, ", got ", uplink);
  EMUGPU_CHECK(occupancy >= 0, kValue, "PCIe uplinks: expected an occupancy >= 0 ns, got ", occupancy);
  EMUGPU_CHECK(occupancy <= kMaxBacklogNs, kValue, "PCIe uplinks: expected an occupancy of at most a day (",
               kMaxBacklogNs, " ns), got ", occupancy);
  std::atomic<int64_t>& free_at = slots_[2 * uplink + (to_device ? 0 : 1)];
  int64_t seen = free_at.load(std::memory_order_acquire);
  for (;;) {
    EMUGPU_CHECK(seen >= 0 && seen - kMaxBacklogNs <= earliest, kRuntime, "PCIe uplinks: shared memory ",
                 segment_ ? segment_->name() : std::string("(in process)"), " says uplink ", uplink, " is busy until ",
                 seen, " ns, expected a time from 0 to a day after now (", earliest,
                 " ns): it was written by something other than this job's ranks. Remove it and restart the job");
    const TimeNs begin = std::max(earliest, seen);
    if (free_at.compare_exchange_weak(seen, begin + occupancy, std::memory_order_acq_rel)) return begin;
  }
}

}  // namespace emugpu
