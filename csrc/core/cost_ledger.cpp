#include "cost_ledger.h"

#include <algorithm>

namespace emugpu {

void CostLedger::record(const OpCost& cost, const KernelCost& charged) {
  const auto index = static_cast<size_t>(cost.family);
  std::lock_guard<std::mutex> lock(mutex_);
  FamilyCost& f = families_[index];
  f.family = cost.family;
  f.kernels += 1;
  f.time_ns += charged.duration;
  f.flops += cost.flops;
  f.bytes += cost.bytes;
  f.peak_compute_ns += charged.peak_compute_ns;
  f.peak_memory_ns += charged.peak_memory_ns;
  f.compute_bound += charged.compute_bound ? 1 : 0;
}

std::vector<FamilyCost> CostLedger::report() const {
  std::vector<FamilyCost> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const FamilyCost& f : families_) {
      if (f.kernels > 0) out.push_back(f);
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const FamilyCost& a, const FamilyCost& b) {
    return a.time_ns > b.time_ns;
  });
  return out;
}

void CostLedger::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  families_ = {};
}

}  // namespace emugpu
