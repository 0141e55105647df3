// What the cost model charged one device, per op family: kernels, time, and
// the work measured against the GPU's peak rates, for cost_report() and
// `torch-emugpu explain`. Profiled regions may re-time kernels; the ledger
// keeps what the cost model charged.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

#include "clock.h"
#include "cost_model.h"

namespace emugpu {

struct FamilyCost {
  OpFamily family = OpFamily::kElementwise;
  int64_t kernels = 0;
  TimeNs time_ns = 0;
  double flops = 0;
  double bytes = 0;
  double peak_compute_ns = 0;  // the FLOPs at the dtype's peak rate
  double peak_memory_ns = 0;   // the bytes at the memory's peak bandwidth
  int64_t compute_bound = 0;   // kernels whose compute time exceeded their memory time
};

class CostLedger {
 public:
  void record(const OpCost& cost, const KernelCost& charged);
  // Families that ran kernels, the most time first.
  std::vector<FamilyCost> report() const;
  void reset();

 private:
  mutable std::mutex mutex_;
  std::array<FamilyCost, kOpFamilyCount> families_{};
};

}  // namespace emugpu
