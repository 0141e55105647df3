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
// elementwise kernels 25-82%; batch norm streams at 96-100% of the
// bandwidth once it has channels enough (half of that at 0.2-1.0 channels
// per SM); a kernel occupies the stream for 13-24 us, launch gaps included. Fields a fit cannot see in fp32
// CNN training (tensor cores, attention, reductions, layer norms, optimizer,
// gathers, unaligned GEMMs) keep KernelParams' defaults, except Volta's tensor cores:
// cuBLAS HGEMM reaches 90-100 of the V100's 125 TFLOP/s on large shapes
// (its FP16 convolutions keep that rate: no measurement says otherwise).
// The Hopper row is the fit of this project's own H100 sweep
// (profiles/NVIDIA_H100_80GB_HBM3/calibration.json, `torch-emugpu
// calibrate`), which also applies to that GPU directly. Turing, Ampere (with
// Ada) and Blackwell are not fitted: they take Volta's forms for CUDA-core
// work and Hopper's for tensor cores, bandwidth and batch norms (Turing
// without the bfloat16 batch-norm factors: it has no bfloat16), with their
// launch costs in between; a calibration file measured on the GPU replaces them.
const std::vector<ArchRow>& rows() {
  static const std::vector<ArchRow> table = {
      {3,
       0,
       "kepler",
       {{"simt_efficiency", 0.61},
        {"memory_efficiency", 0.25},
        {"batch_norm_efficiency", 0.96},
        {"batch_norm_channels_per_sm", 1.04},
        {"depthwise_efficiency", 0.089},
        {"winograd_gain", 3.5},
        {"launch_ns", 24'300},
        {"gemm_k_half", 292}}},
      {5,
       0,
       "maxwell",
       {{"simt_efficiency", 0.95},
        {"memory_efficiency", 0.44},
        {"batch_norm_efficiency", 1.0},
        {"batch_norm_channels_per_sm", 0.42},
        {"depthwise_efficiency", 0.086},
        {"winograd_gain", 1.8},
        {"launch_ns", 13'300},
        {"gemm_k_half", 224}}},
      {6,
       0,
       "pascal",
       {{"simt_efficiency", 0.91},
        {"memory_efficiency", 0.42},
        {"batch_norm_efficiency", 1.0},
        {"batch_norm_channels_per_sm", 0.23},
        {"depthwise_efficiency", 0.073},
        {"winograd_gain", 3.5},
        {"launch_ns", 17'900},
        {"gemm_k_half", 110}}},
      {7,
       0,
       "volta",
       {{"simt_efficiency", 0.97},
        {"tensor_efficiency", 0.75},
        {"memory_efficiency", 0.82},
        {"batch_norm_efficiency", 1.0},
        {"batch_norm_channels_per_sm", 0.18},
        {"depthwise_efficiency", 0.244},
        {"winograd_gain", 3.7},
        {"launch_ns", 13'200},
        {"gemm_k_half", 169}}},
      {7,
       5,
       "turing",
       {{"simt_efficiency", 0.9},
        {"tensor_efficiency", 0.6},
        {"conv_tensor_efficiency", 0.59},
        {"memory_efficiency", 0.8},
        {"norm_efficiency", 0.6},
        {"batch_norm_efficiency", 1.0},
        {"batch_norm_channels_per_sm", 0.68},
        {"depthwise_efficiency", 0.15},
        {"winograd_gain", 2.5},
        {"launch_ns", 10'000},
        {"gemm_k_half", 64}}},
      {8,
       0,
       "ampere",
       {{"simt_efficiency", 0.85},
        {"tensor_efficiency", 0.7},
        {"conv_tensor_efficiency", 0.59},
        {"attention_efficiency", 0.7},
        {"memory_efficiency", 0.9},
        {"reduction_efficiency", 0.9},
        {"norm_efficiency", 0.7},
        {"batch_norm_efficiency", 1.0},
        {"batch_norm_channels_per_sm", 0.68},
        {"batch_norm_16bit_forward", 1.62},
        {"batch_norm_16bit_backward", 1.10},
        {"optimizer_efficiency", 0.75},
        {"gather_efficiency", 0.8},
        {"depthwise_efficiency", 0.15},
        {"winograd_gain", 2.5},
        {"unaligned_efficiency", 0.36},
        {"launch_ns", 10'000},
        {"gemm_k_half", 48}}},
      {9,
       0,
       "hopper",
       {{"simt_efficiency", 0.78},
        {"tensor_efficiency", 0.74},
        {"conv_tensor_efficiency", 0.59},
        {"attention_efficiency", 0.71},
        {"memory_efficiency", 0.91},
        {"reduction_efficiency", 0.94},
        {"norm_efficiency", 0.70},
        {"batch_norm_efficiency", 1.0},
        {"batch_norm_channels_per_sm", 0.67},
        {"batch_norm_16bit_forward", 1.68},
        {"batch_norm_16bit_backward", 1.11},
        {"batch_norm_eval_efficiency", 0.72},
        {"batch_norm_eval_16bit", 0.8},
        {"batch_norm_eval_plane", 160},
        {"optimizer_efficiency", 0.76},
        {"gather_efficiency", 0.96},
        {"depthwise_efficiency", 0.14},
        {"winograd_gain", 2.5},
        {"unaligned_efficiency", 0.36},
        {"launch_ns", 8'500},
        {"gemm_k_half", 41}}},
      {10,
       0,
       "blackwell",
       {{"simt_efficiency", 0.79},
        {"tensor_efficiency", 0.7},
        {"conv_tensor_efficiency", 0.59},
        {"attention_efficiency", 0.7},
        {"memory_efficiency", 0.9},
        {"reduction_efficiency", 0.9},
        {"norm_efficiency", 0.7},
        {"batch_norm_efficiency", 1.0},
        {"batch_norm_channels_per_sm", 0.68},
        {"batch_norm_16bit_forward", 1.62},
        {"batch_norm_16bit_backward", 1.10},
        {"optimizer_efficiency", 0.75},
        {"gather_efficiency", 0.9},
        {"depthwise_efficiency", 0.14},
        {"winograd_gain", 2.5},
        {"unaligned_efficiency", 0.36},
        {"launch_ns", 10'000},
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
      {"conv_tensor_efficiency", &KernelParams::conv_tensor_efficiency, 0.05, 1.0},
      {"attention_efficiency", &KernelParams::attention_efficiency, 0.05, 1.0},
      {"memory_efficiency", &KernelParams::memory_efficiency, 0.05, 1.0},
      {"reduction_efficiency", &KernelParams::reduction_efficiency, 0.02, 1.0},
      {"norm_efficiency", &KernelParams::norm_efficiency, 0.02, 1.0},
      {"batch_norm_efficiency", &KernelParams::batch_norm_efficiency, 0.02, 1.0},
      {"batch_norm_channels_per_sm", &KernelParams::batch_norm_channels_per_sm, 0.0, 16.0},
      {"batch_norm_16bit_forward", &KernelParams::batch_norm_16bit_forward, 1.0, 4.0},
      {"batch_norm_16bit_backward", &KernelParams::batch_norm_16bit_backward, 1.0, 4.0},
      {"batch_norm_eval_efficiency", &KernelParams::batch_norm_eval_efficiency, 0.02, 1.0},
      {"batch_norm_eval_16bit", &KernelParams::batch_norm_eval_16bit, 0.25, 2.0},
      {"batch_norm_eval_plane", &KernelParams::batch_norm_eval_plane, 0, 100'000},
      {"optimizer_efficiency", &KernelParams::optimizer_efficiency, 0.02, 1.0},
      {"gather_efficiency", &KernelParams::gather_efficiency, 0.01, 1.0},
      {"depthwise_efficiency", &KernelParams::depthwise_efficiency, 0.01, 1.0},
      {"depthwise_compute_efficiency", &KernelParams::depthwise_compute_efficiency, 0.001, 1.0},
      {"depthwise_nchw_factor", &KernelParams::depthwise_nchw_factor, 0.05, 1.0},
      {"depthwise_wgrad_efficiency", &KernelParams::depthwise_wgrad_efficiency, 0.0005, 1.0},
      {"depthwise_wgrad_nchw_efficiency", &KernelParams::depthwise_wgrad_nchw_efficiency, 0.0005, 1.0},
      {"winograd_gain", &KernelParams::winograd_gain, 1.0, 4.0},
      {"unaligned_efficiency", &KernelParams::unaligned_efficiency, 0.05, 1.0},
      {"rnn_step_ns", &KernelParams::rnn_step_ns, 0, 200'000},
      {"rnn_bias_grad_efficiency", &KernelParams::rnn_bias_grad_efficiency, 0.01, 1.0},
      {"column_reduction_half_bytes", &KernelParams::column_reduction_half_bytes, 0, 1'000'000},
      {"norm_row_ns", &KernelParams::norm_row_ns, 0, 10'000},
      {"strided_elements_per_sm_ns", &KernelParams::strided_elements_per_sm_ns, 0.1, 100},
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
