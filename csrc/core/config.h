// The configuration of the emulated GPUs, from explicit values or the
// environment (EMUGPU_GPU, EMUGPU_DEVICE_COUNT, EMUGPU_MODE, EMUGPU_CATALOG):
// the one place either is parsed.
#pragma once

#include <optional>
#include <string>

namespace emugpu {

enum class Mode { kTiming, kCompute };

constexpr int kMaxDevices = 64;
constexpr const char* kDefaultGpu = "NVIDIA A100-SXM4-40GB";

struct Config {
  std::string catalog_path;
  std::string gpu;
  int device_count = 1;
  Mode mode = Mode::kTiming;
};

// What a caller asks for; whatever is left out comes from the environment,
// then from the defaults. Bad values throw kValue naming their source.
struct ConfigRequest {
  std::optional<std::string> gpu;
  std::optional<int> device_count;
  std::optional<std::string> mode;
};

Config resolve_config(const ConfigRequest& request, const std::string& default_catalog);
Mode parse_mode(const std::string& text, const std::string& source);
int parse_device_count(const std::string& text, const std::string& source);
const char* mode_name(Mode mode);

}  // namespace emugpu
