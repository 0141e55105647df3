#include "cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cost_rule.h"
#include "error.h"

namespace emugpu {

namespace {

// One channel per group: cuDNN's direct depthwise kernels, not implicit GEMMs.
bool is_depthwise(const OpCost& cost) {
  return uses_cudnn(cost.family) && cost.conv.groups > 1 && cost.conv.c <= cost.conv.groups;
}

// Channels per group that cuDNN's tensor-core grouped kernels can tile: a
// CTA tile's 32-128 channels hold a whole number of groups (a power of two
// up to 128) or a group spans whole tiles (a multiple of 32), as in CUTLASS's
// grouped convolutions. Others (RegNet's 24 per group) have no such kernel.
bool tileable_per_group(double channels) {
  if (channels <= 0) return true;
  const bool power_of_two = std::exp2(std::round(std::log2(channels))) == channels;
  return (power_of_two && channels <= 128) || std::fmod(channels, 32) == 0;
}

// A grouped (not depthwise) convolution cuDNN runs in its direct grouped
// kernels on CUDA cores: its input or output channels per group cannot be tiled.
bool is_direct_grouped(const OpCost& cost) {
  if (!uses_cudnn(cost.family) || cost.conv.groups <= 1 || is_depthwise(cost)) return false;
  return !tileable_per_group(cost.conv.c / cost.conv.groups) || !tileable_per_group(cost.conv.k / cost.conv.groups);
}

// Whether `dtype` runs on tensor cores on `gpu` (cuBLAS and cuDNN use them
// by default for FP16 from Volta, for BF16 and TF32 from Ampere on).
bool on_tensor_cores(const GpuSpec& gpu, DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return gpu.major >= 7;
    case DType::kBFloat16:
    case DType::kTensorFloat32: return gpu.major >= 8;
    default: return false;
  }
}

double ceil_div(double a, double b) { return std::ceil(a / b); }

// A 1x1 stride-1 convolution on NCHW tensors: each image's C x P*Q plane is
// already a matrix with the pixels contiguous, so cuDNN's tensor-core path
// runs it without layout transforms (H100 sweep: one kernel per forward and
// input-gradient pass, against 4-6 for a 3x3) as one GEMM per image over its
// P*Q pixels, not one over N*P*Q. A plane of one pixel (squeeze-excitation's
// pooled maps) is the same matrix in both layouts and runs as one GEMM.
bool is_nchw_pointwise(const OpCost& cost) {
  const ConvShape& v = cost.conv;
  return uses_cudnn(cost.family) && !v.channels_last && v.groups == 1 && v.r * v.s == 1 && v.stride <= 1 &&
         v.p * v.q > 1 && v.n > 1;
}

// One pass of it as N per-image GEMMs (conv_gemms' order: the forward, else
// the input gradient, then the weight gradient). The weight gradient's
// reduction is one image's P*Q pixels; the images' K x C partial sums are
// added up afterwards (nchw_pointwise_partial_bytes).
GemmShape nchw_pointwise_gemm(const OpCost& cost, const GemmShape& g) {
  const ConvShape& v = cost.conv;
  GemmShape out = g;
  out.batch = v.n;
  if (g.weight_grad) {
    out.k = v.p * v.q;
  } else if (cost.family == OpFamily::kConv) {
    out.m = v.p * v.q;
  } else {
    out.m = v.h * v.w;
  }
  return out;
}

// The FP32 partial sums of a per-image weight gradient: one K x C matrix per
// image, written by the GEMM and read back by the kernel that adds them.
double nchw_pointwise_partial_bytes(const ConvShape& v) { return v.n * v.k * v.c * 4; }

// The most slices tried for a partial last wave (filling one wave may use more).
constexpr double kMaxSplitK = 32;

// The fraction of the peak bandwidth a family's kernels sustain.
double memory_efficiency(OpFamily family, const KernelParams& p) {
  switch (family) {
    case OpFamily::kReduction: return p.reduction_efficiency;
    case OpFamily::kNorm: return p.norm_efficiency;
    case OpFamily::kBatchNorm: return p.batch_norm_efficiency;
    case OpFamily::kOptimizer: return p.optimizer_efficiency;
    case OpFamily::kGather: return p.gather_efficiency;
    default: return p.memory_efficiency;
  }
}

double element_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat64: return 8;
    default: return 4;
  }
}

}  // namespace

