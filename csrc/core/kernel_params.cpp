#include "kernel_params.h"

#include <cmath>

#include "error.h"

namespace emugpu {
namespace {

struct ArchRow {
  int major_min;  // the row applies from this compute capability ...
  int minor_min;
  const char* name;
  KernelParams params;
};

// Rows for Kepler to Volta are fitted (`benchmarks/fit_cost_model.py --fit`)
// to GPEmu's published per-iteration times of 36 torchvision CNNs, batch
// 1-256, fp32, cudnn.benchmark on, on a K80, M40, P100-PCIE and V100-PCIE
// (github.com/mengwanguc/gpemu, profiled_data/; the data is not in this
// repository), over the configurations that were not host-bound there. The
// fits say what those runs show: cuDNN's Winograd and FFT kernels (picked
// by cudnn.benchmark) more than halve 3x3 convolutions; depthwise
// convolutions reach under 15% of the bandwidth; the PyTorch 1.x kernels
// between them (batch norm, elementwise) sustain 30-65%; and a kernel
// occupies the stream for 12-36 us, launch gaps included. Later rows are
// not fitted: they start from Volta's kernel forms with the tensor-core and
// bandwidth figures of published measurements (cuBLAS reaches 60-75% of the
// dense tensor-core peak on large BF16/FP16 GEMMs on A100 and H100; HBM2e
// and HBM3 copies reach ~85-90% of peak) and launch costs of current CUDA;
// a calibration file measured on the GPU replaces them.
// Fields: simt, tensor, memory, gather, depthwise, winograd, launch_ns, k_half.
const ArchRow kRows[] = {
    {3, 0, "kepler", {0.70, 0.6, 0.27, 0.15, 0.071, 3.6, 36'000, 80, ""}},
    {5, 0, "maxwell", {0.97, 0.6, 0.46, 0.25, 0.082, 2.0, 17'600, 36, ""}},
    {6, 0, "pascal", {1.00, 0.6, 0.44, 0.25, 0.071, 4.0, 22'500, 1, ""}},
    {7, 0, "volta", {1.00, 0.6, 0.64, 0.30, 0.146, 4.0, 12'400, 56, ""}},
    {7, 5, "turing", {0.90, 0.55, 0.75, 0.35, 0.20, 2.5, 6'000, 32, ""}},
    {8, 0, "ampere", {0.90, 0.65, 0.85, 0.40, 0.25, 2.5, 5'000, 32, ""}},
    {8, 9, "ada", {0.90, 0.60, 0.85, 0.40, 0.25, 2.5, 5'000, 32, ""}},
    {9, 0, "hopper", {0.85, 0.62, 0.85, 0.40, 0.25, 2.5, 4'000, 32, ""}},
    {10, 0, "blackwell", {0.85, 0.62, 0.85, 0.40, 0.25, 2.5, 4'000, 32, ""}},
};

}  // namespace

KernelParams default_kernel_params(const GpuSpec& gpu) {
  const ArchRow* row = &kRows[0];
  for (const ArchRow& r : kRows) {
    if (gpu.major > r.major_min || (gpu.major == r.major_min && gpu.minor >= r.minor_min)) row = &r;
  }
  KernelParams p = row->params;
  p.source = std::string("table: ") + row->name;
  return p;
}

const std::vector<KernelParamField>& kernel_param_fields() {
  static const std::vector<KernelParamField> fields = {
      {"simt_efficiency", &KernelParams::simt_efficiency, 0.05, 1.0},
      {"tensor_efficiency", &KernelParams::tensor_efficiency, 0.05, 1.0},
      {"memory_efficiency", &KernelParams::memory_efficiency, 0.05, 1.0},
      {"gather_efficiency", &KernelParams::gather_efficiency, 0.01, 1.0},
      {"depthwise_efficiency", &KernelParams::depthwise_efficiency, 0.01, 1.0},
      {"winograd_gain", &KernelParams::winograd_gain, 1.0, 4.0},
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
