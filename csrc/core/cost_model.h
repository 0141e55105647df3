// Per-op duration estimates: a roofline over the catalog's peak rates.
#pragma once

#include <atomic>

#include "catalog.h"
#include "clock.h"
#include "op_cost.h"

namespace emugpu {

struct OpCost {
  double flops = 0;   // floating-point operations the op performs
  double bytes = 0;   // bytes it reads and writes in device memory
  DType dtype = DType::kFloat32;
  OpFamily family = OpFamily::kElementwise;
};

// A kernel's charged duration and the same work at the GPU's peak rates.
struct KernelCost {
  TimeNs duration = 0;
  double peak_compute_ns = 0;
  double peak_memory_ns = 0;
  bool compute_bound = false;
};

struct CostModelParams {
  // Fraction of the peak that real kernels sustain (cuBLAS/cuDNN reach
  // 60-80% of peak on large shapes; elementwise kernels ~80% of bandwidth).
  double compute_efficiency = 0.7;
  double memory_efficiency = 0.8;
  TimeNs launch_ns = 4'000;  // per-kernel fixed cost on the device
  TimeNs copy_latency_ns = 8'000;
  // Pageable copies go through CUDA's pinned staging buffers: the host's
  // memcpy into them runs in series with the link. Measured on an H100
  // host: 52.5 GB/s pinned, 11.5 GB/s pageable at 16 MiB, so ~14.7 GB/s.
  double host_staging_rate = 14e9;
};

class CostModel {
 public:
  CostModel(const GpuSpec& gpu, CostModelParams params = {});

  TimeNs kernel(const OpCost& cost) const { return kernel_cost(cost).duration; }
  KernelCost kernel_cost(const OpCost& cost) const;
  // Host<->device copy of `bytes`: pinned copies at the link rate, pageable
  // ones also through the host's staging copy; or at the measured rates set
  // by set_measured_transfer().
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

}  // namespace emugpu