namespace {
constexpr double kWaveBytesPerSm = 2048 * 16;
}  // namespace

double byte_fill(double bytes, int sm_count) {
  return std::clamp(bytes / (std::max(sm_count, 1) * kWaveBytesPerSm), 0.0, 1.0);
}

double byte_waves(double bytes, int sm_count) {
  return std::max(1.0, std::ceil(bytes / (std::max(sm_count, 1) * kWaveBytesPerSm)));
}

double gemm_compute_seconds(const GemmShape& g, double rate, int sm_count, const KernelParams& p, GemmWaves* out) {
  if (out) *out = {};
  if (g.batch <= 0 || g.m <= 0 || g.n <= 0 || g.k <= 0 || rate <= 0) return 0;
  // CTA tiles cuBLAS/CUTLASS pick from, with the fraction of a 128x128
  // tile's throughput each reaches per SM (smaller tiles reuse each loaded
  // element for fewer multiply-adds) and how many of them an SM holds at once.
  struct Tile {
    double m, n, efficiency, resident;
  };
  static constexpr Tile kTiles[] = {
      {128, 128, 1.0, 1}, {128, 64, 0.9, 2}, {64, 64, 0.8, 4}, {64, 32, 0.65, 6}, {32, 32, 0.5, 8}};
  const double sms = std::max(sm_count, 1);
  double best = std::numeric_limits<double>::infinity();
  for (const Tile& t : kTiles) {
    const double tiles = g.batch * ceil_div(g.m, t.m) * ceil_div(g.n, t.n);
    const double slots = sms * t.resident;
    // Split-K: the reduction shared out in slices of at least 256, as many
    // as fill one wave when the tiles are too few, or fewer that leave less
    // of a last wave idle (cuBLAS's split-K and Hopper's stream-K kernels): a
    // weight gradient's few output tiles over a long token reduction run near
    // peak, and 1.1 waves of tiles do not cost two.
    const double max_split = std::max(1.0, std::floor(g.k / 256));
    auto consider = [&](double split) {
      const double waves = ceil_div(tiles * split, slots);
      const double k = g.k / split;
      const double s = waves * 2 * t.m * t.n * k / (rate / slots * t.efficiency) * (1 + p.gemm_k_half / k);
      if (s < best) {
        best = s;
        if (out) *out = {waves, tiles * split / (waves * slots)};
      }
    };
    if (tiles < slots) consider(std::clamp(std::floor(slots / tiles), 1.0, max_split));
    // Whole waves gain nothing from splitting (each slice pays its own fill).
    const double tries = std::fmod(tiles, slots) == 0 ? 1.0 : std::min(max_split, kMaxSplitK);
    for (double split = 1; split <= tries; ++split) consider(split);
  }
  return best;
}

CostModel::CostModel(const GpuSpec& gpu, CostModelParams params) : CostModel(gpu, params, default_kernel_params(gpu)) {}

CostModel::CostModel(const GpuSpec& gpu, CostModelParams params, const KernelParams& kernel)
    : gpu_(gpu), params_(params), kernel_(kernel) {
  EMUGPU_CHECK(std::isfinite(params.host_staging_rate) && params.host_staging_rate > 0, kValue,
               "host staging rate must be a positive number of bytes/s, got ", params.host_staging_rate);
  set_kernel_params(kernel);
}

void CostModel::set_kernel_params(const KernelParams& kernel) {
  for (const KernelParamField& f : kernel_param_fields()) {
    const double v = kernel.*f.member;
    EMUGPU_CHECK(std::isfinite(v) && v >= f.lo && v <= f.hi, kValue, "kernel parameter '", f.name, "' must lie in [",
                 f.lo, ", ", f.hi, "], got ", v, " (", kernel.source, ")");
  }
  std::lock_guard<std::mutex> lock(kernel_mutex_);
  kernel_ = kernel;
}

KernelParams CostModel::kernel_params() const {
  std::lock_guard<std::mutex> lock(kernel_mutex_);
  return kernel_;
}

