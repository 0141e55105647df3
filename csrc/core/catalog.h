// GPU catalog: published specs of the GPUs torch-emugpu can emulate.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace emugpu {

enum class DType { kFloat32, kTensorFloat32, kFloat16, kBFloat16, kFloat64, kInteger };

// A MIG GPU-instance profile as `nvidia-smi mig -lgip` lists it: the
// compute slices (of 7) and memory slices (of the GPU's) it takes, its SMs,
// memory and the memory slices an instance may start at (-lgipp).
struct MigProfile {
  std::string name;  // "1g.10gb": nvidia-smi's name without its "MIG " prefix
  int compute_slices = 0;
  int memory_slices = 0;
  int sm_count = 0;
  uint64_t memory_bytes = 0;
  std::vector<int> placements;
};

struct GpuSpec {
  std::string name;  // as torch.cuda.get_device_name() prints it
  std::vector<std::string> aliases;
  uint64_t memory_bytes = 0;  // total_memory as CUDA reports it
  int sm_count = 0;
  int major = 0;
  int minor = 0;
  double fp32_flops = 0;  // peak dense FLOP/s
  double tf32_flops = 0;
  double fp16_flops = 0;
  double bf16_flops = 0;
  double fp64_flops = 0;
  double memory_bandwidth = 0;  // bytes/s
  int pcie_generation = 0;
  int pcie_width = 0;
  double nvlink_bandwidth = 0;  // bytes/s per direction, 0 when absent
  // MIG: the slices a GPU divides into and the instance profiles it offers
  // (none: it has no MIG). See mig.h.
  int mig_compute_slices = 0;
  int mig_memory_slices = 0;
  std::vector<MigProfile> mig_profiles;
  // Set on a MIG instance's spec (mig.h): its profile, its GPU's name, its UUID.
  std::string mig_profile;
  std::string parent_name;
  std::string uuid;

  double peak_flops(DType dtype) const;
  // Usable host<->device bandwidth in bytes/s (about 80% of the PCIe link).
  double pcie_bandwidth() const;
};

// The physical bounds of a catalog entry's numbers: generous on both sides,
// so that every GPU made so far and any of the next years fits (the shipped
// catalog spans 11-140 GiB, 13-132 SMs, 0.2-989 TFLOP/s and 240-4800 GB/s),
// while unit mix-ups and absurd rates (1e-15 GB/s: every op takes a day) are
// refused with the range in the message.
constexpr double kMinMemoryGib = 0.125;  // 128 MiB: the first CUDA GPUs had 256 MiB
constexpr double kMaxMemoryGib = 16384;
constexpr int kMaxSmCount = 10000;
constexpr double kMinTflops = 0.01;            // GeForce 8-class FP32; FP64 of consumer cards is above it
constexpr double kMaxTflops = 1e6;             // 1e18 FLOP/s
constexpr double kMinBandwidthGBps = 1;        // memory and NVLink bandwidth
constexpr double kMaxBandwidthGBps = 100'000;  // 100 TB/s

class Catalog {
 public:
  static Catalog from_json_text(std::string_view text, const std::string& origin);
  static Catalog from_file(const std::string& path);

  // Loose lookup: case, separators and vendor prefixes ("Tesla", "NVIDIA",
  // "Quadro") are ignored; throws kValue listing the names and the closest one.
  const GpuSpec& find(std::string_view name) const;
  const std::vector<GpuSpec>& gpus() const { return gpus_; }

 private:
  std::vector<GpuSpec> gpus_;
};

// Lower-case alphanumerics with vendor prefixes removed: "Tesla_V100-PCIE-32GB"
// and "v100 pcie 32gb" both become "v100pcie32gb".
std::string normalize_gpu_name(std::string_view name);
size_t edit_distance(std::string_view a, std::string_view b);

// Catalog and profile files are edited by hand and may be hostile: parsing
// and error messages must stay bounded whatever the input.
constexpr int kMaxJsonDepth = 64;

// Parses `text`; throws kValue starting with `origin` for invalid JSON or for
// arrays/objects nested deeper than kMaxJsonDepth (refused before parsing, so
// a deep document is never built).
nlohmann::json parse_json_document(std::string_view text, const std::string& origin);

// `value` for an error message: at most about 80 characters, looking one
// level into arrays and objects and no deeper.
std::string describe_json(const nlohmann::json& value);

// The integer `value` holds, when it holds one in [lo, hi]: integral floats
// such as 64.0 count, 1.5 does not; nothing out of range is ever cast.
std::optional<int64_t> json_integer_in(const nlohmann::json& value, int64_t lo, int64_t hi);

}  // namespace emugpu
