// Per-op duration estimates: a roofline over the catalog's peak rates.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "catalog.h"
#include "clock.h"

namespace emugpu {

struct OpCost {
  double flops = 0;   // floating-point operations the op performs
  double bytes = 0;   // bytes it reads and writes in device memory
  DType dtype = DType::kFloat32;
};

struct CostModelParams {
  // Fraction of the peak that real kernels sustain (cuBLAS/cuDNN reach
  // 60-80% of peak on large shapes; elementwise kernels ~80% of bandwidth).
  double compute_efficiency = 0.7;
  double memory_efficiency = 0.8;
  TimeNs launch_ns = 4'000;  // per-kernel fixed cost on the device
  TimeNs copy_latency_ns = 8'000;
  double pageable_copy_factor = 0.5;  // staging halves the pageable rate
};

class CostModel {
 public:
  CostModel(const GpuSpec& gpu, CostModelParams params = {});

  TimeNs kernel(const OpCost& cost) const;
  // Host<->device copy of `bytes`; pinned copies run at the link rate, or at
  // the measured rate set by set_measured_transfer().
  TimeNs transfer(double bytes, bool pinned) const;
  // Host-to-device copies from a profile: `latency` plus bytes at `rate`
  // (bytes/s), for pageable copies; pinned ones at `pinned_rate` if > 0.
  // A rate of 0 returns to the catalog's link.
  void set_measured_transfer(TimeNs latency, double rate, double pinned_rate);
  // Device-to-device copy within one GPU (read + write).
  TimeNs device_copy(double bytes) const;
  const CostModelParams& params() const { return params_; }

 private:
  const GpuSpec& gpu_;
  CostModelParams params_;
  std::atomic<TimeNs> measured_latency_{0};
  std::atomic<double> measured_rate_{0};
  std::atomic<double> measured_pinned_rate_{0};
};

// Charges a code region (a model's forward, or its backward + update) a
// measured total: the region must finish `target` after it started on the
// device. Ops inside it are scaled so that their time plus the idle gaps the
// host left in the region's previous occurrence add up to the target (the
// time stays spread over the ops in proportion to their estimates); what is
// still missing when the region ends is returned as a pad for the caller.
class RegionCalibrator {
 public:
  struct Report {
    std::string key;
    TimeNs target = 0;      // of the last occurrence
    TimeNs charged = 0;     // by its ops, scaled
    TimeNs estimated = 0;   // by its ops, unscaled
    TimeNs padded = 0;      // owed at its end
    TimeNs gaps = 0;        // device idle time inside it (host-bound stretches)
    double scale = 1;       // applied during it
    int64_t occurrences = 0;
  };

  // Ends the active region, whose ops finish at `finish` on the device
  // (returning its pad, >= 0), and starts `key` at host time `now`: its work
  // starts on the device after that and after the pad.
  // With `ends_at_sync`, the region also ends at the next host sync point
  // (settle()): a backward + update region ends where the loop waits.
  TimeNs begin(const std::string& key, TimeNs target, TimeNs finish, TimeNs now, bool ends_at_sync = false);
  // At a host sync point: ends the active region if it ends at syncs; returns its pad.
  TimeNs settle(TimeNs finish);
  // Ends the active region, whose ops finish at `finish` on the device;
  // returns its pad (0 when none is active).
  TimeNs end(TimeNs finish);
  // An op's duration inside the active region (unchanged outside one).
  TimeNs apply(TimeNs estimate);
  bool active() const { return active_.load(std::memory_order_relaxed); }
  std::vector<Report> report() const;

 private:
  TimeNs end_locked(TimeNs finish);

  mutable std::mutex mutex_;
  std::atomic<bool> active_{false};
  std::atomic<double> scale_{1};
  std::atomic<TimeNs> charged_{0};
  std::atomic<TimeNs> estimated_{0};
  std::string key_;
  TimeNs target_ = 0;
  TimeNs start_ = 0;
  bool ends_at_sync_ = false;
  std::map<std::string, double> scales_;
  std::map<std::string, Report> reports_;
};

}  // namespace emugpu