KernelCost CostModel::kernel_cost(const OpCost& cost) const {
  const KernelParams p = kernel_params();
  const double peak_rate = gpu_.peak_flops(cost.dtype);
  // A grouped convolution with no tensor-core kernel runs on CUDA cores
  // and needs no NHWC transforms (see the GEMM loop below).
  const bool direct_grouped = on_tensor_cores(gpu_, cost.dtype) && is_direct_grouped(cost);
  const bool tensor = on_tensor_cores(gpu_, cost.dtype) && !direct_grouped;
  const double rate = direct_grouped ? gpu_.peak_flops(DType::kFloat32) * p.simt_efficiency
                                     : peak_rate * (tensor ? p.tensor_efficiency : p.simt_efficiency);
  const double peak_compute_s = peak_rate > 0 ? cost.flops / peak_rate : 0;
  const double peak_memory_s = cost.bytes / gpu_.memory_bandwidth;
  constexpr double kMaxKernelNs = 86'400e9;  // sizes from files or absurd shapes: a kernel lasts at most a day
  if (cost.family == OpFamily::kRnn || cost.family == OpFamily::kRnnBackward) {
    // One call runs all of cuDNN's kernels for every layer and timestep
    // (rnn_cost.h); the call itself pays one launch. Its tensor-core GEMMs
    // keep what cuDNN's convolutions keep of the GEMM rate (H100 trace:
    // 110-290 TFLOP/s in TF32 against cuBLAS's ~370).
    const double cudnn_rate = tensor ? rate * p.conv_tensor_efficiency : rate;
    const RnnTime t = rnn_time(cost.rnn, cost.family == OpFamily::kRnnBackward,
                               {cudnn_rate, gpu_.memory_bandwidth, gpu_.sm_count, element_bytes(cost.dtype)}, p);
    const double ns = p.launch_ns + t.seconds * 1e9;
    // Its timesteps' small GEMMs hold few SMs (the wavefront overlaps layers).
    const double demand =
        ns > 0 ? byte_fill(cost.bytes / std::max(cost.rnn.seq_len, 1.0), gpu_.sm_count) * t.seconds * 1e9 / ns : 0;
    const Occupancy occupancy{std::isfinite(demand) ? demand : 1.0, t.seconds * 1e9 / std::max(t.launches, 1),
                              peak_memory_s * 1e9};
    return {static_cast<TimeNs>(std::isfinite(ns) ? std::min(ns, kMaxKernelNs) : kMaxKernelNs),
            peak_compute_s * 1e9,
            peak_memory_s * 1e9,
            t.compute_seconds > t.seconds - t.compute_seconds,
            std::max(t.launches, 1),
            occupancy};
  }
  double compute_s = 0;
  double memory_s = peak_memory_s / memory_efficiency(cost.family, p);
  if ((cost.family == OpFamily::kElementwise || cost.family == OpFamily::kCopy) && cost.strided &&
      p.strided_elements_per_sm_ns > 0) {
    // PyTorch's non-vectorised elementwise kernel (strided, broadcast or
    // mixed-dtype operands): one element per thread and load, at a rate of
    // elements that 16-bit operands do not double.
    memory_s = std::max(memory_s, cost.elements / (p.strided_elements_per_sm_ns * 1e9 * gpu_.sm_count));
  }
  if (cost.family == OpFamily::kNorm && cost.columns > 0 && cost.elements > 0) {
    // A block per row: short rows cost their blocks' fixed time, not bytes.
    memory_s = std::max(memory_s, cost.elements / cost.columns * p.norm_row_ns * 1e-9 / std::max(gpu_.sm_count, 1));
  }
  if (cost.family == OpFamily::kReduction && cost.columns > 0) {
    // A column reduction: each thread's loads run along a row, so narrow
    // rows leave too few of them in flight to fill the bandwidth.
    const double row_bytes = cost.columns * element_bytes(cost.dtype);
    memory_s *= (row_bytes + p.column_reduction_half_bytes) / row_bytes;
  }
  const bool eval_batch_norm = cost.family == OpFamily::kBatchNorm && cost.running_stats && !cost.backward;
  if (eval_batch_norm) {
    // With running statistics nothing is reduced: one elementwise pass over
    // planes of H*W elements, a block's threads along the plane (small
    // planes leave them idle), at a rate of elements: a 16-bit one keeps
    // most of float32's time.
    memory_s = peak_memory_s / p.batch_norm_eval_efficiency;
    if (cost.plane > 0) memory_s *= (cost.plane + p.batch_norm_eval_plane) / cost.plane;
    if (element_bytes(cost.dtype) == 2) memory_s *= 2 * p.batch_norm_eval_16bit;
  }
  // The share of the SMs a grid that grows with the bytes would fill that
  // this kernel's grid does fill (for MPS: what it leaves to other processes).
  double grid_fill = 1.0;
  if (cost.family == OpFamily::kBatchNorm && cost.channels > 0 && !eval_batch_norm) {
    // Its per-channel reductions run a block or a few per channel, so with
    // few channels most SMs idle; the backward reduces two products per
    // channel in a heavier kernel (H100 sweep: half-rate channel counts
    // ~0.75 SMs forward, ~2.5 SMs backward).
    const double half = p.batch_norm_channels_per_sm * gpu_.sm_count * (cost.backward ? 3.0 : 1.0);
    memory_s *= (cost.channels + half) / cost.channels;
    // PyTorch's own kernels reduce each channel in one block (a grid of C
    // blocks, whatever the batch), so the time beyond the bytes is SMs left
    // idle, which another process's kernels may take. cuDNN's grids are
    // not known here: its kernels are taken to fill the GPU.
    if (!cost.cudnn) grid_fill = cost.channels / (cost.channels + half);
  }
  if (cost.family == OpFamily::kBatchNorm && element_bytes(cost.dtype) == 2 && !cost.cudnn && !eval_batch_norm) {
    memory_s *= cost.backward ? p.batch_norm_16bit_backward : p.batch_norm_16bit_forward;
  }
  const bool depthwise = is_depthwise(cost);
  double gemm_fill_s = 0;  // GEMM time weighted by the SMs its waves fill
  double gemm_waves = 0;
  double serial_s = 0;  // kernels that add to the others' time instead of overlapping it
  if (depthwise) {
    // cuDNN's direct depthwise kernels: bandwidth-bound, far below peak.
    // With large filters the 32-bit ones are compute-bound on CUDA cores
    // (R*S multiply-adds per output; no tensor cores for one channel per
    // group), slower on NCHW tensors; the 16-bit NHWC ones up to 7x7 have
    // kernels of their own that stay bandwidth-bound (H100 sweep, 7x7: bf16
    // NHWC 2.6x the fp32 forward's rate; at 31x31 they are as slow as fp32).
    // Filters up to 5x5 (MobileNet, EfficientNet) keep the bandwidth rule
    // alone, fitted on them.
    memory_s = peak_memory_s / p.depthwise_efficiency;
    const double simt_rate = gpu_.peak_flops(DType::kFloat32);
    const bool nhwc = cost.conv.channels_last;
    const bool large = cost.conv.r * cost.conv.s > 25;
    const bool fast_16bit = nhwc && element_bytes(cost.dtype) == 2 && cost.conv.r * cost.conv.s <= 49;
    if (!large) compute_s = rate > 0 ? cost.flops / rate : 0;
    for (int i = 0;
         large && !fast_16bit && simt_rate > 0 && i < cost.gemm_count && i < static_cast<int>(cost.gemms.size()); ++i) {
      const GemmShape& g = cost.gemms[static_cast<size_t>(i)];
      const double flops = matmul_flops(g.batch, g.m, g.k, g.n);
      if (g.weight_grad) {
        // A filter beyond 5x5 has no specialised weight-gradient kernel:
        // cuDNN reduces each tap over N*P*Q in generic kernels (on NHWC
        // fp32, an implicit GEMM behind layout transforms, slower still).
        serial_s += flops / (simt_rate * (nhwc ? p.depthwise_wgrad_efficiency : p.depthwise_wgrad_nchw_efficiency));
      } else {
        compute_s += flops / (simt_rate * p.depthwise_compute_efficiency * (nhwc ? 1.0 : p.depthwise_nchw_factor));
      }
    }
  } else if (is_gemm_family(cost.family)) {
    if (cost.gemm_count > 0) {
      const bool matmul = uses_cublas(cost.family);
      const double align = 16 / element_bytes(cost.dtype);
      // cuDNN's tensor-core convolutions want channels in 16-byte groups too
      // (the 3-channel stem runs on slower kernels). Grouped ones are exempt:
      // cuDNN runs them in grouped kernels of their own, which keep their pace
      // with few channels per group (H100 sweep, ResNeXt's 4 channels per
      // group in bf16: 0.6x the TF32 pass, not the fallback's 3-7x).
      const bool unaligned_conv = tensor && cost.conv.groups == 1 && cost.conv.c > 0 && uses_cudnn(cost.family) &&
                                  std::fmod(cost.conv.c, align) != 0;
      const bool per_image = tensor && !direct_grouped && is_nchw_pointwise(cost);
      for (int i = 0; i < cost.gemm_count && i < static_cast<int>(cost.gemms.size()); ++i) {
        const GemmShape& shape = cost.gemms[static_cast<size_t>(i)];
        const GemmShape g = per_image ? nchw_pointwise_gemm(cost, shape) : shape;
        if (per_image && g.weight_grad) {
          // The per-image partial sums are written as the GEMM's output
          // (they share its bandwidth with the operands) and read back by a
          // second kernel that adds them up, after it (the H100 sweep's 1x1
          // weight gradients run two kernels). It is charged its bytes, not
          // a launch floor of its own: with one, the 56x56 bf16 ones, whose
          // partials are small (4-10 us above their forwards), come out 10%
          // slow; without, the fp32 ones are 8-10% fast.
          const double partials = nchw_pointwise_partial_bytes(cost.conv);
          const double bandwidth = gpu_.memory_bandwidth * p.memory_efficiency;
          memory_s += partials / bandwidth;
          serial_s += (partials + cost.conv.k * cost.conv.c * element_bytes(cost.dtype)) / bandwidth;
        }
        if (direct_grouped && !g.weight_grad) {
          // cuDNN's direct grouped kernels loop over a group's C/g x R x S
          // inputs per output, a load per multiply-add, as the large-filter
          // depthwise kernels do: their FP32 rate, slower on NCHW tensors.
          // The weight gradient reduces over N*P*Q, a long GEMM-like
          // reduction: the per-group GEMM at the CUDA-core rate.
          const double s = matmul_flops(g.batch, g.m, g.k, g.n) /
                           (gpu_.peak_flops(DType::kFloat32) * p.depthwise_compute_efficiency *
                            (cost.conv.channels_last ? 1.0 : p.depthwise_nchw_factor));
          compute_s += s;
          gemm_fill_s += s;
          gemm_waves += byte_waves(cost.bytes, gpu_.sm_count);
          continue;
        }
        // cuDNN's Winograd kernels take no groups its direct kernels cannot tile.
        double speedup = g.winograd && !tensor && !direct_grouped ? p.winograd_gain : 1.0;
        if ((tensor && matmul && (g.unaligned_ld || std::fmod(g.n, align) != 0 || std::fmod(g.k, align) != 0)) ||
            unaligned_conv) {
          // The fallback kernels load one element at a time, so they move
          // bytes at the element's width: 16-bit operands at half TF32's
          // rate (H100 sweep, GPT-2's 50257-word head: TF32 0.36, bf16 0.19).
          // cuBLAS picks them when any operand's leading dimension is
          // unaligned, also for an aligned n and k (H100 trace of GPT-2 bf16:
          // all three passes of the head run align1 kernels, 4.3-6.7 ms).
          speedup *= p.unaligned_efficiency * element_bytes(cost.dtype) / 4;
        }
        if (cost.family == OpFamily::kAttention || cost.family == OpFamily::kAttentionBackward) {
          speedup *= p.attention_efficiency;
        }
        if (tensor && uses_cudnn(cost.family)) speedup *= p.conv_tensor_efficiency;
        GemmWaves w;
        const double s = gemm_compute_seconds(g, rate, gpu_.sm_count, p, &w) / speedup;
        compute_s += s;
        gemm_fill_s += w.fill * s;
        gemm_waves += w.waves;
      }
    } else if (rate > 0) {
      compute_s = cost.flops / rate;  // no shape known (sparse products): the plain rate
    }
  } else {
    compute_s = rate > 0 ? cost.flops / rate : 0;
  }
  double launches = std::max(cost.kernels, 1);
  double transform_s = 0;
  if (tensor && !depthwise && uses_cudnn(cost.family) && !cost.conv.channels_last &&
      (cost.conv.r * cost.conv.s > 1 || cost.conv.stride > 1)) {
    // cuDNN's tensor-core convolutions work in NHWC: on PyTorch's default
    // NCHW tensors each pass transposes its activation input in and its
    // output back (and the filter), in kernels of their own (H100 sweep:
    // 4-6 kernels per 3x3 pass, one per 1x1 stride-1 pass, which runs as
    // per-image GEMMs: is_nchw_pointwise). The transposes cost ~2x each
    // activation's bytes.
    const ConvShape& v = cost.conv;
    const double activations = v.n * (v.c * v.h * v.w + v.k * v.p * v.q) * element_bytes(cost.dtype);
    transform_s = cost.gemm_count * 2 * activations / (gpu_.memory_bandwidth * p.memory_efficiency);
    launches += 3 * cost.gemm_count;
  } else if (tensor && !depthwise && uses_cudnn(cost.family) && cost.conv.channels_last && cost.conv.groups > 1 &&
             element_bytes(cost.dtype) == 4) {
    // cuDNN has no NHWC kernel of its own for a 32-bit grouped weight
    // gradient: it takes as long as on NCHW tensors, transforms included
    // (H100 sweep, ResNeXt-50's grouped 3x3 layers: NHWC within 10% of NCHW
    // in every shape, 0.09-0.56 ms, where the 16-bit ones gain 2-4x).
    const ConvShape& v = cost.conv;
    const double activations = v.n * (v.c * v.h * v.w + v.k * v.p * v.q) * element_bytes(cost.dtype);
    for (int i = 0; i < cost.gemm_count && i < static_cast<int>(cost.gemms.size()); ++i) {
      if (!cost.gemms[static_cast<size_t>(i)].weight_grad) continue;
      transform_s += 2 * activations / (gpu_.memory_bandwidth * p.memory_efficiency);
      launches += 3;
    }
  }
  const double work_s = std::max(compute_s, memory_s) + transform_s + serial_s;
  const double ns = launches * p.launch_ns + work_s * 1e9;
  // The SMs held while the work runs: a GEMM's waves, else a grid that grows
  // with the bytes; none during the launch gaps.
  const bool by_gemm = gemm_fill_s > 0 && compute_s > memory_s;
  const double fill = by_gemm ? gemm_fill_s / compute_s : byte_fill(cost.bytes / launches, gpu_.sm_count) * grid_fill;
  const double waves = by_gemm ? gemm_waves : launches * byte_waves(cost.bytes / launches, gpu_.sm_count);
  const double demand = ns > 0 ? std::clamp(fill * work_s * 1e9 / ns, 0.0, 1.0) : 0.0;
  const Occupancy occupancy{std::isfinite(demand) ? demand : 1.0, work_s * 1e9 / std::max(waves, 1.0),
                            peak_memory_s * 1e9};
  return {static_cast<TimeNs>(std::isfinite(ns) ? std::min(ns, kMaxKernelNs) : kMaxKernelNs),
          peak_compute_s * 1e9,
          peak_memory_s * 1e9,
          compute_s > memory_s,
          static_cast<int>(launches),
          occupancy};
}

