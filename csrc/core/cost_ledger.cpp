#include "cost_ledger.h"

#include <algorithm>

namespace emugpu {

void CostLedger::record(const OpCost& cost, const KernelCost& charged, std::string_view name) {
  const auto index = static_cast<size_t>(cost.family);
  std::lock_guard<std::mutex> lock(mutex_);
  FamilyCost& f = families_[index];
  f.family = cost.family;
  f.ops += 1;
  f.kernels += std::max(charged.launches > 0 ? charged.launches : cost.kernels, 1);
  f.time_ns += charged.duration;
  f.flops += cost.flops;
  f.bytes += cost.bytes;
  f.peak_compute_ns += charged.peak_compute_ns;
  f.peak_memory_ns += charged.peak_memory_ns;
  f.compute_bound += charged.compute_bound ? 1 : 0;
  if (trace_.size() < trace_limit_) trace_.push_back({std::string(name), cost, charged});
  if (trace_.size() >= trace_limit_) tracing_.store(false, std::memory_order_relaxed);  // full: back to cached costs
}

void CostLedger::start_trace(size_t limit) {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_.clear();
  trace_limit_ = limit;
  tracing_.store(limit > 0, std::memory_order_relaxed);
}

std::vector<TracedOp> CostLedger::take_trace() {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_limit_ = 0;
  tracing_.store(false, std::memory_order_relaxed);
  return std::move(trace_);
}

std::vector<FamilyCost> CostLedger::report() const {
  std::vector<FamilyCost> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const FamilyCost& f : families_) {
      if (f.ops > 0) out.push_back(f);
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const FamilyCost& a, const FamilyCost& b) { return a.time_ns > b.time_ns; });
  return out;
}

void CostLedger::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  families_ = {};
}

}  // namespace emugpu
