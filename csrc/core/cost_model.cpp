#include "cost_model.h"

#include <algorithm>
#include <cmath>

#include "error.h"

namespace emugpu {

CostModel::CostModel(const GpuSpec& gpu, CostModelParams params) : gpu_(gpu), params_(params) {
  EMUGPU_CHECK(params.compute_efficiency > 0 && params.compute_efficiency <= 1 &&
                   params.memory_efficiency > 0 && params.memory_efficiency <= 1,
               kValue, "cost model efficiencies must lie in (0, 1], got compute=",
               params.compute_efficiency, " memory=", params.memory_efficiency);
  EMUGPU_CHECK(std::isfinite(params.host_staging_rate) && params.host_staging_rate > 0, kValue,
               "host staging rate must be a positive number of bytes/s, got ", params.host_staging_rate);
}

KernelCost CostModel::kernel_cost(const OpCost& cost) const {
  const double peak_compute_s = cost.flops / gpu_.peak_flops(cost.dtype);
  const double peak_memory_s = cost.bytes / gpu_.memory_bandwidth;
  const double compute_s = peak_compute_s / params_.compute_efficiency;
  const double memory_s = peak_memory_s / params_.memory_efficiency;
  return {params_.launch_ns + static_cast<TimeNs>(std::max(compute_s, memory_s) * 1e9), peak_compute_s * 1e9,
          peak_memory_s * 1e9, compute_s > memory_s};
}

void CostModel::set_measured_transfer(TimeNs latency, double rate, double pinned_rate) {
  EMUGPU_CHECK(latency >= 0 && rate >= 0 && pinned_rate >= 0, kValue,
               "measured transfer latency and rates must be >= 0, got ", latency, " ns, ", rate, " and ",
               pinned_rate, " B/s");
  measured_latency_ = latency;
  measured_rate_ = rate;
  measured_pinned_rate_ = pinned_rate;
}

TimeNs CostModel::transfer(double bytes, bool pinned) const {
  const double measured = pinned && measured_pinned_rate_ > 0 ? measured_pinned_rate_.load() : measured_rate_.load();
  if (measured > 0) return measured_latency_ + static_cast<TimeNs>(bytes / measured * 1e9);
  const double seconds = bytes / gpu_.pcie_bandwidth() + (pinned ? 0.0 : bytes / params_.host_staging_rate);
  return params_.copy_latency_ns + static_cast<TimeNs>(seconds * 1e9);
}

TimeNs CostModel::device_copy(double bytes) const {
  return params_.launch_ns +
         static_cast<TimeNs>(2 * bytes / (gpu_.memory_bandwidth * params_.memory_efficiency) * 1e9);
}

}  // namespace emugpu
