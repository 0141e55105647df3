// Per-op duration estimates where no profile covers an op: each kernel is
// timed from the GPU's peak rates and how far real kernels of its family fall
// short of them (kernel_params.h), GEMM-shaped kernels through the tiles and
// waves they run in.
#pragma once

#include <array>
#include <atomic>
#include <mutex>

#include "catalog.h"
#include "clock.h"
#include "kernel_params.h"
#include "op_cost.h"
#include "rnn_cost.h"

namespace emugpu {

struct OpCost {
  double flops = 0;  // floating-point operations the op performs
  double bytes = 0;  // bytes it reads and writes in device memory
  DType dtype = DType::kFloat32;
  OpFamily family = OpFamily::kElementwise;
  int kernels = 1;  // launches the op makes
  // The GEMM-shaped kernels of matmul, convolution and attention ops; the
  // other families are timed by their bytes.
  int gemm_count = 0;
  std::array<GemmShape, 3> gemms{};  // conv_gemms fills up to three
  ConvShape conv{};                  // convolutions only
  // Norms: the channel count (batch norms; 0: unknown) and whether it is a backward.
  double channels = 0;
  bool backward = false;
  // A batch norm PyTorch hands to cuDNN: float32, or float16 with float32
  // weights (autocast). bfloat16 and all-half ones run its own kernels,
  // which the 16-bit factors of KernelParams time.
  bool cudnn = false;
  // A batch norm with running statistics (eval mode): one normalising pass
  // over the input, no per-channel reductions; `plane` is the elements per
  // (image, channel) plane (H*W; 0: unknown).
  bool running_stats = false;
  double plane = 0;
  // A reduction over a tensor's outer dimensions that keeps its contiguous
  // inner ones (a bias gradient sums rows of `columns` elements into one):
  // the kept elements per row; 0 for a reduction along rows or unknown. A
  // layer norm: the elements of a normalised row (its input's are `elements`).
  double columns = 0;
  // An elementwise op or copy PyTorch cannot vectorise (operands strided,
  // broadcast or of mixed dtypes): its fallback kernel moves one element
  // per thread and load, at a rate of elements; `elements` is how many
  // (a layer norm's: its input's).
  bool strided = false;
  double elements = 0;
  RnnShape rnn{};  // kRnn and kRnnBackward only
};

// What a kernel holds of the GPU while it runs alone, for MPS (kernels of
// several processes at once): `demand`, the fraction of the GPU's SMs its
// blocks hold over its duration (launch gaps hold none); `hold_ns`, how long
// one of its blocks holds an SM (its work over its waves): SMs freed while
// several kernels wait go to each in turn, so the longer a kernel's blocks,
// the more SMs it holds; `memory_ns`, its bytes at the GPU's peak
// bandwidth, which over its duration is the share of the bandwidth it draws
// (kernels of several processes that together draw more slow each other).
struct Occupancy {
  double demand = 1.0;
  double hold_ns = 0;
  double memory_ns = 0;
};

// A kernel's charged duration and the same work at the GPU's peak rates.
struct KernelCost {
  TimeNs duration = 0;
  double peak_compute_ns = 0;
  double peak_memory_ns = 0;
  bool compute_bound = false;
  int launches = 0;  // kernels launched (an NCHW tensor-core convolution adds its layout transforms); 0: OpCost's
  Occupancy occupancy{};
};

struct CostModelParams {
  TimeNs copy_latency_ns = 8'000;
  // Pageable copies go through CUDA's pinned staging buffers: the host's
  // memcpy into them runs in series with the link. Measured on an H100
  // host: 52.5 GB/s pinned, 11.5 GB/s pageable at 16 MiB, so ~14.7 GB/s.
  double host_staging_rate = 14e9;
};

class CostModel {
 public:
  // Kernels are timed with `kernel` (default: the GPU architecture's row of
  // the table in kernel_params.cpp).
  CostModel(const GpuSpec& gpu, CostModelParams params = {});
  CostModel(const GpuSpec& gpu, CostModelParams params, const KernelParams& kernel);

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
  // Replaces the kernel parameters (a calibration file loaded after start).
  void set_kernel_params(const KernelParams& kernel);
  KernelParams kernel_params() const;
  const CostModelParams& params() const { return params_; }
  const GpuSpec& gpu() const { return gpu_; }

 private:
  const GpuSpec& gpu_;
  CostModelParams params_;
  mutable std::mutex kernel_mutex_;  // kernel_cost runs on shape-cache misses only
  KernelParams kernel_;
  std::atomic<TimeNs> measured_latency_{0};
  std::atomic<double> measured_rate_{0};
  std::atomic<double> measured_pinned_rate_{0};
};

// The seconds one GEMM-shaped kernel computes for, at `rate` FLOP/s of the
// whole GPU: its output tiles run in waves over the SMs (a last partial wave
// costs a full one unless splitting the reduction K fills it better), small
// problems use smaller tiles that reuse less, and short reductions pay a
// pipeline fill (KernelParams::gemm_k_half).
// Exposed for tests.
// The chosen kernel's waves, and the fraction of the SMs' tile slots they
// hold on average (a partial last wave holds fewer).
struct GemmWaves {
  double waves = 0;
  double fill = 0;
};
double gemm_compute_seconds(const GemmShape& g, double rate, int sm_count, const KernelParams& p,
                            GemmWaves* waves = nullptr);
// A bandwidth-bound kernel's grid grows with its bytes (16 bytes per thread,
// 2048 threads per SM): the share of `sm_count` SMs a kernel moving `bytes`
// fills, and the waves it takes.
double byte_fill(double bytes, int sm_count);
double byte_waves(double bytes, int sm_count);

}  // namespace emugpu
