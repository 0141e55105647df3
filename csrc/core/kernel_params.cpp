#include "kernel_params.h"

#include <cmath>
#include <utility>

#include "error.h"

namespace emugpu {
namespace {

struct ArchRow {
  int major_min;  // the row applies from this compute capability ...
  int minor_min;
  const char* name;
  std::vector<std::pair<const char*, double>> values;  // over KernelParams' defaults
};

// Rows for Kepler to Volta are fitted (`benchmarks/fit_cost_model.py --fit`)
// to GPEmu's published per-iteration times of 36 torchvision CNNs, batch
// 1-256, fp32, cudnn.benchmark on, on a K80, M40, P100-PCIE and V100-PCIE
// (github.com/mengwanguc/gpemu, profiled_data/; the data is not in this
// repository), over the configurations that were not host-bound there. What
// the fits say: cuDNN's Winograd and FFT kernels (cudnn.benchmark picks
// them) run 3x3 convolutions 2-4x faster than their implicit GEMM at peak;
// depthwise convolutions reach 6-16% of the bandwidth; the PyTorch 1.x
// elementwise kernels 24-65%, batch norm 65-77%; a kernel occupies the
// stream for 11-36 us, launch gaps included. Fields a fit cannot see in fp32
// CNN training (tensor cores, attention, reductions, optimizer, gathers,
// unaligned GEMMs) keep KernelParams' defaults, except Volta's tensor cores:
// cuBLAS HGEMM reaches 90-100 of the V100's 125 TFLOP/s on large shapes.
// The Hopper row is the fit of this project's own H100 sweep
// (profiles/NVIDIA_H100_80GB_HBM3/calibration.json, `torch-emugpu
// calibrate`), which also applies to that GPU directly. Turing, Ampere (with
// Ada) and Blackwell are not fitted: they take Volta's forms for CUDA-core
// work and Hopper's for tensor cores and bandwidth, with their launch costs
// in between; a calibration file measured on the GPU replaces them.
const std::vector<ArchRow>& rows() {
  static const std::vector<ArchRow> table = {
      {3, 0, "kepler", {{"simt_efficiency", 0.62}, {"memory_efficiency", 0.24}, {"norm_efficiency", 0.65},
                        {"depthwise_efficiency", 0.057}, {"winograd_gain", 4.0}, {"launch_ns", 36'400},
                        {"gemm_k_half", 127}}},
      {5, 0, "maxwell", {{"simt_efficiency", 0.95}, {"memory_efficiency", 0.40}, {"norm_efficiency", 0.77},
                         {"depthwise_efficiency", 0.075}, {"winograd_gain", 2.0}, {"launch_ns", 14'900},
                         {"gemm_k_half", 126}}},
      {6, 0, "pascal", {{"simt_efficiency", 1.0}, {"memory_efficiency", 0.35}, {"norm_efficiency", 0.67},
                        {"depthwise_efficiency", 0.065}, {"winograd_gain", 4.0}, {"launch_ns", 18'200},
                        {"gemm_k_half", 0}}},
      {7, 0, "volta", {{"simt_efficiency", 1.0}, {"tensor_efficiency", 0.75}, {"memory_efficiency", 0.65},
                       {"norm_efficiency", 0.71},
                       {"depthwise_efficiency", 0.156}, {"winograd_gain", 4.0}, {"launch_ns", 11'400},
                       {"gemm_k_half", 88}}},
      {7, 5, "turing", {{"simt_efficiency", 0.9}, {"tensor_efficiency", 0.6}, {"memory_efficiency", 0.8},
                        {"norm_efficiency", 0.6}, {"depthwise_efficiency", 0.15}, {"winograd_gain", 2.5},
                        {"launch_ns", 10'000}, {"gemm_k_half", 64}}},
      {8, 0, "ampere", {{"simt_efficiency", 0.85}, {"tensor_efficiency", 0.7}, {"attention_efficiency", 0.7},
                        {"memory_efficiency", 0.9}, {"reduction_efficiency", 0.6}, {"norm_efficiency", 0.45},
                        {"optimizer_efficiency", 0.75}, {"gather_efficiency", 0.8}, {"depthwise_efficiency", 0.15},
                        {"winograd_gain", 2.5}, {"unaligned_efficiency", 0.2}, {"launch_ns", 10'000},
                        {"gemm_k_half", 48}}},
      {9, 0, "hopper", {{"simt_efficiency", 0.79}, {"tensor_efficiency", 0.73}, {"attention_efficiency", 0.71},
                        {"memory_efficiency", 0.92}, {"reduction_efficiency", 0.6}, {"norm_efficiency", 0.39},
                        {"optimizer_efficiency", 0.77}, {"gather_efficiency", 1.0}, {"depthwise_efficiency", 0.14},
                        {"winograd_gain", 2.5}, {"unaligned_efficiency", 0.19}, {"launch_ns", 10'200},
                        {"gemm_k_half", 42}}},
      {10, 0, "blackwell", {{"simt_efficiency", 0.79}, {"tensor_efficiency", 0.7}, {"attention_efficiency", 0.7},
                            {"memory_efficiency", 0.9}, {"reduction_efficiency", 0.6}, {"norm_efficiency", 0.4},
                            {"optimizer_efficiency", 0.75}, {"gather_efficiency", 0.9}, {"depthwise_efficiency", 0.14},
                            {"winograd_gain", 2.5}, {"unaligned_efficiency", 0.2}, {"launch_ns", 10'000},
                            {"gemm_k_half", 42}}},
  };
  return table;
}

}  // namespace

KernelParams default_kernel_params(const GpuSpec& gpu) {
  const ArchRow* row = &rows().front();
  for (const ArchRow& r : rows()) {
    if (gpu.major > r.major_min || (gpu.major == r.major_min && gpu.minor >= r.minor_min)) row = &r;
  }
  KernelParams p;
  for (const auto& [name, value] : row->values) set_kernel_param(p, name, value);
  p.source = std::string("table: ") + row->name;
  return p;
}

const std::vector<KernelParamField>& kernel_param_fields() {
  static const std::vector<KernelParamField> fields = {
      {"simt_efficiency", &KernelParams::simt_efficiency, 0.05, 1.0},
      {"tensor_efficiency", &KernelParams::tensor_efficiency, 0.05, 1.0},
      {"attention_efficiency", &KernelParams::attention_efficiency, 0.05, 1.0},
      {"memory_efficiency", &KernelParams::memory_efficiency, 0.05, 1.0},
      {"reduction_efficiency", &KernelParams::reduction_efficiency, 0.02, 1.0},
      {"norm_efficiency", &KernelParams::norm_efficiency, 0.02, 1.0},
      {"optimizer_efficiency", &KernelParams::optimizer_efficiency, 0.02, 1.0},
      {"gather_efficiency", &KernelParams::gather_efficiency, 0.01, 1.0},
      {"depthwise_efficiency", &KernelParams::depthwise_efficiency, 0.01, 1.0},
      {"winograd_gain", &KernelParams::winograd_gain, 1.0, 4.0},
      {"unaligned_efficiency", &KernelParams::unaligned_efficiency, 0.05, 1.0},
      {"launch_ns", &KernelParams::launch_ns, 500, 100'000},
      {"gemm_k_half", &KernelParams::gemm_k_half, 0, 1024},
  };
  return fields;
}

void set_kernel_param(KernelParams& params, std::string_view name, double value) {
  for (const KernelParamField& f : kernel_param_fields()) {
    if (name != f.name) continue;
    EMUGPU_CHECK(std::isfinite(value) && value >= f.lo && value <= f.hi, kValue, "kernel parameter '", name,
                 "' must lie in [", f.lo, ", ", f.hi, "], got ", value);
    params.*f.member = value;
    return;
  }
  std::string names;
  for (const KernelParamField& f : kernel_param_fields()) names += std::string(names.empty() ? "" : ", ") + f.name;
  EMUGPU_CHECK(false, kValue, "unknown kernel parameter '", name, "'; expected one of: ", names);
}

}  // namespace emugpu