CostRule cost_rule(const OpCost& cost, const GpuSpec& gpu) {
  const bool tensor = on_tensor_cores(gpu, cost.dtype);
  const auto filter = [&] {
    return std::to_string(static_cast<int>(cost.conv.r)) + "x" + std::to_string(static_cast<int>(cost.conv.s));
  };
  switch (cost.family) {
    case OpFamily::kRnn:
    case OpFamily::kRnnBackward: {
      const char* mode = cost.rnn.mode == RnnMode::kLstm ? "lstm" : cost.rnn.mode == RnnMode::kGru ? "gru" : "rnn";
      return {mode, "cuDNN RNN wavefront rule"};
    }
    case OpFamily::kConv:
    case OpFamily::kConvBackward: {
      if (is_depthwise(cost)) {
        const bool large = cost.conv.r * cost.conv.s > 25;
        return {"conv depthwise " + filter(), large ? "large-kernel depthwise rule" : "depthwise bandwidth rule"};
      }
      const std::string family = cost.conv.groups > 1 ? "conv grouped " + filter() : "conv " + filter();
      if (tensor && is_direct_grouped(cost)) return {family, "direct grouped rule (no tensor-core tiling)"};
      const double align = 16 / element_bytes(cost.dtype);
      if (tensor && cost.conv.groups == 1 && cost.conv.c > 0 && std::fmod(cost.conv.c, align) != 0) {
        return {family, "implicit-GEMM tile rule, unaligned channels"};
      }
      if (tensor && !cost.conv.channels_last && (cost.conv.r * cost.conv.s > 1 || cost.conv.stride > 1)) {
        return {family, "implicit-GEMM tile rule + NCHW transposes"};
      }
      if (tensor && is_nchw_pointwise(cost)) return {family, "per-image GEMM rule (NCHW 1x1)"};
      return {family, "implicit-GEMM tile rule"};
    }
    case OpFamily::kMm:
    case OpFamily::kBmm:
    case OpFamily::kAddmm:
    case OpFamily::kBaddbmm: {
      const double align = 16 / element_bytes(cost.dtype);
      for (int i = 0; tensor && i < cost.gemm_count && i < static_cast<int>(cost.gemms.size()); ++i) {
        const GemmShape& g = cost.gemms[static_cast<size_t>(i)];
        if (g.unaligned_ld || std::fmod(g.n, align) != 0 || std::fmod(g.k, align) != 0) {
          return {"matmul", "unaligned GEMM rule"};
        }
      }
      return {"matmul", cost.gemm_count > 0 ? "GEMM tile rule" : "plain FLOP rate"};
    }
    case OpFamily::kAttention:
    case OpFamily::kAttentionBackward: return {"attention", "fused attention tile rule"};
    case OpFamily::kBatchNorm:
      if (cost.running_stats && !cost.backward) return {"batch norm (eval)", "eval-mode normalisation pass rule"};
      return {"batch norm", cost.cudnn ? "per-channel reduction rule (cuDNN)" : "per-channel reduction rule"};
    case OpFamily::kOptimizer: return {"optimizer", "multi-tensor bandwidth rule"};
    case OpFamily::kUnmodelled: return {"unmodelled", "bandwidth rule (no family known)"};
    case OpFamily::kReduction:
      return {op_family_name(cost.family), cost.columns > 0 ? "column reduction rule" : "bandwidth rule"};
    case OpFamily::kElementwise:
    case OpFamily::kCopy:
      return {op_family_name(cost.family), cost.strided ? "strided elementwise rule" : "bandwidth rule"};
    case OpFamily::kNorm:
      return {op_family_name(cost.family), cost.columns > 0 ? "bandwidth rule, per-row floor" : "bandwidth rule"};
    case OpFamily::kGather: return {op_family_name(cost.family), "bandwidth rule"};
  }
  return {op_family_name(cost.family), "bandwidth rule"};
}

