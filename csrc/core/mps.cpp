#include "mps.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "device.h"
#include "error.h"
#include "text.h"

namespace emugpu {

double parse_active_thread_percentage(const std::string& text, const std::string& source) {
  const std::string t = trim(text);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  EMUGPU_CHECK(!t.empty() && *end == '\0' && std::isfinite(v) && v > 0 && v <= 100, kValue, source,
               ": expected a percentage of the GPU's SMs above 0 and at most 100, got '", echo_input(text), "'");
  return v;
}

namespace {

uint64_t parse_size(const std::string& text, const std::string& source, const std::string& whole) {
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) {
    ++digits;
  }
  std::string unit = text.substr(digits);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double scale = 0;
  if (unit == "K" || unit == "KB" || unit == "KIB") scale = 1024.0;
  if (unit == "M" || unit == "MB" || unit == "MIB") scale = 1024.0 * 1024;
  if (unit == "G" || unit == "GB" || unit == "GIB") scale = 1024.0 * 1024 * 1024;
  if (unit == "T" || unit == "TB" || unit == "TIB") scale = 1024.0 * 1024 * 1024 * 1024;
  char* end = nullptr;
  const std::string number = text.substr(0, digits);
  const double v = std::strtod(number.c_str(), &end);
  EMUGPU_CHECK(!number.empty() && *end == '\0' && scale > 0 && std::isfinite(v) && v > 0 && v * scale < 1e18, kValue,
               source, ": expected DEVICE=SIZE entries such as 0=1G,1=512M (a size above 0 with a unit K, M, G or ",
               "T), got '", echo_input(whole), "'");
  return static_cast<uint64_t>(v * scale);
}

}  // namespace

std::map<int, uint64_t> parse_pinned_mem_limit(const std::string& text, const std::string& source) {
  std::map<int, uint64_t> out;
  for (const std::string& entry : split_trimmed(text, ',')) {
    const size_t eq = entry.find('=');
    const std::string device = trim(entry.substr(0, eq));
    char* end = nullptr;
    const long index = std::strtol(device.c_str(), &end, 10);
    EMUGPU_CHECK(eq != std::string::npos && !device.empty() && *end == '\0' && index >= 0 && index < 1024, kValue,
                 source, ": expected DEVICE=SIZE entries such as 0=1G,1=512M (DEVICE: a device ordinal), got '",
                 echo_input(text), "'");
    EMUGPU_CHECK(out.count(static_cast<int>(index)) == 0, kValue, source, ": device ", index, " is limited twice in '",
                 echo_input(text), "'; give each device one limit");
    out[static_cast<int>(index)] = parse_size(trim(entry.substr(eq + 1)), source, text);
  }
  return out;
}

GpuSpec mps_client_spec(const GpuSpec& gpu, double percent, uint64_t memory_limit) {
  EMUGPU_CHECK(percent > 0 && percent <= 100, kValue, "an MPS active thread percentage must lie in (0, 100], got ",
               percent);
  GpuSpec s = gpu;
  const int sms = std::clamp(static_cast<int>(std::ceil(gpu.sm_count * percent / 100.0 - 1e-9)), 1, gpu.sm_count);
  if (sms < gpu.sm_count) {
    const double scale = static_cast<double>(sms) / gpu.sm_count;
    s.sm_count = sms;
    // A part of the GPU, as a MIG instance is: its GPU's calibration holds,
    // its GPU's profiles (whole-GPU times) do not.
    s.parent_name = gpu.name;
    for (double* rate : {&s.fp32_flops, &s.tf32_flops, &s.fp16_flops, &s.bf16_flops, &s.fp64_flops}) *rate *= scale;
  }
  // What the client may allocate is its usable memory (device.h).
  if (memory_limit > 0 && memory_limit < usable_memory_bytes(gpu)) s.memory_bytes = memory_limit + kCudaContextBytes;
  return s;
}

}  // namespace emugpu
