#include "cost_model.h"

#include <algorithm>

#include "error.h"

namespace emugpu {

CostModel::CostModel(const GpuSpec& gpu, CostModelParams params) : gpu_(gpu), params_(params) {
  EMUGPU_CHECK(params.compute_efficiency > 0 && params.compute_efficiency <= 1 &&
                   params.memory_efficiency > 0 && params.memory_efficiency <= 1,
               kValue, "cost model efficiencies must lie in (0, 1], got compute=",
               params.compute_efficiency, " memory=", params.memory_efficiency);
}

TimeNs CostModel::kernel(const OpCost& cost) const {
  const double compute_s = cost.flops / (gpu_.peak_flops(cost.dtype) * params_.compute_efficiency);
  const double memory_s = cost.bytes / (gpu_.memory_bandwidth * params_.memory_efficiency);
  return params_.launch_ns + static_cast<TimeNs>(std::max(compute_s, memory_s) * 1e9);
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
  const double rate = gpu_.pcie_bandwidth() * (pinned ? 1.0 : params_.pageable_copy_factor);
  return params_.copy_latency_ns + static_cast<TimeNs>(bytes / rate * 1e9);
}

TimeNs CostModel::device_copy(double bytes) const {
  return params_.launch_ns +
         static_cast<TimeNs>(2 * bytes / (gpu_.memory_bandwidth * params_.memory_efficiency) * 1e9);
}

TimeNs RegionCalibrator::begin(const std::string& key, TimeNs target, TimeNs finish, TimeNs now,
                               bool ends_at_sync) {
  EMUGPU_CHECK(target >= 0, kValue, "region '", key, "': target must be >= 0 ns, got ", target);
  std::lock_guard<std::mutex> lock(mutex_);
  const TimeNs pad = end_locked(finish);
  key_ = key;
  target_ = target;
  start_ = std::max(now, finish) + pad;
  ends_at_sync_ = ends_at_sync;
  auto it = scales_.find(key);
  scale_ = it == scales_.end() ? 1.0 : it->second;
  charged_ = 0;
  estimated_ = 0;
  active_ = true;
  return pad;
}

TimeNs RegionCalibrator::end(TimeNs finish) {
  std::lock_guard<std::mutex> lock(mutex_);
  return end_locked(finish);
}

TimeNs RegionCalibrator::settle(TimeNs finish) {
  if (!active_.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  return ends_at_sync_ ? end_locked(finish) : 0;
}

TimeNs RegionCalibrator::end_locked(TimeNs finish) {
  if (!active_) return 0;
  active_ = false;
  const TimeNs charged = charged_, estimated = estimated_;
  const TimeNs gaps = std::max<TimeNs>(0, (finish - start_) - charged);
  const TimeNs pad = std::max<TimeNs>(0, start_ + target_ - std::max(finish, start_));
  Report& r = reports_[key_];
  r.key = key_;
  r.target = target_;
  r.charged = charged;
  r.estimated = estimated;
  r.padded = pad;
  r.gaps = gaps;
  r.scale = scale_;
  r.occurrences += 1;
  if (estimated > 0) {
    // Next time, leave room for the gaps the host left this time (but never
    // shrink the ops below a twentieth of the target: then the host is the
    // bottleneck, as it would be on a real GPU).
    const double room = std::max(static_cast<double>(target_ - gaps), 0.05 * static_cast<double>(target_));
    scales_[key_] = room / static_cast<double>(estimated);
  }
  return pad;
}

TimeNs RegionCalibrator::apply(TimeNs estimate) {
  if (!active_.load(std::memory_order_relaxed)) return estimate;
  const auto scaled = static_cast<TimeNs>(static_cast<double>(estimate) * scale_.load(std::memory_order_relaxed));
  charged_.fetch_add(scaled, std::memory_order_relaxed);
  estimated_.fetch_add(estimate, std::memory_order_relaxed);
  return scaled;
}

std::vector<RegionCalibrator::Report> RegionCalibrator::report() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Report> out;
  for (const auto& [key, r] : reports_) out.push_back(r);
  return out;
}

}  // namespace emugpu
