// What the cost model charged one device, per op family: kernels, time, and
// the work measured against the GPU's peak rates, for cost_report() and
// `torch-emugpu explain`. Profiled regions may re-time kernels; the ledger
// keeps what the cost model charged.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "clock.h"
#include "cost_model.h"

namespace emugpu {

struct FamilyCost {
  OpFamily family = OpFamily::kElementwise;
  int64_t ops = 0;
  int64_t kernels = 0;  // launches: an op may run several
  TimeNs time_ns = 0;
  double flops = 0;
  double bytes = 0;
  double peak_compute_ns = 0;  // the FLOPs at the dtype's peak rate
  double peak_memory_ns = 0;   // the bytes at the memory's peak bandwidth
  int64_t compute_bound = 0;   // ops whose compute time exceeded their memory time
};

// One op as the cost model saw it, for the fitting benchmark and debugging.
struct TracedOp {
  std::string name;
  OpCost cost;
  KernelCost charged{};  // its duration, peak-rate times and occupancy (for MPS)
};

class CostLedger {
 public:
  void record(const OpCost& cost, const KernelCost& charged, std::string_view name = {});
  // Keeps the next `limit` ops recorded (replacing any trace kept so far);
  // take_trace() hands them over and stops.
  void start_trace(size_t limit);
  std::vector<TracedOp> take_trace();
  bool tracing() const { return tracing_.load(std::memory_order_relaxed); }
  // Families that ran kernels, the most time first.
  std::vector<FamilyCost> report() const;
  void reset();

 private:
  mutable std::mutex mutex_;
  std::array<FamilyCost, kOpFamilyCount> families_{};
  std::vector<TracedOp> trace_;
  size_t trace_limit_ = 0;
  std::atomic<bool> tracing_{false};  // trace_limit_ > 0, read without the lock on every op
};

}  // namespace emugpu