void CostModel::set_measured_transfer(TimeNs latency, double rate, double pinned_rate) {
  EMUGPU_CHECK(latency >= 0 && rate >= 0 && pinned_rate >= 0, kValue,
               "measured transfer latency and rates must be >= 0, got ", latency, " ns, ", rate, " and ", pinned_rate,
               " B/s");
  measured_latency_ = latency;
  measured_rate_ = rate;
  measured_pinned_rate_ = pinned_rate;
}

TimeNs CostModel::transfer(double bytes, bool pinned) const {
  const double measured = pinned && measured_pinned_rate_ > 0 ? measured_pinned_rate_.load() : measured_rate_.load();
  // Saturated, not wrapped, for huge sizes over slow rates.
  if (measured > 0) return add_saturating(measured_latency_, ns_from_double(bytes / measured * 1e9));
  const double seconds = bytes / gpu_.pcie_bandwidth() + (pinned ? 0.0 : bytes / params_.host_staging_rate);
  return add_saturating(params_.copy_latency_ns, ns_from_double(seconds * 1e9));
}

TimeNs CostModel::device_copy(double bytes) const {
  OpCost copy;
  copy.bytes = 2 * bytes;
  copy.family = OpFamily::kCopy;
  return kernel(copy);
}

}  // namespace emugpu
